import type { BlockId, LoraAdapter } from './kv/blockManager.js';
import type { VllmKvEvent } from './kv/vllmKvEvents.js';
import type { PassTiming } from './timingModels.js';

// The contract between the scheduler cores (vLLM's `EngineCore`, SGLang's `SglangCore`) and the drivers that
// run them: both cores import it, and neither imports the other.

/** A cache change in the block manager's own ids (full blocks: chained content hashes with prefix caching). */
export type CacheEvent = { kind: 'stored'; blocks: BlockId[]; parent: BlockId | null } | { kind: 'removed'; blocks: BlockId[] } | { kind: 'cleared' };

/** Dynamo's KV cache trace entry (engine-reference §3.7), counts right after the store or eviction. */
export interface KvTraceEntry {
  event: 'allocation' | 'eviction';
  activeBlocks: number;
  inactiveBlocks: number;
  freeBlocks: number;
}

/**
 * Token ids: a plain array, or packed (generated workloads build their prompts packed: a trace's 100k-token
 * prompt is then 400 KB outside the JS heap, not 800 KB in it, and costs no garbage collection).
 */
export type TokenIds = readonly number[] | Uint32Array;

export interface CoreRequest {
  id: string;
  promptTokenIds: TokenIds;
  maxOutputTokens: number;
  /** The tokens to generate, when the output is known (captured or planned); random otherwise. */
  outputTokenIds?: readonly number[];
  /** With captured timing: the earliest time (engine clock, ms) each output token may come out. */
  notBeforeMs?: readonly number[];
  /**
   * The prompt's KV comes from a prefill engine (vLLM `do_remote_prefill`): its blocks are allocated and
   * pulled (transfer time, no prefill compute), then the last prompt token is recomputed with the first decode.
   */
  remotePrefill?: boolean;
  /** Keep the blocks after the last token until `releaseHeld` (a prefill engine, for a remote decode to pull). */
  holdBlocksOnFinish?: boolean;
  /** The LoRA adapter it runs under (none: the base model). */
  lora?: LoraAdapter;
}

export type RequestStatus = 'waiting' | 'running' | 'preempted' | 'waiting_for_remote_kvs';

/** One request's scheduling state, as tests and `/mocker/engine` see it. */
export interface RequestView {
  status: RequestStatus;
  numComputedTokens: number;
  numAllocatedTokens: number;
  generated: number;
  length: number;
  numPreemptions: number;
}

export interface TokenOut {
  id: string;
  /** Output tokens this request has produced so far. */
  generated: number;
  completed: boolean;
}

export interface Admission {
  id: string;
  /** Tokens found in the prefix cache at this admission (whole blocks, never the last token). */
  cachedTokens: number;
}

export interface PassResult {
  startMs: number;
  prefillMs: number;
  decodeMs: number;
  endMs: number;
  /** Tokens out at `endMs`, in running order. */
  tokens: TokenOut[];
  admitted: Admission[];
  preempted: string[];
  /** Tokens computed this pass (prefill chunks and decodes). */
  scheduledTokens: number;
  /** Of those, prompt tokens (prefill, including recomputed ones after a preemption). */
  promptTokens: number;
  /** With captured timing: the earliest time a held-back token may come out (null: none held back). */
  wakeAtMs: number | null;
}

export interface EngineStats {
  running: number;
  waiting: number;
  activeBlocks: number;
  inactiveBlocks: number;
  freeBlocks: number;
  totalBlocks: number;
  blockSize: number;
  preemptions: number;
  /**
   * Tokens looked up in the prefix cache, and found (vLLM's prefix_cache_queries / hits): in the vLLM flavour,
   * first admissions only, as vLLM counts them.
   */
  prefixCacheQueries: number;
  prefixCacheHits: number;
  /** The vLLM flavour's lookups by requests preempted before (vLLM's preempted_queries / preempted_hits). */
  preemptedPrefixCacheQueries?: number;
  preemptedPrefixCacheHits?: number;
  passes: number;
  /** Requests holding blocks while their prompt's KV is pulled from a prefill engine. */
  waitingForRemoteKvs: number;
  /** Simulated prefill compute charged so far (ms, before the speedup). */
  prefillMs: number;
  /**
   * With LoRA enabled, vLLM's scheduler LoRA stats: the adapters of running and of waiting requests, each named
   * once, in queue order.
   */
  runningLoraAdapters?: string[];
  waitingLoraAdapters?: string[];
}

/**
 * What the drivers (live, offline, trace replay) need of a scheduler core: the vLLM flavour (`EngineCore`) and
 * SGLang's (`SglangCore`) both offer it. Pure and clock-free: `executePass(now)` is told the time.
 */
export interface SchedulerCore {
  readonly config: { readonly timing: PassTiming };
  /** When a pass's KV events become visible: vLLM publishes them at the step's start, SGLang at its end. */
  readonly kvEventVisibility: 'pass-start' | 'pass-end';
  readonly isIdle: boolean;
  /** Why a request of this size can never run here, or null. */
  rejection(promptTokens: number, maxOutputTokens: number): string | null;
  /**
   * How many of its output tokens an accepted request gets, when the flavour clamps them to the KV cache rather
   * than refusing the request (TRT-LLM's enqueue normalization, llama.cpp's full context); absent: all of them.
   */
  outputLimit?(promptTokens: number, maxOutputTokens: number): number;
  add(request: CoreRequest): void;
  abort(id: string): void;
  executePass(now: number): PassResult;
  engineStats(): EngineStats;
  view(id: string): RequestView | undefined;
  waitingIds(): string[];
  runningIds(): string[];
  takeKvEvents(): VllmKvEvent[];
  takeCacheEvents(): CacheEvent[];
  takeKvTrace(): KvTraceEntry[];
  cachedBlockEventHashes(): bigint[];
  releaseHeld(id: string): boolean;
  heldBlocks(id: string): number;
  resetPrefixCache(resetRunningRequests?: boolean): boolean;
}
