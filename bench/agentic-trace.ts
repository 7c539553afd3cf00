/**
 * Benchmark: offline replay of a large agentic trace (`mocker trace --trace-format agentic_mooncake`), as a user
 * runs it: the built CLI in a process of its own, its wall time and peak RSS taken by /usr/bin/time.
 *
 * The trace is synthetic (seeded, written to a temporary directory): --lanes lanes, each running agent plays back to
 * back (a lane's next play waits for its previous play's last request). A play is a main agent of 8–24 turns, each
 * waiting for the one before plus a tool wait of 50–2,000 ms; every fourth turn fans out into 2–3 sub-agents of 1–3
 * turns each, which the next main turn joins. Every prompt starts with one of 16 shared system prompts (4 blocks);
 * a main turn's prompt is its previous prompt plus 1–3 new blocks (answer and tool output), a sub-agent's the
 * system prompt, its task (2 blocks) and its own growth. Output 50–400 tokens. Trace block --block-size tokens, the
 * engine's block size the same.
 *
 * The baseline, interleaved in the same rounds: the same rows as a plain `mooncake` trace (every request at a fixed
 * timestamp, no dependencies): what the rows cost without the DAG. Both on --workers workers, kv_router.
 *
 *   npm run build && npx tsx bench/agentic-trace.ts [--requests 100000] [--lanes 8] [--workers 8]
 *                                                    [--block-size 64] [--rounds 3]
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { seededUniform } from '../src/util/mulberry32.js';
import { median, numberArg, printTable, round } from './lib/stats.js';

const REQUESTS = numberArg('requests', 100_000);
const LANES = numberArg('lanes', 8);
const WORKERS = numberArg('workers', 8);
const BLOCK = numberArg('block-size', 64);
const ROUNDS = numberArg('rounds', 3);
const CLI = fileURLToPath(new URL('../dist/cli/main.js', import.meta.url));

interface Row {
  request_id: string;
  session_id: string;
  timestamp?: number;
  wait_for?: string[];
  delay?: number;
  tool_wait_ms?: number;
  input_length: number;
  output_length: number;
  hash_ids: number[];
}

/** The agentic trace described above; rows in the order their requests could first start. */
export function agenticRows(requests: number, lanes: number, seed = 7): Row[] {
  const random = seededUniform(seed);
  const between = (lo: number, hi: number) => lo + Math.floor(random() * (hi - lo + 1));
  let nextBlock = 1_000;
  const fresh = (n: number) => Array.from({ length: n }, () => nextBlock++);
  const systemPrompts = Array.from({ length: 16 }, () => fresh(4));
  const rows: Row[] = [];
  const laneTail: (string | null)[] = Array(lanes).fill(null);
  let play = 0;
  while (rows.length < requests) {
    for (let lane = 0; lane < lanes && rows.length < requests; lane++, play++) {
      const session = `play-${play}`;
      const system = systemPrompts[play % systemPrompts.length];
      let prompt = [...system, ...fresh(2)];
      let waitFor: string[] = laneTail[lane] === null ? [] : [laneTail[lane]!];
      const turns = between(8, 24);
      for (let turn = 0; turn < turns && rows.length < requests; turn++) {
        const id = `${session}-t${turn}`;
        const row: Row = { request_id: id, session_id: session, input_length: prompt.length * BLOCK, output_length: between(50, 400), hash_ids: prompt };
        if (waitFor.length === 0) row.timestamp = lane * 1_000;
        else Object.assign(row, { wait_for: waitFor, delay: between(0, 20), tool_wait_ms: turn === 0 ? 0 : between(50, 2_000) });
        rows.push(row);
        waitFor = [id];
        if (turn % 4 === 3) {
          const joins: string[] = [];
          for (let agent = 0, agents = between(2, 3); agent < agents && rows.length < requests; agent++) {
            let subPrompt = [...system, ...fresh(2)];
            let subWait = id;
            for (let step = 0, steps = between(1, 3); step < steps && rows.length < requests; step++) {
              const subId = `${session}-t${turn}-a${agent}-s${step}`;
              rows.push({
                request_id: subId,
                session_id: `${session}-a${turn}.${agent}`,
                wait_for: [subWait],
                delay: between(0, 20),
                tool_wait_ms: step === 0 ? 0 : between(50, 1_000),
                input_length: subPrompt.length * BLOCK,
                output_length: between(50, 400),
                hash_ids: subPrompt,
              });
              subWait = subId;
              subPrompt = [...subPrompt, ...fresh(between(1, 2))];
            }
            joins.push(subWait);
          }
          waitFor = [id, ...joins];
        }
        prompt = [...prompt, ...fresh(between(1, 3))];
      }
      laneTail[lane] = waitFor[waitFor.length - 1];
    }
  }
  return rows;
}

