/**
 * Benchmark (issues #3 and #13): the cost of one engine pass in steady decode, and how it grows with the
 * number of running requests, for each engine flavour. N requests of --prompt distinct tokens (no shared
 * prefixes) are admitted and prefilled (untimed), the heap collected and 200 decode passes run (untimed: the
 * passes right after a full collection are slower); then --passes decode passes are timed, each emitting one
 * token per request. Flavours, all with room for every request (4,194,304 KV tokens) so that exactly N run:
 *   vllm        vLLM defaults (block 64), max_num_seqs N.
 *   sglang      SGLang defaults at page size 64 (mocker's default block size): the radix tree takes each
 *               request's sequence once per 64 tokens. SGLang has no max_num_seqs; the KV room admits all N.
 *   sglang-p1   SGLang at page size 1 (SGLang's own default): the tree takes every decoded token.
 * Each flavour runs in a process of its own, as `mocker serve` runs one flavour: in one process the flavours
 * share the engine's code and its type feedback, which made the vLLM flavour's pass dearer (2026-11-27, 256
 * running, four alternated pairs of 7 rounds: 70.5, 46.6, 60.8, 58.4 µs in one process against 33.1, 50.4, 47.9,
 * 43.9 in its own).
 * Every flavour first runs once untimed at 64 requests (JIT warm-up). Then, per size, the flavours' processes
 * take turns round by round (vllm, sglang, sglang-p1, vllm, …; one measures while the others wait) so that
 * drift in the machine's speed hits them alike; per flavour the median and min–max of --runs rounds are
 * reported, and each SGLang flavour's ratio to vLLM (median of the per-round ratios, and their min–max).
 * --baseline-root DIR adds a fourth flavour, vllm-baseline: the vLLM flavour built from another checkout's
 * src/ (e.g. `git archive <commit> src | tar -x -C DIR`), interleaved with the others, so a change to the core
 * is measured against the code before it in the same run; its ratio to vllm is old ÷ new.
 *
 *   npx tsx bench/engine-pass.ts [--prompt 1000] [--passes 500] [--runs 5] [--sizes 1,16,64,128,256,512]
 *                                [--baseline-root DIR] [--flavours vllm,sglang,sglang-p1,vllm-baseline]
 */
import { fork, type ChildProcess } from 'node:child_process';
import { cpus, loadavg } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import * as currentArgs from '../src/config/engineArgs.js';
import { DEFAULT_ENGINE_ARGS, type EngineArgs } from '../src/config/engineArgs.js';
import * as currentEngine from '../src/engine/index.js';
import { median, numberArg, printTable, round, stringArg } from './lib/stats.js';

const PROMPT = numberArg('prompt', 1000);
const PASSES = numberArg('passes', 500);
const RUNS = numberArg('runs', 5);
/** Untimed passes after the collection that precedes each timed loop (see measure). */
const SETTLE_PASSES = 200;
const SIZES = stringArg('sizes', '1,16,64,128,256,512').split(',').map(Number);
if (!SIZES.every((n) => Number.isInteger(n) && n >= 1)) throw new Error(`--sizes takes running counts ≥ 1, got ${stringArg('sizes', '')}`);
const BASELINE_ROOT = stringArg('baseline-root', '');
/** KV capacity in tokens, the same for every flavour: 65,536 blocks of 64. */
const KV_TOKENS = 65536 * 64;

/** The code a flavour runs: this checkout's, or the baseline checkout's (same exports, older code). */
interface Code {
  args: typeof currentArgs;
  engine: typeof currentEngine;
}
const CURRENT: Code = { args: currentArgs, engine: currentEngine };
const load = async (file: string): Promise<unknown> => import(pathToFileURL(join(BASELINE_ROOT, file)).href);
const baseline = async (): Promise<Code> => ({
  args: (await load('src/cli/engineArgs.ts')) as typeof currentArgs,
  engine: (await load('src/engine/index.ts')) as typeof currentEngine,
});

