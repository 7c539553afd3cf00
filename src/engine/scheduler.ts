import type { CacheEvent, CoreRequest, EngineStats, KvTraceEntry, PassResult, RequestView, SchedulerConfig } from './core.js';
import { EngineCore } from './core.js';
import type { VllmKvEvent } from './kv/vllmKvEvents.js';
import { SglangCore, type SglangSchedulerConfig } from './sglang/core.js';
import type { PassTiming } from './timingModels.js';

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

/** A scheduler's configuration, tagged with its flavour (`--engine-type`). */
export type AnySchedulerConfig = ({ engineType: 'vllm' } & SchedulerConfig) | ({ engineType: 'sglang' } & SglangSchedulerConfig);

export function createSchedulerCore(config: AnySchedulerConfig): SchedulerCore {
  return config.engineType === 'sglang' ? new SglangCore(config) : new EngineCore(config);
}
