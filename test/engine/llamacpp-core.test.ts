/**
 * `--engine-type llamacpp`: llama-server's scheduling, against hand-computed scenarios of its documented and
 * coded behaviour (ggml-org/llama.cpp tools/server/server-context.cpp; tools/server/README.md):
 * - `get_available_slot`: an idle slot whose cached tokens share more than `--slot-prompt-similarity` (0.1) of
 *   the prompt wins, the most similar first; otherwise the least recently used idle slot
 *   (`slot.t_last_used <= t_last`: among never-used slots, the last);
 * - `cache_prompt` (README: "Re-use KV cache from a previous request if possible"): the common prefix with the
 *   slot's cache is kept, but at least one prompt token is evaluated (`n_past--` when all match);
 * - `update_slots`: one `llama_decode` per iteration of at most `n_batch` tokens, every generating slot's
 *   sampled token first, then prompt tokens slot by slot (continuous batching);
 * - no free slot: the task is deferred until one is released; no preemption;
 * - KV full: `try_clear_idle_slots` purges idle slots' caches; when the slots' own tokens do not fit,
 *   "Context size has been exceeded." ends every processing slot.
 */
import { describe, expect, it } from 'vitest';
import { DEFAULT_ENGINE_ARGS, schedulerConfig } from '../../src/config/engineArgs.js';
import type { CoreRequest, PassResult, TokenIds } from '../../src/engine/contract.js';
import { LlamaCppCore, type LlamaCppSchedulerConfig } from '../../src/engine/llamacpp/core.js';
import { createSchedulerCore } from '../../src/engine/scheduler.js';
import { type PassTiming, zeroTiming } from '../../src/engine/timingModels.js';
import { prng } from '../support/prng.js';

function core(overrides: Partial<LlamaCppSchedulerConfig> = {}): LlamaCppCore {
  return new LlamaCppCore({ slots: 4, nBatch: 2048, numGpuBlocks: 256, blockSize: 16, cachePrompt: true, timing: zeroTiming(false), seed: 3, ...overrides });
}

const ids = (n: number, from: number) => Array.from({ length: n }, (_, i) => from + i);
const request = (id: string, prompt: TokenIds, maxOutputTokens: number): CoreRequest => ({ id, promptTokenIds: prompt, maxOutputTokens });

/** Passes until idle, from time 0; every pass's result. */
function run(c: LlamaCppCore, limit = 1000): PassResult[] {
  const passes: PassResult[] = [];
  let now = 0;
  while (!c.isIdle && passes.length < limit) {
    const pass = c.executePass(now);
    passes.push(pass);
    now = pass.endMs;
  }
  return passes;
}

/** The prompt tokens `id` found in its slot's cache when it was launched. */
function cachedTokensOf(passes: PassResult[], id: string): number | undefined {
  return passes.flatMap((p) => p.admitted).find((a) => a.id === id)?.cachedTokens;
}

