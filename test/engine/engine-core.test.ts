/**
 * The engine core against the scenarios of engine-reference.md §9.2 (items 1–17, 19), with their
 * configurations and asserted numbers. Unless stated: no speedup scaling, prefix caching off.
 */
import { describe, expect, it } from 'vitest';
import { EngineCore, type SchedulerConfig } from '../../src/engine/core.js';
import type { CoreRequest } from '../../src/engine/contract.js';
import { LruEvictor } from '../../src/engine/kv/evictor.js';
import { KvBlockManager, type KvCacheEvent, type MoveBlock } from '../../src/engine/kv/blockManager.js';
import { runOffline } from '../../src/engine/offlineDriver.js';
import { polynomialPerfModel } from '../../src/engine/perf/perfModel.js';
import { ActiveSequence } from '../../src/engine/sequence.js';
import { fixedTiming, modelTiming, zeroTiming } from '../../src/engine/timingModels.js';
import { VLLM_SCHEDULER_DEFAULTS } from '../support/schedulerDefaults.js';

function makeCore(overrides: Partial<SchedulerConfig> = {}): EngineCore {
  return new EngineCore({
    numGpuBlocks: 16384,
    blockSize: 64,
    ...VLLM_SCHEDULER_DEFAULTS,
    enablePrefixCaching: false,
    timing: modelTiming(polynomialPerfModel, 0, 1),
    seed: 7,
    ...overrides,
  });
}

const tokens = (n: number, from = 1) => Array.from({ length: n }, (_, i) => from + i);
const request = (id: string, promptLength: number, maxOutputTokens: number, from = 1): CoreRequest => ({
  id,
  promptTokenIds: tokens(promptLength, from),
  maxOutputTokens,
});

let uniqueId = -1;
const sequence = (prompt: number[], maxOutput: number, blockSize: number, prefixCaching = true) =>
  new ActiveSequence(prompt, maxOutput, blockSize, prefixCaching, () => uniqueId--);

