/**
 * The SGLang-flavour core and its radix cache against Dynamo's SGLang scenarios (engine-reference §9.2 items
 * 23–29 and the SGLang parts of 18–19; `scheduler/sglang/tests.rs`, `cache/radix_cache.rs`,
 * `kv_manager/sglang_backend.rs`), restated through this core's API with the same asserted outcomes, plus
 * prefix reuse, LRU eviction order and what a retracted request keeps. Expected numbers are worked out by
 * hand from the algorithm in engine-reference §2 (comments show the arithmetic).
 */
import { describe, expect, it } from 'vitest';
import type { EngineCore } from '../../src/engine/core.js';
import type { CacheEvent, CoreRequest, PassResult } from '../../src/engine/contract.js';
import { chainHash, contentHash } from '../../src/engine/kv/fastHash.js';
import { eventBlockHash, hashBlockTokens, noneHash } from '../../src/engine/kv/vllmBlockHash.js';
import { runOffline } from '../../src/engine/offlineDriver.js';
import { polynomialPerfModel } from '../../src/engine/perf/perfModel.js';
import { SglangCore, type SglangSchedulerConfig } from '../../src/engine/sglang/core.js';
import { lpmOrder } from '../../src/engine/sglang/policy.js';
import { RadixCache, TokenPool } from '../../src/engine/sglang/radixCache.js';
import { SglangRequest } from '../../src/engine/sglang/request.js';
import { modelTiming, zeroTiming } from '../../src/engine/timingModels.js';
import { SGLANG_SERVER_DEFAULTS } from '../support/schedulerDefaults.js';

function makeCore(overrides: Partial<SglangSchedulerConfig> = {}): SglangCore {
  return new SglangCore({
    ...SGLANG_SERVER_DEFAULTS,
    numGpuBlocks: 16384,
    enablePrefixCaching: true,
    timing: modelTiming(polynomialPerfModel, 0, 1),
    seed: 7,
    ...overrides,
  });
}

const range = (n: number, from = 1) => Array.from({ length: n }, (_, i) => from + i);
const request = (id: string, prompt: number[], maxOutputTokens: number, extra: Partial<CoreRequest> = {}): CoreRequest => ({
  id,
  promptTokenIds: prompt,
  maxOutputTokens,
  ...extra,
});
/** A request whose first token is held back (captured timing): the state right after its admission stays put. */
const heldRequest = (id: string, prompt: number[], maxOutputTokens: number) => request(id, prompt, maxOutputTokens, { notBeforeMs: [1e12] });
/** runOffline is typed for EngineCore until the drivers take a shared interface; this core has the same public contract. */
const asDriven = (core: SglangCore) => core as unknown as EngineCore;

const u32 = (xs: number[]) => Uint32Array.from(xs);
/** Takes `n` slots from the cache's pool, as a request's prefill would. */
function take(cache: RadixCache, n: number): Int32Array {
  const slots = new Int32Array(n);
  expect(cache.pool.allocate(slots, 0, n)).toBe(true);
  return slots;
}
const insert = (cache: RadixCache, tokens: number[], slots = take(cache, tokens.length)) => {
  cache.insert(cache.root, u32(tokens), tokens.length, slots);
  return slots;
};
const matched = (cache: RadixCache, tokens: number[]) => cache.matchPrefix(u32(tokens), tokens.length).depth;

/** A router's view of one worker, built from cache events; refuses what a real index would flag as invalid. */
class EventIndex {
  readonly blocks = new Set<number>();
  stored = 0;
  removed = 0;

  apply(events: readonly CacheEvent[]): void {
    for (const event of events) {
      if (event.kind === 'cleared') this.blocks.clear();
      else if (event.kind === 'stored') {
        if (event.parent !== null && !this.blocks.has(event.parent)) throw new Error(`stored under unknown parent ${event.parent}`);
        for (const block of event.blocks) {
          if (this.blocks.has(block)) throw new Error(`block ${block} stored twice`);
          this.blocks.add(block);
          this.stored++;
        }
      } else {
        for (const block of event.blocks) {
          if (!this.blocks.delete(block)) throw new Error(`removal of unknown block ${block}`);
          this.removed++;
        }
      }
    }
  }
}

/** Every page hash the tree holds. */
function treePages(cache: RadixCache): Set<number> {
  const pages = new Set<number>();
  cache.forEachNode((node) => node.pageHashes!.forEach((h) => pages.add(h)));
  return pages;
}

/** The router's chained block hashes of `tokens` in pages (the oracle for cache events). */
function pageChain(tokens: number[], page: number, parent: number | null = null): number[] {
  const out: number[] = [];
  let hash = parent;
  for (let i = 0; i + page <= tokens.length; i += page) {
    hash = chainHash(hash, contentHash(tokens, i, i + page));
    out.push(hash);
  }
  return out;
}

