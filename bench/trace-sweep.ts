/**
 * Benchmark (issue 40, sweeps): `mocker trace --sweep router-mode=round_robin,kv_router --sweep
 * num_gpu_blocks=A,B,C` (six offline replays over worker threads, one per core) against the slowest of those six
 * combinations run alone, both through the built CLI as users run them (process start included), on an
 * agent-like trace whose every turn extends its session's history (test/support/agentTrace.ts). The sweep runs in
 * lanes, one per core: the command's own thread and worker threads. Each round runs the sweep and each
 * combination alone (which goes first alternates between rounds); reported: per round the ratio sweep ÷ that round's slowest single
 * run, their median and spread (issue 40's target: ≤ 2 on 2 cores). Each round also times the command's start (the
 * same command on a one-request trace) and gives the floor of that ratio: a perfect sweep, which starts once and
 * splits the six runs' time beyond their start evenly over its lanes with nothing lost, takes start + Σ (run − start)
 * ÷ lanes. Six runs of about equal cost on two lanes tend to 3× one as the simulation outweighs the start (about
 * 0.25 s), and come nearer 1× as it shrinks; --sessions sizes it. Above that floor: a run alone has the other core
 * for its JIT compiler and garbage collector, while each lane of the sweep warms up (its first runs up to 1.5× a
 * warm one) on a busy machine.
 *
 *   npm run build && npx tsx bench/trace-sweep.ts [--rounds 3] [--sessions 512] [--turns 12]
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { writeAgentTrace } from '../test/support/agentTrace.js';
import { median, nowMs, numberArg, printTable, round } from './lib/stats.js';

const ROUNDS = numberArg('rounds', 3);
const SESSIONS = numberArg('sessions', 512);
const TURNS = numberArg('turns', 12);
const KV_SIZES = [256, 1024, 4096];
const MODES = ['round_robin', 'kv_router'];

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'bench-trace-sweep-'));
const trace = join(dir, 'agent.jsonl');
/** One request: the same command on it is the command's start. */
const tinyTrace = join(dir, 'one.jsonl');
const LANES = Math.min(availableParallelism(), 6);
const FLAGS = [
  '--trace-format',
  'agentic_mooncake',
  '--trace-block-size',
  '64',
  '--num-workers',
  '4',
  '--no-progress',
  '--force',
  '--report-json',
  join(dir, 'report.json'),
];

/** Runs the CLI's trace command on `file`; its wall time in ms. */
function timed(args: string[], file = trace): number {
  const started = nowMs();
  const run = spawnSync(process.execPath, [join(ROOT, 'dist', 'cli', 'main.js'), 'trace', file, ...FLAGS, ...args], { encoding: 'utf8' });
  if (run.status !== 0) throw new Error(`mocker trace ${args.join(' ')} failed (${run.status}): ${run.stderr}`);
  return nowMs() - started;
}

const single = (mode: string, blocks: number) => ['--router-mode', mode, '--extra-engine-args', JSON.stringify({ num_gpu_blocks: blocks })];
const SWEEP = ['--sweep', `router-mode=${MODES.join(',')}`, '--sweep', `num_gpu_blocks=${KV_SIZES.join(',')}`];

try {
  writeAgentTrace(trace, {
    sessions: SESSIONS,
    turns: TURNS,
    blocksPerTurn: 4,
    blockTokens: 64,
    outputTokens: 64,
    gapMs: 20,
    delayMs: 1000,
    seed: 40,
    agentic: true,
  });
  writeAgentTrace(tinyTrace, { sessions: 1, turns: 1, blocksPerTurn: 4, blockTokens: 64, outputTokens: 64, gapMs: 20, delayMs: 1000, seed: 40, agentic: true });
  const combinations = MODES.flatMap((mode) => KV_SIZES.map((blocks) => ({ mode, blocks })));
  timed(single(combinations[0].mode, combinations[0].blocks)); // unmeasured: the file system's caches warm
  const sweepMs: number[] = [];
  const slowestMs: number[] = [];
  const slowestOf: string[] = [];
  const floorMs: number[] = [];
  for (let r = 0; r < ROUNDS; r++) {
    // Each round: the sweep, then every combination alone (the slowest is this round's baseline), or the reverse.
    const sweepFirst = r % 2 === 0;
    if (sweepFirst) sweepMs.push(timed(SWEEP));
    const alone = combinations.map((c) => ({ label: `${c.mode}/${c.blocks}`, ms: timed(single(c.mode, c.blocks)) }));
    if (!sweepFirst) sweepMs.push(timed(SWEEP));
    const slowest = alone.reduce((a, b) => (b.ms > a.ms ? b : a));
    slowestMs.push(slowest.ms);
    slowestOf.push(slowest.label);
    const startMs = timed(single(combinations[0].mode, combinations[0].blocks), tinyTrace);
    floorMs.push(startMs + alone.reduce((t, a) => t + Math.max(0, a.ms - startMs), 0) / LANES);
    console.log(
      `round ${r + 1}: alone (ms) ${alone.map((a) => `${a.label} ${round(a.ms, 0)}`).join(', ')}; sum ${round(
        alone.reduce((t, a) => t + a.ms, 0),
        0,
      )}; the command's start ${round(startMs, 0)}`,
    );
  }
  const ratios = sweepMs.map((ms, i) => ms / slowestMs[i]);
  const floorRatios = floorMs.map((ms, i) => ms / slowestMs[i]);
  printTable(
    ['round', 'sweep of 6 (ms)', 'slowest alone (ms)', 'slowest', 'ratio', `a perfect sweep on ${LANES} lanes (ms)`, 'its ratio'],
    ratios.map((ratio, i) => [
      i + 1,
      round(sweepMs[i], 0),
      round(slowestMs[i], 0),
      slowestOf[i],
      round(ratio, 2),
      round(floorMs[i], 0),
      round(floorRatios[i], 2),
    ]),
  );
  console.log(
    JSON.stringify({
      config: { sessions: SESSIONS, turns: TURNS, requests: SESSIONS * TURNS, kvSizes: KV_SIZES, lanes: LANES, rounds: ROUNDS },
      sweepMsMedian: round(median(sweepMs), 1),
      slowestMsMedian: round(median(slowestMs), 1),
      ratio: round(median(ratios), 3),
      ratios: ratios.map((x) => round(x, 3)),
      floorRatio: round(median(floorRatios), 3),
      floorRatios: floorRatios.map((x) => round(x, 3)),
    }),
  );
} finally {
  rmSync(dir, { recursive: true, force: true });
}