const vllm = (n: number): EngineArgs => ({ ...DEFAULT_ENGINE_ARGS, numGpuBlocks: KV_TOKENS / 64, blockSize: 64, maxNumSeqs: n });
const ALL_FLAVOURS: { name: string; args: (n: number) => EngineArgs; code: () => Promise<Code> }[] = [
  { name: 'vllm', args: vllm, code: async () => CURRENT },
  { name: 'sglang', args: () => sglang(64), code: async () => CURRENT },
  { name: 'sglang-p1', args: () => sglang(1), code: async () => CURRENT },
  ...(BASELINE_ROOT ? [{ name: 'vllm-baseline', args: vllm, code: baseline }] : []),
];
const CHOSEN = stringArg('flavours', ALL_FLAVOURS.map((f) => f.name).join(',')).split(',');
/** vllm always runs, first: the others' ratios are to it. */
const FLAVOURS = ALL_FLAVOURS.filter((f) => f.name === 'vllm' || CHOSEN.includes(f.name));
for (const name of CHOSEN)
  if (!ALL_FLAVOURS.some((f) => f.name === name)) throw new Error(`--flavours takes ${ALL_FLAVOURS.map((f) => f.name).join(', ')}; got ${name}`);
function sglang(pageSize: number): EngineArgs {
  return {
    ...DEFAULT_ENGINE_ARGS,
    engineType: 'sglang',
    numGpuBlocks: KV_TOKENS / pageSize,
    blockSize: pageSize,
    sglang: { ...DEFAULT_ENGINE_ARGS.sglang, pageSize },
  };
}

setFlagsFromString('--expose-gc');
/** A full collection before each timed loop, so no round pays for the garbage of the rounds before it. */
const collectGarbage = runInNewContext('gc') as () => void;

/** µs per decode pass with `n` requests running. */
function measure(code: Code, args: EngineArgs, n: number, seed: number): number {
  const { createSchedulerCore, modelTiming, polynomialPerfModel } = code.engine;
  const core = createSchedulerCore(code.args.schedulerConfig(args, modelTiming(polynomialPerfModel, 1, 1), seed));
  for (let i = 0; i < n; i++)
    core.add({ id: `r${i}`, promptTokenIds: Array.from({ length: PROMPT }, (_, t) => i * PROMPT + t + 1), maxOutputTokens: (SETTLE_PASSES + PASSES) * 4 });
  let now = 0;
  // Until every request is past its prefill and decoding.
  for (;;) {
    const pass = core.executePass(now);
    now = pass.endMs;
    if (pass.tokens.length === n) break;
  }
  collectGarbage();
  // The passes right after a full collection run 3–10× slower than the steady state (measured per 100 passes at
  // 256 running: 74–219 µs, then 15–25): they settle untimed.
  for (let p = 0; p < SETTLE_PASSES; p++) now = core.executePass(now).endMs;
  const t0 = performance.now();
  for (let p = 0; p < PASSES; p++) {
    const pass = core.executePass(now);
    if (pass.tokens.length !== n) throw new Error(`${args.engineType}: ${pass.tokens.length} of ${n} requests decoded in a timed pass`);
    now = pass.endMs;
  }
  return ((performance.now() - t0) * 1000) / PASSES;
}

/** A round's request to a flavour's process, and its answer. */
interface Round {
  n: number;
  seed: number;
}

/** In a flavour's own process (`--child NAME`): measures each round the parent asks for. */
async function child(name: string): Promise<void> {
  const flavour = ALL_FLAVOURS.find((f) => f.name === name);
  if (!flavour) throw new Error(`no flavour ${name}`);
  const code = await flavour.code();
  process.on('message', ({ n, seed }: Round) => process.send!({ us: measure(code, flavour.args(n), n, seed) }));
  process.send!({ ready: true });
}