describe('§9.2 item 29: radix cache (cache/radix_cache.rs, kv_manager/sglang_backend.rs)', () => {
  it('token pool: allocation is all or nothing, freeing returns slots', () => {
    const pool = new TokenPool(10);
    const a = new Int32Array(3);
    const b = new Int32Array(7);
    expect(pool.allocate(a, 0, 3)).toBe(true);
    expect(pool.available).toBe(7);
    expect(pool.allocate(b, 0, 7)).toBe(true);
    expect(pool.available).toBe(0);
    expect(pool.allocate(new Int32Array(1), 0, 1)).toBe(false);
    pool.release(a, 0, 3);
    expect(pool.available).toBe(3);
    pool.release(b, 0, 7);
    expect(pool.available).toBe(10);
    expect(new Set([...a, ...b]).size).toBe(10);
    expect(() => pool.release(a, 0, 1)).toThrow(/double free/);
  });

  it('OOM: a pool of 3 holding [1,2,3] has nothing for [4,5,6], and takes nothing', () => {
    const pool = new TokenPool(3);
    expect(pool.allocate(new Int32Array(3), 0, 3)).toBe(true);
    const into = new Int32Array([-1, -1, -1]);
    expect(pool.allocate(into, 0, 3)).toBe(false);
    expect([...into]).toEqual([-1, -1, -1]);
  });

  it('match_prefix: empty tree, full match, partial match ending on a node boundary', () => {
    const cache = new RadixCache(100, 1);
    const empty = cache.matchPrefix(u32([1, 2, 3]), 3);
    expect(empty).toBe(cache.root);
    expect(empty.depth).toBe(0);
    const first = insert(cache, [1, 2, 3, 4, 5]);
    expect(matched(cache, [1, 2, 3, 4, 5])).toBe(5);
    const tail = take(cache, 2);
    insert(cache, [1, 2, 3, 4, 5, 6, 7], Int32Array.from([...first, ...tail]));
    const node = cache.matchPrefix(u32([1, 2, 3, 4, 5, 9, 9]), 7);
    expect(node.depth).toBe(5);
    expect([...node.key]).toEqual([1, 2, 3, 4, 5]);
    expect([...node.value]).toEqual([...first]);
    const suffix = node.onlyChild!;
    expect([...suffix.key]).toEqual([6, 7]);
    expect([...suffix.value]).toEqual([...tail]);
  });

  it('insert: a shared prefix splits the tree; extending, repeating and matching-then-inserting', () => {
    const cache = new RadixCache(100, 1);
    const a = insert(cache, [1, 2, 3, 4, 5]);
    insert(cache, [1, 2, 3, 6, 7], Int32Array.from([...a.subarray(0, 3), ...take(cache, 2)]));
    expect(matched(cache, [1, 2, 3, 4, 5])).toBe(5);
    expect(matched(cache, [1, 2, 3, 6, 7])).toBe(5);
    expect(matched(cache, [1, 2, 3, 9])).toBe(3);

    const extended = new RadixCache(100, 1);
    const head = insert(extended, [1, 2, 3]);
    insert(extended, [1, 2, 3, 4, 5], Int32Array.from([...head, ...take(extended, 2)]));
    expect(matched(extended, [1, 2, 3, 4, 5])).toBe(5);
    // The same tokens with the same slots again: nothing changes.
    const before = [extended.evictableSize, extended.pool.available];
    insert(extended, [1, 2, 3], head);
    expect([extended.evictableSize, extended.pool.available]).toEqual(before);

    const suffix = new RadixCache(100, 1);
    const five = insert(suffix, [1, 2, 3, 4, 5]);
    expect(matched(suffix, [1, 2, 3, 4, 5, 6, 7, 8])).toBe(5);
    insert(suffix, [1, 2, 3, 4, 5, 6, 7, 8], Int32Array.from([...five, ...take(suffix, 3)]));
    expect(matched(suffix, [1, 2, 3, 4, 5, 6, 7, 8])).toBe(8);
  });

  it("insert: tokens already in the tree give their duplicate slots back and take the tree's (sglang; Dynamo leaks them)", () => {
    const cache = new RadixCache(20, 1);
    const tree = insert(cache, [1, 2, 3, 4]);
    const mine = take(cache, 6);
    const duplicates = [...mine.subarray(0, 4)];
    expect(cache.pool.available).toBe(10);
    cache.insert(cache.root, u32([1, 2, 3, 4, 5, 6]), 6, mine);
    expect([...mine.subarray(0, 4)]).toEqual([...tree]);
    expect(cache.pool.available).toBe(14);
    expect([...cache.pool.freeSlots()]).toEqual(expect.arrayContaining(duplicates));
    expect(cache.treeTokens).toBe(6);
  });

  it('page size 4: whole pages only, children told apart by their first page, splits keep their slots', () => {
    const cache = new RadixCache(100, 4);
    expect(cache.totalTokens).toBe(100);
    const slots = insert(cache, [1, 2, 3, 4, 5, 6, 7]);
    expect(matched(cache, [1, 2, 3, 4])).toBe(4);
    expect([...cache.matchPrefix(u32([1, 2, 3, 4]), 4).value]).toEqual([...slots.subarray(0, 4)]);
    // The 3 tokens past the last whole page were not inserted.
    expect(cache.treeTokens).toBe(4);
    insert(cache, [1, 2, 3, 4, 5, 6, 7, 8], Int32Array.from([...slots.subarray(0, 4), ...take(cache, 4)]));
    expect(matched(cache, [1, 2, 3, 4, 5, 6, 7, 8])).toBe(8);

    const siblings = new RadixCache(100, 4);
    insert(siblings, [1, 2, 3, 4]);
    insert(siblings, [1, 2, 3, 5]);
    expect(matched(siblings, [1, 2, 3, 4])).toBe(4);
    expect(matched(siblings, [1, 2, 3, 5])).toBe(4);
    expect(matched(siblings, [1, 2, 3, 6])).toBe(0);

    const split = new RadixCache(100, 4);
    const eight = insert(split, [1, 2, 3, 4, 5, 6, 7, 8]);
    expect(matched(split, [1, 2, 3, 4, 9, 9, 9, 9])).toBe(4);
    expect([...split.matchPrefix(u32([1, 2, 3, 4]), 4).value]).toEqual([...eight.subarray(0, 4)]);
    expect(matched(split, [1, 2, 3, 4, 5, 6, 7, 8])).toBe(8);
  });

  it('lock refs: two requests sharing [1,2,3] protect 7 tokens; unlocking both makes all 7 evictable', () => {
    const cache = new RadixCache(100, 1);
    const a = insert(cache, [1, 2, 3, 4, 5]);
    insert(cache, [1, 2, 3, 6, 7], Int32Array.from([...a.subarray(0, 3), ...take(cache, 2)]));
    const nodeA = cache.matchPrefix(u32([1, 2, 3, 4, 5]), 5);
    const nodeB = cache.matchPrefix(u32([1, 2, 3, 6, 7]), 5);
    cache.lock(nodeA);
    cache.lock(nodeB);
    // [1,2,3] + [4,5] + [6,7].
    expect(cache.protectedSize).toBe(7);
    expect(cache.evictableSize).toBe(0);
    cache.unlock(nodeA);
    expect([cache.protectedSize, cache.evictableSize]).toEqual([5, 2]);
    cache.unlock(nodeB);
    expect([cache.protectedSize, cache.evictableSize]).toEqual([0, 7]);
    expect(() => cache.unlock(nodeB)).toThrow(/no request holds/);
  });

  it('evict: the least recently used leaf goes first, its slots back to the pool (an access counter, no clock)', () => {
    const cache = new RadixCache(100, 1);
    const first = insert(cache, [1, 2, 3]);
    const firstNode = cache.matchPrefix(u32([1, 2, 3]), 3);
    cache.lock(firstNode);
    cache.unlock(firstNode);
    insert(cache, [4, 5, 6]);
    const secondNode = cache.matchPrefix(u32([4, 5, 6]), 3);
    cache.lock(secondNode);
    cache.unlock(secondNode);
    expect(cache.evict(3)).toBe(3);
    expect([...cache.pool.freeSlots()].slice(-3).sort()).toEqual([...first].sort());
    expect(matched(cache, [1, 2, 3])).toBe(0);
    expect(matched(cache, [4, 5, 6])).toBe(3);

    // Access, not insertion, decides: [7,8,9] was inserted first but read last.
    const touched = new RadixCache(100, 1);
    insert(touched, [7, 8, 9]);
    insert(touched, [4, 5, 6]);
    expect(matched(touched, [7, 8, 9])).toBe(3);
    touched.evict(1);
    expect(matched(touched, [4, 5, 6])).toBe(0);
    expect(matched(touched, [7, 8, 9])).toBe(3);
  });

  it('evict: locked nodes are never evicted (evict(6) frees only the 3 unlocked tokens)', () => {
    const cache = new RadixCache(100, 1);
    insert(cache, [1, 2, 3]);
    const unlocked = insert(cache, [4, 5, 6]);
    cache.lock(cache.matchPrefix(u32([1, 2, 3]), 3));
    expect(cache.evict(6)).toBe(3);
    expect([...cache.pool.freeSlots()].slice(-3).sort()).toEqual([...unlocked].sort());
    expect(matched(cache, [1, 2, 3])).toBe(3);
    expect([cache.evictableSize, cache.protectedSize]).toEqual([0, 3]);
  });

  it('evict: leaves before their parents, least recently used first; a parent left childless is a leaf in turn', () => {
    const cache = new RadixCache(100, 1);
    insert(cache, [1, 2, 3, 4]); // x
    insert(cache, [1, 2, 5, 6]); // y: splits [1,2] off
    insert(cache, [7, 8]); // c
    expect(matched(cache, [1, 2, 3, 4])).toBe(4); // x and [1,2] read last
    const lengths = () =>
      [
        [1, 2, 3, 4],
        [1, 2, 5, 6],
        [7, 8],
      ].map((t) => cache.prefixMatchLength(u32(t), t.length));
    const steps: number[][] = [];
    for (let i = 0; i < 4; i++) {
      cache.evict(1);
      steps.push(lengths());
    }
    // y's leaf (the oldest), then c, then x's leaf, then the shared [1,2] once childless.
    expect(steps).toEqual([
      [4, 2, 2],
      [4, 2, 0],
      [2, 2, 0],
      [0, 0, 0],
    ]);
    expect(cache.pool.available).toBe(100);
  });
});

