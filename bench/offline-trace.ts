/**
 * Benchmark (issues #3 and #13, the speed of `mocker trace`): the offline replay's own code path — a workload,
 * normalizeArrivals, WorkloadDriver, OfflineReplay over scheduler cores, ReplayCollector and its report —
 * wired as src/app/trace.ts wires an offline aggregated run (polynomial perf model, seed 42, worker i seeded
 * 42 + i, vLLM default engine args unless a setting says otherwise). Wall time covers parsing the trace text
 * (read beforehand) or building the synthetic workload, the simulation and the report: what a user waits
 * for, minus process start and file reading. Settings:
 *   a. Dynamo's published run (engine-reference §8.9, PR #7543): first 1,000 rows of conversation_trace.jsonl,
 *      one worker, round robin, trace block 512, engine block_size 512, speedup_ratio 0.5 (Dynamo: ≈ 1.3 s
 *      wall, ≈ 313.6 s simulated). Goal ≤ 0.13 s (10× faster).
 *   b. The same with engine block 64. Goal ≤ 0.2 s.
 *   c. Dynamo's own bench defaults (lib/bench/offline_replay_bench.rs): the whole trace, 4 workers, kv_router
 *      (mocker's default --router-config), arrival speedup 4, trace block 512, engine block 64. Reported.
 *   d. Scaling: Dynamo's flat synthetic workload (--input-tokens 1000 --output-tokens 100, a request every
 *      1 ms, no shared prefixes) on one worker, 1,000 then 10,000 requests in interleaved rounds. That arrival
 *      rate overloads the worker (its waiting queue grows all run), so anything that costs per queued request
 *      shows; the 10,000-request run also works more per request, as its KV cache (16,384 blocks, about as
 *      many as 1,000 of these requests fill) evicts a block for nearly every block it stores. Goal: 10,000
 *      requests cost ≤ 10× 1,000.
 *   e. Memory of setting c's fleet on 1,000 rows and on the whole trace, each in a fresh process: peak RSS,
 *      and JS memory (heap plus typed arrays) at its peak during the run and still held after it (the
 *      workload and the collector, as the CLI holds them when it writes its report), per request.
 *   SGLang flavour (`--extra-engine-args '{"engine_type":"sglang",…}'`, SGLang defaults otherwise), beside
 *   a–c. Dynamo's PR #12034 measured its SGLang 1,000-request Mooncake replay at 19.4 s wall (engine-reference
 *   §8.9): goal ≤ 1.94 s (10× faster) for f, g and h.
 *   f. Setting b's run with SGLang at page size 1 (SGLang's own default), given b's KV capacity in tokens:
 *      16,384 blocks × 64 / page size 1 = 1,048,576 blocks of one token.
 *   g. The same at page size 64 (b's block size, mocker's default): 16,384 pages of 64.
 *   h. Setting a's run with SGLang at page size 512 (a's block size), 16,384 pages as in a.
 *   i. Setting c with SGLang at page size 64 (c's block size), 16,384 pages: the whole trace, 4 workers,
 *      kv_router, arrival speedup 4.
 *   j. Setting i at page size 1 with the same KV tokens (1,048,576 pages of one token; the router's block is
 *      the page, so it indexes every token). Reported. Only with --only: a round takes minutes (about 25× i,
 *      two thirds of it in the kv_router's index).
 * Every timed setting runs one warm-up round (reported too: it is what a single `mocker trace` run costs,
 * before the code is optimised), then --rounds rounds; median and min–max are reported. Without ../shared (a
 * CI clone has none) the trace settings are skipped, saying so.
 *
 *   npx tsx bench/offline-trace.ts [--rounds 5] [--only a,b,c,d,e,f,g,h,i] [--trace PATH]   (--only also takes j)
 * (--memory-probe ROWS is the child process of setting e.)
 */
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { fileURLToPath } from 'node:url';
import { DEFAULT_ENGINE_ARGS, schedulerConfig, type EngineArgs } from '../src/config/engineArgs.js';
import { modelTiming, polynomialPerfModel } from '../src/engine/index.js';
import { ReplayCollector, type ReplayReport } from '../src/trace/collector.js';
import { WorkloadDriver } from '../src/trace/driver.js';
import { DEFAULT_KV_ROUTER_CONFIG, KvRouter } from '../src/trace/kvRouter.js';
import { OfflineReplay } from '../src/trace/offline.js';
import { RoundRobinRouter, type Router } from '../src/trace/router.js';
import { mooncakeFileWorkload, normalizeArrivals, syntheticWorkload, type Workload } from '../src/trace/workload.js';
import { median, numberArg, printTable, round, stringArg } from './lib/stats.js';

