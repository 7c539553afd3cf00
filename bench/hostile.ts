/**
 * Benchmark (robustness, issue #33): the hostile mix through the spawned CLI — fuzzed tool schemas (huge
 * minLength and minItems, deep nesting, wrong types) and fuzzed request chat templates into one
 * `serve --mode random --trust-request-chat-template`, and chats steering a hostile capture file's own chat
 * template (loops, allocations, recursion, giant strings) and tokenizer files into a `serve` of that capture
 * (test/support/hostileFuzz.ts): --cases of each, one serve at a time (both at once on 2 cores, their
 * renderers spinning in hostile loops, measure the machine more than either). A prober in a process of its own
 * asks both for /health every 50 ms; RSS is sampled every 250 ms (each serve, and apart its template renderers).
 * Prints crashes, answers by kind, /health latency percentiles and peak RSS with the machine and date, then a JSON
 * line; exits 1 unless there were 0 crashes and 0 invalid answers, the /health p99 was at most 100 ms and each
 * serve's peak RSS, with its template renderers, at most 1 GB (the acceptance targets). Runs the built CLI: `npm run build` first.
 *
 *   npx tsx bench/hostile.ts [--cases 10000] [--seed 1] [--concurrency 16]   (--cases per serve)
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { cpus, loadavg, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import {
  deadHostile,
  hostileRssMb,
  makeHostileRigCase,
  runHostileCases,
  startHostileRig,
  type HostileDoor,
  type HostileOutcome,
} from '../test/support/hostileFuzz.js';
import { prng } from '../test/support/prng.js';
import { startHealthProber, type HealthProbes } from './lib/healthProber.js';
import { numberArg, printTable, quantile, round } from './lib/stats.js';

const CASES = numberArg('cases', 10_000);
const SEED = numberArg('seed', 1);
const CONCURRENCY = numberArg('concurrency', 16);
/** Cases sent between two checks that both processes live. */
const BATCH = 500;
/** The acceptance targets. */
const HEALTH_P99_MS = 100;
const PEAK_RSS_MB = 1024;

const countBy = (xs: string[]) => Object.fromEntries([...xs.reduce((m, x) => m.set(x, (m.get(x) ?? 0) + 1), new Map<string, number>())].sort());

async function main(): Promise<void> {
  const date = new Date().toISOString();
  console.log(
    `bench:hostile ${date}; machine: ${cpus().length} cores, ${cpus()[0]?.model.trim() ?? '?'}, ${Math.round(totalmem() / 2 ** 30)} GiB, node ${process.version}, load average ${loadavg()[0].toFixed(2)}`,
  );
  const dir = mkdtempSync(join(tmpdir(), 'mocker-bench-hostile-'));
  const rig = await startHostileRig(dir);
  const prober = startHealthProber([
    { name: 'plain', port: rig.plain.port, path: '/health' },
    { name: 'captured', port: rig.captured.port, path: '/health' },
  ]);
  const peakRss: Record<string, number> = {};
  const sampleRss = () => {
    for (const [name, mb] of Object.entries(hostileRssMb(rig))) if (Number.isFinite(mb)) peakRss[name] = Math.max(peakRss[name] ?? 0, mb);
  };
  let polling = true;
  const poller = (async () => {
    while (polling) {
      sampleRss();
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
  })();

  const outcomes: HostileOutcome[] = [];
  const dead = new Set<string>();
  const r = prng(SEED);
  const start = performance.now();
  let probes: HealthProbes = { ms: {}, unhealthy: [] };
  try {
    for (const door of ['plain', 'captured'] as HostileDoor[]) {
      for (let first = 0; first < CASES && dead.size === 0; first += BATCH) {
        const cases = Array.from({ length: Math.min(BATCH, CASES - first) }, () => makeHostileRigCase(r, door));
        outcomes.push(...(await runHostileCases(rig, cases, { concurrency: CONCURRENCY, firstIndex: outcomes.length, seed: SEED })));
        for (const d of deadHostile(rig)) dead.add(d);
        console.log(
          `… ${door}: ${first + cases.length}/${CASES} cases, ${outcomes.filter((o) => o.violation).length} violations, ${round((performance.now() - start) / 1000, 1)} s`,
        );
      }
    }
    sampleRss();
  } finally {
    polling = false;
    await poller;
    probes = await prober.stop();
    await rig.stop();
    rmSync(dir, { recursive: true, force: true });
  }
  const seconds = (performance.now() - start) / 1000;

  const violations = outcomes.filter((o) => o.violation !== null).map((o) => o.violation!);
  printTable(['case', 'cases'], Object.entries(countBy(outcomes.map((o) => `${o.door}: ${o.case.kind}`))));
  console.log();
  printTable(['answer', 'cases'], Object.entries(countBy(outcomes.map((o) => o.kind))));
  console.log();
  console.log('slowest answers:');
  for (const o of [...outcomes].sort((a, b) => b.ms - a.ms).slice(0, 5))
    console.log(`  ${round(o.ms, 1)} ms ${o.door} ${o.kind}: ${o.case.body.toString('utf8').slice(0, 160)}`);
  console.log();
  printTable(
    ['process', 'peak RSS MB'],
    Object.entries(peakRss).map(([name, mb]) => [name, round(mb, 1)]),
  );
  console.log();
  const healthMs = Object.values(probes.ms).flat();
  printTable(
    ['/health of', 'probes', 'p50 ms', 'p99 ms', 'max ms'],
    Object.entries(probes.ms).map(([name, ms]) => [name, ms.length, round(quantile(ms, 0.5)), round(quantile(ms, 0.99)), round(Math.max(...ms))]),
  );
  const p99 = quantile(healthMs, 0.99);
  // A serve's renderers are its own processes: the target holds for the serve with them.
  const servePeak = Math.max(peakRss['plain with renderers'] ?? 0, peakRss['captured with renderers'] ?? 0);
  console.log();
  console.log(
    `crashes: ${dead.size} (${[...dead].join(', ') || 'none'}); invalid answers: ${violations.length}; /health: ${healthMs.length} probes, p99 ${round(p99)} ms (target ≤ ${HEALTH_P99_MS}), ${probes.unhealthy.length} not 200; peak RSS of a serve with its renderers ${round(servePeak, 1)} MB (target ≤ ${PEAK_RSS_MB}); ${outcomes.length} cases in ${round(seconds, 1)} s`,
  );
  for (const v of [...violations, ...probes.unhealthy].slice(0, 20)) console.log(`  ${v.slice(0, 600)}`);
  console.log(
    JSON.stringify({
      benchmark: 'hostile',
      date,
      machine: { cpu: cpus()[0]?.model.trim() ?? 'unknown', cores: cpus().length, node: process.version },
      cases: outcomes.length,
      seed: SEED,
      concurrency: CONCURRENCY,
      seconds: round(seconds, 1),
      crashes: dead.size,
      violations: violations.length,
      unhealthy: probes.unhealthy.length,
      healthP50Ms: round(quantile(healthMs, 0.5)),
      healthP99Ms: round(p99),
      healthMaxMs: round(Math.max(...healthMs)),
      peakRssMb: Object.fromEntries(Object.entries(peakRss).map(([name, mb]) => [name, round(mb, 1)])),
      byAnswer: countBy(outcomes.map((o) => o.kind)),
    }),
  );
  const failed = dead.size > 0 || violations.length > 0 || probes.unhealthy.length > 0 || !(p99 <= HEALTH_P99_MS) || servePeak > PEAK_RSS_MB;
  process.exitCode = failed ? 1 : 0;
}

await main();
