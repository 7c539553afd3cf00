import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { chainHash, contentHash } from '../../src/engine/kv/fastHash.js';
import {
  DEFAULT_KV_ROUTER_CONFIG,
  KvRouter,
  decodeRouterConfig,
  parseRouterConfig,
  prefillRouterConfig,
  type KvRouterConfig,
} from '../../src/trace/kvRouter.js';
import type { RoutedRequest, RouterKvEvent } from '../../src/trace/router.js';

const BLOCK = 4;

/** `count` distinct token ids from `start`. */
const seq = (start: number, count: number) => Array.from({ length: count }, (_, i) => start + i);
const req = (uuid: string, tokens: number[], arrivalMs = 0): RoutedRequest => ({ uuid, tokens, arrivalMs });

/** The engine's block ids for the full blocks of `tokens`: chainHash over each block's contentHash. */
function blockIds(tokens: number[]): number[] {
  const ids: number[] = [];
  let parent: number | null = null;
  for (let start = 0; start + BLOCK <= tokens.length; start += BLOCK) {
    parent = chainHash(parent, contentHash(tokens, start, start + BLOCK));
    ids.push(parent);
  }
  return ids;
}

/** The KV event a worker emits when it caches `tokens` from scratch. */
const stored = (tokens: number[]): RouterKvEvent => ({ kind: 'stored', blocks: blockIds(tokens), parent: null });

function router(config: Partial<KvRouterConfig> = {}, options: { workers?: number; maxNumBatchedTokens?: number | null; seed?: number } = {}): KvRouter {
  return new KvRouter({
    workers: options.workers ?? 2,
    blockSize: BLOCK,
    config: { ...DEFAULT_KV_ROUTER_CONFIG, ...config },
    maxNumBatchedTokens: options.maxNumBatchedTokens ?? null,
    seed: options.seed ?? 1,
  });
}

