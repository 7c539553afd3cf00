/**
 * Trace replay in process (engine-reference §8): the collector's statistics, the report's table and JSON,
 * synthetic workloads, the workload driver, and the offline event loop against hand-computed timelines and
 * the engine's own offline driver.
 */
import { describe, expect, it } from 'vitest';
import { DEFAULT_ENGINE_ARGS, schedulerConfig } from '../../src/config/engineArgs.js';
import { createSchedulerCore, fixedTiming, modelTiming, polynomialPerfModel, runOffline, type AnySchedulerConfig } from '../../src/engine/index.js';
import { ReplayCollector } from '../../src/trace/collector.js';
import { WorkloadDriver, type DriverMode } from '../../src/trace/driver.js';
import { DEFAULT_KV_ROUTER_CONFIG, decodeRouterConfig, KvRouter, prefillRouterConfig } from '../../src/trace/kvRouter.js';
import {
  mooncakeFileWorkload,
  normalizeArrivals,
  syntheticTokenId,
  syntheticWorkload,
  type SyntheticOptions,
  type Workload,
} from '../../src/trace/workload.js';
import { OfflineReplay, type Fleet } from '../../src/trace/offline.js';
import { formatReportTable, reportJson } from '../../src/trace/report.js';
import { RoundRobinRouter } from '../../src/trace/router.js';

/** A fixed-step engine: every pass that emits tokens takes `stepMs`, prefill is free (hand-computable timelines). */
const fixedConfig = (blockSize: number, stepMs = 10): AnySchedulerConfig =>
  schedulerConfig({ ...DEFAULT_ENGINE_ARGS, blockSize, numGpuBlocks: 1000 }, fixedTiming(stepMs, 1), 1);

function replay(workload: Workload, fleet: Fleet, mode: DriverMode = { kind: 'trace' }, names?: string[]) {
  const workerNames =
    names ??
    (fleet.kind === 'aggregated'
      ? fleet.workers.map((_, i) => `worker-${i}`)
      : [...fleet.prefill.map((_, i) => `prefill-${i}`), ...fleet.decode.map((_, i) => `decode-${i}`)]);
  const collector = new ReplayCollector(workerNames);
  new OfflineReplay(fleet, new WorkloadDriver(workload, mode), collector).run();
  return collector;
}

const single = (config: AnySchedulerConfig): Fleet => ({ kind: 'aggregated', workers: [config], router: new RoundRobinRouter(1) });

describe('collector statistics (§8.8, §9.2 item 31)', () => {
  it('pools per-token gaps for ITL and averages per request for TPOT', () => {
    const c = new ReplayCollector(['w']);
    c.onArrival('r', 0, 4, 4);
    c.onAdmit('r', 0, 0);
    for (const t of [10, 11, 12, 110]) c.onTokens('r', t);
    const r = c.report(0);
    expect(r.mean_tpot_ms).toBeCloseTo(33.333, 3);
    expect(r.mean_itl_ms).toBeCloseTo(33.333, 3);
    expect(r.median_itl_ms).toBe(1);
    for (const key of ['p75_itl_ms', 'p90_itl_ms', 'p95_itl_ms', 'max_itl_ms']) expect(r[key]).toBe(98);
    expect(r.mean_ttst_ms).toBe(1);
    expect(r.min_output_token_throughput_per_user).toBeCloseTo(1000 / 98, 9);
    expect(r.max_output_token_throughput_per_user).toBe(1000);
  });

  it('counts only admitted requests with a token as completed; empty distributions are zeros', () => {
    const c = new ReplayCollector(['w']);
    c.onArrival('never', 0, 8, 2);
    const r = c.report(5);
    expect([r.num_requests, r.completed_requests, r.total_input_tokens, r.mean_ttft_ms, r.std_e2e_latency_ms, r.prefix_cache_reused_ratio]).toEqual([
      1, 0, 0, 0, 0, 0,
    ]);
  });

  it('reports sessions: turns, latency from first arrival to last token, and first-admission reuse by turn (8 and later pooled)', () => {
    const c = new ReplayCollector(['w']);
    // Session a: 10 turns of 10 tokens, turn t arriving at 100·t, finding t tokens cached, done 50 ms later.
    for (let t = 0; t < 10; t++) {
      c.onArrival(`a${t}`, 100 * t, 10, 1, { sessionId: 'a', turnIndex: t });
      c.onAdmit(`a${t}`, 100 * t, t);
      c.onTokens(`a${t}`, 100 * t + 50);
    }
    // Session b: one turn 0 at 5 (20 tokens, none cached, done at 25) and a turn 1 that never completes.
    c.onArrival('b0', 5, 20, 1, { sessionId: 'b', turnIndex: 0 });
    c.onAdmit('b0', 5, 0);
    c.onTokens('b0', 25);
    c.onArrival('b1', 30, 10, 1, { sessionId: 'b', turnIndex: 1 });
    const r = c.report(0);
    expect([r.num_sessions, r.mean_turns_per_session, r.max_turns_per_session]).toEqual([2, 6, 10]);
    // Only a completed all its requests: 950 − 0.
    expect([r.mean_session_latency_ms, r.max_session_latency_ms]).toEqual([950, 950]);
    expect(r.first_admission_prefix_cache_reused_ratio_turn_0).toBe(0 / 30);
    expect(r.first_admission_prefix_cache_reused_ratio_turn_1).toBe(1 / 10);
    expect(r.first_admission_prefix_cache_reused_ratio_turn_7).toBe(7 / 10);
    expect(r.first_admission_prefix_cache_reused_ratio_turn_8_plus).toBe((8 + 9) / 20);
    expect(formatReportTable(r)).toContain(
      'First Admission Prefix Cache Reused Ratio by Turn: 0: 0.00, 1: 0.10, 2: 0.20, 3: 0.30, 4: 0.40, 5: 0.50, 6: 0.60, 7: 0.70, 8+: 0.85',
    );
    expect(reportJson(r)).toContain('"num_sessions": 2,');
  });
});

