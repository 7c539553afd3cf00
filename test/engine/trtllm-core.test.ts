/**
 * `--engine-type trtllm`: the vLLM core under TensorRT-LLM's GUARANTEED_NO_EVICT, against the scenarios of
 * Dynamo's own tests (ai-dynamo/dynamo lib/mocker/src/scheduler/trtllm/tests.rs, PR #10193; engine-reference
 * §1.8 and the #10093 DEP entry), with their configurations and numbers. Dynamo's `speedup_ratio(0.0)` runs
 * passes in no time: zero timing here.
 */
import { describe, expect, it } from 'vitest';
import type { CoreRequest, PassResult } from '../../src/engine/contract.js';
import { EngineCore, type SchedulerConfig } from '../../src/engine/core.js';
import { DEFAULT_ENGINE_ARGS, schedulerConfig } from '../../src/config/engineArgs.js';
import { createSchedulerCore } from '../../src/engine/scheduler.js';
import { zeroTiming } from '../../src/engine/timingModels.js';
import { VLLM_SCHEDULER_DEFAULTS } from '../support/schedulerDefaults.js';

type Policy = 'vllm' | 'trtllm';

/** Dynamo's MockEngineArgs of these tests: chunked prefill on, prefix caching off, no watermark. */
function core(policy: Policy, overrides: Partial<SchedulerConfig>): EngineCore {
  return new EngineCore({
    ...VLLM_SCHEDULER_DEFAULTS,
    numGpuBlocks: 6,
    blockSize: 4,
    enablePrefixCaching: false,
    timing: zeroTiming(false),
    seed: 1,
    ...(policy === 'trtllm' ? { schedulingPolicy: 'trtllm-guaranteed-no-evict' as const } : {}),
    ...overrides,
  });
}

/** Dynamo's `receive(core, uuid, from..to, max_output)`: prompt ids from `from` up to `to` (exclusive). */
const request = (id: string, from: number, to: number, maxOutputTokens: number): CoreRequest => ({
  id,
  promptTokenIds: Array.from({ length: to - from }, (_, i) => from + i),
  maxOutputTokens,
});

/** Dynamo's `drain`: passes until the core is empty (at most `limit`), counting completions and preemptions. */
function drain(c: EngineCore, limit: number): { completed: number; preempted: number } {
  let now = 0;
  let completed = 0;
  let preempted = 0;
  for (let i = 0; i < limit && !c.isIdle; i++) {
    const pass: PassResult = c.executePass(now);
    now = Math.max(pass.endMs, now + 1);
    completed += pass.tokens.filter((t) => t.completed).length;
    preempted += pass.preempted.length;
  }
  return { completed, preempted };
}