const ROUNDS = numberArg('rounds', 5);
const SETTINGS = ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j'];
/** j is left out unless asked for: it takes minutes a round. */
const ONLY = new Set(
  stringArg('only', SETTINGS.filter((key) => key !== 'j').join(','))
    .split(',')
    .map((s) => s.trim()),
);
const TRACE = stringArg('trace', fileURLToPath(new URL('../../shared/traces/conversation_trace.jsonl', import.meta.url)));
const MEMORY_PROBE = stringArg('memory-probe', '');
if (!(Number.isInteger(ROUNDS) && ROUNDS >= 1)) throw new Error(`--rounds must be an integer >= 1, got ${ROUNDS}`);
for (const key of ONLY) if (!SETTINGS.includes(key)) throw new Error(`--only takes settings among ${SETTINGS.join(',')}, got ${key}`);
/** The CLI's default --seed for `mocker trace`. */
const SEED = 42;
const TRACE_BLOCK_SIZE = 512;
const DYNAMO_WALL_S = 1.3;
/** Dynamo's SGLang replay after its PR #12034 (engine-reference §8.9). */
const DYNAMO_SGLANG_WALL_S = 19.4;

interface Fleet {
  workers: number;
  router: 'round_robin' | 'kv_router';
  engine: Partial<EngineArgs>;
  arrivalSpeedup: number;
}

interface Outcome {
  wallMs: number;
  report: ReplayReport;
  rejected: number;
  /** What a `mocker trace` run still holds when it writes its report. */
  held: { workload: Workload; collector: ReplayCollector };
}

/** One offline aggregated run, as `mocker trace` makes it; `onProgress` stands in for the CLI's progress bar. */
function replay(makeWorkload: () => Workload, fleet: Fleet, onProgress: (done: number, nowMs: number) => void = () => {}): Outcome {
  const started = performance.now();
  const engine: EngineArgs = { ...DEFAULT_ENGINE_ARGS, ...fleet.engine };
  const workload = normalizeArrivals(makeWorkload(), fleet.arrivalSpeedup);
  const config = schedulerConfig(engine, modelTiming(polynomialPerfModel, engine.speedupRatio, engine.decodeSpeedupRatio), SEED);
  const router: Router =
    fleet.router === 'kv_router'
      ? new KvRouter({
          workers: fleet.workers,
          blockSize: engine.blockSize,
          config: DEFAULT_KV_ROUTER_CONFIG,
          maxNumBatchedTokens: engine.maxNumBatchedTokens,
          seed: SEED,
        })
      : new RoundRobinRouter(fleet.workers);
  const collector = new ReplayCollector(Array.from({ length: fleet.workers }, (_, i) => `worker-${i}`));
  const simulation = new OfflineReplay(
    { kind: 'aggregated', workers: Array.from({ length: fleet.workers }, (_, i) => ({ ...config, seed: SEED + i })), router },
    new WorkloadDriver(workload, { kind: 'trace' }),
    collector,
    onProgress,
  );
  simulation.run();
  const report = collector.report(performance.now() - started);
  let rejected = 0;
  for (const count of simulation.rejections.values()) rejected += count;
  return { wallMs: performance.now() - started, report, rejected, held: { workload, collector } };
}

/** The first `rows` lines of the trace (all when null). */
function traceText(rows: number | null): string {
  const text = readFileSync(TRACE, 'utf8');
  return rows === null ? text : text.split('\n').slice(0, rows).join('\n');
}

