import type { BlockHashAlgo, LatencyKnobs, TimingMode } from '../engine/index.js';
import type { KvEventsConfig } from '../events/index.js';
import type { MatchMode } from '../generation/matching.js';
import type { MissPolicy, OutputsMode } from '../generation/resolver.js';
import type { FaultSettings } from '../http/faults.js';
import type { LoraModule } from '../http/loraAdapters.js';
import type { PdConfig } from '../http/serveConfig.js';
import type { DcgmConfig } from '../metrics/dcgm.js';
import type { ApiKeyScope } from '../wire/access.js';
import type { LogConfig } from '../util/log.js';
import type { WireShape } from '../wire/shapes.js';
import type { TlsFiles } from '../wire/tls.js';
import type { EngineArgs } from './engineArgs.js';
import type { DEFAULT_POOLING } from './serveSettings.js';

export type PoolingOptions = typeof DEFAULT_POOLING;

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
  /** `/v1/responses` answers are kept (in memory) for retrieval and chaining. Default: VLLM_ENABLE_RESPONSES_API_STORE. */
  enableResponsesApiStore?: boolean;
  /** `--wire`: the engine release whose response shape rendered answers take. Default DEFAULT_WIRE. */
  wire?: WireShape;
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
  /** --stagger-delay: seconds between two workers' starts, Dynamo's rule (-1: auto by the number of workers, 0: off). Default -1. */
  staggerDelayS?: number;
  /** --no-tokenizer: character chunks (AIPerf's) instead of the model's tokenizer; not with replay. Default false. */
  noTokenizer?: boolean;
  /** --log-level, --log-format, --access-logs. Defaults: info, text, off (on at debug). */
  logs?: Partial<LogConfig & { accessLogs: boolean }>;
  /** --match, --min-prefix-ratio, --ignore-field: which captures answer a request. Defaults: exact, DEFAULT_MIN_PREFIX_RATIO, none. */
  matching?: { match?: MatchMode; minPrefixRatio?: number; ignoreFields?: string[] };
}
