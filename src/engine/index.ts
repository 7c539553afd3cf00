export { EngineCore, type PreemptionMode, type SchedulerConfig, type SchedulingPolicy, type VllmSchedulerSettings } from './core.js';
export type { CacheEvent, CoreRequest, EngineStats, KvTraceEntry, PassResult, TokenIds } from './contract.js';
export type { VllmKvEvent, VllmKvEventOptions } from './kv/vllmKvEvents.js';
export type { LoraAdapter } from './kv/blockManager.js';
export { defaultHashSeed, type BlockHashAlgo } from './kv/vllmBlockHash.js';
export { LiveDriver } from './liveDriver.js';
export { runOffline, type OfflineResult, type TimedRequest } from './offlineDriver.js';
export { loadPerfModel, polynomialPerfModel, type PerfModel } from './perf/perfModel.js';
export { SimulatedEngine, type SimulatedEngineOptions } from './simulatedEngine.js';
export { attendedContext, fixedTiming, modelTiming, zeroTiming, type PassTiming } from './timingModels.js';
export { badLatencyKnob, DEFAULT_LATENCY_KNOBS, latencyTiming, type LatencyKnobs } from './latencyTiming.js';
export {
  EngineRejection,
  type Engine,
  type EngineObserver,
  type EngineRequest,
  type EngineSequence,
  type EngineState,
  type EngineStream,
  type FinishedRequest,
  type KvHold,
  type PassStats,
  type TimingMode,
  type TokenEvent,
} from './types.js';
export { createSchedulerCore, type AnySchedulerConfig } from './scheduler.js';
export type { SchedulerCore } from './contract.js';
export { SglangCore, type SglangSchedulerConfig, type SglangSchedulerSettings } from './sglang/core.js';
export type { SglangSchedulePolicy } from './sglang/policy.js';
export { LlamaCppCore, type LlamaCppSchedulerConfig } from './llamacpp/core.js';