// Logits below are hand-computed from §8.7: overlap_score_weight × (active prefill + uncached prompt tokens) / block
// size + (active blocks + request blocks not active there); lower wins.
describe('KV router scoring (§8.7, §9.2 item 35)', () => {
  it('spreads A and B, then sends A\u2032 after A and B\u2032 after B once their blocks are cached', () => {
    const r = router();
    const A = seq(100, 16);
    const B = seq(200, 16);
    const a = r.admit(req('A', A), 0)!;
    // B on A's worker: (16 + 16)/4 + (4 + 4) = 16; on the other: 16/4 + 4 = 8.
    const b = r.admit(req('B', B), 0);
    expect(b).toBe(1 - a);
    r.applyKvEvents(a, [stored(A)]);
    r.applyKvEvents(1 - a, [stored(B)]);
    r.markPrefillCompleted('A', 1);
    r.markPrefillCompleted('B', 1);
    expect(r.overlaps(A)[a]).toBe(4);
    expect(r.overlaps(B)[1 - a]).toBe(4);
    // A′ with A: 0/4 + (4 + 0) = 4; with B: 16/4 + (4 + 4) = 12.
    expect(r.admit(req("A'", A), 2)).toBe(a);
    // B′ with A and A′ (A′ adds no prefill: all cached): 16/4 + (4 + 4) = 12; with B: 0 + (4 + 0) = 4.
    expect(r.admit(req("B'", B), 2)).toBe(1 - a);
  });

  it('weighs cached prefix against decode load by overlap_score_weight', () => {
    const R = seq(300, 16); // 4 blocks; its first 3 are cached on worker 0
    const F = seq(400, 8); // filler, 2 blocks, cached on worker 0
    const choices = [0, 0.5, 0.8, 1].map((weight) => {
      const r = router({ overlap_score_weight: weight });
      r.applyKvEvents(0, [stored(R.slice(0, 12)), stored(F)]);
      r.applyKvEvents(1, [stored(seq(500, 32))]); // 8 unrelated blocks: worker 1's tree is the larger
      // F: worker 0: weight·0 + 2 = 2; worker 1: weight·8/4 + 2 (a tie at weight 0 goes to the smaller tree, worker 0).
      expect(r.admit(req('F', F), 0)).toBe(0);
      r.markPrefillCompleted('F', 0);
      const onCache = (weight * (16 - 3 * 4)) / 4 + (2 + 4);
      const onEmpty = (weight * 16) / 4 + (0 + 4);
      const choice = r.admit(req('R', R), 0);
      expect(choice).toBe(onCache < onEmpty ? 0 : 1);
      return choice;
    });
    // weight 0: 6 vs 4; 0.5: 6.5 vs 6; 0.8: 6.8 vs 7.2; 1: 7 vs 8.
    expect(choices).toEqual([1, 1, 0, 0]);
  });

  it('breaks equal logits by the smaller cache', () => {
    const X = seq(600, 8);
    // No overlap anywhere: 8/4 + 2 = 4 on both workers.
    const r1 = router();
    r1.applyKvEvents(0, [stored(seq(700, 12))]);
    r1.applyKvEvents(1, [stored(seq(800, 4))]);
    expect(r1.admit(req('X', X), 0)).toBe(1);
    const r2 = router();
    r2.applyKvEvents(0, [stored(seq(800, 4))]);
    r2.applyKvEvents(1, [stored(seq(700, 12))]);
    expect(r2.admit(req('X', X), 0)).toBe(0);
  });

  it('breaks full ties at random, the same way for the same seed', () => {
    const choices = (seed: number) => {
      const r = router({}, { workers: 4, seed });
      return Array.from({ length: 30 }, (_, i) => {
        const worker = r.admit(req(`r${i}`, seq(1000 * i, 8)), 0)!;
        r.free(`r${i}`, 0);
        return worker;
      });
    };
    const first = choices(7);
    expect(choices(7)).toEqual(first);
    expect(new Set(first).size).toBeGreaterThan(1);
  });

  it('samples softmax(−logit/(max − min)/T) when the temperature is positive', () => {
    const R = seq(900, 16);
    const r = router({ router_temperature: 1 }, { seed: 3 });
    r.applyKvEvents(0, [stored(R)]);
    // Logits 0/4 + 4 = 4 and 16/4 + 4 = 8 → scaled −1 and −2 → P(worker 0) = 1 / (1 + e^−1) ≈ 0.731.
    const draws = 4000;
    let onCache = 0;
    for (let i = 0; i < draws; i++) {
      if (r.admit(req(`r${i}`, R), 0) === 0) onCache++;
      r.free(`r${i}`, 0);
    }
    expect(Math.abs(onCache / draws - 1 / (1 + Math.exp(-1)))).toBeLessThan(0.03);
  });

  it('forgets removed and cleared blocks', () => {
    const A = seq(100, 16);
    const r = router();
    r.applyKvEvents(0, [stored(A)]);
    r.applyKvEvents(1, [stored(A)]);
    expect(r.overlaps(A)).toEqual([4, 4]);
    // Only full blocks count, and only the leading run.
    expect(r.overlaps([...A.slice(0, 8), 1, 2, 3, 4, 5, 6])).toEqual([2, 2]);
    r.applyKvEvents(0, [{ kind: 'removed', blocks: [blockIds(A)[2]] }]);
    r.applyKvEvents(1, [{ kind: 'cleared' }]);
    expect(r.overlaps(A)).toEqual([2, 0]);
  });

  it('ignores lifecycle calls for requests it does not hold', () => {
    const r = router();
    r.markPrefillCompleted('nobody', 0);
    r.free('nobody', 0);
    expect(r.released(0)).toEqual([]);
  });
});

describe('disaggregated router variants (§5.4)', () => {
  it('derives the prefill and decode configurations', () => {
    expect(prefillRouterConfig(DEFAULT_KV_ROUTER_CONFIG)).toEqual({ ...DEFAULT_KV_ROUTER_CONFIG, router_track_active_blocks: false });
    expect(decodeRouterConfig({ ...DEFAULT_KV_ROUTER_CONFIG, overlap_score_weight: 2 })).toEqual({
      ...DEFAULT_KV_ROUTER_CONFIG,
      overlap_score_weight: 0,
      router_assume_kv_reuse: false,
      router_track_prefill_tokens: false,
      router_prefill_load_model: 'none',
    });
  });

  it('prefill routing ignores decode blocks', () => {
    const A = seq(100, 16);
    const G = seq(200, 16);
    const route = (config: KvRouterConfig) => {
      const r = new KvRouter({ workers: 2, blockSize: BLOCK, config, maxNumBatchedTokens: null, seed: 1 });
      r.applyKvEvents(1, [stored(seq(900, 4))]); // ties go to worker 0
      expect(r.admit(req('A', A), 0)).toBe(0); // 16/4 + 4 (or 16/4 + 0) on both
      r.markPrefillCompleted('A', 0);
      return r.admit(req('G', G), 0);
    };
    // Default: 16/4 + (4 + 4) = 12 vs 16/4 + 4 = 8. Prefill variant: 4 vs 4, tie → worker 0.
    expect(route(DEFAULT_KV_ROUTER_CONFIG)).toBe(1);
    expect(route(prefillRouterConfig(DEFAULT_KV_ROUTER_CONFIG))).toBe(0);
  });

  it('decode routing counts every block as new (no assumed KV reuse)', () => {
    const A = seq(100, 16);
    const F = seq(300, 12);
    const route = (config: KvRouterConfig) => {
      const r = new KvRouter({ workers: 2, blockSize: BLOCK, config, maxNumBatchedTokens: null, seed: 1 });
      r.applyKvEvents(1, [stored(seq(900, 4))]); // ties go to worker 0
      expect(r.admit(req('A', A), 0)).toBe(0); // 4 vs 4
      expect(r.admit(req('F', F), 0)).toBe(1); // 4 + 3 vs 3
      return r.admit(req('A2', A), 0);
    };
    // Reuse assumed: 4 + 0 vs 3 + 4. Decode variant: 4 + 4 vs 3 + 4.
    expect(route({ ...DEFAULT_KV_ROUTER_CONFIG, overlap_score_weight: 0, router_track_prefill_tokens: false })).toBe(0);
    expect(route(decodeRouterConfig(DEFAULT_KV_ROUTER_CONFIG))).toBe(1);
  });
});