describe('§9.2 items 23–28: the SGLang scheduler', () => {
  it('23: chunking is page-aware: a 6-token prompt at page 4, chunk 8, materializes 6 and reserves 8', () => {
    const core = makeCore({ pageSize: 4, chunkedPrefillSize: 8, timing: zeroTiming(true) });
    core.add(heldRequest('r', [1, 1, 1, 1, 1, 1], 3));
    core.executePass(0);
    expect(core.view('r')).toMatchObject({ status: 'running', numComputedTokens: 6, numAllocatedTokens: 8 });
  });

  it('23: a sub-page budget defers the next request: prompts of 7 and 8 tokens, chunk 8 — only the first runs', () => {
    const core = makeCore({ pageSize: 4, chunkedPrefillSize: 8, timing: zeroTiming(true) });
    core.add(heldRequest('first', [1, 1, 1, 1, 1, 1, 1], 3));
    core.add(heldRequest('second', [2, 2, 2, 2, 2, 2, 2, 2], 3));
    const pass = core.executePass(0);
    // The first is charged ceil(7/4)*4 = 8, the whole chunk budget.
    expect(pass.admitted.map((a) => a.id)).toEqual(['first']);
    expect(core.waitingIds()).toEqual(['second']);
  });

  it('24: decode allocation is page-aware: a 6-token prompt at page 4 reserves 8, 8, then 12 after decode steps 1–3', () => {
    const core = makeCore({ pageSize: 4 });
    core.add(request('r', range(6), 4));
    const allocated: number[] = [];
    for (let t = 0; t < 3; t++) {
      core.executePass(t);
      allocated.push(core.view('r')!.numAllocatedTokens);
    }
    expect(allocated).toEqual([8, 8, 12]);
    expect(core.view('r')!.generated).toBe(3);
  });

  it('25: decode_speedup_ratio scales the decode time: speedup 2 with decode speedup 1 vs 4 → a 4× decode time', () => {
    const pass = (decodeSpeedup: number) => {
      const core = makeCore({ pageSize: 4, timing: modelTiming(polynomialPerfModel, 2, decodeSpeedup) });
      core.add(request('r', [1, 2, 3, 4], 4));
      return core.executePass(0);
    };
    const base = pass(1);
    const fast = pass(4);
    expect(base.decodeMs).toBeGreaterThan(fast.decodeMs);
    expect(base.decodeMs / fast.decodeMs).toBeCloseTo(4, 3);
    expect(base.prefillMs).toBe(fast.prefillMs);
  });

  /**
   * Pool 16 tokens at page 1, clip 1 (each admission reserves one output token): A (4 + 5) runs from pass 1,
   * B (4 + 10) from pass 2. Free slots after passes 1–4: 11, 5, 3, 1. In pass 5 the two running requests need
   * 2 slots and only 1 is free: B, with 3 outputs to A's 4, is retracted.
   */
  function retractionScenario() {
    const core = makeCore({ numGpuBlocks: 16, pageSize: 1, clipMaxNewTokens: 1 });
    core.add(request('A', [1, 2, 3, 4], 5));
    const passes: PassResult[] = [core.executePass(0)];
    core.add(request('B', [9, 8, 7, 6], 10));
    for (let t = 1; t < 5; t++) passes.push(core.executePass(t));
    return { core, passes };
  }

  it('26: retraction takes the running request with the fewest outputs, which keeps its outputs and gives back its KV', () => {
    const { core, passes } = retractionScenario();
    expect(passes.slice(0, 4).map((p) => p.preempted)).toEqual([[], [], [], []]);
    expect(passes[4].preempted).toEqual(['B']);
    expect(core.view('B')).toEqual({ status: 'preempted', numComputedTokens: 0, numAllocatedTokens: 0, generated: 3, length: 7, numPreemptions: 1 });
    // A got its 5th and last token in that pass.
    expect(passes[4].tokens).toEqual([{ id: 'A', generated: 5, completed: true }]);
    expect(core.engineStats().preemptions).toBe(1);
    expect(core.kvAudit()).toEqual([]);
    // §2.3 step 6: a retraction resets new_token_ratio to its initial 0.7 before this pass's decay.
    expect(core.newTokenRatio).toBeCloseTo(0.7 - (0.7 - 0.098) / 600, 12);
  });

  it('a retracted request keeps its cached prefix: it comes back with all but its last token cached, and its next output is its 4th', () => {
    const { core } = retractionScenario();
    // B's 7 tokens stayed in the tree (unlocked); it matches at most length - 1 = 6 of them, recomputes 1.
    const pass = core.executePass(5);
    expect(pass.admitted).toEqual([{ id: 'B', cachedTokens: 6 }]);
    expect(pass.promptTokens).toBe(0);
    expect(pass.tokens).toEqual([{ id: 'B', generated: 4, completed: false }]);
    expect(core.kvAudit()).toEqual([]);
  });

  it('27: LPM puts the request whose current sequence (prompt + outputs) matches the cache first', () => {
    const cache = new RadixCache(1000, 1);
    insert(cache, [1, 2, 3, 4, 5]);
    const noMatch = new SglangRequest({ id: 'no-match', promptTokenIds: [9, 8, 7], maxOutputTokens: 1 });
    const match = new SglangRequest({ id: 'match', promptTokenIds: [1, 2, 3, 4, 5], maxOutputTokens: 3 });
    match.appendOutput(6);
    match.appendOutput(7);
    expect(lpmOrder(new Set([noMatch, match]), cache, 1)!.map((r) => r.id)).toEqual(['match', 'no-match']);
  });

  it('27: LPM deprioritizes duplicate short prefixes: 33 identical 32-token prompts and a unique one → the unique one is second', () => {
    const waiting = new Set<SglangRequest>();
    for (let i = 0; i < 33; i++) waiting.add(new SglangRequest({ id: `dup${i}`, promptTokenIds: range(32, 0), maxOutputTokens: 1 }));
    waiting.add(new SglangRequest({ id: 'unique', promptTokenIds: range(32, 100), maxOutputTokens: 1 }));
    const order = lpmOrder(waiting, new RadixCache(1000, 1), 1)!.map((r) => r.id);
    expect(order.indexOf('unique')).toBe(1);
    expect(order[0]).toBe('dup0');
  });

  it('LPM keeps the queue as it is above 128 waiting requests', () => {
    const waiting = new Set(range(129).map((i) => new SglangRequest({ id: `r${i}`, promptTokenIds: [i], maxOutputTokens: 1 })));
    expect(lpmOrder(waiting, null, 1)).toBeNull();
  });

  it('LPM in the scheduler: with [1..40] cached, a later request sharing it is admitted before an earlier one that does not', () => {
    // max_prefill_tokens and the chunk are 16: the sharer (1 token left to compute) and then the other (16)
    // do not both fit; in FIFO order the other goes first and fills the chunk.
    const admittedFirst = (schedulePolicy: 'fifo' | 'lpm') => {
      const core = makeCore({ pageSize: 1, schedulePolicy, timing: zeroTiming(true), maxPrefillTokens: 16, chunkedPrefillSize: 16 });
      core.add(request('warm', range(40), 1));
      for (let t = 0; t < 3; t++) core.executePass(t);
      expect(core.isIdle).toBe(true);
      core.add(heldRequest('other', range(16, 500), 2));
      core.add(heldRequest('sharer', [...range(40), 77], 2));
      return core.executePass(3).admitted;
    };
    expect(admittedFirst('lpm')).toEqual([{ id: 'sharer', cachedTokens: 40 }]);
    expect(admittedFirst('fifo')).toEqual([{ id: 'other', cachedTokens: 0 }]);
  });

  it('28: active_decode_blocks counts used slots plus partly filled pages: 32 blocks × 4, a 6-token prompt → 2 after one pass', () => {
    const core = makeCore({ numGpuBlocks: 32, pageSize: 4, chunkedPrefillSize: 8 });
    core.add(request('r', [1, 1, 1, 1, 1, 1], 2));
    const pass = core.executePass(0);
    expect(pass.tokens).toEqual([{ id: 'r', generated: 1, completed: false }]);
    // 7 slots used (6 prompt + 1 output), 8 reserved: ceil(8 / 4).
    expect(core.activeDecodeBlocks).toBe(2);
  });

  it('an unfinished decode request caches its page-aligned prefix after an output (and keeps it locked)', () => {
    const core = makeCore({ numGpuBlocks: 16, pageSize: 4 });
    core.add(request('r', [1, 2, 3, 4], 4));
    core.executePass(0);
    expect(core.cache.prefixMatchLength(u32([1, 2, 3, 4]), 4)).toBe(4);
    expect(core.cache.protectedSize).toBe(4);
  });
});