describe('the AIPerf table and the JSON file (§8.8, §9.2 item 37)', () => {
  // The figures of Dynamo's own test fixture.
  const fixture = {
    completed_requests: 711,
    num_requests: 711,
    request_throughput_rps: 255.54,
    output_throughput_tok_s: 10944.03,
    wall_time_ms: 4046.31,
    prefix_cache_reused_ratio: 0.3587,
    mean_ttft_ms: 12.5,
    min_ttft_ms: 1,
    max_ttft_ms: 1234.5678,
    p99_ttft_ms: 1000,
    p90_ttft_ms: 100,
    p75_ttft_ms: 50,
    std_ttft_ms: 3,
  };

  it('prints the golden strings', () => {
    const table = formatReportTable(fixture);
    for (const golden of [
      'NVIDIA AIPerf | LLM Metrics',
      'Time to First Token (ms)',
      'Output Token Throughput (tokens/sec)',
      'Request Throughput (requests/sec)',
      'Prefix Cache Reused Ratio: 0.36',
      '10,944.03',
      '255.54',
      'N/A',
      '1,234.57',
      'Wall Time (ms): 4,046.31',
    ]) {
      expect(table).toContain(golden);
    }
    const lines = table.split('\n');
    expect(lines[0]).toBe('NVIDIA AIPerf | LLM Metrics');
    expect(lines[1].startsWith('┏━')).toBe(true);
    expect(lines[2]).toMatch(/^┃ Metric +┃ +avg ┃ +min ┃ +max ┃ +p99 ┃ +p90 ┃ +p75 ┃ +std ┃$/);
    expect(lines[3].startsWith('┡')).toBe(true);
    expect(lines).toContain(lines.find((l) => l.startsWith('└'))!);
    // Rows without a distribution in the report are left out; the single-value rows carry N/A in six columns.
    expect(table).not.toContain('Inter Token Latency');
    expect(lines.find((l) => l.includes('Request Count'))!.match(/N\/A/g)).toHaveLength(6);
    // Every table line is as wide as the first.
    for (const line of lines.slice(1, lines.findIndex((l) => l.startsWith('└')) + 1)) expect([...line].length).toBe([...lines[1]].length);
  });

  it('writes JSON as Python json.dumps(indent=2, sort_keys=True) + newline', () => {
    expect(reportJson({ completed_requests: 2 })).toBe('{\n  "completed_requests": 2\n}\n');
    expect(reportJson({ z_ms: 2, a_ms: 0.00001, duration_ms: 1.5, num_requests: 3 })).toBe(
      '{\n  "a_ms": 1e-05,\n  "duration_ms": 1.5,\n  "num_requests": 3,\n  "z_ms": 2.0\n}\n',
    );
  });
});