describe("llama.cpp's slot choice and per-slot prompt cache", () => {
  it('a follow-up sharing its prefix goes to the slot that holds it and reuses the common prefix', () => {
    const c = core();
    const system = ids(100, 1);
    c.add(request('a', [...system, ...ids(20, 5000)], 4));
    run(c);
    // Another idle slot was used less recently (never), but this one holds 100 of the 120 prompt tokens: 0.83 > 0.1.
    c.add(request('b', [...system, ...ids(20, 7000)], 4));
    expect(cachedTokensOf(run(c), 'b')).toBe(100);
  });

  it('the same prompt again reuses all but its last token (n_past-- so the logits are computed)', () => {
    const c = core();
    const prompt = ids(64, 1);
    c.add(request('a', prompt, 3));
    run(c);
    c.add(request('b', prompt, 3));
    const passes = run(c);
    expect(cachedTokensOf(passes, 'b')).toBe(63);
    expect(passes[0].promptTokens).toBe(1);
  });

  it("a slot keeps its prompt and every output but the last: llama-server's log, 50 prompt + 537 generated → 'stop processing: n_past = 586'", () => {
    // A published llama-server log (its SLT_INF lines): 'n_prompt_tokens = 50', 'eval time = … / 537 tokens',
    // 'release: … stop processing: n_past = 586' (50 + 537 − 1: the last sampled token is never decoded).
    const c = core({ slots: 1, numGpuBlocks: 2048, blockSize: 1 });
    const prompt = ids(50, 1);
    c.add(request('a', prompt, 537));
    run(c);
    expect(c.engineStats().inactiveBlocks).toBe(586);
    // The same log's next line of the kind: 'need to evaluate at least 1 token to generate logits, n_past = 50,
    // n_prompt_tokens = 50' then 'kv cache rm [49, end)' and 'n_tokens = 1'.
    c.add(request('b', prompt, 1));
    const passes = run(c);
    expect([cachedTokensOf(passes, 'b'), passes[0].promptTokens]).toEqual([49, 1]);
    expect(c.engineStats().inactiveBlocks).toBe(50);
  });

  it('a common prefix of at most 10 % of the prompt does not choose the slot: the least recently used one is taken, reusing nothing', () => {
    const c = core({ slots: 2 });
    // 'a' runs on slot 1 (never-used slots tie on t_last_used; llama.cpp's `<=` keeps the last), leaving its cache there.
    c.add(request('a', ids(100, 1), 2));
    run(c);
    // 10 of 100 tokens shared: 0.10 is not > 0.1, so LRU: slot 0 (never used), with an empty cache.
    c.add(request('b', [...ids(10, 1), ...ids(90, 9000)], 2));
    expect(cachedTokensOf(run(c), 'b')).toBe(0);
    // 11 shared: 0.11 > 0.1 picks slot 1 over slot 0 (whose cache shares nothing), and reuses the 11.
    c.add(request('c', [...ids(11, 1), ...ids(89, 20000)], 2));
    expect(cachedTokensOf(run(c), 'c')).toBe(11);
  });

  it('of several similar idle slots the most similar wins', () => {
    const c = core({ slots: 2 });
    c.add(request('a', ids(100, 1), 1));
    c.add(request('b', [...ids(50, 1), ...ids(50, 5000)], 1));
    run(c);
    // Prompt shares 50 with b's slot and 80 with a's: a's slot, 80 reused.
    c.add(request('c', [...ids(80, 1), ...ids(20, 9000)], 1));
    expect(cachedTokensOf(run(c), 'c')).toBe(80);
  });

  it('with cache_prompt off (--no-enable-prefix-caching) nothing is reused', () => {
    const c = core({ cachePrompt: false });
    c.add(request('a', ids(64, 1), 2));
    run(c);
    c.add(request('b', ids(64, 1), 2));
    const passes = run(c);
    expect(cachedTokensOf(passes, 'b')).toBe(0);
    expect(passes[0].promptTokens).toBe(64);
  });
});