describe('§9.2 item 29 (kv_manager/sglang_backend.rs) through the scheduler', () => {
  it('a miss takes one slot per prompt token: 5 tokens of a 100-token pool leave 95', () => {
    const core = makeCore({ numGpuBlocks: 100, pageSize: 1, timing: zeroTiming(true) });
    core.add(heldRequest('r', range(5), 1));
    const pass = core.executePass(0);
    expect(pass.admitted).toEqual([{ id: 'r', cachedTokens: 0 }]);
    expect(core.cache.availableTokens).toBe(95);
  });

  it('after [1..5] is cached, [1..7] matches 5 tokens and takes 2 slots', () => {
    const core = makeCore({ numGpuBlocks: 100, pageSize: 1, timing: zeroTiming(true) });
    core.add(request('first', range(5), 1, { outputTokenIds: [99] }));
    core.executePass(0);
    // The finished [1..5, 99] stays cached: 94 free.
    expect([core.cache.availableTokens, core.cache.evictableSize]).toEqual([94, 6]);
    core.add(heldRequest('second', range(7), 1));
    const pass = core.executePass(1);
    expect(pass.admitted).toEqual([{ id: 'second', cachedTokens: 5 }]);
    expect(core.cache.availableTokens).toBe(92);
    expect(core.kvAudit()).toEqual([]);
  });

  it('duplicate pages are stored once and removed once: two identical requests prefilled together', () => {
    const core = makeCore({ numGpuBlocks: 100, pageSize: 1, cacheEvents: true });
    core.add(request('a', [1, 2, 3], 1, { outputTokenIds: [7] }));
    core.add(request('b', [1, 2, 3], 1, { outputTokenIds: [7] }));
    const pass = core.executePass(0);
    expect(pass.admitted).toEqual([
      { id: 'a', cachedTokens: 0 },
      { id: 'b', cachedTokens: 0 },
    ]);
    const stored = core.takeCacheEvents();
    expect(stored).toEqual([{ kind: 'stored', blocks: pageChain([1, 2, 3, 7], 1), parent: null }]);
    // b's duplicate slots went back: only the 4 cached remain taken.
    expect(core.cache.availableTokens).toBe(96);
    core.cache.evict(100);
    expect(core.takeCacheEvents()).toEqual([{ kind: 'removed', blocks: pageChain([1, 2, 3, 7], 1) }]);
  });

  it("chunked prefill: the second chunk's stored pages chain from the first chunk's last page and hold only new pages", () => {
    const core = makeCore({ numGpuBlocks: 32, pageSize: 1, chunkedPrefillSize: 3, maxPrefillTokens: 3, cacheEvents: true });
    const prompt = [11, 22, 33, 44, 55, 66];
    core.add(request('r', prompt, 2, { outputTokenIds: [77, 88] }));
    const first = core.executePass(0);
    expect(first.tokens).toEqual([]);
    expect(core.takeCacheEvents()).toEqual([{ kind: 'stored', blocks: pageChain([11, 22, 33], 1), parent: null }]);
    const second = core.executePass(first.endMs);
    expect(second.tokens).toEqual([{ id: 'r', generated: 1, completed: false }]);
    const [event] = core.takeCacheEvents();
    const chunk1Last = pageChain([11, 22, 33], 1)[2];
    // Pages enter the tree after the pass's decode: the rest of the prompt and the first output.
    expect(event).toEqual({ kind: 'stored', blocks: pageChain([44, 55, 66, 77], 1, chunk1Last), parent: chunk1Last });
  });
});