describe('workloads (§8.1–§8.3)', () => {
  it("synthesizes Dynamo's token ids (SplitMix64, checked against a BigInt computation)", () => {
    const oracle = (request: number, token: number) => {
      const mask = (1n << 64n) - 1n;
      let v = (((BigInt(request) << 32n) ^ BigInt(token)) + 0x9e3779b97f4a7c15n) & mask;
      v ^= v >> 30n;
      v = (v * 0xbf58476d1ce4e5b9n) & mask;
      v ^= v >> 27n;
      v = (v * 0x94d049bb133111ebn) & mask;
      v ^= v >> 31n;
      const low = Number(v & 0xffffffffn);
      return low === 0 ? 1 : low;
    };
    for (const [r, t] of [
      [0, 0],
      [1, 0],
      [0, 1],
      [7, 1234],
      [123456, 99999],
      [2 ** 31, 2 ** 32 - 1],
    ])
      expect(syntheticTokenId(r, t)).toBe(oracle(r, t));
  });

  const synthetic = (o: Partial<SyntheticOptions>): Workload =>
    syntheticWorkload({
      inputTokens: 64,
      outputTokens: 4,
      requestCount: 4,
      arrivalIntervalMs: 10,
      turnsPerSession: 1,
      sharedPrefixRatio: 0,
      numPrefixGroups: 0,
      interTurnDelayMs: 0,
      blockSize: 16,
      seed: 42,
      ...o,
    });

  it('flat synthetic requests share nothing and arrive every interval', () => {
    const w = synthetic({});
    expect(w.sessions.map((s) => s.startMs)).toEqual([0, 10, 20, 30]);
    const prompts = w.sessions.map((s) => s.turns[0].prompt());
    expect(prompts[0]).toHaveLength(64);
    expect(prompts[0][0]).not.toBe(prompts[1][0]);
  });

  it('prefix groups share round(blocks × ratio) whole blocks; every turn gets fresh ids after them', () => {
    const w = synthetic({ sharedPrefixRatio: 0.5, numPrefixGroups: 1, turnsPerSession: 2, interTurnDelayMs: 7 });
    expect(w.requests).toBe(8);
    const [a, b] = [w.sessions[0].turns[0].prompt(), w.sessions[1].turns[1].prompt()];
    // 64 tokens = 4 blocks of 16; half of them (2 blocks = 32 tokens) from the group.
    expect(a.slice(0, 32)).toEqual(b.slice(0, 32));
    expect(a.slice(32, 48)).not.toEqual(b.slice(32, 48));
    expect(w.sessions[0].turns[1].delayMs).toBe(7);
  });

  it('normalises arrivals to start at 0 and divides starts and delays by the speedup', () => {
    const w = mooncakeFileWorkload(
      '{"timestamp":100,"output_length":1,"hash_ids":[1]}\n{"timestamp":200,"output_length":1,"hash_ids":[2]}\n{"session_id":"s","timestamp":300,"output_length":1,"hash_ids":[3]}\n{"session_id":"s","delay":50,"output_length":1,"hash_ids":[4]}',
      4,
    );
    const n = normalizeArrivals(w, 10);
    expect(n.sessions.map((s) => s.startMs)).toEqual([0, 10, 20]);
    expect(n.sessions[2].turns[1].delayMs).toBe(5);
  });
});

