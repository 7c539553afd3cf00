/**
 * One entry point for every benchmark (issue #17):
 *   npm run bench [-- NAME…] [-- --trace PATH]
 * runs each selected benchmark (bench/lib/suite.ts; NAME is an invocation like replay-16 or a group like
 * replay) in a process of its own, one after another, with short settings; reads its final JSON line(s);
 * prints one table of figure, value, baseline, ratio, spread and target; and appends the JSON lines to
 * bench/results/<date>.jsonl (`npm run bench:docs` turns that into the tables of docs/benchmarks.md and README.md). Each benchmark
 * measures its baseline interleaved with the measured system itself. A benchmark that fails is reported
 * (exit code, no figures) and the others still run; the runner then exits 1. `--trace` is passed to the
 * offline-trace benchmark (its default path, ../shared beside the checkout, is absent in a worktree).
 */
import { spawn } from 'node:child_process';
import { appendFileSync, mkdirSync } from 'node:fs';
import { cpus, loadavg, totalmem } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { formatTable, jsonLinesOf, toJsonl, type Figure, type Machine, type RunLine } from './lib/report.js';
import { selectBenchmarks, type Benchmark } from './lib/suite.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));

function machine(): Machine {
  return { cpu: cpus()[0]?.model.trim() ?? 'unknown', cores: cpus().length, ramGiB: Math.round(totalmem() / 2 ** 30), node: process.version };
}

/** Runs one benchmark, echoing its output indented; resolves with its stdout and exit code. */
function runOne(bench: Benchmark, extraArgs: string[]): Promise<{ stdout: string; exitCode: number | null }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', bench.script, ...bench.args, ...extraArgs], { cwd: ROOT, stdio: ['ignore', 'pipe', 'inherit'] });
    let stdout = '';
    child.stdout.setEncoding('utf8');
    child.stdout.on('data', (text: string) => {
      stdout += text;
      process.stdout.write(text.replace(/^(?=.)/gm, `  [${bench.name}] `));
    });
    child.on('error', reject);
    child.on('close', (exitCode) => resolve({ stdout, exitCode }));
  });
}

async function main(argv: string[]): Promise<number> {
  const traceAt = argv.indexOf('--trace');
  const trace = traceAt >= 0 ? argv[traceAt + 1] : undefined;
  if (traceAt >= 0 && !trace) throw new Error('--trace needs a path');
  // Without --trace (traceAt -1) every argument is a name, the first one too.
  const names = traceAt < 0 ? argv : argv.filter((_, i) => i !== traceAt && i !== traceAt + 1);
  const selected = selectBenchmarks(names);

  const started = new Date();
  const startLoad = loadavg();
  const t0 = performance.now();
  const figures: Figure[] = [];
  const raw: { bench: string; json: unknown }[] = [];
  const benches: RunLine['benches'] = [];
  const failures: string[] = [];
  for (const bench of selected) {
    const extra = bench.group === 'offline' && trace ? ['--trace', trace] : [];
    console.log(`\n== ${bench.name}: ${[bench.script, ...bench.args, ...extra].join(' ')} (load average ${loadavg()[0].toFixed(2)})`);
    const b0 = performance.now();
    const { stdout, exitCode } = await runOne(bench, extra);
    const json = jsonLinesOf(stdout);
    for (const j of json) raw.push({ bench: bench.name, json: j });
    benches.push({
      name: bench.name,
      script: bench.script,
      args: [...bench.args, ...extra],
      exitCode,
      seconds: Math.round((performance.now() - b0) / 100) / 10,
    });
    try {
      if (exitCode !== 0) throw new Error(`exited with code ${exitCode}`);
      figures.push(...bench.figures(json).map((f) => ({ bench: bench.name, ...f })));
    } catch (err) {
      failures.push(`${bench.name}: ${(err as Error).message}`);
    }
  }

  const run: RunLine = {
    kind: 'run',
    run: started.toISOString(),
    date: started.toISOString().slice(0, 10),
    machine: machine(),
    loadAverage: { start: startLoad.map((l) => Math.round(l * 100) / 100), end: loadavg().map((l) => Math.round(l * 100) / 100) },
    seconds: Math.round((performance.now() - t0) / 1000),
    benches,
  };
  const dir = join(ROOT, 'bench', 'results');
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `${run.date}.jsonl`);
  appendFileSync(file, toJsonl(run, figures, raw));

  const m = run.machine;
  console.log(
    `\n${run.date}, ${m.cpu}, ${m.cores} cores, ${m.ramGiB} GiB, Node ${m.node}; ${run.seconds} s; load average ${run.loadAverage.start.join(' ')} → ${run.loadAverage.end.join(' ')}`,
  );
  console.log(formatTable(figures));
  for (const f of failures) console.log(`FAILED ${f}`);
  console.log(`appended to ${file}`);
  return failures.length === 0 ? 0 : 1;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  main(process.argv.slice(2)).then(
    (code) => (process.exitCode = code),
    (err: unknown) => {
      console.error(err);
      process.exitCode = 1;
    },
  );
}
