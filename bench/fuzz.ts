/**
 * Benchmark (robustness): fuzzed requests through the spawned CLI, as users launch it — `serve`, `capture` in
 * front of it, and `pd-proxy` in front of a prefill and a decode `serve` (all `--timing none`). Cases are
 * structural (wrong paths, methods, content types, non-objects, oversized bodies, wrong types), grammar-based
 * (hostile numbers, unicode edge cases, deep nesting, duplicated keys, giant strings) and byte-level mutations
 * of valid bodies; 6 % of the clients leave early. Batches alternate one client and --concurrency clients.
 * A prober in a process of its own asks every process for /health every 50 ms the whole time; RSS is sampled
 * every 500 ms.
 * Prints counts by status and kind, /health latency percentiles, peak RSS, then a JSON line; exits 1 on any
 * crash, invalid answer, engine left busy, integrity failure or capture that does not replay.
 * The same machinery, seeded and smaller, is test/fuzz/fuzz-processes.test.ts. Runs the built CLI: `npm run build` first.
 *
 *   npx tsx bench/fuzz.ts [--requests 10000] [--seed 1] [--batch 500] [--concurrency 32] [--keep]
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { makeProcessFuzzCase } from '../test/support/fuzzRequests.js';
import {
  deadProcesses,
  FUZZ_MAX_BODY,
  fuzzBatch,
  RSS_BOUND_MB,
  rssMb,
  settledEngines,
  startFuzzRig,
  verifyCaptureFile,
  type FuzzOutcome,
} from '../test/support/fuzzRig.js';
import { prng } from '../test/support/prng.js';
import { startHealthProber, type HealthProbes } from './lib/healthProber.js';
import { flag, numberArg, printTable, quantile, round } from './lib/stats.js';

const REQUESTS = numberArg('requests', 10_000);
const SEED = numberArg('seed', 1);
const BATCH = numberArg('batch', 500);
const CONCURRENCY = numberArg('concurrency', 32);
/** Keep the temporary directory (capture file included) for a look afterwards. */
const KEEP = flag('keep');

