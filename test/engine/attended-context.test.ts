/**
 * The context a pass's new prompt tokens attend over, as every flavour's engine hands it to its perf model: each
 * prefilling request's length weighted by its new tokens (Vidur's attention term sums new × context per request),
 * beside Dynamo's integer means. Oracle: arithmetic by hand.
 */
import { describe, expect, it } from 'vitest';
import { DEFAULT_ENGINE_ARGS, schedulerConfig, type EngineArgs } from '../../src/config/engineArgs.js';
import { createSchedulerCore } from '../../src/engine/scheduler.js';
import type { PassTiming } from '../../src/engine/timingModels.js';
import { InterpolatedPerfModel } from '../../src/engine/perf/perfModel.js';

/** A timing that records what each pass's prefill was asked with. */
function recordingTiming(): { timing: PassTiming; asked: number[][] } {
  const asked: number[][] = [];
  return {
    asked,
    timing: {
      prefillMs: (...args) => {
        asked.push(args);
        return 1;
      },
      decodeMs: () => 1,
      honoursCapturedTimes: false,
    },
  };
}

const prompt = (n: number, from: number) => Array.from({ length: n }, (_, i) => from + i);

describe.each<[string, Partial<EngineArgs>]>([
  ['vllm', {}],
  ['sglang', { engineType: 'sglang' }],
  ['llamacpp', { engineType: 'llamacpp', maxNumSeqs: 4, maxNumBatchedTokens: 2048 }],
])('%s: prompts of 1,200 and 100 tokens prefilled in one pass', (_name, overrides) => {
  it('ask for batch 2, mean length 650, no prefix, and an attended context of (1200² + 100²) / 1300', () => {
    const { timing, asked } = recordingTiming();
    const core = createSchedulerCore(schedulerConfig({ ...DEFAULT_ENGINE_ARGS, ...overrides }, timing, 1));
    core.add({ id: 'long', promptTokenIds: prompt(1200, 1), maxOutputTokens: 2 });
    core.add({ id: 'short', promptTokenIds: prompt(100, 5000), maxOutputTokens: 2 });
    core.executePass(0);
    expect(asked).toHaveLength(1);
    const [batch, meanIsl, meanPrefix, attended] = asked[0];
    expect([batch, meanIsl, meanPrefix]).toEqual([2, 650, 0]);
    expect(attended).toBeCloseTo(1_450_000 / 1300, 9); // 1,115.38…, not the mean 650
  });
});

describe('a context table read at the attended context', () => {
  // Rows: 1300 and 2600 new tokens; columns: contexts 650 and 1300 (values: 100 + tokens/100 + context/10).
  const tables = {
    prefill_isl: new Float64Array([1300, 2600]),
    prefill_ttft_ms: new Float64Array([0, 0]),
    prefill_context_length: new Float64Array([650, 1300]),
    prefill_ttft_ms_by_context: [new Float64Array([178, 243]), new Float64Array([191, 256])],
    decode_active_kv_tokens: new Float64Array([0, 1]),
    decode_context_length: new Float64Array([0, 1]),
    decode_itl: [new Float64Array([1, 1]), new Float64Array([1, 1])],
  };

  it('charges 1,300 new tokens over 1,115.38 (bilinear: 100 + 13 + 111.54), and over the mean when not given', () => {
    const model = new InterpolatedPerfModel(tables);
    expect(model.prefillMs(2, 650, 0, 1_450_000 / 1300)).toBeCloseTo(100 + 13 + 145_000 / 1300, 9);
    expect(model.prefillMs(2, 650, 0)).toBeCloseTo(100 + 13 + 65, 9);
  });
});