describe('§9.2 KV block manager and sequences', () => {
  it('1: the LRU evictor evicts in insertion order, re-insertion moving an item to the back', () => {
    const lru = new LruEvictor<number>();
    for (const x of [4, 3, 2, 1, 5, 1, 4, 2]) lru.insert(x);
    const order: (number | undefined)[] = [];
    for (let i = 0; i < 6; i++) order.push(lru.evict());
    // The reference's counter-only sequence (its push_front variant is unused by the KV manager).
    expect(order).toEqual([3, 5, 1, 4, 2, undefined]);
    expect(lru.size).toBe(0);
  });

  it('2: a full cache refuses a new block without failing', () => {
    const kv = new KvBlockManager(10);
    expect(kv.process({ kind: 'use', blocks: tokens(10, 0), parent: null })).toBe(10);
    expect(kv.numActive + kv.numInactive).toBe(10);
    expect(kv.process({ kind: 'use', blocks: [10], parent: null })).toBe(0);
  });

  it("3: the block lifecycle of vLLM's prefix-caching docs", () => {
    const kv = new KvBlockManager(10);
    const run = (...moves: MoveBlock[]) => moves.forEach((m) => kv.process(m));
    const active = () => Object.fromEntries(kv.activeBlocks());
    const inactive = () => new Set(kv.inactiveBlocks());
    run({ kind: 'use', blocks: [0, 1, 2, 3, 4], parent: null }, { kind: 'use', blocks: [0, 1, 5, 6], parent: null });
    expect(active()).toEqual({ 0: 2, 1: 2, 2: 1, 3: 1, 4: 1, 5: 1, 6: 1 });
    run({ kind: 'destroy', blocks: [4] }, { kind: 'deref', blocks: [0, 1, 2, 3] });
    expect(inactive()).toEqual(new Set([3, 2]));
    expect(active()).toEqual({ 0: 1, 1: 1, 5: 1, 6: 1 });
    run({ kind: 'destroy', blocks: [6] }, { kind: 'deref', blocks: [0, 1, 5] });
    expect(inactive()).toEqual(new Set([0, 1, 2, 3, 5]));
    expect(active()).toEqual({});
    run({ kind: 'use', blocks: [0, 1, 2, 7, 8, 9], parent: null });
    expect(inactive()).toEqual(new Set([3, 5]));
    expect(active()).toEqual({ 0: 1, 1: 1, 2: 1, 7: 1, 8: 1, 9: 1 });
    // probe_new_blocks([0..4]) = 1: of 0..4 only 4 is nowhere in the cache.
    expect(5 - kv.prefixHits([0, 1, 2, 3, 4])).toBe(1);
    run({ kind: 'use', blocks: [10, 11, 12], parent: null });
    expect(inactive()).toEqual(new Set([5]));
  });

  it('4: chunked prefill stores its blocks in two events, the second chained to block 3', () => {
    const events: KvCacheEvent[] = [];
    const kv = new KvBlockManager(256, (e) => events.push(e));
    const seq = sequence(tokens(512), 1, 64);
    for (const target of [256, 512]) {
      const move = seq.prepareAllocation(target)!;
      expect(kv.process(move)).toBe(move.blocks.length);
      seq.commitAllocation(target);
    }
    expect(events.map((e) => e.kind)).toEqual(['stored', 'stored']);
    expect(events[0]).toMatchObject({ parent: null });
    expect(events[1]).toMatchObject({ parent: seq.blocks[3] });
  });

  it('5: a second preemption frees only the blocks allocated again', () => {
    const kv = new KvBlockManager(16);
    const seq = sequence(tokens(6), 10, 4);
    const apply = (moves: readonly MoveBlock[]) => moves.forEach((m) => kv.process(m));
    apply([seq.prepareAllocation(6)!]);
    seq.commitAllocation(6);
    expect(kv.numActive).toBe(2);
    for (let i = 0; i < 3; i++) {
      apply(seq.generate(100 + i));
      seq.commitAllocation(seq.length);
    }
    expect(kv.numActive).toBe(3);
    apply(seq.reset());
    expect(kv.numActive).toBe(0);
    apply([seq.prepareAllocation(6)!]);
    seq.commitAllocation(6);
    expect(kv.numActive).toBe(2);
    apply(seq.reset());
    expect(kv.numActive).toBe(0);
  });

  it('6: the moves of a 14-token prompt generating 5 tokens with blocks of 16', () => {
    const seq = sequence(tokens(14), 5, 16);
    const creation = seq.prepareAllocation(14)!;
    expect(creation.blocks).toHaveLength(1);
    expect(creation.blocks[0]).toBeLessThan(0); // a partial block
    seq.commitAllocation(14);
    expect(seq.generate(1)).toEqual([]);
    expect(seq.generate(2)).toEqual([]);
    const third = seq.generate(3);
    expect(third.map((m) => m.kind)).toEqual(['promote', 'use']);
    expect(third[0]).toMatchObject({ parent: null });
    expect(seq.generate(4)).toEqual([]);
    expect(seq.generate(5).map((m) => m.kind)).toEqual(['destroy', 'deref']);
  });

  it('7: crossing a block boundary promotes the full block and takes a new partial one', () => {
    const seq = sequence(tokens(15), 10, 16);
    expect(seq.generate(1)).toEqual([]);
    const moves = seq.generate(2);
    expect(moves.map((m) => m.kind)).toEqual(['promote', 'use']);
    expect(moves[0]).toMatchObject({ parent: null });
    expect(seq.blocks).toHaveLength(2);
    expect(seq.length % 16).toBe(1);
  });

  it('8: equivalent histories give the same full block, never the same partial one', () => {
    const all = tokens(16);
    const a = sequence(all, 10, 16);
    a.generate(99);
    const b = sequence(all.slice(0, 10), 10, 16);
    for (const t of all.slice(10)) b.generate(t);
    b.generate(99);
    expect(b.blocks[0]).toBe(a.blocks[0]);
    expect(b.blocks[1]).not.toBe(a.blocks[1]);
  });

  it('9: allocation targets slice full and partial blocks', () => {
    const seq = sequence(tokens(10), 1, 4);
    expect(seq.prepareAllocation(4)!.blocks).toEqual(seq.blocks.slice(0, 1));
    expect(seq.prepareAllocation(8)!.blocks).toEqual(seq.blocks.slice(0, 2));
    expect(seq.prepareAllocation(10)!.blocks).toEqual(seq.blocks.slice(0, 3));
    expect(seq.blocks[2]).toBeLessThan(0);
  });
});