describe('workload driver (§8.4, §9.2 item 34)', () => {
  const twoTurns = (delayMs: number): Workload => ({
    requests: 2,
    sessions: [{ id: 's', startMs: 0, turns: [0, delayMs].map((d) => ({ inputLength: 4, outputLength: 1, delayMs: d, prompt: () => [1, 2, 3, 4] })) }],
  });

  it('holds a follow-up turn until its predecessor completes plus the delay', () => {
    const driver = new WorkloadDriver(twoTurns(10), { kind: 'trace' });
    const [first] = driver.popReady(0);
    driver.onComplete(first.uuid, 5);
    expect(driver.popReady(14)).toEqual([]);
    const [second] = driver.popReady(15);
    expect([second.turnIndex, second.arrivalMs]).toEqual([1, 15]);
    driver.onComplete(second.uuid, 20);
    expect(driver.done).toBe(true);
  });

  it('refuses a trace-mode session without a start time, and a concurrency below 1', () => {
    expect(() => new WorkloadDriver({ requests: 1, sessions: [{ id: 'x', startMs: null, turns: twoTurns(0).sessions[0].turns }] }, { kind: 'trace' })).toThrow(
      /session x has no arrival timestamp/,
    );
    expect(() => new WorkloadDriver(twoTurns(0), { kind: 'concurrency', limit: 0 })).toThrow(/--replay-concurrency/);
  });

  // Dynamo's agentic readiness: a request with dependencies is ready at the slowest one's completion plus its delay;
  // its own timestamp does not count (its driver tests: dependencies done at 10 and 30, delay 2 → ready at 32).
  const request = (id: string, startMs: number | null, waitFor: string[] = [], dependencyDelayMs = 0) => ({
    id,
    startMs,
    waitFor,
    dependencyDelayMs,
    turns: [{ inputLength: 4, outputLength: 1, delayMs: 0, prompt: () => [1, 2, 3, 4] }],
  });

  it('releases a request its delay after the slowest of the requests it waits for', () => {
    const sessions = [{ ...request('a', 0), group: 'main' }, request('b', 5), { ...request('join', 100, ['a', 'b'], 2), group: 'main' }];
    const driver = new WorkloadDriver({ requests: 3, sessions }, { kind: 'trace' });
    const [a] = driver.popReady(0);
    const [b] = driver.popReady(5);
    driver.onComplete(b.uuid, 30);
    driver.onComplete(a.uuid, 10);
    expect(driver.nextReadyMs()).toBe(32);
    expect(driver.popReady(31.9)).toEqual([]);
    const [join] = driver.popReady(32);
    // Reports see a DAG's trajectory as the session, its requests as turns in the order they started.
    expect([a.sessionId, a.turnIndex, b.sessionId]).toEqual(['main', 0, 'b']);
    expect([join.sessionId, join.turnIndex, join.arrivalMs]).toEqual(['main', 1, 32]);
    driver.onComplete(join.uuid, 40);
    expect(driver.done).toBe(true);
  });

  it('refuses unknown dependencies, self-waits, cycles and a concurrency cap, naming the request', () => {
    const run =
      (sessions: ReturnType<typeof request>[], mode: DriverMode = { kind: 'trace' }) =>
      () =>
        new WorkloadDriver({ requests: sessions.length, sessions }, mode);
    expect(run([request('a', 0, ['zz'])])).toThrow('request a waits for unknown request_id zz');
    expect(run([request('a', 0, ['a'])])).toThrow('request a cannot wait for itself');
    expect(run([request('r0', 0), request('a', null, ['b']), request('b', null, ['a'])])).toThrow(/cycle detected at request (a|b)/);
    expect(run([request('a', 0), request('b', null, ['a'])], { kind: 'concurrency', limit: 2 })).toThrow(/not supported with --replay-concurrency/);
  });
});