const countBy = (xs: string[]) => Object.fromEntries([...xs.reduce((m, x) => m.set(x, (m.get(x) ?? 0) + 1), new Map<string, number>())].sort());

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'mocker-bench-fuzz-'));
  const rig = await startFuzzRig(dir);
  const prober = startHealthProber(
    Object.entries(rig.processes).map(([name, p]) => ({ name, port: p.port, path: name === 'pd-proxy' ? '/healthcheck' : '/health' })),
  );
  const peakRss: Record<string, number> = {};
  let polling = true;
  const poller = (async () => {
    while (polling) {
      for (const [name, mb] of Object.entries(rssMb(rig))) peakRss[name] = Math.max(peakRss[name] ?? 0, mb);
      await new Promise((resolve) => setTimeout(resolve, 500));
    }
  })();

  const outcomes: FuzzOutcome[] = [];
  const dead = new Set<string>();
  const r = prng(SEED);
  const net = prng(SEED + 1);
  const start = performance.now();
  let verified: Awaited<ReturnType<typeof verifyCaptureFile>> | null = null;
  let busy: string[] = [];
  let probes: HealthProbes = { ms: {}, unhealthy: [] };
  try {
    for (let first = 0; first < REQUESTS; first += BATCH) {
      const cases = Array.from({ length: Math.min(BATCH, REQUESTS - first) }, () => makeProcessFuzzCase(r, FUZZ_MAX_BODY));
      const concurrency = (first / BATCH) % 2 === 0 ? 1 : CONCURRENCY;
      outcomes.push(...(await fuzzBatch(rig, cases, { concurrency, firstIndex: first, seed: SEED, r: net })));
      for (const d of deadProcesses(rig)) dead.add(d);
      console.log(
        `… ${outcomes.length}/${REQUESTS} requests, ${outcomes.filter((o) => o.violation).length} violations, ${round((performance.now() - start) / 1000, 1)} s`,
      );
      if (dead.size > 0) break;
    }
    for (const [name, mb] of Object.entries(rssMb(rig))) peakRss[name] = Math.max(peakRss[name] ?? 0, mb);
    polling = false;
    await poller;
    probes = await prober.stop();
    busy = await settledEngines(rig);
    if (dead.size === 0) verified = await verifyCaptureFile(rig, outcomes, dir, SEED);
  } finally {
    polling = false;
    await poller;
    await prober.stop();
    await rig.stop();
    if (KEEP) console.log(`kept ${dir}`);
    else rmSync(dir, { recursive: true, force: true });
  }
  const seconds = (performance.now() - start) / 1000;

  const violations = outcomes.filter((o) => o.violation !== null).map((o) => o.violation!);
  const byStatus = countBy(outcomes.map((o) => (o.kind === 'disconnected' ? 'client left' : o.reply ? String(o.reply.status) : 'none')));
  const byKind = countBy(outcomes.map((o) => o.case.kind));
  const byAnswer = countBy(outcomes.map((o) => o.kind));
  printTable(['status', 'requests'], Object.entries(byStatus));
  console.log();
  printTable(['answer', 'requests'], Object.entries(byAnswer));
  console.log();
  printTable(['generator', 'requests'], Object.entries(byKind));
  console.log();
  printTable(
    ['process', 'peak RSS MB'],
    Object.entries(peakRss).map(([name, mb]) => [name, round(mb, 1)]),
  );
  console.log();
  console.log("slowest answers (sequential batches, so the time is the request's own):");
  const sequential = outcomes.filter((o) => Math.floor(o.index / BATCH) % 2 === 0 && o.kind !== 'disconnected');
  for (const o of sequential.sort((a, b) => b.ms - a.ms).slice(0, 8)) {
    console.log(`  ${round(o.ms, 1)} ms ${o.door} ${o.kind} (${o.case.kind}, ${o.case.body.length} bytes): ${o.case.body.toString('latin1').slice(0, 160)}`);
  }
  console.log();
  const { unhealthy } = probes;
  const healthMs = Object.values(probes.ms).flat();
  printTable(
    ['/health of', 'probes', 'p50 ms', 'p99 ms', 'max ms'],
    Object.entries(probes.ms).map(([name, ms]) => [name, ms.length, round(quantile(ms, 0.5)), round(quantile(ms, 0.99)), round(Math.max(...ms))]),
  );
  console.log();
  const latency = { p50: quantile(healthMs, 0.5), p99: quantile(healthMs, 0.99), max: Math.max(...healthMs) };
  console.log(
    `/health: ${healthMs.length} probes, p50 ${round(latency.p50)} ms, p99 ${round(latency.p99)} ms, max ${round(latency.max)} ms; ${unhealthy.length} not 200`,
  );
  console.log(`${outcomes.length} requests in ${round(seconds, 1)} s; processes dead: ${[...dead].join(', ') || 'none'}; engines left busy: ${busy.length}`);
  console.log(
    `capture file: integrity ${verified?.integrity ?? 'not checked'}, ${verified?.replayed ?? 0} completed exchanges replayed, ${verified?.batches ?? 0} batches of prompts stored whole (never replayed), ${verified?.problems.length ?? 0} problems`,
  );
  for (const v of [...violations, ...busy, ...unhealthy, ...(verified?.problems ?? [])].slice(0, 20)) console.log(`  ${v.slice(0, 600)}`);
  const maxPeak = Math.max(...Object.values(peakRss));
  console.log(
    JSON.stringify({
      benchmark: 'fuzz',
      requests: outcomes.length,
      seed: SEED,
      concurrency: CONCURRENCY,
      seconds: round(seconds, 1),
      byStatus,
      byKind,
      violations: violations.length,
      dead: dead.size,
      unhealthy: unhealthy.length,
      healthP50Ms: round(latency.p50),
      healthP99Ms: round(latency.p99),
      healthMaxMs: round(latency.max),
      peakRssMb: round(maxPeak, 1),
      rssBoundMb: RSS_BOUND_MB,
      enginesBusy: busy.length,
      integrity: verified?.integrity ?? null,
      replayed: verified?.replayed ?? 0,
      batchesNotReplayed: verified?.batches ?? 0,
      replayProblems: verified?.problems.length ?? null,
    }),
  );
  const failed =
    violations.length + dead.size + unhealthy.length + busy.length + (verified ? verified.problems.length + (verified.integrity === 'ok' ? 0 : 1) : 1) > 0 ||
    maxPeak >= RSS_BOUND_MB;
  process.exitCode = failed ? 1 : 0;
}

await main();