describe('§9.2 scheduler', () => {
  const small = { blockSize: 4, numGpuBlocks: 6, maxNumBatchedTokens: 12, maxNumSeqs: 3 };

  it('10: one pass keeps a partial prefill running beside the finished one', () => {
    const core = makeCore(small);
    core.add(request('r1', 8, 2));
    core.add(request('r2', 8, 2, 100));
    const pass = core.executePass(0);
    expect(pass.tokens.map((t) => t.id)).toEqual(['r1']);
    expect(core.waitingIds()).toEqual([]);
    expect(core.runningIds()).toEqual(['r1', 'r2']);
    expect(core.view('r1')).toMatchObject({ numComputedTokens: 8, generated: 1 });
    expect(core.view('r2')).toMatchObject({ numComputedTokens: 4 });
    expect(core.kv.numActive).toBe(4);
  });

  it('11: running requests spend the budget before waiting ones', () => {
    const core = makeCore({ maxNumBatchedTokens: 4 });
    core.add(request('r1', 8, 5));
    core.add(request('r2', 8, 5, 100));
    const first = core.executePass(0);
    const second = core.executePass(first.endMs);
    expect([...first.tokens, ...second.tokens].map((t) => t.id)).toEqual(['r1']);
    expect(core.view('r2')!.numComputedTokens).toBe(0);
  });

  it('12: two prompts that fit one budget are admitted and answered in the same pass', () => {
    const core = makeCore({ maxNumBatchedTokens: 8 });
    core.add(request('r1', 4, 1));
    core.add(request('r2', 4, 1, 100));
    const pass = core.executePass(0);
    expect(pass.admitted.map((a) => a.id)).toEqual(['r1', 'r2']);
    expect(pass.tokens.map((t) => [t.id, t.completed])).toEqual([
      ['r1', true],
      ['r2', true],
    ]);
  });

  it("13: a decode worker pulls a remote prefill's KV in tokens × bytes ÷ bandwidth (8 tokens at 1 MB/token over 1 GB/s = 8 ms), then decodes with no prefill compute", () => {
    const transfer = { kvTransfer: { bytesPerToken: 1_000_000, bandwidthGBps: 1 } };
    const core = makeCore(transfer);
    core.add({ ...request('r1', 8, 2), remotePrefill: true });
    const first = core.executePass(0);
    expect(first.tokens).toEqual([]);
    expect(first.wakeAtMs).toBe(8);
    expect(core.view('r1')).toMatchObject({ status: 'waiting_for_remote_kvs', numAllocatedTokens: 8, numComputedTokens: 7 });
    expect(core.engineStats()).toMatchObject({ activeBlocks: 1, waiting: 1, waitingForRemoteKvs: 1, running: 0 });
    expect(core.executePass(4).tokens).toEqual([]);
    // Landed: the last prompt token is recomputed with the first decode; no prefill time is charged.
    const landed = core.executePass(8);
    expect(landed).toMatchObject({ prefillMs: 0, scheduledTokens: 1, tokens: [{ id: 'r1', generated: 1, completed: false }] });
    expect(landed.decodeMs).toBeGreaterThan(0);
    expect(core.engineStats().prefillMs).toBe(0);
    // 128 tokens → 128 ms.
    const long = makeCore(transfer);
    long.add({ ...request('r', 128, 1), remotePrefill: true });
    expect(long.executePass(0).wakeAtMs).toBe(128);
    // The same request computed locally is charged its prefill.
    const local = makeCore(transfer);
    local.add(request('r', 128, 1));
    expect(local.executePass(0).prefillMs).toBeGreaterThan(0);
  });

  it('13c: a decode request is preempted like any other; it loses the pulled KV and recomputes its prompt locally', () => {
    // 4 blocks of 4: a local request (1 block) and a remote one (2 blocks) fit until both grow.
    const core = makeCore({ blockSize: 4, numGpuBlocks: 4, maxNumBatchedTokens: 64, kvTransfer: { bytesPerToken: 1_000_000, bandwidthGBps: 1 } });
    core.add(request('local', 4, 8));
    core.executePass(0);
    core.add({ ...request('remote', 8, 8, 100), remotePrefill: true });
    let now = 1000;
    let preemptedAt = -1;
    const passes = [];
    for (let i = 0; i < 40 && !core.isIdle; i++) {
      const pass = core.executePass(now);
      passes.push(pass);
      if (preemptedAt < 0 && pass.preempted.includes('remote')) preemptedAt = passes.length - 1;
      now = Math.max(pass.endMs, pass.wakeAtMs ?? pass.endMs) + 1;
    }
    // The newest running request (LIFO) is the remote one: preempted once the local one's growth needs a block.
    expect(preemptedAt).toBeGreaterThanOrEqual(0);
    expect(passes.slice(0, preemptedAt).every((p) => p.promptTokens === 0)).toBe(true);
    // Back from preemption its prompt is prefilled here, with prefill time charged, before its first token.
    const firstToken = passes.findIndex((p) => p.tokens.some((t) => t.id === 'remote'));
    const recompute = passes.slice(preemptedAt + 1, firstToken + 1).filter((p) => p.promptTokens > 0 && p.admitted.some((a) => a.id === 'remote'));
    expect(recompute.length).toBeGreaterThan(0);
    expect(recompute.every((p) => p.prefillMs > 0)).toBe(true);
    expect(core.isIdle).toBe(true);
    expect(core.engineStats().activeBlocks).toBe(0);
  });

  it('13d: a pulled request kept out by --max-num-seqs waits for a running one to finish, not for a time (no busy wake-ups)', () => {
    const core = makeCore({ maxNumSeqs: 1, timing: zeroTiming(true), kvTransfer: { bytesPerToken: 1, bandwidthGBps: 0 } });
    // Captured timing: b's tokens are due at 100 and 200 ms; c's KV lands at once but b holds the only seat.
    core.add({ ...request('b', 8, 2), remotePrefill: true, notBeforeMs: [100, 200] });
    core.add({ ...request('c', 8, 2, 50), remotePrefill: true, notBeforeMs: [0, 0] });
    core.executePass(0);
    const waiting = core.executePass(0);
    expect(core.view('b')?.status).toBe('running');
    expect(core.view('c')?.status).toBe('waiting_for_remote_kvs');
    expect(waiting.tokens).toEqual([]);
    // The next thing that can happen is b's token at 100 ms.
    expect(waiting.wakeAtMs).toBe(100);
  });

  it("13e: reset_prefix_cache with reset_running_requests fails without preempting anyone while a prefill's KV is held", () => {
    // A 200-token prompt in 8-token chunks stays running over several passes.
    const chunked = makeCore({ workerType: 'prefill', maxNumBatchedTokens: 8 });
    chunked.add({ ...request('held', 8, 1), holdBlocksOnFinish: true });
    chunked.executePass(0);
    chunked.add(request('running', 200, 1, 1000));
    chunked.executePass(1);
    expect(chunked.view('running')?.status).toBe('running');
    expect(chunked.resetPrefixCache(true)).toBe(false);
    expect(chunked.view('running')?.status).toBe('running');
    expect(chunked.engineStats().preemptions).toBe(0);
    // Once the hold is released, the same reset preempts the running request and clears the cache.
    expect(chunked.releaseHeld('held')).toBe(true);
    expect(chunked.resetPrefixCache(true)).toBe(true);
    expect(chunked.engineStats()).toMatchObject({ preemptions: 1, inactiveBlocks: 0, activeBlocks: 0 });
  });

  it('13b: a prefill worker emits its token at the end of the prefill, with no decode step', () => {
    const core = makeCore({ workerType: 'prefill' });
    core.add(request('r1', 8, 1));
    const pass = core.executePass(0);
    expect(pass.decodeMs).toBe(0);
    expect(pass.endMs).toBe(pass.prefillMs);
    expect(pass.tokens).toEqual([{ id: 'r1', generated: 1, completed: true }]);
    // --timing fixed charges the pass that emits tokens, not the prefill: a prefill worker's pass still costs a step.
    const fixed = makeCore({ workerType: 'prefill', timing: fixedTiming(25, 0) });
    fixed.add(request('r1', 8, 1));
    expect(fixed.executePass(0)).toMatchObject({ endMs: 25, tokens: [{ id: 'r1', generated: 1, completed: true }] });
  });

  it('14: the first token comes out in the pass that completes the prompt', () => {
    const core = makeCore({ maxNumBatchedTokens: 8 });
    core.add(request('r1', 8, 4));
    const pass = core.executePass(0);
    expect(pass.tokens).toEqual([{ id: 'r1', generated: 1, completed: false }]);
  });

  it("15: LIFO preemption sends the newest running request to the front of waiting when another's admission needs its blocks", () => {
    const core = makeCore(small);
    core.add(request('r1', 8, 2));
    core.add(request('r2', 8, 2, 100));
    core.add(request('r3', 12, 2, 200));
    core.executePass(0);
    core.executePass(1);
    expect(core.view('r2')).toMatchObject({ status: 'preempted', numComputedTokens: 0, numPreemptions: 1 });
    expect(core.waitingIds()[0]).toBe('r2');
  });

  it('16: a re-admitted request catches up its decode tail before its next block', () => {
    // A workload that puts r1 (6 prompt + 6 generated tokens, preempted before) at 9 computed tokens.
    const core = makeCore({ numGpuBlocks: 5, blockSize: 4, maxNumSeqs: 3, maxNumBatchedTokens: 3, preemptionMode: 'fifo' });
    core.add(request('r1', 6, 8));
    let checked = false;
    for (let t = 0; t < 40 && !checked; t++) {
      if (t === 1) core.add({ id: 'r2', promptTokenIds: tokens(7, 200), maxOutputTokens: 5 });
      const before = core.view('r1');
      const pass = core.executePass(t);
      if (before?.status === 'running' && before.numPreemptions > 0 && before.numComputedTokens === 9 && before.length === 12) {
        expect(pass.tokens).toHaveLength(1);
        expect(pass.tokens[0].id).toBe('r1');
        expect(core.view('r1')).toMatchObject({ numComputedTokens: 12, numAllocatedTokens: 13 });
        expect(core.kv.numActive).toBe(4);
        checked = true;
      }
    }
    expect(checked).toBe(true);
  });

  it('17: completing every request returns the scheduler to idle', () => {
    const core = makeCore();
    core.add(request('r1', 8, 3));
    core.add(request('r2', 8, 3, 100));
    let now = 0;
    while (!core.isIdle) now = core.executePass(now).endMs;
    expect(core.waitingIds()).toEqual([]);
    expect(core.runningIds()).toEqual([]);
    expect(core.kv.numActive).toBe(0);
  });

  it('rejects a request larger than the whole cache instead of livelocking', () => {
    const core = makeCore({ numGpuBlocks: 4, blockSize: 4 });
    expect(core.rejection(16, 1)).toMatch(/needs 5 KV cache blocks/);
    expect(core.rejection(15, 1)).toBeNull();
    expect(() => core.add(request('big', 16, 1))).toThrow(/cache holds only 4/);
  });
});