describe("TRT-LLM GUARANTEED_NO_EVICT (Dynamo's trtllm/tests.rs)", () => {
  // block 4, 6 blocks, 16-token budget, 4 sequences: two 8 + 8 requests each reserve 4 blocks; 8 > 6.
  const small = { numGpuBlocks: 6, blockSize: 4, maxNumBatchedTokens: 16, maxNumSeqs: 4 };

  it('admits_only_what_fits_to_completion: only the first request runs, the second keeps waiting, nothing is preempted', () => {
    const c = core('trtllm', small);
    c.add(request('r1', 0, 8, 8));
    c.add(request('r2', 100, 108, 8));
    const pass = c.executePass(0);
    expect(c.runningIds()).toEqual(['r1']);
    expect(c.waitingIds()).toEqual(['r2']);
    expect(c.view('r2')?.status).toBe('waiting');
    expect(pass.preempted).toEqual([]);
  });

  it('vllm_admits_optimistically_unlike_trtllm: the same arguments under vLLM run both at once', () => {
    const c = core('vllm', small);
    c.add(request('r1', 0, 8, 8));
    c.add(request('r2', 100, 108, 8));
    c.executePass(0);
    expect(c.runningIds()).toEqual(['r1', 'r2']);
  });

  it('preemption_inducing_workload_never_preempts: two 4 + 12 requests in 4 blocks run one after the other', () => {
    const args = { numGpuBlocks: 4, blockSize: 4, maxNumBatchedTokens: 8, maxNumSeqs: 4 };
    const c = core('trtllm', args);
    c.add(request('r1', 0, 4, 12));
    c.add(request('r2', 100, 104, 12));
    expect(drain(c, 300)).toEqual({ completed: 2, preempted: 0 });
    expect(c.isIdle).toBe(true);
    // The contrast that makes it a test: vLLM admits both and preempts when their decodes outgrow the 4 blocks.
    const v = core('vllm', args);
    v.add(request('r1', 0, 4, 12));
    v.add(request('r2', 100, 104, 12));
    expect(drain(v, 300).preempted).toBeGreaterThan(0);
  });

  it('no_evict_admission_cap_matches_hardware: 7319 blocks of 32, 64 requests of 1096 + 7000 → 28 running (floor(7319 / 253))', () => {
    const c = core('trtllm', { numGpuBlocks: 7319, blockSize: 32, maxNumSeqs: 256, maxNumBatchedTokens: 8192 });
    for (let i = 0; i < 64; i++) {
      const base = (i + 1) * 100_000;
      c.add(request(`r${i + 1}`, base, base + 1096, 7000));
    }
    let now = 0;
    let preempted = 0;
    for (let pass = 0; pass < 40; pass++) {
      const result = c.executePass(now);
      now = Math.max(result.endMs, now + 1);
      preempted += result.preempted.length;
    }
    expect(preempted).toBe(0);
    expect(c.runningIds()).toHaveLength(28);
    expect(c.runningIds().length + c.waitingIds().length).toBe(64);
    // Admission is first come, first served: the 28 oldest run.
    expect(c.runningIds()).toEqual(Array.from({ length: 28 }, (_, i) => `r${i + 1}`));
  });

  it("blocks_needed_to_finish discounts a waiting request's active cached prefix blocks (trtllm/policy.rs)", () => {
    // r1 (8 + 8) holds 2 blocks and reserves 2 more: 6 − 2 − 2 = 2 unreserved. r2 (12 + 4) needs ceil(16 / 4) = 4,
    // less r1's 2 prompt blocks it shares, active in the cache: 2 ≤ 2, admitted.
    const c = core('trtllm', { ...small, enablePrefixCaching: true });
    c.add(request('r1', 0, 8, 8));
    c.executePass(0);
    c.add({ id: 'r2', promptTokenIds: [...Array.from({ length: 8 }, (_, i) => i), 100, 101, 102, 103], maxOutputTokens: 4 });
    c.executePass(1);
    expect(c.runningIds()).toEqual(['r1', 'r2']);
    // Without the shared prefix the same request waits: 4 > 2.
    const d = core('trtllm', { ...small, enablePrefixCaching: true });
    d.add(request('r1', 0, 8, 8));
    d.executePass(0);
    d.add(request('r2', 200, 212, 4));
    d.executePass(1);
    expect(d.runningIds()).toEqual(['r1']);
  });

  // 4 blocks of 4: a 16-token pool.
  const capacity = { numGpuBlocks: 4, blockSize: 4, maxNumBatchedTokens: 64, maxNumSeqs: 4 };

  it('enqueue_rejects_prompt_with_no_decode_room: a 20-token prompt is refused, a following 4-token one runs', () => {
    const c = core('trtllm', capacity);
    expect(c.rejection(20, 4)).toMatch(/20-token prompt leaves no room for output in the KV cache of 16 tokens/);
    expect(() => c.add(request('r1', 0, 20, 4))).toThrow(/no room for output/);
    c.add(request('r2', 100, 104, 4));
    expect(drain(c, 100)).toEqual({ completed: 1, preempted: 0 });
  });

  it('enqueue_clamps_excess_output_to_capacity: 4 + 40 is admitted and runs to 4 + 12 = 16 tokens', () => {
    const c = core('trtllm', capacity);
    expect(c.rejection(4, 40)).toBeNull();
    c.add(request('r1', 0, 4, 40));
    let now = 0;
    let last = 0;
    while (!c.isIdle) {
      const pass = c.executePass(now);
      now = Math.max(pass.endMs, now + 1);
      for (const t of pass.tokens) if (t.completed) last = t.generated;
    }
    expect(last).toBe(12);
    // vLLM refuses it outright: 11 blocks > 4.
    expect(core('vllm', capacity).rejection(4, 40)).toMatch(/needs 11 KV cache blocks/);
  });

  it('--engine-type trtllm (its engine args) builds this core: the admission cap holds, max_num_tokens is the batch budget', () => {
    const args = { ...DEFAULT_ENGINE_ARGS, engineType: 'trtllm' as const, ...small, enablePrefixCaching: false };
    const c = createSchedulerCore(schedulerConfig(args, zeroTiming(false), 1));
    c.add(request('r1', 0, 8, 8));
    c.add(request('r2', 100, 108, 8));
    expect(c.executePass(0).scheduledTokens).toBe(8);
    expect(c.runningIds()).toEqual(['r1']);
  });
});