/** A flavour's process, measuring one round at a time. */
class FlavourProcess {
  private readonly process: ChildProcess;
  private readonly ready: Promise<void>;

  constructor(readonly name: string) {
    this.process = fork(fileURLToPath(import.meta.url), [...process.argv.slice(2), '--child', name], { execArgv: process.execArgv });
    this.ready = new Promise((resolve, reject) => {
      this.process.once('message', () => resolve());
      this.process.once('exit', (code) => reject(new Error(`${name}: its process exited with code ${code}`)));
    });
  }

  async measure(n: number, seed: number): Promise<number> {
    await this.ready;
    return new Promise((resolve, reject) => {
      const exited = (code: number | null) => reject(new Error(`${this.name}: its process exited with code ${code}`));
      this.process.once('exit', exited);
      this.process.once('message', ({ us }: { us: number }) => {
        this.process.off('exit', exited);
        resolve(us);
      });
      this.process.send({ n, seed } satisfies Round);
    });
  }

  stop(): void {
    this.process.disconnect();
  }
}

async function parent(): Promise<void> {
  const loadAverage = () =>
    loadavg()
      .map((l) => l.toFixed(2))
      .join(' ');
  const spread = (values: number[], digits: number) => `${round(Math.min(...values), digits)}–${round(Math.max(...values), digits)}`;
  console.log(
    `machine: ${cpus().length} cores, ${cpus()[0]?.model.trim()}, node ${process.version}; ${new Date().toISOString()}; load average ${loadAverage()}`,
  );
  console.log(`prompt ${PROMPT} tokens, ${PASSES} timed passes, ${RUNS} interleaved rounds per size, each flavour in its own process`);
  const rows: (string | number)[][] = [];
  const results: Record<string, Record<number, { median: number; min: number; max: number }>> = {};
  const ratios: Record<string, Record<number, { median: number; min: number; max: number }>> = {};
  for (const f of FLAVOURS) results[f.name] = {};
  for (const f of FLAVOURS.slice(1)) ratios[f.name] = {};
  const processes = FLAVOURS.map((f) => new FlavourProcess(f.name));
  try {
    for (const p of processes) await p.measure(64, 0);
    for (const n of SIZES) {
      const samples = FLAVOURS.map((): number[] => []);
      for (let run = 0; run < RUNS; run++) for (const [i, p] of processes.entries()) samples[i].push(await p.measure(n, run));
      const row: (string | number)[] = [n];
      FLAVOURS.forEach((f, i) => {
        results[f.name][n] = { median: round(median(samples[i]), 2), min: round(Math.min(...samples[i]), 2), max: round(Math.max(...samples[i]), 2) };
        row.push(round(median(samples[i]), 1), spread(samples[i], 1));
        if (i === 0) return;
        const perRound = samples[i].map((us, k) => us / samples[0][k]);
        ratios[f.name][n] = { median: round(median(perRound), 3), min: round(Math.min(...perRound), 3), max: round(Math.max(...perRound), 3) };
        row.push(`${round(median(perRound), 2)} (${spread(perRound, 2)})`);
      });
      rows.push(row);
      console.log(`  ${n} running: ${FLAVOURS.map((f, i) => `${f.name} ${round(median(samples[i]), 1)}`).join(', ')} µs per pass`);
    }
  } finally {
    for (const p of processes) p.stop();
  }
  printTable(['running', ...FLAVOURS.flatMap((f, i) => [`${f.name} µs/pass`, 'min–max', ...(i === 0 ? [] : [`${f.name} ÷ vllm (min–max)`])])], rows);
  console.log(`load average at the end: ${loadAverage()}`);
  console.log(
    JSON.stringify({ bench: 'engine-pass', prompt: PROMPT, passes: PASSES, runs: RUNS, kvTokens: KV_TOKENS, usPerPass: results, ratioToVllm: ratios }),
  );
}

const CHILD = stringArg('child', '');
await (CHILD ? child(CHILD) : parent());
