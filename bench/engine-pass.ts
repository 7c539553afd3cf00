/**
 * Benchmark (issue #3): the cost of one engine pass in steady decode, and how it grows with the number of
 * running requests. N requests of --prompt tokens are admitted and prefilled (untimed); then --passes decode
 * passes are timed, each emitting one token per request (with a block promotion every 64 tokens). Median of
 * --runs runs per N.
 *
 *   npx tsx bench/engine-pass.ts [--prompt 1000] [--passes 500] [--runs 5]
 */
import { cpus } from 'node:os';
import { DEFAULT_ENGINE_ARGS, schedulerConfig } from '../src/cli/engineArgs.js';
import { createSchedulerCore, modelTiming, polynomialPerfModel } from '../src/engine/index.js';
import { median, numberArg, printTable, round } from './lib/stats.js';

const PROMPT = numberArg('prompt', 1000);
const PASSES = numberArg('passes', 500);
const RUNS = numberArg('runs', 5);
const SIZES = [1, 16, 64, 128, 256, 512];

console.log(`machine: ${cpus().length} cores, ${cpus()[0]?.model.trim()}, node ${process.version}`);
const rows: (string | number)[][] = [];
const results: Record<number, number> = {};
for (const n of SIZES) {
  const samples: number[] = [];
  for (let run = 0; run < RUNS; run++) {
    // vLLM defaults, with room for every request and exactly n running.
    const core = createSchedulerCore(schedulerConfig({ ...DEFAULT_ENGINE_ARGS, numGpuBlocks: 65536, maxNumSeqs: n }, modelTiming(polynomialPerfModel, 1, 1), run));
    for (let i = 0; i < n; i++) core.add({ id: `r${i}`, promptTokenIds: Array.from({ length: PROMPT }, (_, t) => i * PROMPT + t + 1), maxOutputTokens: PASSES * 4 });
    let now = 0;
    // Until every request is past its prefill and decoding.
    for (;;) {
      const pass = core.executePass(now);
      now = pass.endMs;
      if (pass.tokens.length === n) break;
    }
    const t0 = performance.now();
    for (let p = 0; p < PASSES; p++) now = core.executePass(now).endMs;
    samples.push(((performance.now() - t0) * 1000) / PASSES);
  }
  const us = median(samples);
  results[n] = us;
  rows.push([n, round(us, 1), round(us / n, 2)]);
  console.log(`  ${n} running: ${round(us, 1)} µs per pass`);
}
printTable(['running requests', 'µs per pass (median)', 'µs per request'], rows);
console.log(JSON.stringify({ bench: 'engine-pass', prompt: PROMPT, passes: PASSES, usPerPass: results }));