describe('KV router queue (§8.7: busy = every worker above threshold × max_num_batched_tokens)', () => {
  const queued = (policy: KvRouterConfig['router_queue_policy']) =>
    router({ router_queue_threshold: 1, router_queue_policy: policy }, { maxNumBatchedTokens: 8 });

  it('parks a request while both workers are busy and lets it go when a prefill completes', () => {
    const r = queued('fcfs');
    const a = r.admit(req('A', seq(100, 16)), 0)!;
    expect(r.admit(req('B', seq(200, 16)), 0)).toBe(1 - a);
    // 16 prompt tokens on each worker > 1 × 8.
    expect(r.admit(req('C', seq(300, 16), 1), 1)).toBeNull();
    expect(r.released(1)).toEqual([]);
    r.markPrefillCompleted('A', 5);
    // C with A: 16/4 + (4 + 4) = 12; with B: 32/4 + (4 + 4) = 16.
    expect(r.released(5)).toEqual([{ request: req('C', seq(300, 16), 1), worker: a }]);
    expect(r.released(5)).toEqual([]);
    expect(r.admit(req('D', seq(400, 16), 6), 6)).toBeNull();
    r.free('B', 7);
    // D with A and C: 32/4 + (4 + 4 + 4) = 20; on B's emptied worker: 16/4 + 4 = 8.
    expect(r.released(7)).toEqual([{ request: req('D', seq(400, 16), 6), worker: 1 - a }]);
  });

  it('releases parked requests first-come first-served under fcfs and the other way under lcfs', () => {
    const release = (policy: 'fcfs' | 'lcfs') => {
      const r = queued(policy);
      const a = r.admit(req('A', seq(100, 16)), 0)!;
      expect(r.admit(req('B', seq(200, 20)), 0)).toBe(1 - a); // (16 + 20)/4 + 9 = 18 vs 20/4 + 5 = 10
      for (const [uuid, t] of [
        ['C', 1],
        ['D', 2],
        ['E', 3],
      ] as const)
        expect(r.admit(req(uuid, seq(1000 * t, 8), t), t)).toBeNull();
      r.markPrefillCompleted('A', 4);
      // First: 8/4 + (4 + 2) = 8 vs 28/4 + 7 = 14, leaving 8 tokens (not above 8); second: 16/4 + 8 = 12 vs 14,
      // leaving 16 (busy again): two go, both to A's worker.
      const out = r.released(4);
      expect(out.every(({ worker }) => worker === a)).toBe(true);
      return out.map(({ request }) => request.uuid);
    };
    expect(release('fcfs')).toEqual(['C', 'D']);
    expect(release('lcfs')).toEqual(['E', 'D']);
  });

  it('releases the shortest remaining prefill first under wspt, counting the best cached prefix', () => {
    const r = queued('wspt');
    const a = r.admit(req('A', seq(100, 16)), 0)!;
    const b = 1 - a;
    expect(r.admit(req('B', seq(200, 20)), 0)).toBe(b);
    const E = seq(500, 24);
    r.applyKvEvents(b, [stored(E.slice(0, 16))]);
    expect(r.admit(req('C', seq(300, 24), 1), 1)).toBeNull(); // 24 left
    expect(r.admit(req('D', seq(400, 12), 2), 2)).toBeNull(); // 12 left
    expect(r.admit(req('E', E, 3), 3)).toBeNull(); // 24 − 4·4 = 8 left
    r.markPrefillCompleted('A', 4);
    // E: 24/4 + (4 + 6) = 16 vs (20 + 8)/4 + (5 + 6) = 18 → A's worker, now 24 tokens: busy.
    expect(r.released(4).map(({ request, worker }) => [request.uuid, worker])).toEqual([['E', a]]);
    r.markPrefillCompleted('B', 5);
    // D: (24 + 12)/4 + 13 = 22 vs 12/4 + 8 = 11.
    expect(r.released(5).map(({ request, worker }) => [request.uuid, worker])).toEqual([['D', b]]);
    r.markPrefillCompleted('E', 6);
    // C: 24/4 + 16 = 22 vs (12 + 24)/4 + 14 = 23.
    expect(r.released(6).map(({ request, worker }) => [request.uuid, worker])).toEqual([['C', a]]);
  });

  it('never parks without a threshold, nor with a single worker', () => {
    const open = router({ router_queue_threshold: null }, { maxNumBatchedTokens: 8 });
    const single = router({ router_queue_threshold: 1 }, { workers: 1, maxNumBatchedTokens: 8 });
    for (const r of [open, single]) {
      for (const [i, uuid] of ['A', 'B', 'C'].entries()) expect(r.admit(req(uuid, seq(1000 * i, 16)), 0)).not.toBeNull();
    }
  });

  it('takes 10,000,000 as max_num_batched_tokens when the engine gives none', () => {
    // Threshold 1e-6 × 10,000,000 = 10 tokens.
    const r = router({ router_queue_threshold: 1e-6 }, { maxNumBatchedTokens: null });
    r.admit(req('A', seq(100, 8)), 0);
    r.admit(req('B', seq(200, 8)), 0);
    expect(r.admit(req('C', seq(300, 16)), 0)).not.toBeNull(); // 8 and 8 are not above 10
    expect(r.admit(req('D', seq(400, 16)), 0)).not.toBeNull(); // one worker still has 8
    expect(r.admit(req('E', seq(500, 8)), 0)).toBeNull(); // 24 and 24
  });
});