describe('§9.2 item 18: KV events (pass-end visibility, consistency)', () => {
  it("SGLang's events become visible at the end of a pass", () => {
    expect(makeCore().kvEventVisibility).toBe('pass-end');
  });

  const scenarios: [string, Partial<SglangSchedulerConfig>, CoreRequest[]][] = [
    ['chunked prefill (page 4, chunk 4)', { numGpuBlocks: 32, pageSize: 4, chunkedPrefillSize: 4, maxPrefillTokens: 4 }, [request('r', [1, 2, 3, 4, 5, 6], 2)]],
    ['decode growth (page 4, chunk 16)', { numGpuBlocks: 32, pageSize: 4, chunkedPrefillSize: 16 }, [request('r', [7, 8, 9, 10], 5)]],
    ['completion tail free (page 4)', { numGpuBlocks: 32, pageSize: 4, chunkedPrefillSize: 16 }, [request('r', [11, 12, 13, 14], 3)]],
    [
      'retraction under pressure (page 4, 3 blocks)',
      { numGpuBlocks: 3, pageSize: 4, chunkedPrefillSize: 4, maxPrefillTokens: 4, clipMaxNewTokens: 1 },
      [request('a', [1, 2, 3, 4], 6), request('b', [9, 8, 7, 6], 6)],
    ],
    [
      'pathological load (4 blocks × 4, chunk 4, 8 × [42] with 4 outputs)',
      { numGpuBlocks: 4, pageSize: 4, chunkedPrefillSize: 4, maxPrefillTokens: 4 },
      range(8).map((i) => request(`r${i}`, [42], 4)),
    ],
  ];

  it.each(scenarios)('%s: every event applies cleanly to a router index, which ends up holding exactly the tree', (_name, config, requests) => {
    const core = makeCore({ ...config, cacheEvents: true, timing: modelTiming(polynomialPerfModel, 1000, 1) });
    const index = new EventIndex();
    const result = runOffline(
      asDriven(core),
      requests.map((r) => ({ request: r, arrivalMs: 0 })),
      () => {
        index.apply(core.takeCacheEvents());
        expect(index.blocks).toEqual(treePages(core.cache));
        expect(core.kvAudit()).toEqual([]);
      },
    );
    for (const r of requests) expect(result.records.get(r.id)!.tokenTimesMs).toHaveLength(r.maxOutputTokens);
    expect(index.stored).toBeGreaterThan(0);
    expect(core.isIdle).toBe(true);
  });

  it('pathological load evicts: removals reach the index', () => {
    const core = makeCore({ numGpuBlocks: 4, pageSize: 4, chunkedPrefillSize: 4, maxPrefillTokens: 4, cacheEvents: true });
    const index = new EventIndex();
    const result = runOffline(
      asDriven(core),
      range(8).map((i) => ({ request: request(`r${i}`, [42], 4), arrivalMs: 0 })),
      () => index.apply(core.takeCacheEvents()),
    );
    expect([...result.records.values()].reduce((n, r) => n + r.tokenTimesMs.length, 0)).toBe(32);
    expect(index.removed).toBeGreaterThan(0);
  });

  it("vLLM-wire events: one hash per page, vLLM's chained digests, removed on eviction, and the cached set agrees", () => {
    const options = { algo: 'sha256_cbor' as const, hashSeed: 'test-seed' };
    const core = makeCore({ numGpuBlocks: 32, pageSize: 4, kvEvents: options });
    core.add(request('r', range(8), 1, { outputTokenIds: [9] }));
    core.executePass(0);
    const none = noneHash(options.hashSeed, options.algo);
    const first = hashBlockTokens(null, none, [1, 2, 3, 4], null, options.algo);
    const second = hashBlockTokens(first, none, [5, 6, 7, 8], null, options.algo);
    const hashes = [eventBlockHash(first), eventBlockHash(second)];
    // The finished 9-token sequence caches its 2 whole pages.
    expect(core.takeKvEvents()).toEqual([{ type: 'BlockStored', blockHashes: hashes, parentBlockHash: null, tokenIds: range(8), blockSize: 4, lora: null }]);
    expect(core.cachedBlockEventHashes().sort()).toEqual([...hashes].sort());
    core.cache.evict(8);
    expect(core.takeKvEvents()).toEqual([{ type: 'BlockRemoved', blockHashes: hashes }]);
    expect(core.cachedBlockEventHashes()).toEqual([]);
  });
});