/** The same requests without dependencies: each at a timestamp, 20 ms apart. */
const plainRows = (rows: Row[]) =>
  rows.map((r, i) => ({ session_id: r.request_id, timestamp: i * 20, input_length: r.input_length, output_length: r.output_length, hash_ids: r.hash_ids }));

interface Run {
  wallS: number;
  peakRssMiB: number;
  completed: number;
  simulatedS: number;
}

function runTrace(trace: string, format: string, report: string): Run {
  const args = ['-f', '%e %M', process.execPath, CLI, 'trace', trace, '--trace-format', format, '--trace-block-size', String(BLOCK)];
  args.push('--extra-engine-args', JSON.stringify({ block_size: BLOCK }), '--num-workers', String(WORKERS), '--router-mode', 'kv_router');
  args.push('--report-json', report, '--force', '--no-progress');
  const child = spawnSync('/usr/bin/time', args, { encoding: 'utf8', maxBuffer: 64 * 2 ** 20 });
  if (child.status !== 0) throw new Error(`mocker trace --trace-format ${format} exited ${child.status}: ${child.stderr.slice(-2000)}`);
  const [wallS, rssKiB] = child.stderr.trim().split('\n').at(-1)!.split(' ').map(Number);
  const json = JSON.parse(readFileSync(report, 'utf8')) as Record<string, number>;
  return { wallS, peakRssMiB: rssKiB / 1024, completed: json.completed_requests, simulatedS: json.duration_ms / 1000 };
}

function main(): void {
  const dir = mkdtempSync(join(tmpdir(), 'mocker-agentic-bench-'));
  try {
    const rows = agenticRows(REQUESTS, LANES);
    const agentic = join(dir, 'agentic.jsonl');
    const plain = join(dir, 'plain.jsonl');
    writeFileSync(agentic, `${rows.map((r) => JSON.stringify(r)).join('\n')}\n`);
    writeFileSync(
      plain,
      `${plainRows(rows)
        .map((r) => JSON.stringify(r))
        .join('\n')}\n`,
    );
    const tokens = rows.reduce((n, r) => n + r.input_length, 0);
    console.error(`agentic trace: ${rows.length} requests, ${LANES} lanes, ${round(tokens / rows.length, 0)} prompt tokens on average (block ${BLOCK})`);
    const agenticRuns: Run[] = [];
    const plainRuns: Run[] = [];
    for (let r = 0; r < ROUNDS; r++) {
      // The order alternates: neither always runs on a warmer machine.
      const order = r % 2 === 0 ? (['agentic', 'plain'] as const) : (['plain', 'agentic'] as const);
      for (const which of order) {
        const run = which === 'agentic' ? runTrace(agentic, 'agentic_mooncake', join(dir, 'a.json')) : runTrace(plain, 'mooncake', join(dir, 'p.json'));
        (which === 'agentic' ? agenticRuns : plainRuns).push(run);
        console.error(`round ${r + 1} ${which}: ${run.wallS} s wall, ${round(run.peakRssMiB, 0)} MiB peak RSS, ${run.completed} completed`);
      }
    }
    const summary = (runs: Run[]) => ({
      wallS: median(runs.map((x) => x.wallS)),
      wallSMin: Math.min(...runs.map((x) => x.wallS)),
      wallSMax: Math.max(...runs.map((x) => x.wallS)),
      peakRssMiB: Math.max(...runs.map((x) => x.peakRssMiB)),
      completed: runs[0].completed,
      simulatedS: runs[0].simulatedS,
    });
    const result = {
      config: { requests: rows.length, lanes: LANES, workers: WORKERS, blockSize: BLOCK, meanPromptTokens: round(tokens / rows.length, 0), rounds: ROUNDS },
      agentic: summary(agenticRuns),
      plain: summary(plainRuns),
      ratios: agenticRuns.map((a, i) => round(a.wallS / plainRuns[i].wallS, 3)),
    };
    printTable(
      ['trace', 'wall s (median)', 'range', 'peak RSS MiB', 'completed', 'simulated s'],
      (['agentic', 'plain'] as const).map((k) => [
        k,
        result[k].wallS,
        `${result[k].wallSMin}–${result[k].wallSMax}`,
        round(result[k].peakRssMiB, 0),
        result[k].completed,
        round(result[k].simulatedS, 1),
      ]),
    );
    console.log(JSON.stringify(result));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

main();
