import { getRequestListener } from '@hono/node-server';
import type { AddressInfo } from 'node:net';
import type { Server } from 'node:http';
import { Recorder } from '../capture/recorder.js';
import {
  badLatencyKnob,
  DEFAULT_LATENCY_KNOBS,
  defaultHashSeed,
  fixedTiming,
  latencyTiming,
  loadPerfModel,
  modelTiming,
  polynomialPerfModel,
  SimulatedEngine,
  zeroTiming,
  type EngineObserver,
  type LatencyKnobs,
  type PassTiming,
} from '../engine/index.js';
import { KvEventStreams, KvTraceLog, kvTraceEnabled } from '../events/index.js';
import { OutputResolver, type MissPolicy, type OutputsMode } from '../generation/resolver.js';
import { resolveReasoningSpan } from '../generation/reasoning.js';
import { randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import { Drain, listen } from '../wire/drain.js';
import { DEFAULT_WIRE, vllmVersionOf } from '../wire/shapes.js';
import { createServeApp } from '../http/serveApp.js';
import { serveRoutes } from '../http/routes.js';
import type { EffectiveSettings, ServeAppConfig } from '../http/serveConfig.js';
import { serverTls, upstreamTls } from '../wire/tls.js';
import { DEFAULT_API_KEY_SCOPE, exposedControlWarning, type ApiKeyPolicy, type ClassifiedRoute } from '../wire/access.js';
import { LoraAdapters, runtimeLoraUpdating } from '../http/loraAdapters.js';
import { badFaultSetting, FAULT_TYPES, FaultInjector, type FaultSettings } from '../http/faults.js';
import { kvBytesPerToken, parsePeer } from '../pd/kvTransfer.js';
import { MockerMetrics } from '../metrics/mockerMetrics.js';
import { backendMetrics } from '../metrics/backendMetrics.js';
import { DEFAULT_DCGM } from '../metrics/dcgm.js';
import { StatsLog } from '../metrics/statsLog.js';
import { SglangMetrics } from '../metrics/sglangMetrics.js';
import { VllmMetrics, type MetricsConfig } from '../metrics/vllmMetrics.js';
import { CaptureStore, type CaptureContents } from '../store/captureStore.js';
import { ChunkVocabulary, loadModelFiles, loadTokenizer, ModelTokenizer } from '../tokenizer/index.js';
import { schedulerConfig, type EngineArgs } from '../config/engineArgs.js';
import { completeServeOptions, settingsView, type ResolvedServeOptions } from '../config/resolveServe.js';
import type { ServeOptions } from '../config/serveOptions.js';
import { CONTROL_KEYS } from '../config/serveSettings.js';

export type { ServeOptions };
import { runColumns, UpstreamEngine } from '../capture/upstreamEngine.js';
import { RecordingSink, type StopReport } from './shutdown.js';
import { UpstreamPool } from '../capture/upstreamHttp.js';
import { staggerOffsetMs } from '../http/startup.js';
import { configureLogs, log, logStart, logsAt } from '../util/log.js';
import { terminalText } from '../util/terminalText.js';

/** Where a server started in process listens unless told: loopback, any free port (the CLI's defaults are the table's). */
export const IN_PROCESS_ADDRESS = { host: '127.0.0.1', port: 0 };

/** vLLM's VLLM_LOG_STATS_INTERVAL (seconds, default 10). */
const STATS_LOG_INTERVAL_MS = 1000 * Number(process.env.VLLM_LOG_STATS_INTERVAL ?? 10);

export interface Running {
  /** The (first) port listened on. */
  port: number;
  /** Every port, one per `--num-workers` engine. */
  ports?: number[];
  /** The routes the (first) server answers, each with its access class. */
  routes?: ClassifiedRoute[];
  /** What the startup line says before and after the URLs served (printed unless `share` was given). */
  startupLine?: StartupLine;
  /**
   * Stops taking requests, lets those in flight finish for up to `graceMs` (default 0: cut them off), then
   * closes everything (a capture file last, self-contained).
   */
  close(graceMs?: number): Promise<StopReport>;
}

export interface StartupLine {
  head: string;
  /** https with --ssl-certfile. */
  scheme: 'http' | 'https';
  host: string;
  tail: string;
}

/** The startup line: the settings, then every engine's URL (tests and scripts wait for "on http://…"). */
/** (Model names from a capture file are in it: escaped for the terminal.) */
export const startupLineText = (line: StartupLine, ports: number[]) =>
  terminalText(`${line.head}${ports.map((p) => `${line.scheme}://${line.host}:${p}`).join(', ')}${line.tail}`);

/** vLLM's side-channel host, where decode engines reach a prefill engine listening on `host` (a wildcard is not one they can call). */
export function advertisedHost(host: string): string {
  return process.env.VLLM_NIXL_SIDE_CHANNEL_HOST ?? (['0.0.0.0', '::'].includes(host) ? '127.0.0.1' : host);
}

/** `serve`'s --api-key (else VLLM_API_KEY, as vLLM) and --api-key-scope. */
export function apiKeyPolicy(options: Pick<ServeOptions, 'apiKey' | 'apiKeyScope'>): ApiKeyPolicy {
  return { key: options.apiKey ?? process.env.VLLM_API_KEY, scope: options.apiKeyScope ?? DEFAULT_API_KEY_SCOPE };
}

/**
 * One of vLLM's boolean environment variables: VLLM_SERVER_DEV_MODE (its development routes, `/reset_prefix_cache`,
 * `/sleep`…, are attached), VLLM_ENABLE_RESPONSES_API_STORE (`/v1/responses` keeps its answers).
 */
function vllmEnvFlag(name: 'VLLM_SERVER_DEV_MODE' | 'VLLM_ENABLE_RESPONSES_API_STORE', env: NodeJS.ProcessEnv = process.env): boolean {
  // vLLM's envs: `bool(int(os.getenv("VLLM_SERVER_DEV_MODE", "0")))`.
  return ['1', 'true'].includes((env[name] ?? '0').trim().toLowerCase());
}

/** A capture file's contents in one line. */
function describeContents(c: CaptureContents): string {
  const engines = c.engines.length > 0 ? c.engines.join(', ') : 'unknown';
  const models = c.models.length > 0 ? c.models.join(', ') : 'none';
  return `${c.runs} run(s) (engines: ${engines}), models: ${models}, ${c.outcomes.complete} complete exchange(s) (${c.outcomes.failed} failed, ${c.outcomes.aborted} aborted, never replayed)`;
}

/**
 * `mocker serve`: a vLLM-compatible server answering from captures or random tokens. It listens before it
 * opens anything (a taken port leaves no file behind); requests that come meanwhile wait for it.
 */
export async function startServe(options: ServeOptions): Promise<Running> {
  const drain = new Drain();
  const closers: (() => unknown)[] = [];
  try {
    return await startServing(options, drain, closers);
  } catch (err) {
    await drain.drain(0);
    for (const close of closers) await close();
    throw err;
  }
}

/** What one server's engines share: the model, its captures, the upstream and the settings. */
interface Shared {
  opts: ResolvedServeOptions;
  args: EngineArgs;
  workers: number;
  quiet: boolean;
  timing: TimingSetup;
  model: LoadedModel;
  upstream: UpstreamSetup;
  resolver: OutputResolver;
  settings: EffectiveSettings;
  access: ApiKeyPolicy;
  bytesPerToken: number | null;
  kvPeers: Set<string>;
  kvHoldTimeoutMs: number;
  /** Dynamo's KV cache trace log (DYN_MOCKER_KV_CACHE_TRACE unless given). */
  kvTrace: boolean;
  dcgmSeed: number;
  readyAtMs: number | undefined;
  /** When the model was loaded (performance.now() ms): the workers' stagger counts from here. */
  startedAtMs: number;
  faults: FaultSettings;
  closers: (() => unknown)[];
}

/** startServe's work; what it opens is closed by `closers` (in order) if it fails. */
async function startServing(options: ServeOptions, drain: Drain, closers: (() => unknown)[]): Promise<Running> {
  const opts = completeServeOptions(options, IN_PROCESS_ADDRESS);
  configureLogs(opts.logs);
  const args = opts.engine;
  const workers = opts.numWorkers;
  const engineIndices = opts.share?.engines ?? Array.from({ length: workers }, (_, w) => w);
  // Under --threads, what the capture file holds is said once, by the first thread.
  const quiet = opts.share !== undefined && !opts.share.first;
  // What the capture file holds (its models) is text from the file.
  const say = quiet ? () => undefined : (line: string) => log('info', terminalText(line));
  // Read (and checked) before anything listens.
  const tls = serverTls(opts.tls);
  // One server per worker, on consecutive ports.
  const servers: Server[] = [];
  for (const w of engineIndices) {
    const server = drain.server(tls);
    servers.push(server);
    await listen(server, opts.host, opts.port === 0 ? 0 : opts.port + w);
  }
  const badFault = badFaultSetting(opts.faults);
  if (badFault) throw new Error(`failure injection: ${badFault[1]}`);
  const timing = await timingSetup(opts, workers);
  const model = await loadModel(opts, closers, say);
  const upstream = await upstreamSetup(opts, model, closers);
  const synthetic = { reasoning: args.reasoning ? resolveReasoningSpan(args.reasoning, model.tokenizer) : null, toolCallRate: opts.toolCallRate };
  const resolver = new OutputResolver({
    ...opts.matching,
    outputs: opts.outputs,
    onMiss: opts.onMiss,
    seed: opts.seed,
    store: model.store,
    tokenizer: model.tokenizer,
    role: opts.role,
    synthetic,
  });
  // As Dynamo: a config without the KV geometry means no transfer delay (said when it matters).
  const bytesPerToken = opts.kvBytesPerToken ?? kvBytesPerToken(model.tokenizer.modelConfig, opts.kvCacheDtype);
  if (bytesPerToken === null && opts.role !== 'agg' && !quiet)
    log('warning', `mocker serve: ${model.tokenizer.name}'s config.json gives no KV geometry: KV transfers take no time (give --kv-bytes-per-token)`);
  const kvPeers = new Set(
    opts.kvTransferAllowedHosts.map((entry) => {
      try {
        return parsePeer(entry);
      } catch (err) {
        throw new Error(`--kv-transfer-allowed-hosts: ${(err as Error).message}`);
      }
    }),
  );
  if (opts.role === 'decode' && kvPeers.size === 0 && !quiet)
    log('warning', 'mocker serve: a decode engine without --kv-transfer-allowed-hosts pulls no KV: every prompt is recomputed here');
  const settings = settingsView(opts, {
    perf_model: timing.perfModel,
    reasoning:
      synthetic.reasoning &&
      JSON.stringify({
        start_thinking_token_id: synthetic.reasoning.startTokenId,
        end_thinking_token_id: synthetic.reasoning.endTokenId,
        thinking_ratio: synthetic.reasoning.thinkingRatio,
      }),
    kv_bytes_per_token: bytesPerToken,
    max_model_len: model.maxModelLen,
    upstream: upstream.engine?.url.href ?? null,
  });
  const timers: NodeJS.Timeout[] = [];
  closers.unshift(() => timers.forEach(clearInterval));
  const shared: Shared = {
    opts,
    args,
    workers,
    quiet,
    timing,
    model,
    upstream,
    resolver,
    settings,
    access: apiKeyPolicy(opts),
    bytesPerToken,
    kvPeers,
    kvHoldTimeoutMs: kvHoldTimeoutMs(opts.kvHoldTimeoutMs),
    kvTrace: opts.kvTrace ?? kvTraceEnabled(),
    dcgmSeed: opts.dcgm?.seed ?? Math.floor(Math.random() * 2 ** 32),
    // --startup-time counts from here: the model (tokenizer, captures) is loaded.
    readyAtMs: opts.startupTimeS ? performance.now() + 1000 * opts.startupTimeS : undefined,
    startedAtMs: performance.now(),
    faults: opts.faults,
    closers,
  };
  let routes: ClassifiedRoute[] | undefined;
  // One engine (own scheduler and KV cache per rank) per worker, each behind its own server.
  for (const [i, w] of engineIndices.entries()) {
    const app = await startWorker(shared, w, servers[i], timers);
    drain.handle(servers[i], getRequestListener(app.fetch, { hostname: opts.host }));
    routes ??= serveRoutes(app);
  }
  const controlPaths = [...new Set(routes!.filter((r) => r.class === 'control').map((r) => r.path))];
  const exposed = exposedControlWarning('serve', opts.host, shared.access, controlPaths);
  if (exposed && !quiet) log('warning', exposed);
  const ports = servers.map((s) => (s.address() as AddressInfo).port);
  const startupLine = startupLineOf(opts, timing.description, model, tls !== undefined);
  if (!opts.share) logStart(startupLineText(startupLine, ports));
  return {
    port: ports[0],
    ports,
    routes,
    startupLine,
    close: async (graceMs = 0) => {
      const drained = await drain.drain(graceMs);
      // Exchanges being recorded (those the drain cut off: as aborted) are stored before the file closes.
      await upstream.recording?.settled();
      for (const close of closers) await close();
      return { ...drained, recorded: upstream.recording?.recorded };
    },
  };
}

/** How long a prefill engine holds KV for a decode that never comes: vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT (480 s). */
function kvHoldTimeoutMs(given: number | undefined): number {
  const ms = given ?? 1000 * Number(process.env.VLLM_NIXL_ABORT_REQUEST_TIMEOUT ?? 480);
  // setTimeout fires at once for anything that is not a number of ms up to 2^31 - 1 (about 24.8 days).
  if (!(ms > 0 && ms <= 2 ** 31 - 1)) {
    throw new Error(
      `VLLM_NIXL_ABORT_REQUEST_TIMEOUT must be a number of seconds between 0 and ${Math.floor((2 ** 31 - 1) / 1000)}, got "${process.env.VLLM_NIXL_ABORT_REQUEST_TIMEOUT}"`,
    );
  }
  return ms;
}

interface TimingSetup {
  passTiming: (worker: number) => PassTiming;
  description: string;
  perfModel: string | null;
  /** Each worker its own knobs under `--timing latency` (changed through its own /mocker/config), else none. */
  latencyKnobs: LatencyKnobs[];
}

/** The engines' pass timing for the timing mode. */
async function timingSetup(opts: ResolvedServeOptions, workers: number): Promise<TimingSetup> {
  const { timing, engine: args } = opts;
  const latencyKnobs = Array.from({ length: timing === 'latency' ? workers : 0 }, () => ({ ...DEFAULT_LATENCY_KNOBS, ...opts.latency }));
  const badKnob = latencyKnobs.length > 0 ? badLatencyKnob(latencyKnobs[0]) : null;
  if (badKnob) throw new Error(`--timing latency: ${badKnob[0]} must be a non-negative number of ms, got ${badKnob[1]}`);
  if (timing === 'model') {
    const profile = args.plannerProfileData;
    const model = profile
      ? await loadPerfModel(profile).catch((err: Error) => {
          throw new Error(`--planner-profile-data: ${err.message}`);
        })
      : polynomialPerfModel;
    return {
      passTiming: () => modelTiming(model, args.speedupRatio, args.decodeSpeedupRatio),
      description: `model: ${model.description}`,
      perfModel: model.description,
      latencyKnobs,
    };
  }
  if (timing === 'fixed')
    return {
      passTiming: () => fixedTiming(opts.forwardTimeMs, args.speedupRatio),
      description: `fixed: ${opts.forwardTimeMs} ms per step`,
      perfModel: null,
      latencyKnobs,
    };
  if (timing === 'latency') {
    const k = latencyKnobs[0];
    return {
      passTiming: (w) => latencyTiming(latencyKnobs[w], opts.seed + w, args.speedupRatio),
      description: `latency: TTFT ${k.ttftMs} ± ${k.ttftStdMs} ms, ITL ${k.itlMs} ± ${k.itlStdMs} ms at start`,
      perfModel: null,
      latencyKnobs,
    };
  }
  return { passTiming: () => zeroTiming(timing === 'captured'), description: timing, perfModel: null, latencyKnobs };
}

interface LoadedModel {
  store: CaptureStore | undefined;
  run: ReturnType<CaptureStore['latestRun']> | undefined;
  tokenizer: ModelTokenizer;
  servedModels: string[];
  maxModelLen: number;
}

/** The capture file and the tokenizer (a capture carries its own: replay needs no --model), warmed up. */
async function loadModel(opts: ResolvedServeOptions, closers: (() => unknown)[], say: (line: string) => void): Promise<LoadedModel> {
  const store = openCaptures(opts.captures, opts.outputs, opts.onMiss, say);
  if (store) closers.push(() => store.close());
  const run = store?.latestRun();
  let tokenizer: ModelTokenizer;
  if (opts.noTokenizer) {
    // The model's files still give its name, chat template and context length; its tokens are character chunks.
    const { name, files } = loadModelFiles(opts.model);
    tokenizer = new ModelTokenizer(name, files, { backend: new ChunkVocabulary() });
  } else if (opts.model !== undefined || !run || !store) tokenizer = loadTokenizer(opts.model);
  else {
    const files = store.tokenizerFiles(run);
    // A capture may come from anyone: its chat template renders sandboxed, as a request's does, and its tokenizer is checked.
    tokenizer = files.has('tokenizer.json') ? new ModelTokenizer(run.tokenizerName ?? 'captured', files, { fromCapture: true }) : loadTokenizer();
  }
  // Warm the tokenizer, the chat template and the random-token vocabulary (a few hundred ms on first use)
  // so the first request's TTFT is not a cold start.
  await tokenizer.decode(await tokenizer.encode('warm up', false), true);
  if (opts.outputs === 'random' || opts.onMiss === 'random') tokenizer.ordinaryTokenIds();
  try {
    await tokenizer.renderChatGuarded({ messages: [{ role: 'user', content: 'warm up' }] });
  } catch {
    // A model without a chat template serves completions only; a template that fails here fails its chats with a 400.
  }
  const captured = store?.capturedModels() ?? [];
  const servedModels = opts.servedModelName?.length ? opts.servedModelName : captured.length > 0 && opts.outputs === 'captured' ? captured : [tokenizer.name];
  return { store, run, tokenizer, servedModels, maxModelLen: opts.maxModelLen ?? run?.maxModelLen ?? tokenizer.maxModelLen };
}

interface UpstreamSetup {
  engine: UpstreamEngine | undefined;
  connections: UpstreamPool | undefined;
  recording: RecordingSink | undefined;
}

/** The upstream misses go to (`--on-miss passthrough|record`), and the recording of what it answers. */
async function upstreamSetup(opts: ResolvedServeOptions, model: LoadedModel, closers: (() => unknown)[]): Promise<UpstreamSetup> {
  const engine = opts.upstream ? await UpstreamEngine.identify(new URL(opts.upstream), upstreamTls(opts.upstreamCaCerts)) : undefined;
  const connections = engine ? new UpstreamPool(engine.url, opts.upstreamTimeoutMs, engine.tls) : undefined;
  if (connections) closers.push(() => connections.close());
  const { store, tokenizer } = model;
  if (opts.onMiss !== 'record' || !store || !engine) return { engine, connections, recording: undefined };
  const runId = store.startRun({ kind: 'record', upstream: engine.url.href, ...runColumns(engine.identity), tokenizerName: tokenizer.name }, tokenizer.files);
  engine.onIdentified((later) => store.updateRun(runId, runColumns(later)));
  const redacted = new Set(opts.redactHeaders.map((h) => h.toLowerCase()));
  return { engine, connections, recording: new RecordingSink(new Recorder(store, runId, tokenizer, engine, redacted).sink, opts.captures) };
}

/** Worker `w`'s engine (its own scheduler, KV cache, metrics and KV events) and the app that serves it on `server`. */
async function startWorker(s: Shared, w: number, server: Server, timers: NodeJS.Timeout[]) {
  const { opts, args } = s;
  const metrics = workerMetrics(s);
  const statsLog = new StatsLog(args.dataParallelSize, performance.now());
  const logTimer = setInterval(() => {
    for (const line of statsLog.lines(performance.now())) log('info', s.workers > 1 ? `worker ${w}: ${line}` : line);
  }, STATS_LOG_INTERVAL_MS);
  logTimer.unref();
  timers.push(logTimer);
  // AIPerf's mock server's other backends' metrics and DCGM telemetry, from the same engine.
  const backends = backendMetrics({
    vllm: metrics.vllmConfig,
    blockSize: args.blockSize,
    numGpuBlocks: args.numGpuBlocks,
    maxNumSeqs: args.maxNumSeqs,
    maxNumBatchedTokens: args.maxNumBatchedTokens,
    role: opts.role,
    // Each worker a node of its own: its exporters' seeds follow the previous worker's two.
    dcgm: { ...DEFAULT_DCGM, ...opts.dcgm, seed: s.dcgmSeed + 2 * w },
  });
  const observers: EngineObserver[] = [metrics.engine, statsLog, ...backends.observers];
  if (logsAt('debug')) observers.push(schedulerStepLog(s.workers > 1 ? `worker ${w} ` : ''));
  const kvEvents = opts.kvEvents ?? [];
  const eventsConfig = kvEvents.length > 1 ? kvEvents[w] : kvEvents[0];
  if (eventsConfig) {
    const stream = await KvEventStreams.open(
      eventsConfig,
      args.dataParallelSize,
      kvEvents.length > 1 ? 0 : ((opts.engineIndex ?? 0) + w) * args.dataParallelSize,
    );
    s.closers.push(() => stream.close());
    observers.push(stream);
  }
  if (s.kvTrace) observers.push(new KvTraceLog(args.blockSize, args.numGpuBlocks));
  const engine = new SimulatedEngine({
    scheduler: {
      ...schedulerConfig(args, s.timing.passTiming(w), opts.seed + w),
      kvEvents: eventsConfig ? { algo: opts.prefixCachingHashAlgo, hashSeed: opts.hashSeed ?? defaultHashSeed() } : undefined,
      kvTrace: s.kvTrace,
      ...(opts.lora.enabled ? { maxLoras: opts.lora.maxLoras } : {}),
      workerType: opts.role === 'prefill' ? 'prefill' : 'aggregated',
      // With captured timing the decode hop's own captured times already include its wait for the KV (the SGLang
      // flavour does not model the transfer).
      ...(args.engineType === 'vllm' || args.engineType === 'trtllm'
        ? { kvTransfer: { bytesPerToken: s.bytesPerToken ?? 0, bandwidthGBps: opts.timing === 'captured' ? 0 : opts.kvTransferBandwidthGBps } }
        : {}),
    },
    kvHoldTimeoutMs: s.kvHoldTimeoutMs,
    dataParallelSize: args.dataParallelSize,
    speedupRatio: args.speedupRatio,
    timingDescription: s.timing.description,
    observers,
  });
  return createServeApp(appConfig(s, w, server, engine, metrics.engine, backends.routes));
}

/** Each worker is its own vLLM or SGLang instance: its own metrics, in its engine's names. */
function workerMetrics(s: Shared) {
  const { opts, args, model } = s;
  const vllmConfig: MetricsConfig = {
    modelName: model.servedModels[0],
    ranks: args.dataParallelSize,
    maxModelLen: model.maxModelLen,
    showHidden: opts.showHiddenMetrics ?? false,
    maxLoras: opts.lora.enabled ? opts.lora.maxLoras : undefined,
    cacheConfig: {
      block_size: args.blockSize,
      cache_dtype: 'auto',
      enable_prefix_caching: args.enablePrefixCaching ? 'True' : 'False',
      num_gpu_blocks: args.numGpuBlocks,
      num_cpu_blocks: 'None',
      prefix_caching_hash_algo: opts.prefixCachingHashAlgo,
    },
  };
  const engine =
    args.engineType === 'sglang'
      ? new SglangMetrics({ modelName: model.servedModels[0], ranks: args.dataParallelSize, pageSize: args.blockSize })
      : new VllmMetrics(vllmConfig);
  return { vllmConfig, engine };
}

/** What the start line says of the scheduler flavour (nothing for vLLM's). */
const FLAVOUR_HEAD: Record<EngineArgs['engineType'], (args: EngineArgs) => string> = {
  vllm: () => '',
  sglang: (args) => `SGLang scheduler (${args.sglang.schedulePolicy}, radix cache), `,
  trtllm: () => 'TRT-LLM scheduler (GUARANTEED_NO_EVICT), ',
  llamacpp: (args) => `llama.cpp scheduler (${args.maxNumSeqs} slots, n_batch ${args.maxNumBatchedTokens}), `,
};

/** The app of worker `w`. */
function appConfig(
  s: Shared,
  w: number,
  server: Server,
  engine: SimulatedEngine,
  metrics: VllmMetrics | SglangMetrics,
  backendRoutes: ReturnType<typeof backendMetrics>['routes'],
): ServeAppConfig {
  const { opts, args, model, upstream } = s;
  const engineId = randomUUID();
  const advertised = advertisedHost(opts.host);
  // Their own latency, scaled like every simulated duration; none at all under --timing none.
  const poolingMs = (ms: number) => (opts.timing === 'none' ? 0 : ms / args.speedupRatio);
  const capturedDuration = opts.timing === 'captured' ? (ms: number) => ms / args.speedupRatio : undefined;
  return {
    engine,
    resolver: s.resolver,
    tokenizer: model.tokenizer,
    servedModels: model.servedModels,
    modelRoot: opts.model ?? model.tokenizer.name,
    maxModelLen: model.maxModelLen,
    versionJson: model.run?.versionJson ?? JSON.stringify({ version: vllmVersionOf(opts.wire ?? DEFAULT_WIRE) }),
    forward:
      upstream.engine && upstream.connections
        ? { config: { upstream: upstream.engine, connections: upstream.connections }, sink: upstream.recording?.sink }
        : undefined,
    maxBodyBytes: opts.maxBodyBytes,
    promptTokensDetails: opts.enablePromptTokensDetails,
    responsesStore: opts.enableResponsesApiStore ?? vllmEnvFlag('VLLM_ENABLE_RESPONSES_API_STORE'),
    wire: opts.wire,
    metrics,
    backendMetrics: backendRoutes,
    mockerMetrics: new MockerMetrics(metrics.registry, model.servedModels[0], FAULT_TYPES),
    access: s.access,
    requestIdHeaders: opts.requestIdHeaders,
    serverLoadTracking: opts.serverLoadTracking,
    pd: {
      role: opts.role,
      peers: s.kvPeers,
      endpoint: () => ({ engineId, host: advertised, port: (server.address() as AddressInfo).port }),
      pullTimeoutMs: 5000,
    },
    settings: s.settings,
    trustRequestChatTemplate: opts.trustRequestChatTemplate,
    pooling: {
      embeddingDimensions: opts.pooling.embeddingDimensions,
      latency: {
        embeddingBaseMs: poolingMs(opts.pooling.embeddingBaseLatencyMs),
        embeddingPerInputMs: poolingMs(opts.pooling.embeddingPerInputLatencyMs),
        rankingBaseMs: poolingMs(opts.pooling.rankingBaseLatencyMs),
        rankingPerPassageMs: poolingMs(opts.pooling.rankingPerPassageLatencyMs),
      },
      capturedDuration,
    },
    capturedDuration,
    // Each worker is its own vLLM: its own adapters, loaded and unloaded on its own.
    lora: new LoraAdapters(opts.lora.enabled, model.servedModels, opts.lora.modules),
    loraRuntimeUpdating: runtimeLoraUpdating(),
    controlRoutes: opts.enableControlRoutes ?? vllmEnvFlag('VLLM_SERVER_DEV_MODE'),
    runtime: {
      faults: new FaultInjector({ ...s.faults, errorTypes: [...s.faults.errorTypes] }, opts.faultSeed ?? opts.seed),
      latency: s.timing.latencyKnobs[w] ?? null,
      timing: opts.timing,
      keys: CONTROL_KEYS,
    },
    readyAtMs: workerReadyAtMs(s, w),
    accessLogs: opts.logs.accessLogs,
  };
}

/** --log-level debug: one line per scheduler step of the engine (each DP rank's), as vLLM's scheduler debug logs. */
function schedulerStepLog(prefix: string): EngineObserver {
  return {
    onPass: (rank, stats) =>
      log(
        'debug',
        `${prefix}rank ${rank} scheduler step: ${stats.running} running, ${stats.waiting} waiting, ${stats.promptTokens} prompt and ${stats.generationTokens} generation tokens, KV blocks ${stats.activeBlocks}/${stats.totalBlocks}`,
        { rank, ...stats, timesToFirstTokenS: undefined, interTokenLatenciesS: undefined },
      ),
  };
}

/** When worker `w` answers: after --startup-time, and its turn of --stagger-delay. */
function workerReadyAtMs(s: Shared, w: number): number | undefined {
  const staggerMs = staggerOffsetMs(w, s.workers, s.opts.staggerDelayS);
  if (staggerMs === 0) return s.readyAtMs;
  return (s.readyAtMs ?? s.startedAtMs) + staggerMs;
}

/** The startup line's settings: only what applies (a miss policy where captures are looked up, a speedup where there are durations to divide). */
function startupLineOf(opts: ResolvedServeOptions, timingDescription: string, model: LoadedModel, https: boolean): StartupLine {
  const args = opts.engine;
  const described = [
    `outputs ${opts.outputs}`,
    ...(opts.outputs === 'captured' ? [`on miss ${opts.onMiss}`] : []),
    `timing ${timingDescription}`,
    ...(opts.timing === 'none' ? [] : [`speedup ${args.speedupRatio}`]),
  ];
  // A PD engine says which it is (several print the same settings under `serve --pd`).
  const engineName = opts.role === 'agg' ? '' : `${opts.role} engine${opts.roleIndex === undefined ? '' : ` ${opts.roleIndex}`}, `;
  return {
    scheme: https ? 'https' : 'http',
    head:
      `mocker serve: ${engineName}${opts.mode} mode (${described.join(', ')}, ` +
      `${FLAVOUR_HEAD[args.engineType](args)}${args.dataParallelSize} rank(s) x ${args.numGpuBlocks} blocks of ${args.blockSize}) ` +
      `serving ${model.servedModels.join(', ')} on `,
    host: opts.host,
    tail: model.store && model.store.path !== ':memory:' ? ` from ${opts.captures}` : '',
  };
}

/**
 * The capture file, opened read-only unless misses are recorded into it, and what it holds said once. A file
 * that is not there is an error when answers can only come from it (`--on-miss error`); otherwise every request
 * is a miss (an empty store in memory: nothing is created on disk), also said once.
 */
function openCaptures(path: string, outputs: OutputsMode, onMiss: MissPolicy, say: (line: string) => void): CaptureStore | undefined {
  if (outputs !== 'captured' && onMiss !== 'record') return undefined;
  if (onMiss !== 'record' && onMiss !== 'error' && !existsSync(path)) {
    say(`mocker serve: no capture file at ${path}: every request is a miss (--on-miss ${onMiss})`);
    return CaptureStore.open(':memory:');
  }
  // Recording, it is a long-lived writer on the serving thread: its checkpoints must not stall that loop.
  const store = CaptureStore.open(path, { readonly: onMiss !== 'record', backgroundCheckpoints: onMiss === 'record' });
  say(`mocker serve: ${path} holds ${describeContents(store.contents())}`);
  return store;
}