describe('§9.2 item 19: token generation matrix (shared prefix × policy × page size)', () => {
  const cases = [false, true].flatMap((shared) => (['fifo', 'lpm'] as const).flatMap((policy) => [1, 4].map((page) => [shared, policy, page] as const)));
  it.each(cases)(
    'shared %s, %s, page %i: 200 requests × 1,000 tokens × 100 outputs give exactly 20,000 tokens and leave nothing held',
    (shared, policy, page) => {
      const core = makeCore({ numGpuBlocks: 32000 / page, pageSize: page, schedulePolicy: policy, timing: modelTiming(polynomialPerfModel, 1000, 1) });
      const requests = range(200, 0).map((i) => {
        const prefix = shared ? Array<number>(500).fill(1) : [];
        const unique = range(1000 - prefix.length, i * (1000 - prefix.length) + 1000);
        return { request: request(`r${i}`, [...prefix, ...unique], 100), arrivalMs: 0 };
      });
      const result = runOffline(asDriven(core), requests);
      expect([...result.records.values()].reduce((n, r) => n + r.tokenTimesMs.length, 0)).toBe(20_000);
      expect(core.isIdle).toBe(true);
      expect(core.engineStats()).toMatchObject({ running: 0, waiting: 0, activeBlocks: 0 });
      expect(core.cache.protectedSize).toBe(0);
      expect(core.kvAudit()).toEqual([]);
    },
  );

  it('FIFO: five 10-token requests (page 64) are admitted in arrival order and each gets its 3 tokens', () => {
    const core = makeCore({ numGpuBlocks: 100, pageSize: 64, timing: modelTiming(polynomialPerfModel, 100, 1) });
    const admitted: string[] = [];
    const result = runOffline(
      asDriven(core),
      range(5, 0).map((i) => ({ request: request(`r${i}`, Array<number>(10).fill(i), 3), arrivalMs: 0 })),
      (pass) => admitted.push(...pass.admitted.map((a) => a.id)),
    );
    expect(admitted).toEqual(['r0', 'r1', 'r2', 'r3', 'r4']);
    for (const record of result.records.values()) expect(record.tokenTimesMs).toHaveLength(3);
  });
});