const FLEET_A: Fleet = { workers: 1, router: 'round_robin', engine: { blockSize: 512, speedupRatio: 0.5 }, arrivalSpeedup: 1 };
const FLEET_B: Fleet = { ...FLEET_A, engine: { blockSize: 64, speedupRatio: 0.5 } };
const FLEET_C: Fleet = { workers: 4, router: 'kv_router', engine: { blockSize: 64 }, arrivalSpeedup: 4 };
const FLEET_D: Fleet = { workers: 1, router: 'round_robin', engine: {}, arrivalSpeedup: 1 };
/** SGLang at `pageSize` holding `kvTokens` KV tokens: the page is also the block (stats, events, router). */
const sglangEngine = (pageSize: number, kvTokens: number): Partial<EngineArgs> => ({
  engineType: 'sglang',
  blockSize: pageSize,
  numGpuBlocks: kvTokens / pageSize,
  sglang: { ...DEFAULT_ENGINE_ARGS.sglang, pageSize },
});
/** The KV tokens of settings b and c: mocker's default 16,384 blocks of 64. */
const KV_TOKENS_64 = DEFAULT_ENGINE_ARGS.numGpuBlocks * 64;
const FLEET_F: Fleet = { ...FLEET_B, engine: { ...sglangEngine(1, KV_TOKENS_64), speedupRatio: 0.5 } };
const FLEET_G: Fleet = { ...FLEET_B, engine: { ...sglangEngine(64, KV_TOKENS_64), speedupRatio: 0.5 } };
const FLEET_H: Fleet = { ...FLEET_A, engine: { ...sglangEngine(512, DEFAULT_ENGINE_ARGS.numGpuBlocks * 512), speedupRatio: 0.5 } };
const FLEET_I: Fleet = { ...FLEET_C, engine: sglangEngine(64, KV_TOKENS_64) };
const FLEET_J: Fleet = { ...FLEET_C, engine: sglangEngine(1, KV_TOKENS_64) };
const synthetic = (requestCount: number) => () =>
  syntheticWorkload({
    inputTokens: 1000,
    outputTokens: 100,
    requestCount,
    arrivalIntervalMs: 1,
    turnsPerSession: 1,
    sharedPrefixRatio: 0,
    numPrefixGroups: 0,
    interTurnDelayMs: 0,
    blockSize: 64,
    seed: SEED,
  });

/** Setting e's figures for one run (MB). JS memory is the heap plus what typed arrays hold outside it. */
interface MemoryProbe {
  requests: number;
  peakRssMb: number;
  /** Before the run, after a full GC. */
  baseMb: number;
  /** Sampled during the run, garbage included. */
  peakMb: number;
  /** After the run and a full GC, with the workload and collector still held (as the CLI holds them). */
  heldMb: number;
}

const mb = (bytes: number) => bytes / 2 ** 20;
const jsMemory = () => {
  const usage = process.memoryUsage();
  return usage.heapUsed + usage.arrayBuffers;
};

if (MEMORY_PROBE !== '') {
  // A child of setting e: one run in a fresh process, with gc exposed (--expose-gc) for settled figures.
  const gc = (globalThis as { gc?: () => void }).gc;
  if (!gc) throw new Error('the memory probe needs node --expose-gc');
  const text = traceText(MEMORY_PROBE === 'all' ? null : Number(MEMORY_PROBE));
  gc();
  gc();
  const base = jsMemory();
  let peak = base;
  // Sampled every 100 completions: memoryUsage() is too slow for every event.
  const outcome = replay(
    () => mooncakeFileWorkload(text, TRACE_BLOCK_SIZE),
    FLEET_C,
    (done) => {
      if (done % 100 === 0) peak = Math.max(peak, jsMemory());
    },
  );
  // Twice: typed arrays' memory is freed by a sweep after the collection that found them dead.
  gc();
  gc();
  const held = jsMemory();
  const probe: MemoryProbe = {
    requests: outcome.held.collector.perRequest().length,
    peakRssMb: process.resourceUsage().maxRSS / 1024,
    baseMb: mb(base),
    peakMb: mb(Math.max(peak, held)),
    heldMb: mb(held),
  };
  console.log(JSON.stringify(probe));
  process.exit(0);
}

const spread = (values: number[]) => `${round(Math.min(...values), 1)}–${round(Math.max(...values), 1)}`;
const traceAvailable = existsSync(TRACE);
// The load average says whether other work shared the machine (every figure here is wall time).
const load = () =>
  loadavg()
    .map((l) => l.toFixed(2))
    .join(' ');