describe("llama.cpp's batch: n_batch tokens per decode call, sampled tokens first, then prompt chunks in slot order", () => {
  it('two 10-token prompts in an 8-token batch: slot 0 (the second arrival) first, 8 / 2+6 / 1+4 tokens, first tokens at passes 2 and 3', () => {
    const c = core({ slots: 2, nBatch: 8 });
    // a takes slot 1 (LRU tie: the last), b slot 0; prompt chunks go in slot order.
    c.add(request('a', ids(10, 1), 3));
    c.add(request('b', ids(10, 100), 3));
    const p1 = c.executePass(0);
    expect(p1.admitted.map((x) => x.id)).toEqual(['a', 'b']);
    expect([p1.scheduledTokens, p1.promptTokens, p1.tokens]).toEqual([8, 8, []]);
    const p2 = c.executePass(1);
    // b's last 2 prompt tokens, then 6 of a's: b samples its first token.
    expect([p2.scheduledTokens, p2.promptTokens]).toEqual([8, 8]);
    expect(p2.tokens).toEqual([{ id: 'b', generated: 1, completed: false }]);
    const p3 = c.executePass(2);
    // b's sampled token is decoded (1) and a's last 4 prompt tokens: both sample.
    expect([p3.scheduledTokens, p3.promptTokens]).toEqual([5, 4]);
    expect(p3.tokens.map((t) => [t.id, t.generated])).toEqual([
      ['b', 2],
      ['a', 1],
    ]);
  });

  it('decode tokens take their share of n_batch: a 20-token prompt beside one generating slot goes 7, 7, 6', () => {
    const c = core({ slots: 2, nBatch: 8 });
    c.add(request('gen', ids(4, 1), 50));
    c.executePass(0);
    c.add(request('long', ids(20, 500), 2));
    const chunks = [1, 2, 3].map((t) => c.executePass(t).promptTokens);
    expect(chunks).toEqual([7, 7, 6]);
  });

  it('no free slot: the request waits (deferred) and takes the slot its predecessor releases; nobody is preempted', () => {
    const c = core({ slots: 1 });
    c.add(request('a', ids(8, 1), 3));
    c.add(request('b', ids(8, 1), 2));
    const passes = run(c);
    expect(passes.flatMap((p) => p.preempted)).toEqual([]);
    // a: pass 1 prefills and samples 1, passes 2–3 sample 2 and 3. b starts on pass 4 on the same slot,
    // finding a's 8 prompt tokens (7 reused, the last re-evaluated).
    expect(passes.map((p) => p.tokens.map((t) => `${t.id}${t.generated}`).join())).toEqual(['a1', 'a2', 'a3', 'b1', 'b2']);
    expect(passes[3].admitted).toEqual([{ id: 'b', cachedTokens: 7 }]);
    expect(c.engineStats().preemptions).toBe(0);
  });
});

describe("llama.cpp's unified KV cache", () => {
  it("an idle slot's cache is purged when a new prompt needs its cells (try_clear_idle_slots)", () => {
    // 32 cells, 2 slots.
    const c = core({ slots: 2, numGpuBlocks: 4, blockSize: 8 });
    c.add(request('a', ids(20, 1), 2));
    run(c);
    // a's slot keeps its 20 prompt tokens and the first output (the last one is never decoded): 21 cells, 3 blocks.
    expect([c.engineStats().activeBlocks, c.engineStats().inactiveBlocks]).toEqual([0, 3]);
    c.add(request('b', ids(20, 1000), 2));
    const passes = run(c);
    expect(passes.flatMap((p) => p.tokens).map((t) => t.generated)).toEqual([1, 2]);
    // 21 + 20 > 32: a's cache went; b's 21 cells remain.
    expect([c.engineStats().activeBlocks, c.engineStats().inactiveBlocks]).toEqual([0, 3]);
    c.add(request('c', ids(20, 1), 1));
    expect(cachedTokensOf(run(c), 'c')).toBe(0);
  });

  it('"Context size has been exceeded": when the slots themselves fill the cache, every processing slot ends where it is', () => {
    // 16 cells, 2 slots, two 6-token prompts asking 10 tokens each (10 = 16 - 6 fits each alone).
    const c = core({ slots: 2, numGpuBlocks: 2, blockSize: 8 });
    c.add(request('a', ids(6, 1), 10));
    c.add(request('b', ids(6, 100), 10));
    const passes = run(c);
    // Pass 1: 12 cells, both sample; passes 2 and 3 decode to 14 and 16 cells; pass 4 cannot place 2 more.
    expect(passes.map((p) => p.tokens.map((t) => `${t.id}${t.generated}${t.completed ? '!' : ''}`).join())).toEqual(['b1,a1', 'b2,a2', 'b3,a3', 'b3!,a3!']);
    expect(c.isIdle).toBe(true);
  });

  it('a prompt that fills the whole context is refused; a long output is cut where the context ends', () => {
    const c = core({ slots: 1, numGpuBlocks: 2, blockSize: 8 });
    expect(c.rejection(16, 1)).toMatch(/exceeds the available context size/);
    c.add(request('a', ids(6, 1), 100));
    const passes = run(c);
    expect(passes.at(-1)?.tokens).toEqual([{ id: 'a', generated: 10, completed: true }]);
  });
});