describe('admission, chunks and timing', () => {
  it('a prompt prefills and emits its first token in one pass (prompt tokens 8, scheduled 8 + 1)', () => {
    const core = makeCore({ numGpuBlocks: 16, pageSize: 4, chunkedPrefillSize: 16 });
    core.add(request('r', range(8, 0), 1));
    const pass = core.executePass(0);
    expect(pass).toMatchObject({ promptTokens: 8, scheduledTokens: 9, tokens: [{ id: 'r', generated: 1, completed: true }] });
    expect(pass.prefillMs).toBeGreaterThan(0);
    expect(pass.endMs).toBe(pass.prefillMs + pass.decodeMs);
  });

  it('a chunked 16-token prompt (chunk 8) prefills 8 tokens per pass; its token comes with the last chunk', () => {
    const core = makeCore({ numGpuBlocks: 32, pageSize: 4, chunkedPrefillSize: 8, maxPrefillTokens: 32 });
    core.add(request('r', range(16, 0), 2));
    const first = core.executePass(0);
    expect([first.promptTokens, first.tokens.length]).toEqual([8, 0]);
    expect(core.runningIds()).toEqual(['r']);
    const second = core.executePass(first.endMs);
    expect([second.promptTokens, second.tokens.length]).toEqual([8, 1]);
    expect(first.admitted).toEqual([{ id: 'r', cachedTokens: 0 }]);
    // A continuation chunk is not a new admission.
    expect(second.admitted).toEqual([]);
  });

  it('a request arriving while another decodes is prefilled and decoded in the same pass as the other decodes', () => {
    const core = makeCore({ numGpuBlocks: 16, pageSize: 4, chunkedPrefillSize: 16 });
    core.add(request('r1', range(4, 0), 3));
    core.executePass(0);
    core.add(request('r2', range(4, 100), 3));
    const pass = core.executePass(1);
    expect(pass.promptTokens).toBe(4);
    expect(pass.tokens.map((t) => [t.id, t.generated])).toEqual([
      ['r1', 2],
      ['r2', 1],
    ]);
  });

  it('the new_token_ratio reservation holds back a request that the running one might crowd out', () => {
    // Pool 100 (page 1). A (10 + 80) runs from pass 1 and holds 11 slots. In pass 2 it reserves its 79
    // remaining outputs × ratio (0.7 − 0.602/600 = 0.698997) = 55.2 tokens: 89 − 55.2 = 33.8 left, and B
    // needs 20 + 20 = 40. Without conservativeness nothing is reserved and B fits.
    const admittedInPass2 = (scheduleConservativeness: number) => {
      const core = makeCore({ numGpuBlocks: 100, pageSize: 1, scheduleConservativeness });
      core.add(request('A', range(10), 80));
      core.executePass(0);
      core.add(request('B', range(20, 100), 20));
      return core.executePass(1).admitted.map((a) => a.id);
    };
    expect(admittedInPass2(1)).toEqual([]);
    expect(admittedInPass2(0)).toEqual(['B']);
  });

  it('new_token_ratio decays from 0.7 by (0.7 − 0.098)/600 a pass down to 0.098', () => {
    const core = makeCore();
    expect(core.newTokenRatio).toBe(0.7);
    core.executePass(0);
    expect(core.newTokenRatio).toBeCloseTo(0.7 - (0.7 - 0.7 * 0.14) / 600, 12);
    for (let t = 1; t < 700; t++) core.executePass(t);
    expect(core.newTokenRatio).toBe(0.7 * 0.14);
    const half = makeCore({ scheduleConservativeness: 0.5 });
    expect(half.newTokenRatio).toBe(0.35);
  });

  it('prefix reuse across requests sharing a 40-token prefix: 40 tokens cached at page 1, 32 (two whole pages) at page 16', () => {
    const shared = range(40);
    for (const [page, expected] of [
      [1, 40],
      [16, 32],
    ]) {
      const core = makeCore({ numGpuBlocks: 64, pageSize: page });
      core.add(request('a', [...shared, ...range(10, 1001)], 2, { outputTokenIds: [5001, 5002] }));
      core.executePass(0);
      core.executePass(1);
      expect(core.isIdle).toBe(true);
      core.add(request('b', [...shared, ...range(10, 2001)], 2));
      const pass = core.executePass(2);
      expect(pass.admitted).toEqual([{ id: 'b', cachedTokens: expected }]);
      expect(pass.promptTokens).toBe(50 - expected);
      expect(core.engineStats()).toMatchObject({ prefixCacheQueries: 100, prefixCacheHits: expected });
    }
  });

  it('a whole prompt in the cache still computes its last token (sglang caps the match at length − 1)', () => {
    const core = makeCore({ pageSize: 1 });
    core.add(request('a', range(20), 1));
    core.executePass(0);
    core.add(request('b', range(20), 1));
    expect(core.executePass(1).admitted).toEqual([{ id: 'b', cachedTokens: 19 }]);
  });

  it('without prefix caching nothing is matched or kept: a finished request frees every slot', () => {
    const core = makeCore({ numGpuBlocks: 64, pageSize: 4, enablePrefixCaching: false });
    core.add(request('a', range(20), 2));
    core.executePass(0);
    core.executePass(1);
    core.add(request('b', range(20), 1));
    expect(core.executePass(2).admitted).toEqual([{ id: 'b', cachedTokens: 0 }]);
    expect(core.cache.treeTokens).toBe(0);
    expect(core.cache.availableTokens).toBe(256);
    expect(core.engineStats()).toMatchObject({ prefixCacheQueries: 0, prefixCacheHits: 0 });
  });

  it('a prefill worker emits its token at the end of the prefill, with no decode charged', () => {
    const core = makeCore({ pageSize: 4, workerType: 'prefill', timing: modelTiming(polynomialPerfModel, 1, 1) });
    core.add(request('r', range(8), 1));
    const pass = core.executePass(10);
    expect(pass.prefillMs).toBeGreaterThan(0);
    expect(pass.decodeMs).toBe(0);
    expect(pass.endMs).toBe(10 + pass.prefillMs);
    expect(pass.tokens).toEqual([{ id: 'r', generated: 1, completed: true }]);
  });

  it('a prompt pulled from a prefill engine is allocated whole (never chunked) but not computed', () => {
    const core = makeCore({ pageSize: 4, chunkedPrefillSize: 8, maxPrefillTokens: 8 });
    core.add(request('r', range(20), 2, { remotePrefill: true }));
    const pass = core.executePass(0);
    expect(pass.prefillMs).toBe(0);
    expect([pass.promptTokens, pass.scheduledTokens]).toEqual([0, 1]);
    expect(pass.tokens).toEqual([{ id: 'r', generated: 1, completed: false }]);
    expect(core.view('r')!.numComputedTokens).toBe(21);
  });
});