describe('offline replay (§8.5)', () => {
  // r0 at 0 ms: blocks [1,1,1,1][2,2,2,2], 3 outputs; r1 at 5 ms: [1,1,1,1][3,3,3,3], 2 outputs (engine block 4).
  const TRACE = '{"timestamp":0,"input_length":8,"output_length":3,"hash_ids":[1,2]}\n{"timestamp":5,"input_length":8,"output_length":2,"hash_ids":[1,3]}';

  it('reports a hand-computed timeline', () => {
    // t=0: r0 prefills 8 tokens, first token at 10. r1 arrives at 5 during that pass and joins at 10 with block
    // [1,1,1,1] cached (4 tokens); both emit at 20, then at 30 (r0's third token, r1's second: both done).
    const c = replay(mooncakeFileWorkload(TRACE, 4), single(fixedConfig(4)));
    const r = c.report(0);
    const expected: Record<string, number> = {
      num_requests: 2,
      completed_requests: 2,
      total_input_tokens: 16,
      total_output_tokens: 5,
      duration_ms: 30,
      request_throughput_rps: 2 / 0.03,
      output_throughput_tok_s: 5 / 0.03,
      input_throughput_tok_s: 16 / 0.03,
      total_throughput_tok_s: 21 / 0.03,
      prefix_cache_reused_ratio: 4 / 16,
      mean_ttft_ms: 12.5,
      min_ttft_ms: 10,
      max_ttft_ms: 15,
      median_ttft_ms: 15,
      std_ttft_ms: 2.5,
      mean_itl_ms: 10,
      max_itl_ms: 10,
      std_itl_ms: 0,
      mean_tpot_ms: 10,
      mean_ttst_ms: 10,
      mean_e2e_latency_ms: 27.5,
      min_e2e_latency_ms: 25,
      max_e2e_latency_ms: 30,
      mean_output_token_throughput_per_user: 100,
    };
    for (const [key, value] of Object.entries(expected)) expect(r[key], key).toBeCloseTo(value, 9);
    const records = c.perRequest();
    expect(records.map((x) => [x.arrival_time_ms, x.first_admit_ms, x.first_token_ms, x.last_token_ms, x.reused_input_tokens])).toEqual([
      [0, 0, 10, 30, 0],
      [5, 10, 20, 30, 4],
    ]);
  });

  it("one worker gives the engine's own offline results: same token times for every request", () => {
    const text = Array.from({ length: 60 }, (_, i) =>
      JSON.stringify({
        timestamp: i * 37,
        input_length: 300 + ((i * 97) % 700),
        output_length: 5 + (i % 23),
        hash_ids: Array.from({ length: 4 }, (_, b) => (b < 2 ? b : i * 10 + b)),
      }),
    ).join('\n');
    const config = schedulerConfig({ ...DEFAULT_ENGINE_ARGS, blockSize: 16, numGpuBlocks: 400, maxNumSeqs: 8 }, modelTiming(polynomialPerfModel, 1, 1), 3);
    const workload = mooncakeFileWorkload(text, 256);
    const c = replay(workload, single(config));
    const own = runOffline(
      createSchedulerCore(config),
      workload.sessions.map((s, i) => ({
        arrivalMs: s.startMs!,
        request: { id: `req-${i}`, promptTokenIds: s.turns[0].prompt(), maxOutputTokens: s.turns[0].outputLength },
      })),
    );
    const records = c.perRequest();
    expect(records).toHaveLength(60);
    for (const [i, record] of records.entries()) {
      const mine = own.records.get(`req-${i}`)!;
      expect([record.first_admit_ms, record.first_token_ms, record.last_token_ms, record.output_length, record.reused_input_tokens]).toEqual([
        mine.admittedMs,
        mine.tokenTimesMs[0],
        mine.tokenTimesMs.at(-1),
        mine.tokenTimesMs.length,
        mine.cachedTokens,
      ]);
    }
    expect(c.report(0).duration_ms).toBe(own.durationMs);
  });

  const sharedPrefix = (o: Partial<SyntheticOptions> = {}) =>
    syntheticWorkload({
      inputTokens: 1024,
      outputTokens: 8,
      requestCount: 64,
      arrivalIntervalMs: 20,
      turnsPerSession: 1,
      sharedPrefixRatio: 0.75,
      numPrefixGroups: 4,
      interTurnDelayMs: 0,
      blockSize: 64,
      seed: 7,
      ...o,
    });
  const fleet = (workers: number, router: 'rr' | 'kv'): Fleet => {
    const config = schedulerConfig({ ...DEFAULT_ENGINE_ARGS, blockSize: 64 }, modelTiming(polynomialPerfModel, 1, 1), 1);
    return {
      kind: 'aggregated',
      workers: Array.from({ length: workers }, () => config),
      router:
        router === 'rr'
          ? new RoundRobinRouter(workers)
          : new KvRouter({ workers, blockSize: 64, config: DEFAULT_KV_ROUTER_CONFIG, maxNumBatchedTokens: 8192, seed: 1 }),
    };
  };

  it('round robin spreads requests evenly over the workers', () => {
    const c = replay(sharedPrefix(), fleet(4, 'rr'));
    expect(c.charts().workers.map((w) => w.requests)).toEqual([16, 16, 16, 16]);
    expect(
      c
        .perRequest()
        .map((r) => r.worker)
        .slice(0, 5),
    ).toEqual(['worker-0', 'worker-1', 'worker-2', 'worker-3', 'worker-0']);
  });

  it('kv_router sends a request to the worker holding its prefix: more reuse than round robin', () => {
    const rr = replay(sharedPrefix(), fleet(4, 'rr')).report(0);
    const kv = replay(sharedPrefix(), fleet(4, 'kv')).report(0);
    expect(kv.prefix_cache_reused_ratio).toBeGreaterThan(rr.prefix_cache_reused_ratio);
    expect(kv.completed_requests).toBe(64);
    // With idle workers (each request done before the next arrives) load plays no part: 4 groups × 12 of 16 blocks
    // shared, so every request but each group's first reuses 12 blocks (768 of 1024 tokens).
    const idle = replay(sharedPrefix({ arrivalIntervalMs: 5000 }), fleet(4, 'kv'));
    expect(idle.report(0).prefix_cache_reused_ratio).toBeCloseTo((60 * 768) / (64 * 1024), 9);
    expect(idle.perRequest().filter((r) => r.reused_input_tokens === 768)).toHaveLength(60);
  });

  it('closed loop never has more requests in flight than the cap', () => {
    const c = replay(sharedPrefix({ requestCount: 40 }), fleet(2, 'rr'), { kind: 'concurrency', limit: 3 });
    const records = c.perRequest();
    expect(records.filter((r) => r.output_length > 0)).toHaveLength(40);
    const edges = records
      .flatMap((r) => [
        [r.arrival_time_ms, 1],
        [r.last_token_ms!, -1],
      ])
      .sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    let inFlight = 0;
    let peak = 0;
    for (const [, delta] of edges) peak = Math.max(peak, (inFlight += delta));
    expect(peak).toBe(3);
  });

  it('a session turn starts no earlier than its predecessor completes plus the delay', () => {
    const w = syntheticWorkload({
      inputTokens: 128,
      outputTokens: 6,
      requestCount: 5,
      arrivalIntervalMs: 3,
      turnsPerSession: 3,
      sharedPrefixRatio: 0,
      numPrefixGroups: 0,
      interTurnDelayMs: 25,
      blockSize: 64,
      seed: 1,
    });
    const records = replay(w, fleet(2, 'rr')).perRequest();
    expect(records).toHaveLength(15);
    for (const r of records.filter((x) => x.turn_index! > 0)) {
      const previous = records.find((x) => x.session_id === r.session_id && x.turn_index === r.turn_index! - 1)!;
      expect(r.arrival_time_ms).toBe(previous.last_token_ms! + 25);
      expect(r.first_admit_ms!).toBeGreaterThanOrEqual(r.arrival_time_ms);
    }
  });

  it('disaggregated: prefill on a prefill worker, every reported token from a decode worker, TTFT including the KV handoff', () => {
    const w = mooncakeFileWorkload(TRACE, 4);
    const disagg = (handoff: { bytesPerToken: number; bandwidthGBps: number } | null): Fleet => ({
      kind: 'disaggregated',
      prefill: [fixedConfig(4)],
      decode: [fixedConfig(4), fixedConfig(4)],
      prefillRouter: new KvRouter({ workers: 1, blockSize: 4, config: prefillRouterConfig(DEFAULT_KV_ROUTER_CONFIG), maxNumBatchedTokens: 8192, seed: 1 }),
      decodeRouter: new KvRouter({ workers: 2, blockSize: 4, config: decodeRouterConfig(DEFAULT_KV_ROUTER_CONFIG), maxNumBatchedTokens: 8192, seed: 1 }),
      handoff,
    });
    // 8 tokens × 1,000,000 B at 1 GB/s = 8 ms (§5.2).
    const slow = replay(w, disagg({ bytesPerToken: 1_000_000, bandwidthGBps: 1 }));
    const instant = replay(w, disagg(null));
    const records = slow.perRequest();
    expect(records.map((r) => r.worker)).toEqual(['prefill-0', 'prefill-0']);
    // Decode workers report every requested token: 3 and 2.
    expect(records.map((r) => r.output_length)).toEqual([3, 2]);
    expect(records.every((r) => r.decode_worker?.startsWith('decode-'))).toBe(true);
    const decodeRequests = slow
      .charts()
      .workers.filter((x) => x.name.startsWith('decode'))
      .reduce((n, x) => n + x.requests, 0);
    expect(decodeRequests).toBe(2);
    const ttft = (c: ReplayCollector) => c.perRequest().map((r) => r.first_token_ms! - r.arrival_time_ms);
    // r0: prefill token at 10 ms; with the handoff the decode enqueue waits 8 ms more.
    expect(ttft(slow)[0] - ttft(instant)[0]).toBeCloseTo(8, 9);
    expect(instant.perRequest()[0].first_token_ms).toBeGreaterThan(10);
  });
});
