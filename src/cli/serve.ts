import { getRequestListener } from '@hono/node-server';
import type { AddressInfo } from 'node:net';
import type { Server } from 'node:http';
import { DEFAULT_REDACTED_HEADERS } from '../capture/forward.js';
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
  type BlockHashAlgo,
  type EngineObserver,
  type LatencyKnobs,
  type PassTiming,
  type TimingMode,
} from '../engine/index.js';
import { KvEventStreams, KvTraceLog, kvTraceEnabled, type KvEventsConfig } from '../events/index.js';
import { DEFAULT_MIN_PREFIX_RATIO, OutputResolver, type MatchMode, type MissPolicy, type OutputsMode } from '../generation/resolver.js';
import { resolveReasoningSpan } from '../generation/reasoning.js';
import { DEFAULT_TOOL_CALL_RATE } from '../generation/toolCalls.js';
import { randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import { Drain, listen } from '../wire/drain.js';
import { createServeApp } from '../http/serveApp.js';
import { serveRoutes } from '../http/routes.js';
import type { EffectiveSettings, PdConfig } from '../http/serveConfig.js';
import { serverTls, upstreamTls, type TlsFiles } from '../wire/tls.js';
import { DEFAULT_API_KEY_SCOPE, exposedControlWarning, type ApiKeyPolicy, type ApiKeyScope, type ClassifiedRoute } from '../wire/access.js';
import { LoraAdapters, runtimeLoraUpdating, type LoraModule } from '../http/loraAdapters.js';
import { badFaultSetting, DEFAULT_FAULT_TYPES, DEFAULT_MIDSTREAM_AFTER_TOKENS, FAULT_TYPES, FaultInjector, type FaultSettings } from '../http/faults.js';
import { kvBytesPerToken, parsePeer } from '../pd/kvTransfer.js';
import { MockerMetrics } from '../metrics/mockerMetrics.js';
import { backendMetrics } from '../metrics/backendMetrics.js';
import { DEFAULT_DCGM, type DcgmConfig } from '../metrics/dcgm.js';
import { StatsLog } from '../metrics/statsLog.js';
import { SglangMetrics } from '../metrics/sglangMetrics.js';
import { VllmMetrics, type MetricsConfig } from '../metrics/vllmMetrics.js';
import { CaptureStore, type CaptureContents } from '../store/captureStore.js';
import { loadTokenizer, ModelTokenizer } from '../tokenizer/index.js';
import { checkEngineArgs, DEFAULT_ENGINE_ARGS, schedulerConfig, type EngineArgs } from '../config/engineArgs.js';
import { EMULATED_VLLM_VERSION } from './identity.js';
import { runColumns, UpstreamEngine } from '../capture/upstreamEngine.js';
import { RecordingSink, type StopReport } from './shutdown.js';
import { UpstreamPool } from '../capture/upstreamHttp.js';
import { terminalText } from '../util/terminalText.js';

/** vLLM's VLLM_LOG_STATS_INTERVAL (seconds, default 10). */
const STATS_LOG_INTERVAL_MS = 1000 * Number(process.env.VLLM_LOG_STATS_INTERVAL ?? 10);

/** Largest request body accepted unless told otherwise. */
export const DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024;
/** One engine step under `--timing fixed`. */
export const DEFAULT_FORWARD_TIME_MS = 25;
/** How long the upstream may stay silent (no response, no bytes) before the request fails. */
export const DEFAULT_UPSTREAM_TIMEOUT_MS = 600_000;
/** PD KV transfer bandwidth, GB/s (Dynamo's mocker default). */
export const DEFAULT_KV_TRANSFER_BANDWIDTH_GBPS = 64;

export type ServeMode = 'simulate' | 'replay' | 'random';

export interface ServeOptions {
  mode: ServeMode;
  captures: string;
  model?: string;
  servedModelName?: string[];
  /** Default 127.0.0.1 (the CLI listens on 0.0.0.0). */
  host?: string;
  /** Default 0: any free port. */
  port?: number;
  outputs?: OutputsMode;
  timing?: TimingMode;
  /** Default DEFAULT_FORWARD_TIME_MS. */
  forwardTimeMs?: number;
  onMiss?: MissPolicy;
  upstream?: string;
  /** Default DEFAULT_UPSTREAM_TIMEOUT_MS. */
  upstreamTimeoutMs?: number;
  /** Default 0. */
  seed?: number;
  maxModelLen?: number;
  /** Default 32 MiB. */
  maxBodyBytes?: number;
  /** vLLM's --trust-request-chat-template: a request's own chat_template is rendered, not refused. */
  trustRequestChatTemplate?: boolean;
  /** Default: DEFAULT_REDACTED_HEADERS. */
  redactHeaders?: string[];
  /** Scheduler, KV cache and speedups (defaults: DEFAULT_ENGINE_ARGS). */
  engine?: Partial<EngineArgs>;
  /** vLLM's --enable-prompt-tokens-details. */
  enablePromptTokensDetails?: boolean;
  /** vLLM's --enable-lora, --lora-modules and --max-loras (default: LoRA off). */
  lora?: { enabled: boolean; modules: LoraModule[]; maxLoras: number };
  /** --num-workers: independent engines, each on its own port (port, port + 1, …). Default 1. */
  numWorkers?: number;
  /**
   * `--threads`: this call runs only these of the `numWorkers` engines (the others run in other threads, see
   * threads.ts), prints no startup line (`Running.startupLine` is its caller's to print with every thread's
   * ports), and only the `first` thread says what the capture file holds. Default: all engines, in this thread.
   */
  share?: { engines: number[]; first: boolean };
  /**
   * Engines started before this server's first one under the same KV events config (`serve --pd`): its event
   * ports come after theirs, as several workers' do. Default 0.
   */
  engineIndex?: number;
  /** --show-hidden-metrics-for-version: also vLLM's deprecated metrics. */
  showHiddenMetrics?: boolean;
  /** --ssl-keyfile, --ssl-certfile, --ssl-ca-certs, --ssl-cert-reqs: HTTPS. Default: plain HTTP. */
  tls?: TlsFiles;
  /** --upstream-ca-certs: the CAs an https: --upstream's certificate is checked against. Default: Node's. */
  upstreamCaCerts?: string;
  /** --api-key (else VLLM_API_KEY): `/v1/*` needs `Authorization: Bearer <key>`. */
  apiKey?: string;
  /** --api-key-scope: `v1` (vLLM's, the default) or `all` (every route but health, version and metrics). */
  apiKeyScope?: ApiKeyScope;
  /** --enable-control-routes: `/mocker/config` and `/reset_prefix_cache` exist. Default: VLLM_SERVER_DEV_MODE. */
  enableControlRoutes?: boolean;
  /** --enable-request-id-headers */
  requestIdHeaders?: boolean;
  /** --enable-server-load-tracking */
  serverLoadTracking?: boolean;
  /**
   * KV events: one config shared by every worker (worker w's ports offset by w × data-parallel size), or one
   * per worker (Dynamo's --zmq-kv-events-ports). Default: none.
   */
  kvEvents?: KvEventsConfig[];
  /** --prefix-caching-hash-algo for KV event hashes. Default sha256_cbor. */
  prefixCachingHashAlgo?: BlockHashAlgo;
  /** Default: PYTHONHASHSEED, else "vllm-none-hash". */
  hashSeed?: string;
  /** Dynamo's KV cache trace log. Default: DYN_MOCKER_KV_CACHE_TRACE. */
  kvTrace?: boolean;
  /** --disaggregation-mode. Default agg. */
  role?: PdConfig['role'];
  /** `serve --pd`: this engine's index among the deployment's engines of its role (its startup line names it). */
  roleIndex?: number;
  /** --kv-bytes-per-token; default from the model's config.json and --kv-cache-dtype. */
  kvBytesPerToken?: number;
  /** --kv-cache-dtype. Default auto (the model's dtype). */
  kvCacheDtype?: string;
  /** --kv-transfer-bandwidth in GB/s (0: instant). Default DEFAULT_KV_TRANSFER_BANDWIDTH_GBPS. */
  kvTransferBandwidthGBps?: number;
  /** Simulated DCGM telemetry (`/dcgm1/metrics`, `/dcgm2/metrics`). Default DEFAULT_DCGM, a random seed. */
  dcgm?: Partial<DcgmConfig>;
  /**
   * --kv-transfer-allowed-hosts: the prefill engines (`host:port`, as they name themselves in `kv_transfer_params`)
   * a PD engine may pull KV from. Default: none (every pull refused, the prompt recomputed).
   */
  kvTransferAllowedHosts?: string[];
  /** How long a prefill engine holds KV for a decode that never comes. Default VLLM_NIXL_ABORT_REQUEST_TIMEOUT (480 s). */
  kvHoldTimeoutMs?: number;
  /** Embeddings and reranking (AIPerf's mock server): vector size and latency knobs. Defaults: DEFAULT_POOLING. */
  pooling?: Partial<PoolingOptions>;
  /** --tool-call-rate: share of random `tool_choice: "auto"` answers that call a tool. Default DEFAULT_TOOL_CALL_RATE. */
  toolCallRate?: number;
  /** --ttft / --itl / --ttft-std / --itl-std (ms) of `timing: 'latency'`. Default DEFAULT_LATENCY_KNOBS. */
  latency?: Partial<LatencyKnobs>;
  /** Failure injection (--error-rate, --error-types, --fail-first, --midstream-after-tokens). Default: none. */
  faults?: Partial<FaultSettings>;
  /** --random-seed: seed of which requests fail. Default: `seed`. */
  faultSeed?: number;
  /** --startup-time: seconds during which `/health` and the API answer 503. Default 0. */
  startupTimeS?: number;
  /** --match, --min-prefix-ratio, --ignore-field: which captures answer a request. Defaults: exact, DEFAULT_MIN_PREFIX_RATIO, none. */
  matching?: { match?: MatchMode; minPrefixRatio?: number; ignoreFields?: string[] };
}

/** Fields --ignore-field refuses: the lookup key itself, and the one that decides which bytes (SSE or JSON) a capture holds. */
const UNIGNORABLE_FIELDS: Record<string, string> = {
  model: 'the served model is part of the lookup key',
  prompt: 'the prompt is the lookup key (--match prefix matches prompts that only share a prefix)',
  messages: 'the prompt is the lookup key (--match prefix matches prompts that only share a prefix)',
  stream: 'a streamed and a non-streamed answer are different bytes (a capture of the other kind is rendered)',
};

/** The matching settings, checked. */
function matchingOf(given: ServeOptions['matching']): Required<NonNullable<ServeOptions['matching']>> {
  const matching = { match: 'exact' as MatchMode, minPrefixRatio: DEFAULT_MIN_PREFIX_RATIO, ignoreFields: [] as string[], ...given };
  if (!['exact', 'prefix', 'sequence'].includes(matching.match)) throw new Error(`--match must be exact, prefix or sequence, got ${matching.match}`);
  if (!(matching.minPrefixRatio > 0 && matching.minPrefixRatio <= 1))
    throw new Error(`--min-prefix-ratio must be > 0 and <= 1, got ${matching.minPrefixRatio}`);
  for (const name of matching.ignoreFields) {
    if (Object.hasOwn(UNIGNORABLE_FIELDS, name)) throw new Error(`--ignore-field ${name}: ${UNIGNORABLE_FIELDS[name]}`);
  }
  return { ...matching, ignoreFields: [...new Set(matching.ignoreFields)] };
}

/** AIPerf's mock server's embedding and ranking settings (its defaults: 768 dimensions, 10 ms + 2 ms per input, 10 ms + 1 ms per passage). */
export interface PoolingOptions {
  embeddingDimensions: number;
  embeddingBaseLatencyMs: number;
  embeddingPerInputLatencyMs: number;
  rankingBaseLatencyMs: number;
  rankingPerPassageLatencyMs: number;
}

export const DEFAULT_POOLING: PoolingOptions = {
  embeddingDimensions: 768,
  embeddingBaseLatencyMs: 10,
  embeddingPerInputLatencyMs: 2,
  rankingBaseLatencyMs: 10,
  rankingPerPassageLatencyMs: 1,
};

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

/** vLLM's VLLM_SERVER_DEV_MODE: its development routes (`/reset_prefix_cache`, `/sleep`…) are attached. */
function serverDevMode(env: NodeJS.ProcessEnv = process.env): boolean {
  // vLLM's envs: `bool(int(os.getenv("VLLM_SERVER_DEV_MODE", "0")))`.
  return ['1', 'true'].includes((env.VLLM_SERVER_DEV_MODE ?? '0').trim().toLowerCase());
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

/** startServe's work; what it opens is closed by `closers` (in order) if it fails. */
// biome-ignore lint/complexity/noExcessiveLinesPerFunction: over 120 lines until it is split (issue 37, in progress)
async function startServing(options: ServeOptions, drain: Drain, closers: (() => unknown)[]): Promise<Running> {
  const opts = {
    host: '127.0.0.1',
    port: 0,
    forwardTimeMs: DEFAULT_FORWARD_TIME_MS,
    upstreamTimeoutMs: DEFAULT_UPSTREAM_TIMEOUT_MS,
    seed: 0,
    maxBodyBytes: DEFAULT_MAX_BODY_BYTES,
    redactHeaders: DEFAULT_REDACTED_HEADERS,
    ...options,
  };
  const workers = opts.numWorkers ?? 1;
  if (!Number.isInteger(workers) || workers < 1) throw new Error(`--num-workers must be a positive integer, got ${workers}`);
  const engineIndices = opts.share?.engines ?? Array.from({ length: workers }, (_, w) => w);
  // Under --threads, what the capture file holds is said once, by the first thread.
  const quiet = opts.share !== undefined && !opts.share.first;
  // What the capture file holds (its models) is text from the file.
  const say = quiet ? () => undefined : (line: string) => console.log(terminalText(line));
  // Read (and checked) before anything listens.
  const tls = serverTls(opts.tls);
  // One server per worker, on consecutive ports.
  const servers: Server[] = [];
  for (const w of engineIndices) {
    const server = drain.server(tls);
    servers.push(server);
    await listen(server, opts.host, opts.port === 0 ? 0 : opts.port + w);
  }
  const outputs: OutputsMode = opts.outputs ?? (opts.mode === 'random' ? 'random' : 'captured');
  const timing: TimingMode = opts.timing ?? ({ replay: 'captured', random: 'fixed', simulate: 'model' } as const)[opts.mode];
  const onMiss: MissPolicy = opts.onMiss ?? (opts.mode === 'simulate' ? 'random' : 'error');
  if ((onMiss === 'passthrough' || onMiss === 'record') && !opts.upstream) throw new Error(`--on-miss ${onMiss} needs --upstream URL`);
  if (!(opts.forwardTimeMs >= 0)) throw new Error(`--forward-time-ms must be >= 0, got ${opts.forwardTimeMs}`);
  const args = checkEngineArgs({ ...DEFAULT_ENGINE_ARGS, ...opts.engine });
  const lora = opts.lora ?? { enabled: false, modules: [], maxLoras: 1 };
  if ((lora.enabled || lora.modules.length > 0) && args.engineType === 'sglang')
    throw new Error('--enable-lora / --lora-modules: LoRA adapters are simulated with --engine-type vllm only');
  if (!(args.speedupRatio > 0)) throw new Error(`--speedup-ratio must be > 0, got ${args.speedupRatio}`);
  if (!(args.decodeSpeedupRatio > 0)) throw new Error(`--decode-speedup-ratio must be > 0, got ${args.decodeSpeedupRatio}`);
  if (opts.latency && timing !== 'latency') throw new Error(`--ttft / --itl apply to --timing latency, not --timing ${timing}`);
  // Each worker its own knobs, changed through its own /mocker/config.
  const latencyKnobs = Array.from({ length: timing === 'latency' ? workers : 0 }, () => ({ ...DEFAULT_LATENCY_KNOBS, ...opts.latency }));
  const badKnob = latencyKnobs.length > 0 ? badLatencyKnob(latencyKnobs[0]) : null;
  if (badKnob) throw new Error(`--timing latency: ${badKnob[0]} must be a non-negative number of ms, got ${badKnob[1]}`);
  const faults: FaultSettings = {
    errorRate: 0,
    errorTypes: [...DEFAULT_FAULT_TYPES],
    failFirst: 0,
    midstreamAfterTokens: DEFAULT_MIDSTREAM_AFTER_TOKENS,
    ...opts.faults,
  };
  const badFault = badFaultSetting(faults);
  if (badFault) throw new Error(`failure injection: ${badFault[1]}`);
  const matching = matchingOf(opts.matching);
  let passTiming: (worker: number) => PassTiming;
  let timingDescription: string;
  let perfModel: string | null = null;
  if (timing === 'model') {
    const profile = args.plannerProfileData;
    const model = profile
      ? await loadPerfModel(profile).catch((err: Error) => {
          throw new Error(`--planner-profile-data: ${err.message}`);
        })
      : polynomialPerfModel;
    passTiming = () => modelTiming(model, args.speedupRatio, args.decodeSpeedupRatio);
    perfModel = model.description;
    timingDescription = `model: ${model.description}`;
  } else if (timing === 'fixed') {
    passTiming = () => fixedTiming(opts.forwardTimeMs, args.speedupRatio);
    timingDescription = `fixed: ${opts.forwardTimeMs} ms per step`;
  } else if (timing === 'latency') {
    passTiming = (w) => latencyTiming(latencyKnobs[w], opts.seed + w, args.speedupRatio);
    const k = latencyKnobs[0];
    timingDescription = `latency: TTFT ${k.ttftMs} ± ${k.ttftStdMs} ms, ITL ${k.itlMs} ± ${k.itlStdMs} ms at start`;
  } else {
    passTiming = () => zeroTiming(timing === 'captured');
    timingDescription = timing;
  }

  const store = openCaptures(opts.captures, outputs, onMiss, say);
  if (store) closers.push(() => store.close());
  const run = store?.latestRun();
  // A capture carries its tokenizer: replay needs no --model.
  let tokenizer: ModelTokenizer;
  if (opts.model !== undefined || !run || !store) tokenizer = loadTokenizer(opts.model);
  else {
    const files = store.tokenizerFiles(run);
    // A capture may come from anyone: its chat template renders sandboxed, as a request's does, and its tokenizer is checked.
    tokenizer = files.has('tokenizer.json') ? new ModelTokenizer(run.tokenizerName ?? 'captured', files, { fromCapture: true }) : loadTokenizer();
  }
  // Warm the tokenizer, the chat template and the random-token vocabulary (a few hundred ms on first use)
  // so the first request's TTFT is not a cold start.
  await tokenizer.decode(await tokenizer.encode('warm up', false), true);
  if (outputs === 'random' || onMiss === 'random') tokenizer.ordinaryTokenIds();
  try {
    await tokenizer.renderChatGuarded({ messages: [{ role: 'user', content: 'warm up' }] });
  } catch {
    // A model without a chat template serves completions only; a template that fails here fails its chats with a 400.
  }
  const captured = store?.capturedModels() ?? [];
  const servedModels = opts.servedModelName?.length ? opts.servedModelName : captured.length > 0 && outputs === 'captured' ? captured : [tokenizer.name];
  const maxModelLen = opts.maxModelLen ?? run?.maxModelLen ?? tokenizer.maxModelLen;

  const upstream = opts.upstream ? await UpstreamEngine.identify(new URL(opts.upstream), upstreamTls(opts.upstreamCaCerts)) : undefined;
  const connections = upstream ? new UpstreamPool(upstream.url, opts.upstreamTimeoutMs, upstream.tls) : undefined;
  if (connections) closers.push(() => connections.close());
  let recording: RecordingSink | undefined;
  if (onMiss === 'record' && store && upstream) {
    const runId = store.startRun(
      { kind: 'record', upstream: upstream.url.href, ...runColumns(upstream.identity), tokenizerName: tokenizer.name },
      tokenizer.files,
    );
    upstream.onIdentified((later) => store.updateRun(runId, runColumns(later)));
    recording = new RecordingSink(new Recorder(store, runId, tokenizer, upstream, new Set(opts.redactHeaders.map((h) => h.toLowerCase()))).sink, opts.captures);
  }

  const role = opts.role ?? 'agg';
  const toolCallRate = opts.toolCallRate ?? DEFAULT_TOOL_CALL_RATE;
  if (!(toolCallRate >= 0 && toolCallRate <= 1)) throw new Error(`--tool-call-rate must be between 0 and 1, got ${toolCallRate}`);
  const synthetic = { reasoning: args.reasoning ? resolveReasoningSpan(args.reasoning, tokenizer) : null, toolCallRate };
  const resolver = new OutputResolver({ outputs, onMiss, seed: opts.seed, store, tokenizer, role, synthetic, ...matching });
  const kvEvents = opts.kvEvents ?? [];
  if (kvEvents.length > 1 && kvEvents.length !== workers) throw new Error(`${kvEvents.length} KV event configs for ${workers} worker(s)`);
  const hashAlgo = opts.prefixCachingHashAlgo ?? 'sha256_cbor';
  // As Dynamo: a config without the KV geometry means no transfer delay (said when it matters).
  const bytesPerToken = opts.kvBytesPerToken ?? kvBytesPerToken(tokenizer.modelConfig, opts.kvCacheDtype ?? 'auto');
  if (bytesPerToken === null && role !== 'agg' && !quiet)
    console.warn(`mocker serve: ${tokenizer.name}'s config.json gives no KV geometry: KV transfers take no time (give --kv-bytes-per-token)`);
  const bandwidthGBps = opts.kvTransferBandwidthGBps ?? DEFAULT_KV_TRANSFER_BANDWIDTH_GBPS;
  if (!(bandwidthGBps >= 0)) throw new Error(`--kv-transfer-bandwidth must be >= 0, got ${bandwidthGBps}`);
  const kvHoldTimeoutMs = opts.kvHoldTimeoutMs ?? 1000 * Number(process.env.VLLM_NIXL_ABORT_REQUEST_TIMEOUT ?? 480);
  // setTimeout fires at once for anything that is not a number of ms up to 2^31 - 1 (about 24.8 days).
  if (!(kvHoldTimeoutMs > 0 && kvHoldTimeoutMs <= 2 ** 31 - 1)) {
    throw new Error(
      `VLLM_NIXL_ABORT_REQUEST_TIMEOUT must be a number of seconds between 0 and ${Math.floor((2 ** 31 - 1) / 1000)}, got "${process.env.VLLM_NIXL_ABORT_REQUEST_TIMEOUT}"`,
    );
  }
  const advertised = advertisedHost(opts.host);
  const kvPeers = new Set(
    (opts.kvTransferAllowedHosts ?? []).map((entry) => {
      try {
        return parsePeer(entry);
      } catch (err) {
        throw new Error(`--kv-transfer-allowed-hosts: ${(err as Error).message}`);
      }
    }),
  );
  if (role === 'decode' && kvPeers.size === 0 && !quiet)
    console.warn('mocker serve: a decode engine without --kv-transfer-allowed-hosts pulls no KV: every prompt is recomputed here');
  const kvTrace = opts.kvTrace ?? kvTraceEnabled();
  const settings: EffectiveSettings = {
    mode: opts.mode,
    outputs,
    timing,
    on_miss: onMiss,
    perf_model: perfModel,
    forward_time_ms: opts.forwardTimeMs,
    engine_type: args.engineType,
    ...(args.engineType === 'sglang'
      ? {
          sglang_schedule_policy: args.sglang.schedulePolicy,
          sglang_page_size: args.blockSize,
          sglang_max_prefill_tokens: args.sglang.maxPrefillTokens,
          sglang_chunked_prefill_size: args.sglang.chunkedPrefillSize,
          sglang_clip_max_new_tokens: args.sglang.clipMaxNewTokens,
          sglang_schedule_conservativeness: args.sglang.scheduleConservativeness,
        }
      : {}),
    num_gpu_blocks: args.numGpuBlocks,
    block_size: args.blockSize,
    max_num_seqs: args.maxNumSeqs,
    max_num_batched_tokens: args.maxNumBatchedTokens,
    enable_prefix_caching: args.enablePrefixCaching,
    enable_chunked_prefill: args.enableChunkedPrefill,
    preemption_mode: args.preemptionMode,
    watermark: args.watermark,
    speedup_ratio: args.speedupRatio,
    decode_speedup_ratio: args.decodeSpeedupRatio,
    data_parallel_size: args.dataParallelSize,
    planner_profile_data: args.plannerProfileData ?? null,
    reasoning:
      synthetic.reasoning &&
      JSON.stringify({
        start_thinking_token_id: synthetic.reasoning.startTokenId,
        end_thinking_token_id: synthetic.reasoning.endTokenId,
        thinking_ratio: synthetic.reasoning.thinkingRatio,
      }),
    tool_call_rate: toolCallRate,
    disaggregation_mode: role,
    kv_bytes_per_token: bytesPerToken,
    kv_transfer_bandwidth: bandwidthGBps,
    max_model_len: maxModelLen,
    enable_lora: lora.enabled,
    max_loras: lora.maxLoras,
    seed: opts.seed,
    upstream: upstream?.url.href ?? null,
    upstream_timeout: opts.upstreamTimeoutMs,
    match: matching.match,
    min_prefix_ratio: matching.minPrefixRatio,
    ignore_fields: matching.ignoreFields,
  };
  const pooling = { ...DEFAULT_POOLING, ...opts.pooling };
  // Their own latency, scaled like every simulated duration; none at all under --timing none.
  const poolingMs = (ms: number) => (timing === 'none' ? 0 : ms / args.speedupRatio);
  const poolingLatency = {
    embeddingBaseMs: poolingMs(pooling.embeddingBaseLatencyMs),
    embeddingPerInputMs: poolingMs(pooling.embeddingPerInputLatencyMs),
    rankingBaseMs: poolingMs(pooling.rankingBaseLatencyMs),
    rankingPerPassageMs: poolingMs(pooling.rankingPerPassageLatencyMs),
  };
  const dcgmSeed = opts.dcgm?.seed ?? Math.floor(Math.random() * 2 ** 32);
  const access = apiKeyPolicy(opts);
  let routes: ClassifiedRoute[] | undefined;
  const timers: NodeJS.Timeout[] = [];
  closers.unshift(() => timers.forEach(clearInterval));
  // --startup-time counts from here: the model (tokenizer, captures) is loaded.
  const readyAtMs = opts.startupTimeS ? performance.now() + 1000 * opts.startupTimeS : undefined;
  // One engine (own scheduler and KV cache per rank) per worker, each behind its own server.
  for (const [i, w] of engineIndices.entries()) {
    // Each worker is its own vLLM or SGLang instance: its own metrics, in its engine's names.
    const vllmConfig: MetricsConfig = {
      modelName: servedModels[0],
      ranks: args.dataParallelSize,
      maxModelLen,
      showHidden: opts.showHiddenMetrics ?? false,
      maxLoras: lora.enabled ? lora.maxLoras : undefined,
      cacheConfig: {
        block_size: args.blockSize,
        cache_dtype: 'auto',
        enable_prefix_caching: args.enablePrefixCaching ? 'True' : 'False',
        num_gpu_blocks: args.numGpuBlocks,
        num_cpu_blocks: 'None',
        prefix_caching_hash_algo: hashAlgo,
      },
    };
    const metrics =
      args.engineType === 'sglang'
        ? new SglangMetrics({ modelName: servedModels[0], ranks: args.dataParallelSize, pageSize: args.blockSize })
        : new VllmMetrics(vllmConfig);
    const statsLog = new StatsLog(args.dataParallelSize, performance.now());
    const logTimer = setInterval(() => {
      for (const line of statsLog.lines(performance.now())) console.log(workers > 1 ? `worker ${w}: ${line}` : line);
    }, STATS_LOG_INTERVAL_MS);
    logTimer.unref();
    timers.push(logTimer);
    // AIPerf's mock server's other backends' metrics and DCGM telemetry, from the same engine.
    const backends = backendMetrics({
      vllm: vllmConfig,
      blockSize: args.blockSize,
      numGpuBlocks: args.numGpuBlocks,
      maxNumSeqs: args.maxNumSeqs,
      maxNumBatchedTokens: args.maxNumBatchedTokens,
      role,
      // Each worker a node of its own: its exporters' seeds follow the previous worker's two.
      dcgm: { ...DEFAULT_DCGM, ...opts.dcgm, seed: dcgmSeed + 2 * w },
    });
    const observers: EngineObserver[] = [metrics, statsLog, ...backends.observers];
    const engineId = randomUUID();
    const eventsConfig = kvEvents.length > 1 ? kvEvents[w] : kvEvents[0];
    if (eventsConfig) {
      const stream = await KvEventStreams.open(
        eventsConfig,
        args.dataParallelSize,
        kvEvents.length > 1 ? 0 : ((opts.engineIndex ?? 0) + w) * args.dataParallelSize,
      );
      closers.push(() => stream.close());
      observers.push(stream);
    }
    if (kvTrace) observers.push(new KvTraceLog(args.blockSize, args.numGpuBlocks));
    const engine = new SimulatedEngine({
      scheduler: {
        ...schedulerConfig(args, passTiming(w), opts.seed + w),
        kvEvents: eventsConfig ? { algo: hashAlgo, hashSeed: opts.hashSeed ?? defaultHashSeed() } : undefined,
        kvTrace,
        ...(lora.enabled ? { maxLoras: lora.maxLoras } : {}),
        workerType: role === 'prefill' ? 'prefill' : 'aggregated',
        // With captured timing the decode hop's own captured times already include its wait for the KV (the SGLang
        // flavour does not model the transfer).
        ...(args.engineType === 'vllm' ? { kvTransfer: { bytesPerToken: bytesPerToken ?? 0, bandwidthGBps: timing === 'captured' ? 0 : bandwidthGBps } } : {}),
      },
      kvHoldTimeoutMs,
      dataParallelSize: args.dataParallelSize,
      speedupRatio: args.speedupRatio,
      timingDescription,
      observers,
    });
    const app = createServeApp({
      engine,
      resolver,
      tokenizer,
      servedModels,
      modelRoot: opts.model ?? tokenizer.name,
      maxModelLen,
      versionJson: run?.versionJson ?? JSON.stringify({ version: EMULATED_VLLM_VERSION }),
      forward: upstream && connections ? { config: { upstream, connections }, sink: recording?.sink } : undefined,
      maxBodyBytes: opts.maxBodyBytes,
      promptTokensDetails: opts.enablePromptTokensDetails ?? false,
      metrics,
      backendMetrics: backends.routes,
      mockerMetrics: new MockerMetrics(metrics.registry, servedModels[0], FAULT_TYPES),
      access,
      requestIdHeaders: opts.requestIdHeaders,
      serverLoadTracking: opts.serverLoadTracking,
      pd: { role, peers: kvPeers, endpoint: () => ({ engineId, host: advertised, port: (servers[i].address() as AddressInfo).port }), pullTimeoutMs: 5000 },
      settings,
      trustRequestChatTemplate: opts.trustRequestChatTemplate,
      pooling: {
        embeddingDimensions: pooling.embeddingDimensions,
        latency: poolingLatency,
        ...(timing === 'captured' ? { capturedDuration: (ms: number) => ms / args.speedupRatio } : {}),
      },
      // Each worker is its own vLLM: its own adapters, loaded and unloaded on its own.
      lora: new LoraAdapters(lora.enabled, servedModels, lora.modules),
      loraRuntimeUpdating: runtimeLoraUpdating(),
      controlRoutes: opts.enableControlRoutes ?? serverDevMode(),
      runtime: {
        faults: new FaultInjector({ ...faults, errorTypes: [...faults.errorTypes] }, opts.faultSeed ?? opts.seed),
        latency: latencyKnobs[w] ?? null,
        timing,
      },
      readyAtMs,
    });
    drain.handle(servers[i], getRequestListener(app.fetch, { hostname: opts.host }));
    routes ??= serveRoutes(app);
  }
  const controlPaths = [...new Set(routes!.filter((r) => r.class === 'control').map((r) => r.path))];
  const exposed = exposedControlWarning('serve', opts.host, access, controlPaths);
  if (exposed && !quiet) console.warn(exposed);
  const ports = servers.map((s) => (s.address() as AddressInfo).port);
  // Only what applies: a miss policy where captures are looked up, a speedup where there are durations to divide.
  const described = [
    `outputs ${outputs}`,
    ...(outputs === 'captured' ? [`on miss ${onMiss}`] : []),
    `timing ${timingDescription}`,
    ...(timing === 'none' ? [] : [`speedup ${args.speedupRatio}`]),
  ];
  // A PD engine says which it is (several print the same settings under `serve --pd`).
  const engineName = role === 'agg' ? '' : `${role} engine${opts.roleIndex === undefined ? '' : ` ${opts.roleIndex}`}, `;
  const startupLine: StartupLine = {
    scheme: tls ? 'https' : 'http',
    head:
      `mocker serve: ${engineName}${opts.mode} mode (${described.join(', ')}, ` +
      `${args.engineType === 'sglang' ? `SGLang scheduler (${args.sglang.schedulePolicy}, radix cache), ` : ''}${args.dataParallelSize} rank(s) x ${args.numGpuBlocks} blocks of ${args.blockSize}) ` +
      `serving ${servedModels.join(', ')} on `,
    host: opts.host,
    tail: store && store.path !== ':memory:' ? ` from ${opts.captures}` : '',
  };
  if (!opts.share) console.log(startupLineText(startupLine, ports));
  return {
    port: ports[0],
    ports,
    routes,
    startupLine,
    close: async (graceMs = 0) => {
      const drained = await drain.drain(graceMs);
      // Exchanges being recorded (those the drain cut off: as aborted) are stored before the file closes.
      await recording?.settled();
      for (const close of closers) await close();
      return { ...drained, recorded: recording?.recorded };
    },
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