describe('§9.2 item 19: the token-generation matrix', () => {
  for (const sharedPrefix of [false, true])
    for (const enablePrefixCaching of [false, true])
      for (const enableChunkedPrefill of [false, true]) {
        it(`shared prefix ${sharedPrefix}, prefix caching ${enablePrefixCaching}, chunked prefill ${enableChunkedPrefill}: 200 × 100 tokens, nothing left active`, () => {
          const core = makeCore({
            numGpuBlocks: 500,
            blockSize: 64,
            enablePrefixCaching,
            enableChunkedPrefill,
            timing: modelTiming(polynomialPerfModel, 1000, 1),
          });
          let state = 12345;
          const random = () => (state = (Math.imul(state, 1103515245) + 12345) >>> 0);
          const shared = Array.from({ length: 500 }, random);
          const requests = Array.from({ length: 200 }, (_, i) => ({
            arrivalMs: i,
            request: {
              id: `r${i}`,
              promptTokenIds: sharedPrefix ? [...shared, ...Array.from({ length: 500 }, random)] : Array.from({ length: 1000 }, random),
              maxOutputTokens: 100,
            },
          }));
          const result = runOffline(core, requests);
          const total = [...result.records.values()].reduce((n, r) => n + r.tokenTimesMs.length, 0);
          expect(total).toBe(20_000);
          expect(core.kv.numActive).toBe(0);
          expect(core.isIdle).toBe(true);
        });
      }
});