describe('the EngineCore contract', () => {
  it('captured output ids are the tokens generated (they end up in the cache) and captured times hold tokens back', () => {
    const core = makeCore({ pageSize: 1, timing: zeroTiming(true) });
    const result = runOffline(asDriven(core), [
      { request: request('r', range(5), 3, { outputTokenIds: [500, 501, 502], notBeforeMs: [0, 50, 100] }), arrivalMs: 0 },
    ]);
    expect(result.records.get('r')!.tokenTimesMs).toEqual([0, 50, 100]);
    const sequence = [...range(5), 500, 501, 502];
    expect(core.cache.prefixMatchLength(u32(sequence), sequence.length)).toBe(8);
  });

  it('a held-back token reports when to wake', () => {
    const core = makeCore({ timing: zeroTiming(true) });
    core.add(request('r', range(5), 2, { notBeforeMs: [0, 40] }));
    expect(core.executePass(0).tokens).toHaveLength(1);
    const pass = core.executePass(0);
    expect(pass.tokens).toEqual([]);
    expect(pass.wakeAtMs).toBe(40);
  });

  it('rejection: a request needing as many tokens as the pool holds can never be admitted', () => {
    const core = makeCore({ numGpuBlocks: 4, pageSize: 4 });
    expect(core.rejection(10, 6)).toMatch(/needs 16 KV cache tokens .* fewer than the 16 the cache holds \(4 blocks of 4\)/);
    expect(core.rejection(10, 5)).toBeNull();
    expect(core.rejection(0, 1)).toBe('the prompt is empty');
    expect(core.rejection(1, 0)).toBe('the request asks for no output tokens');
    expect(() => core.add(request('r', range(10), 6))).toThrow(/needs 16/);
    core.add(request('r', range(10), 5));
    expect(() => core.add(request('r', range(10), 5))).toThrow(/already in the engine/);
  });

  it('configuration: bad combinations are refused', () => {
    expect(() => makeCore({ pageSize: 16, chunkedPrefillSize: 24 })).toThrow(/multiple of the page size/);
    expect(() => makeCore({ maxPrefillTokens: 100, chunkedPrefillSize: 200 })).toThrow(/at least chunked_prefill_size/);
    expect(() => makeCore({ scheduleConservativeness: 2 })).toThrow(/\[0, 1\]/);
  });

  it('abort frees what the request holds; its cached prefix stays, evictable', () => {
    const core = makeCore({ numGpuBlocks: 16, pageSize: 4 });
    core.add(request('r', range(10), 5));
    core.executePass(0);
    expect(core.engineStats().activeBlocks).toBe(3);
    core.abort('r');
    expect(core.isIdle).toBe(true);
    expect(core.engineStats()).toMatchObject({ running: 0, activeBlocks: 0, inactiveBlocks: 2, freeBlocks: 14 });
    expect(core.kvAudit()).toEqual([]);
    core.abort('r');
  });

  it("engineStats maps the pool onto blocks: requests' pages active, unlocked tree pages inactive, the rest free", () => {
    const core = makeCore({ numGpuBlocks: 16, pageSize: 4 });
    core.add(request('done', range(8), 1));
    core.executePass(0);
    core.add(request('r', range(6, 100), 3));
    core.executePass(1);
    // done: 8 cached tokens, unlocked (2 pages). r: 7 slots, 4 of them cached and locked, 8 reserved → 2 pages.
    expect(core.engineStats()).toMatchObject({
      running: 1,
      waiting: 0,
      activeBlocks: 2,
      inactiveBlocks: 2,
      freeBlocks: 12,
      totalBlocks: 16,
      blockSize: 4,
      passes: 2,
    });
  });

  it('resetPrefixCache: refused while requests hold KV unless they are retracted first; empties the tree', () => {
    const core = makeCore({ numGpuBlocks: 32, pageSize: 4, cacheEvents: true });
    core.add(request('old', range(8), 1));
    core.executePass(0);
    core.add(request('r', range(8, 100), 3));
    core.executePass(1);
    core.takeCacheEvents();
    expect(core.resetPrefixCache()).toBe(false);
    expect(core.resetPrefixCache(true)).toBe(true);
    expect(core.view('r')).toMatchObject({ status: 'preempted', numComputedTokens: 0, generated: 1, numPreemptions: 1 });
    expect(core.waitingIds()).toEqual(['r']);
    expect(core.cache.treeTokens).toBe(0);
    expect(core.cache.availableTokens).toBe(128);
    expect(core.takeCacheEvents()).toEqual([{ kind: 'cleared' }]);
    expect(core.kvAudit()).toEqual([]);
  });

  it('holdBlocksOnFinish keeps the KV of all but the sampled token until released, then caches it', () => {
    const core = makeCore({ numGpuBlocks: 16, pageSize: 4 });
    core.add(request('p', range(10), 1, { holdBlocksOnFinish: true }));
    const pass = core.executePass(0);
    expect(pass.tokens).toEqual([{ id: 'p', generated: 1, completed: true }]);
    expect(core.isIdle).toBe(true);
    expect(core.heldBlocks('p')).toBe(3);
    expect(core.cache.availableTokens).toBe(54);
    expect(core.kvAudit()).toEqual([]);
    expect(core.releaseHeld('p')).toBe(true);
    expect(core.releaseHeld('p')).toBe(false);
    expect(core.heldBlocks('p')).toBe(0);
    // Its 8 page-aligned tokens stay cached; the other 2 are free again.
    expect([core.cache.evictableSize, core.cache.availableTokens]).toEqual([8, 56]);
    expect(core.kvAudit()).toEqual([]);
  });

  it('KV trace entries note allocations and evictions in blocks', () => {
    const core = makeCore({ numGpuBlocks: 4, pageSize: 4, kvTrace: true });
    core.add(request('a', range(8), 1));
    core.executePass(0);
    const trace = core.takeKvTrace();
    expect(trace[0]).toEqual({ event: 'allocation', activeBlocks: 2, inactiveBlocks: 0, freeBlocks: 2 });
    core.add(request('b', range(12, 100), 1));
    core.executePass(1);
    expect(core.takeKvTrace().map((e) => e.event)).toContain('eviction');
    expect(core.takeKvTrace()).toEqual([]);
  });
});