console.log(`machine: ${cpus().length} cores, ${cpus()[0]?.model.trim()}, node ${process.version}; ${new Date().toISOString()}; load average ${load()}`);
console.log(`rounds: ${ROUNDS} after a warm-up round; settings: ${[...ONLY].join(',')}`);
if (!traceAvailable) console.log(`no trace at ${TRACE} (../shared is absent, as in a CI clone): settings a, b, c, e, f, g, h, i and j are skipped`);

const table: (string | number)[][] = [];
const jsonLines: string[] = [];

function timeTrace(key: string, what: string, rows: number | null, fleet: Fleet, goalS: number | null): void {
  if (!ONLY.has(key)) return;
  if (!traceAvailable) return;
  const text = traceText(rows);
  const run = () => replay(() => mooncakeFileWorkload(text, TRACE_BLOCK_SIZE), fleet);
  // The warm-up round is what a single `mocker trace` run costs: the code is not optimised yet.
  const warmUpMs = run().wallMs;
  const outcomes: Outcome[] = [];
  for (let i = 0; i < ROUNDS; i++) outcomes.push(run());
  const walls = outcomes.map((o) => o.wallMs);
  const wallMs = median(walls);
  const { report, rejected } = outcomes[0];
  const met = goalS === null ? '' : wallMs / 1000 <= goalS ? 'MET' : 'NOT MET';
  console.log(`${key}. ${what}: warm-up ${round(warmUpMs, 1)} ms, then ${walls.map((w) => round(w, 1)).join(', ')} ms`);
  table.push([
    key,
    report.num_requests,
    round(wallMs, 1),
    spread(walls),
    round(warmUpMs, 1),
    round(report.duration_ms / 1000, 1),
    round(report.num_requests / (wallMs / 1000), 0),
    round(report.prefix_cache_reused_ratio, 3),
    goalS === null ? '' : `≤ ${round(goalS * 1000, 1)}`,
    met,
  ]);
  jsonLines.push(
    JSON.stringify({
      bench: 'offline-trace',
      setting: key,
      what,
      requests: report.num_requests,
      completed: report.completed_requests,
      rejected,
      wallMsMedian: round(wallMs, 1),
      wallMsMin: round(Math.min(...walls), 1),
      wallMsMax: round(Math.max(...walls), 1),
      wallMs: walls.map((w) => round(w, 1)),
      warmUpMs: round(warmUpMs, 1),
      simulatedS: round(report.duration_ms / 1000, 3),
      prefixReuseRatio: round(report.prefix_cache_reused_ratio, 4),
      goalMs: goalS === null ? null : round(goalS * 1000, 1),
      met: goalS === null ? null : met === 'MET',
    }),
  );
}

timeTrace('a', 'first 1,000 rows, 1 worker, round robin, block 512, speedup 0.5', 1000, FLEET_A, DYNAMO_WALL_S / 10);
timeTrace('b', 'first 1,000 rows, 1 worker, round robin, block 64, speedup 0.5', 1000, FLEET_B, 0.2);
timeTrace('c', 'whole trace, 4 workers, kv_router, arrival speedup 4, block 64', null, FLEET_C, null);

