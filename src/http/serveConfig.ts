import type { HttpBindings } from '@hono/node-server';
import type { ExchangeSink, ForwardConfig } from '../capture/forward.js';
import type { Engine } from '../engine/index.js';
import type { OutputResolver } from '../generation/resolver.js';
import type { MockerMetrics } from '../metrics/mockerMetrics.js';
import type { MetricsSource, MissingMetrics } from '../metrics/backendMetrics.js';
import type { PrefillEndpoint } from '../pd/kvTransfer.js';
import type { ModelTokenizer } from '../tokenizer/index.js';
import type { ApiKeyPolicy } from '../wire/access.js';
import type { WireShape } from '../wire/shapes.js';
import type { LoraAdapters } from './loraAdapters.js';
import type { PoolingLatency } from './poolingEndpoints.js';
import type { RuntimeSettings } from './mockerConfig.js';

export interface ServeAppConfig {
  engine: Engine;
  resolver: OutputResolver;
  tokenizer: ModelTokenizer;
  /** Names accepted in `model`; the first is the default. */
  servedModels: string[];
  /** `root` of /v1/models (the --model path or id). */
  modelRoot: string;
  maxModelLen: number;
  /** `/version`'s body. */
  versionJson: string;
  /** The upstream for `--on-miss passthrough|record`, and the recorder for `record`. */
  forward?: { config: ForwardConfig; sink?: ExchangeSink };
  maxBodyBytes: number;
  /** vLLM's --enable-prompt-tokens-details: usage reports the prefix-cache hits. */
  promptTokensDetails: boolean;
  /** vLLM's VLLM_ENABLE_RESPONSES_API_STORE: `/v1/responses` keeps its answers for `previous_response_id` and GET. */
  responsesStore: boolean;
  /** `--wire`: the response shape of rendered answers (a replayed capture's engine's own shape wins). */
  wire: WireShape;
  /** `GET /metrics` (Prometheus text). */
  metrics?: { text(): Promise<string>; readonly contentType: string };
  /** Other systems' expositions of the same engine (`/vllm/metrics`, `/dcgm1/metrics`…), by path. */
  backendMetrics?: Record<string, MetricsSource | MissingMetrics>;
  /** The mocker's own counters (capture hits and misses, upstream errors, captures written). */
  mockerMetrics?: MockerMetrics;
  /** vLLM's --api-key (`/v1/*` needs `Authorization: Bearer <key>`), and --api-key-scope. */
  access: ApiKeyPolicy;
  /**
   * --enable-control-routes (or VLLM_SERVER_DEV_MODE=1): the routes that change the server at run time
   * (`/mocker/config`, `/reset_prefix_cache`) exist. LoRA loading has its own switch, vLLM's (below).
   */
  controlRoutes?: boolean;
  /** vLLM's --enable-request-id-headers: responses carry `X-Request-Id`. */
  requestIdHeaders?: boolean;
  /** vLLM's --enable-server-load-tracking: `/load` counts requests in flight (else it reads 0). */
  serverLoadTracking?: boolean;
  /** Prefill/decode disaggregation: vLLM's NIXL `kv_transfer_params` protocol, the pull as an HTTP call. */
  pd: PdConfig;
  /** The effective settings, shown as they are by `GET /mocker/engine` beside the live state. */
  settings: EffectiveSettings;
  /** vLLM's --trust-request-chat-template: a `chat_template` in the request is used (rendered in a worker), not refused. */
  trustRequestChatTemplate?: boolean;
  /**
   * Embeddings and reranking (AIPerf's mock server's endpoints): the vector size and their own latency; under `--timing
   * captured`, how long a captured answer takes.
   */
  pooling: { embeddingDimensions: number; latency: PoolingLatency; capturedDuration?: (capturedMs: number) => number };
  /** Under `--timing captured`, how long a captured duration takes as served (the speedup applied); else absent. */
  capturedDuration?: (capturedMs: number) => number;
  /** LoRA adapters served by name (--enable-lora, --lora-modules). */
  lora?: LoraAdapters;
  /** VLLM_ALLOW_RUNTIME_LORA_UPDATING: the load and unload routes exist. */
  loraRuntimeUpdating?: boolean;
  /** Failure injection and latency knobs, shown and changed at run time by `/mocker/config`. */
  runtime?: RuntimeSettings;
  /** --startup-time: until this performance.now() time, `/health` and the API answer 503. */
  readyAtMs?: number;
  /** --access-logs: a line per request (http/accessLog.ts). */
  accessLogs?: boolean;
}

/**
 * What this server was started with, keys spelled as vLLM's and Dynamo's arguments (`enable_prefix_caching`,
 * `num_gpu_blocks`…): plain data built by the CLI, so a user can check what the flags amounted to.
 */
export type EffectiveSettings = Record<string, string | number | boolean | null | string[]>;

export interface PdConfig {
  /**
   * prefill: every request answers with exactly one token (Dynamo's prefill worker). agg: not configured for
   * PD, `kv_transfer_params` are ignored (vLLM without a KV connector): nothing held, nothing pulled.
   */
  role: 'agg' | 'prefill' | 'decode';
  /** The prefill engines a pull may go to (`peerKey`s): the deployment's own, or --kv-transfer-allowed-hosts. */
  peers: ReadonlySet<string>;
  /** This engine as a prefill engine names itself to decode engines (its port is known once listening). */
  endpoint: () => PrefillEndpoint;
  /** How long a decode engine waits for a prefill engine's answer to a pull before recomputing. */
  pullTimeoutMs: number;
}

/** Hono's environment on the Node adapter: the raw request and response are at hand. */
export type Env = { Bindings: HttpBindings };
export type Json = Record<string, unknown>;
