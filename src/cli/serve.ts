import { serve as serveHono } from '@hono/node-server';
import type { AddressInfo } from 'node:net';
import type { Server } from 'node:http';
import { Recorder } from '../capture/recorder.js';
import { LiveEngine, type TimingMode } from '../engine/index.js';
import { OutputResolver, type MissPolicy, type OutputsMode } from '../generation/resolver.js';
import { createServeApp } from '../http/serveApp.js';
import { CaptureStore } from '../store/captureStore.js';
import { loadTokenizer, ModelTokenizer } from '../tokenizer/index.js';
import { engineIdentity, EMULATED_VLLM_VERSION } from './identity.js';

export type ServeMode = 'replay' | 'random';

export interface ServeOptions {
  mode: ServeMode;
  captures: string;
  model?: string;
  servedModelName?: string[];
  host: string;
  port: number;
  outputs?: OutputsMode;
  timing?: TimingMode;
  forwardTimeMs: number;
  speedupRatio: number;
  onMiss?: MissPolicy;
  upstream?: string;
  upstreamTimeoutMs: number;
  seed: number;
  maxModelLen?: number;
  maxBodyBytes: number;
  redactHeaders: string[];
}

export interface Running {
  port: number;
  close(): Promise<void>;
}

/** `mocker serve`: a vLLM-compatible server answering from captures or random tokens. */
export async function startServe(opts: ServeOptions): Promise<Running> {
  const outputs: OutputsMode = opts.outputs ?? (opts.mode === 'replay' ? 'captured' : 'random');
  const timing: TimingMode = opts.timing ?? (opts.mode === 'replay' ? 'captured' : 'fixed');
  const onMiss: MissPolicy = opts.onMiss ?? 'error';
  if ((onMiss === 'passthrough' || onMiss === 'record') && !opts.upstream) throw new Error(`--on-miss ${onMiss} needs --upstream URL`);
  if (!(opts.speedupRatio > 0)) throw new Error(`--speedup-ratio must be > 0, got ${opts.speedupRatio}`);
  if (!(opts.forwardTimeMs >= 0)) throw new Error(`--forward-time-ms must be >= 0, got ${opts.forwardTimeMs}`);

  const store = outputs === 'captured' || onMiss === 'record' ? CaptureStore.open(opts.captures) : undefined;
  const run = store?.latestRun();
  // A capture carries its tokenizer: replay needs no --model.
  let tokenizer: ModelTokenizer;
  if (opts.model !== undefined || !run || !store) tokenizer = loadTokenizer(opts.model);
  else {
    const files = store.tokenizerFiles(run);
    tokenizer = files.has('tokenizer.json') ? new ModelTokenizer(run.tokenizerName ?? 'captured', files) : loadTokenizer();
  }
  // Warm the tokenizer and the chat template so the first request's TTFT is not a cold start.
  await tokenizer.decode(await tokenizer.encode('warm up', false), true);
  try {
    tokenizer.renderChat({ messages: [{ role: 'user', content: 'warm up' }] });
  } catch {
    // A model without a chat template serves completions only.
  }
  const captured = store?.capturedModels() ?? [];
  const servedModels = opts.servedModelName?.length ? opts.servedModelName : captured.length > 0 && outputs === 'captured' ? captured : [tokenizer.name];
  const maxModelLen = opts.maxModelLen ?? run?.maxModelLen ?? tokenizer.maxModelLen;

  const upstream = opts.upstream ? new URL(opts.upstream) : undefined;
  let sink;
  if (onMiss === 'record' && store && upstream) {
    const identity = await engineIdentity(upstream);
    const runId = store.startRun({ kind: 'record', upstream: upstream.href, ...identity, tokenizerName: tokenizer.name }, tokenizer.files);
    sink = new Recorder(store, runId, tokenizer, upstream, new Set(opts.redactHeaders.map((h) => h.toLowerCase()))).sink;
  }

  const app = createServeApp({
    engine: new LiveEngine({ mode: timing, forwardTimeMs: opts.forwardTimeMs, speedupRatio: opts.speedupRatio }),
    resolver: new OutputResolver({ outputs, onMiss, seed: opts.seed, store, tokenizer }),
    tokenizer,
    servedModels,
    modelRoot: opts.model ?? tokenizer.name,
    maxModelLen,
    versionJson: run?.versionJson ?? JSON.stringify({ version: EMULATED_VLLM_VERSION }),
    forward: upstream ? { config: { upstream, timeoutMs: opts.upstreamTimeoutMs }, sink } : undefined,
    maxBodyBytes: opts.maxBodyBytes,
  });

  const server = await new Promise<Server>((resolve) => {
    const s = serveHono({ fetch: app.fetch, hostname: opts.host, port: opts.port, serverOptions: { noDelay: true } }, () => resolve(s as Server));
  });
  server.keepAliveTimeout = 65_000;
  const port = (server.address() as AddressInfo).port;
  console.log(
    `mocker serve: ${opts.mode} mode (outputs ${outputs}, timing ${timing}${timing === 'fixed' ? ` ${opts.forwardTimeMs} ms/step` : ''}, speedup ${opts.speedupRatio}) ` +
      `serving ${servedModels.join(', ')} on http://${opts.host}:${port}${store ? ` from ${opts.captures}` : ''}`,
  );
  return {
    port,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => {
          store?.close();
          resolve();
        });
      }),
  };
}