describe("vLLM's prefix-hit rule (get_computed_blocks: whole blocks, at most num_tokens - 1 tokens)", () => {
  // engine-reference §4.1's prefill polynomial over the new tokens of a one-request batch.
  const prefillPolynomialMs = (tokens: number) => 4.209989e-7 * tokens * tokens + 1.518344e-2 * tokens + 16.50142;
  const cachingCore = (overrides: Partial<SchedulerConfig> = {}) => makeCore({ blockSize: 16, enablePrefixCaching: true, ...overrides });
  const drain = (core: EngineCore, from: number) => {
    let now = from;
    while (!core.isIdle) now = core.executePass(now).endMs;
    return now;
  };

  // The cases of the rule with blocks of 16: a prompt of k full blocks, all cached, hits k - 1 of them.
  it.each([
    { length: 128, hits: 112 },
    { length: 130, hits: 128 },
    { length: 129, hits: 128 },
    { length: 17, hits: 16 },
    { length: 16, hits: 0 },
    { length: 10, hits: 0 },
  ])('a $length-token prompt sent again hits $hits tokens, and its prefill computes only the others', ({ length, hits }) => {
    const core = cachingCore();
    core.add(request('first', length, 1));
    const now = drain(core, 0);
    core.add(request('second', length, 1));
    const pass = core.executePass(now);
    expect(pass.admitted).toEqual([{ id: 'second', cachedTokens: hits }]);
    expect(pass.promptTokens).toBe(length - hits);
    expect(pass.scheduledTokens).toBe(length - hits);
    expect(pass.prefillMs).toBeCloseTo(prefillPolynomialMs(length - hits), 9);
    expect(pass.tokens).toEqual([{ id: 'second', generated: 1, completed: true }]);
    expect(core.engineStats()).toMatchObject({ prefixCacheQueries: 2 * length, prefixCacheHits: hits });
  });

  it('without prefix caching nothing is looked up: no hit, no query', () => {
    const core = makeCore({ blockSize: 16 });
    core.add(request('first', 128, 1));
    core.add(request('second', 128, 1));
    drain(core, 0);
    expect(core.engineStats()).toMatchObject({ prefixCacheQueries: 0, prefixCacheHits: 0 });
  });

  it('a prompt found whole in the cache still needs budget for its last block: it waits for the next pass', () => {
    const core = cachingCore({ maxNumBatchedTokens: 16 });
    core.add(request('first', 128, 1));
    const now = drain(core, 0);
    core.add(request('other', 16, 1, 5000));
    core.add(request('second', 128, 1));
    const full = core.executePass(now);
    expect(full.admitted).toEqual([{ id: 'other', cachedTokens: 0 }]);
    expect(core.waitingIds()).toEqual(['second']);
    const next = core.executePass(full.endMs);
    expect(next.admitted).toEqual([{ id: 'second', cachedTokens: 112 }]);
    expect(next.promptTokens).toBe(16);
  });

  it('a decode whose prompt is cached here pulls the rest (the last block) and recomputes the last prompt token', () => {
    // 1 MB per token over 1 GB/s: 1 ms per pulled token.
    const core = cachingCore({ kvTransfer: { bytesPerToken: 1_000_000, bandwidthGBps: 1 } });
    core.add(request('local', 128, 1));
    const now = drain(core, 0);
    core.add({ ...request('decode', 128, 2), remotePrefill: true });
    const admitted = core.executePass(now);
    expect(admitted.admitted).toEqual([{ id: 'decode', cachedTokens: 112 }]);
    expect(admitted.wakeAtMs).toBe(now + 16);
    expect(core.view('decode')).toMatchObject({ status: 'waiting_for_remote_kvs', numComputedTokens: 127, numAllocatedTokens: 128 });
    const landed = core.executePass(now + 16);
    expect(landed).toMatchObject({ prefillMs: 0, scheduledTokens: 1, promptTokens: 1, tokens: [{ id: 'decode', generated: 1, completed: false }] });
    drain(core, landed.endMs);
    expect(core.engineStats().activeBlocks).toBe(0);
  });

  it('a prefill engine follows the rule too, and still holds the whole prompt for the remote decode', () => {
    const core = cachingCore({ workerType: 'prefill' });
    core.add({ ...request('p1', 128, 1), holdBlocksOnFinish: true });
    const now = drain(core, 0);
    core.add({ ...request('p2', 128, 1), holdBlocksOnFinish: true });
    const pass = core.executePass(now);
    expect(pass.admitted).toEqual([{ id: 'p2', cachedTokens: 112 }]);
    expect(pass.promptTokens).toBe(16);
    expect(pass.prefillMs).toBeCloseTo(prefillPolynomialMs(16), 9);
    expect(pass.tokens).toEqual([{ id: 'p2', generated: 1, completed: true }]);
    expect(core.heldBlocks('p2')).toBe(8);
    expect(core.releaseHeld('p1') && core.releaseHeld('p2')).toBe(true);
    expect(core.engineStats().activeBlocks).toBe(0);
  });
});