if (ONLY.has('d')) {
  const small = synthetic(1000);
  const large = synthetic(10_000);
  const warmUpMs = [replay(small, FLEET_D).wallMs, replay(large, FLEET_D).wallMs];
  const smallWalls: number[] = [];
  const largeWalls: number[] = [];
  for (let i = 0; i < ROUNDS; i++) {
    smallWalls.push(replay(small, FLEET_D).wallMs);
    largeWalls.push(replay(large, FLEET_D).wallMs);
  }
  const ratios = smallWalls.map((w, i) => largeWalls[i] / w);
  const ratio = median(largeWalls) / median(smallWalls);
  const met = ratio <= 10 ? 'MET' : 'NOT MET';
  console.log(`d. synthetic 1k: ${smallWalls.map((w) => round(w, 1)).join(', ')} ms; 10k: ${largeWalls.map((w) => round(w, 1)).join(', ')} ms`);
  table.push([
    'd 1k',
    1000,
    round(median(smallWalls), 1),
    spread(smallWalls),
    round(warmUpMs[0], 1),
    '',
    round(1000 / (median(smallWalls) / 1000), 0),
    '',
    '',
    '',
  ]);
  table.push([
    'd 10k',
    10_000,
    round(median(largeWalls), 1),
    spread(largeWalls),
    round(warmUpMs[1], 1),
    '',
    round(10_000 / (median(largeWalls) / 1000), 0),
    '',
    `≤ 10× 1k (${round(ratio, 2)}×)`,
    met,
  ]);
  jsonLines.push(
    JSON.stringify({
      bench: 'offline-trace',
      setting: 'd',
      what: 'synthetic 1000 in / 100 out, every 1 ms, 1 worker: 10k vs 1k requests',
      wallMs1kMedian: round(median(smallWalls), 1),
      wallMs10kMedian: round(median(largeWalls), 1),
      wallMs1k: smallWalls.map((w) => round(w, 1)),
      wallMs10k: largeWalls.map((w) => round(w, 1)),
      ratio: round(ratio, 3),
      ratioMin: round(Math.min(...ratios), 3),
      ratioMax: round(Math.max(...ratios), 3),
      ratioOfMinima: round(Math.min(...largeWalls) / Math.min(...smallWalls), 3),
      goalRatio: 10,
      met: met === 'MET',
    }),
  );
}

timeTrace('f', 'SGLang: first 1,000 rows, 1 worker, round robin, page 1 (1,048,576 pages), speedup 0.5', 1000, FLEET_F, DYNAMO_SGLANG_WALL_S / 10);
timeTrace('g', 'SGLang: first 1,000 rows, 1 worker, round robin, page 64 (16,384 pages), speedup 0.5', 1000, FLEET_G, DYNAMO_SGLANG_WALL_S / 10);
timeTrace('h', 'SGLang: first 1,000 rows, 1 worker, round robin, page 512 (16,384 pages), speedup 0.5', 1000, FLEET_H, DYNAMO_SGLANG_WALL_S / 10);
timeTrace('i', 'SGLang: whole trace, 4 workers, kv_router, arrival speedup 4, page 64 (16,384 pages)', null, FLEET_I, null);
timeTrace('j', 'SGLang: whole trace, 4 workers, kv_router, arrival speedup 4, page 1 (1,048,576 pages)', null, FLEET_J, null);

if (table.length > 0) {
  console.log('');
  printTable(['setting', 'requests', 'wall ms (median)', 'min–max', 'warm-up ms', 'simulated s', 'req / wall s', 'prefix reuse', 'goal ms', ''], table);
}

if (ONLY.has('e') && traceAvailable) {
  const probe = (rows: string): MemoryProbe => {
    const child = spawnSync(process.execPath, [...process.execArgv, '--expose-gc', fileURLToPath(import.meta.url), '--memory-probe', rows, '--trace', TRACE], {
      encoding: 'utf8',
    });
    if (child.status !== 0) throw new Error(`memory probe (${rows} rows) failed: ${child.stderr}`);
    return JSON.parse(child.stdout.trim().split('\n').pop()!) as MemoryProbe;
  };
  const probes = [probe('1000'), probe('all')];
  console.log("\ne. memory of setting c's fleet, each run in a fresh process (JS memory: heap + typed arrays)");
  const perRequestKb = (p: MemoryProbe, mbs: number) => round((mbs * 1024) / p.requests, 2);
  printTable(
    ['rows', 'peak RSS MB', 'JS before MB', 'JS peak MB', 'JS held after MB', 'held KB / request'],
    probes.map((p) => [p.requests, round(p.peakRssMb, 1), round(p.baseMb, 1), round(p.peakMb, 1), round(p.heldMb, 1), perRequestKb(p, p.heldMb - p.baseMb)]),
  );
  const [small, full] = probes;
  const heldRatio = (full.heldMb - full.baseMb) / full.requests / ((small.heldMb - small.baseMb) / small.requests);
  console.log(`held memory per request, whole trace ÷ 1,000 rows: ${round(heldRatio, 2)}×`);
  jsonLines.push(JSON.stringify({ bench: 'offline-trace', setting: 'e', probes, heldPerRequestRatio: round(heldRatio, 3) }));
}

console.log(`\nload average at the end: ${load()}`);
for (const line of jsonLines) console.log(line);
