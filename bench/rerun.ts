/**
 * Benchmark: `mocker rerun` end to end (the process start, the capture proxy recording every answer into a new
 * file, the comparison, the report) against the floor: the same requests sent straight to the same target by a
 * bare node:http client at the same concurrency. The target is `mocker serve --mode replay --timing none` of the
 * golden file (answers as fast as it can), the golden file a capture of `mocker serve --fast` made by the spawned
 * CLI. Rounds interleave the two, their order alternating; the table gives each round and the median ratio.
 *
 *   npx tsx bench/rerun.ts [--exchanges 400] [--concurrency 8] [--rounds 5]
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import http from 'node:http';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { goldenRequests, type RerunRequest } from '../src/rerun/requests.js';
import { median, numberArg, printTable, round } from './lib/stats.js';

const EXCHANGES = numberArg('exchanges', 400);
const CONCURRENCY = numberArg('concurrency', 8);
const ROUNDS = numberArg('rounds', 5);
const MAIN = join(import.meta.dirname, '..', 'dist', 'cli', 'main.js');
const MODEL = 'Qwen/Qwen3-0.6B';

function start(args: string[]): Promise<{ child: ChildProcess; url: string }> {
  const child = spawn(process.execPath, [MAIN, ...args, '--host', '127.0.0.1', '--port', '0'], { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  return new Promise((resolve, reject) => {
    child.stdout!.on('data', (d: Buffer) => {
      out += d.toString();
      const m = /(?:on|proxying) (http:\/\/127\.0\.0\.1:\d+)/.exec(out);
      if (m) resolve({ child, url: m[1] });
    });
    child.once('exit', (code) => reject(new Error(`mocker ${args[0]} exited with ${code}: ${out}`)));
  });
}

async function stop(child: ChildProcess): Promise<void> {
  const exited = new Promise((r) => child.once('exit', r));
  child.kill('SIGTERM');
  await exited;
}

function post(url: string, path: string, body: Buffer | string, headers: http.OutgoingHttpHeaders = { 'content-type': 'application/json' }): Promise<void> {
  return new Promise((resolve, reject) => {
    const req = http.request(new URL(path, url), { method: 'POST', headers: { ...headers, 'content-length': Buffer.byteLength(body) } }, (res) => {
      res.resume();
      res.on('end', resolve);
    });
    req.on('error', reject);
    req.end(body);
  });
}

async function inParallel<T>(items: readonly T[], concurrency: number, work: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(concurrency, items.length) }, async () => {
      while (next < items.length) await work(items[next++]);
    }),
  );
}

/** Greedy chats (half streamed) and completions, each its own prompt. */
function goldenBodies(): [string, string][] {
  return Array.from({ length: EXCHANGES }, (_, i) =>
    i % 3 === 2
      ? ['/v1/completions', JSON.stringify({ model: MODEL, prompt: `Request ${i}: count to ten.`, max_tokens: 32, temperature: 0, stream: i % 2 === 0 })]
      : [
          '/v1/chat/completions',
          JSON.stringify({
            model: MODEL,
            messages: [{ role: 'user', content: `Request ${i}: tell me about the number ${i}.` }],
            max_tokens: 32,
            temperature: 0,
            stream: i % 2 === 0,
          }),
        ],
  );
}

const dir = mkdtempSync(join(tmpdir(), 'mocker-bench-rerun-'));
const processes: ChildProcess[] = [];
try {
  const golden = join(dir, 'golden.db');
  const engine = await start(['serve', '--fast', '--captures', join(dir, 'none.db')]);
  processes.push(engine.child);
  const capture = await start(['capture', '--upstream', engine.url, '--captures', golden]);
  await inParallel(goldenBodies(), 16, ([path, body]) => post(capture.url, path, body));
  await stop(capture.child);
  await stop(engine.child);
  const target = await start(['serve', '--mode', 'replay', '--timing', 'none', '--captures', golden]);
  processes.push(target.child);
  const requests: RerunRequest[] = goldenRequests(golden).requests;

  const rows: (string | number)[][] = [];
  const ratios: number[] = [];
  for (let r = 0; r < ROUNDS; r++) {
    const times: Record<'rerun' | 'direct', number> = { rerun: 0, direct: 0 };
    for (const mode of r % 2 === 0 ? (['rerun', 'direct'] as const) : (['direct', 'rerun'] as const)) {
      const started = performance.now();
      if (mode === 'direct') await inParallel(requests, CONCURRENCY, (q) => post(target.url, q.path, q.body, q.headers));
      else {
        const run = spawnSync(
          process.execPath,
          [MAIN, 'rerun', golden, '--target', target.url, '--concurrency', String(CONCURRENCY), '-o', join(dir, `rerun-${r}.db`), '--json'],
          { encoding: 'utf8', maxBuffer: 1 << 28 },
        );
        const same = (JSON.parse(run.stdout) as { totals: { same: number } }).totals.same;
        if (run.status !== 0 || same !== requests.length)
          throw new Error(`rerun exited ${run.status} with ${same} of ${requests.length} the same: ${run.stderr}`);
      }
      times[mode] = performance.now() - started;
    }
    ratios.push(times.rerun / times.direct);
    rows.push([
      r + 1,
      round(times.direct / 1000, 2),
      round(times.rerun / 1000, 2),
      round(requests.length / (times.rerun / 1000), 1),
      round(times.rerun / times.direct, 2),
    ]);
  }
  console.log(
    `mocker rerun, ${requests.length} exchanges at concurrency ${CONCURRENCY}; ${cpus().length} × ${cpus()[0]?.model ?? 'CPU'}, ${new Date().toISOString().slice(0, 10)}`,
  );
  printTable(['round', 'direct s', 'rerun s', 'rerun exchanges/s', 'rerun / direct'], rows);
  console.log(`rerun / direct: median ${round(median(ratios), 2)} (${round(Math.min(...ratios), 2)}–${round(Math.max(...ratios), 2)} over ${ROUNDS} rounds)`);
} finally {
  await Promise.all(processes.filter((p) => p.exitCode === null && p.signalCode === null).map(stop));
  rmSync(dir, { recursive: true, force: true });
}