describe('llama.cpp timing: the pass timing (fitted profile) is charged per decode call', () => {
  /** A profile double: prefill 1 ms per new prompt token, decode 2 ms per call. */
  const timing: PassTiming = {
    prefillMs: (batch, isl, prefix) => batch * (isl - prefix),
    decodeMs: (ready) => (ready === 0 ? 0 : 2),
    honoursCapturedTimes: false,
  };

  it('a reused prefix costs nothing: the second identical 64-token prompt prefills 1 token', () => {
    const c = core({ timing });
    c.add(request('a', ids(64, 1), 1));
    const first = run(c)[0];
    expect([first.prefillMs, first.decodeMs, first.endMs]).toEqual([64, 2, 66]);
    c.add(request('b', ids(64, 1), 1));
    expect(run(c)[0].prefillMs).toBe(1);
  });

  it('--engine-type llamacpp (its engine args): --max-num-seqs slots, --max-num-batched-tokens as n_batch', () => {
    const args = { ...DEFAULT_ENGINE_ARGS, engineType: 'llamacpp' as const, maxNumSeqs: 2, maxNumBatchedTokens: 8 };
    const c = createSchedulerCore(schedulerConfig(args, zeroTiming(false), 1));
    for (const id of ['a', 'b', 'c']) c.add(request(id, ids(10, 1), 2));
    const pass = c.executePass(0);
    expect([pass.scheduledTokens, c.runningIds().length, c.waitingIds()]).toEqual([8, 2, ['c']]);
  });
});

describe('llama.cpp core: invariants over random loads', () => {
  it.each([1, 2, 3, 4, 5, 6, 7, 8])('seed %i: every request ends once, within its slots, batch and context', (seed) => {
    const rand = prng(seed);
    const slots = rand.int(1, 4);
    const nBatch = rand.int(slots, 64);
    const c = core({ slots, nBatch, numGpuBlocks: rand.int(4, 16), blockSize: 8, cachePrompt: rand.next() < 0.8 });
    const capacity = c.config.numGpuBlocks * c.config.blockSize;
    const asked = new Map<string, number>();
    const ended = new Map<string, number>();
    let now = 0;
    for (let step = 0; step < 4000 && (asked.size < 40 || !c.isIdle); step++) {
      if (asked.size < 40 && rand.next() < 0.5) {
        const id = `r${asked.size}`;
        // Prompts from a few shared stems, so slots find prefixes.
        const prompt = [...ids(rand.int(0, 20), rand.int(0, 2) * 1000), ...ids(rand.int(1, 20), 10_000 + asked.size * 100)];
        const max = rand.int(1, 30);
        asked.set(id, Math.min(max, capacity - prompt.length));
        if (c.rejection(prompt.length, max) === null) c.add(request(id, prompt, max));
        else asked.delete(id);
      }
      const pass = c.executePass(now);
      now = pass.endMs + 1;
      expect(pass.preempted).toEqual([]);
      expect(pass.scheduledTokens).toBeLessThanOrEqual(nBatch);
      expect(c.runningIds().length).toBeLessThanOrEqual(slots);
      const stats = c.engineStats();
      expect(stats.activeBlocks + stats.inactiveBlocks + stats.freeBlocks).toBe(stats.totalBlocks);
      for (const t of pass.tokens) {
        expect(ended.has(t.id)).toBe(false);
        expect(t.generated).toBeLessThanOrEqual(asked.get(t.id)!);
        if (t.completed) ended.set(t.id, t.generated);
        else expect(t.generated).toBeLessThan(asked.get(t.id)!);
      }
    }
    expect(c.isIdle).toBe(true);
    expect([...ended.keys()].sort()).toEqual([...asked.keys()].sort());
  });
});
