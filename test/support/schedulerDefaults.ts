import { EngineCore } from '../../src/engine/core.js';
import type { PassTiming } from '../../src/engine/timingModels.js';

/** SGLang's own server defaults (engine-reference §2.1; Dynamo's `sglang/config.rs`): the core takes complete settings. */
export const SGLANG_SERVER_DEFAULTS = {
  pageSize: 1,
  schedulePolicy: 'fifo',
  maxPrefillTokens: 16384,
  chunkedPrefillSize: 8192,
  clipMaxNewTokens: 4096,
  scheduleConservativeness: 1,
} as const;

/**
 * vLLM V1's scheduler defaults as its API server sets them (vllm-wire-reference §8): 256 sequences and 8,192 tokens
 * per step, chunked prefill and prefix caching on, preemption of the last running request, no free-block watermark
 * (V1 has none), no long_prefill_token_threshold. Tests give the KV geometry, the timing and a seed.
 */
export const VLLM_SCHEDULER_DEFAULTS = {
  maxNumSeqs: 256,
  maxNumBatchedTokens: 8192,
  enablePrefixCaching: true,
  enableChunkedPrefill: true,
  preemptionMode: 'lifo',
  watermark: 0,
  longPrefillTokenThreshold: 0,
} as const;

/** A small vLLM-flavour core for tests on the virtual clock: 1,024 blocks of 16, 8 sequences, no prefix caching, seed 1. */
export function smallVllmCore(timing: PassTiming): EngineCore {
  return new EngineCore({
    numGpuBlocks: 1024,
    blockSize: 16,
    ...VLLM_SCHEDULER_DEFAULTS,
    maxNumSeqs: 8,
    enablePrefixCaching: false,
    timing,
    seed: 1,
  });
}
