import type { CacheEvent, KvTraceEntry } from './contract.js';
import type { LoraAdapter } from './kv/blockManager.js';
import type { VllmKvEvent } from './kv/vllmKvEvents.js';

/**
 * The engine seam: everything the HTTP layer serves goes through `Engine.submit`. The engine decides
 * when each planned output token becomes available; it never sees text or HTTP.
 */

export interface EngineSequence {
  /** The output token ids this sequence will produce (decided by the output source). */
  outputTokenIds: readonly number[];
  /** When each token arrived in the capture, ms after the request was sent (honoured by captured timing). */
  capturedTimesMs?: readonly number[];
  /** How the sequence ends (`stop`, `length`…), for metrics. */
  finishReason?: string;
}

export interface EngineRequest {
  requestId: string;
  /** When the request arrived (performance.now() ms): captured times count from here. */
  arrivalMs: number;
  promptTokenIds: readonly number[];
  /** One per choice (`n`). */
  sequences: readonly EngineSequence[];
  /** Data-parallel rank asked for by the client (vLLM's `X-data-parallel-rank`); else the least loaded. */
  dataParallelRank?: number;
  /** The request's `max_tokens` as sent (null when absent), for metrics. */
  maxTokensParam?: number | null;
  /**
   * Prefill for a remote decode (vLLM `do_remote_decode`): keep the KV blocks after finishing, until released by
   * this id. The caller chooses it (unguessable: whoever knows it can free the blocks); the engine draws nothing.
   */
  holdKv?: string;
  /** The prompt's KV is pulled from a prefill engine (vLLM `do_remote_prefill`): no prefill compute here. */
  remotePrefill?: boolean;
  /** The LoRA adapter named in `model` (none: the base model). */
  lora?: LoraAdapter;
}

/** KV blocks a finished prefill keeps for a remote decode. */
export interface KvHold {
  /** Names the hold for `Engine.releaseKvHold` (vLLM's `remote_request_id`). */
  holdId: string;
  blocks: number;
}

/** Tokens that became available at the same moment: sequence `sequence` now has `emitted` tokens out. */
export interface TokenEvent {
  sequence: number;
  emitted: number;
}

/** A submitted request's token events, in time order; the iteration ends when every sequence is done. */
export interface EngineStream extends AsyncIterable<TokenEvent[]> {
  /** Prompt tokens the prefix cache supplied at the request's first admission (0 before it). */
  readonly cachedPromptTokens: number;
  /** Once the stream ended: the blocks held for a remote decode (`holdKv`), else null. */
  readonly kvHold: KvHold | null;
}

/** A request the engine can never run (e.g. larger than the whole KV cache): the client's error. */
export class EngineRejection extends Error {}

export interface Engine {
  /**
   * Queues a request; throws `EngineRejection` if it can never run. Aborting the signal drops the
   * request and frees what it holds at once.
   */
  submit(request: EngineRequest, signal: AbortSignal): EngineStream;
  /** The live state, per data-parallel rank (for `/mocker/engine`). */
  state(): EngineState;
  /**
   * vLLM's reset_prefix_cache on every rank: false (nothing dropped on a rank) while requests hold blocks,
   * unless `resetRunningRequests` preempts them first.
   */
  resetPrefixCache(resetRunningRequests?: boolean): boolean;
  /** Per rank, the KV event hash of every cached block (empty without KV events). */
  cachedBlockEventHashes(): bigint[][];
  /** Frees a hold (the remote decode pulled the KV); false when there is none (unknown, expired, released). */
  releaseKvHold(holdId: string): boolean;
  /** Observers have seen every pass so far (their statistics lag the tokens by a turn otherwise): before a scrape. */
  flushStatistics(): void;
}

export interface EngineState {
  ranks: (import('./contract.js').EngineStats & { rank: number })[];
  timing: string;
}

export type TimingMode = 'captured' | 'fixed' | 'model' | 'none' | 'latency';

/** What one engine pass did, as vLLM's stat loggers see an engine step (counters as increments). */
export interface PassStats {
  running: number;
  waiting: number;
  activeBlocks: number;
  totalBlocks: number;
  prefixCacheQueries: number;
  prefixCacheHits: number;
  preemptions: number;
  promptTokens: number;
  generationTokens: number;
  /** These two lists are the driver's, refilled every pass: read them during `onPass`, keep no reference. */
  timesToFirstTokenS: readonly number[];
  interTokenLatenciesS: readonly number[];
  /** With LoRA enabled: the adapters of the running and the waiting requests (vLLM's scheduler LoRA stats). */
  runningLoraAdapters?: string[];
  waitingLoraAdapters?: string[];
}

/** A request that left the engine, with vLLM's per-request intervals (seconds). */
export interface FinishedRequest {
  finishReason: 'stop' | 'length' | 'abort';
  e2eS: number;
  queueS: number;
  prefillS: number;
  inferenceS: number;
  decodeS: number;
  promptTokens: number;
  generationTokens: number;
  meanTimePerOutputTokenS: number;
  maxTokensParam: number | null;
}

/** Receives the engine's statistics (Prometheus metrics, logs) and KV cache events. */
export interface EngineObserver {
  onRequest?(rank: number, n: number): void;
  onPass?(rank: number, stats: PassStats): void;
  onFinished?(rank: number, request: FinishedRequest): void;
  /** vLLM KV events of one engine step (or of an abort or a cache reset between steps). */
  onKvEvents?(rank: number, events: VllmKvEvent[]): void;
  /** Dynamo's KV cache trace entries. */
  onKvTrace?(rank: number, entries: KvTraceEntry[]): void;
  /** The block manager's own events (scheduler `cacheEvents`): a simulated router's index. */
  onCacheEvents?(rank: number, events: CacheEvent[]): void;
}