describe('--router-config', () => {
  const dynamoDefaults = {
    overlap_score_weight: 1,
    router_temperature: 0,
    use_kv_events: true,
    router_track_active_blocks: true,
    router_track_output_blocks: false,
    router_assume_kv_reuse: true,
    router_track_prefill_tokens: true,
    router_prefill_load_model: 'none',
    router_queue_threshold: 4,
    router_queue_policy: 'fcfs',
    router_ttl_secs: 120,
    router_max_tree_size: 1_048_576,
    router_prune_target_ratio: 0.8,
    router_snapshot_threshold: 1_000_000,
    router_event_threads: 4,
  };

  it('keeps Dynamo defaults for keys not given', () => {
    expect(DEFAULT_KV_ROUTER_CONFIG).toEqual(dynamoDefaults);
    expect(parseRouterConfig('{"router_temperature": 0.5, "router_queue_policy": "wspt", "router_queue_threshold": null}')).toEqual({
      ...dynamoDefaults,
      router_temperature: 0.5,
      router_queue_policy: 'wspt',
      router_queue_threshold: null,
    });
  });

  it('reads a file', () => {
    const dir = mkdtempSync(join(tmpdir(), 'kv-router-'));
    try {
      const path = join(dir, 'router.json');
      writeFileSync(path, '{"overlap_score_weight": 2}');
      expect(parseRouterConfig(path)).toEqual({ ...dynamoDefaults, overlap_score_weight: 2 });
      expect(() => parseRouterConfig(join(dir, 'missing.json'))).toThrow(/^--router-config: cannot read/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('names unknown keys and bad values', () => {
    expect(() => parseRouterConfig('{"router_bogus": 1}')).toThrow(/^--router-config: unknown key "router_bogus"/);
    for (const [key, value] of [
      ['overlap_score_weight', -1],
      ['router_temperature', -0.1],
      ['router_queue_policy', '"sjf"'],
      ['router_queue_threshold', -1],
      ['router_prune_target_ratio', 1.5],
      ['router_max_tree_size', 0.5],
      ['router_snapshot_threshold', 0],
      ['router_event_threads', 0],
      ['router_ttl_secs', '"120"'],
      ['use_kv_events', '"yes"'],
    ] as const) {
      expect(() => parseRouterConfig(`{"${key}": ${value}}`)).toThrow(new RegExp(`^--router-config: "${key}"`));
    }
    expect(() => parseRouterConfig('{"router_track_output_blocks": true, "router_track_active_blocks": false}')).toThrow(
      /router_track_output_blocks.*router_track_active_blocks/,
    );
    expect(() => parseRouterConfig('{"overlap_score_weight": ')).toThrow(/^--router-config: not valid JSON/);
  });

  it('refuses the AIC prefill load model by name', () => {
    expect(() => parseRouterConfig('{"router_prefill_load_model": "aic"}')).toThrow(/^--router-config: "router_prefill_load_model": "aic".*not simulated/);
  });
});
