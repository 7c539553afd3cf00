/**
 * `mocker captures fit` (issue 15 item 6). The vLLM double runs a small batching engine whose step times are
 * KNOWN functions (prefill of the new prompt tokens; decode of active KV tokens and batch size) with seeded
 * noise. A load captured through `mocker capture` is fitted with the spawned `mocker captures fit`; the NPZ
 * must (i) predict the known functions, and (ii) make `mocker serve --timing model --planner-profile-data`
 * answer a different, held-out load with the TTFT and ITL medians the double itself gives on that load.
 */
import { existsSync, mkdtempSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadPerfModel, type PerfModel } from '../../src/engine/perf/perfModel.js';
import { KNOWN_COSTS as KNOWN } from '../support/batchingEngine.js';
import { measureLoad, randomRequests as requests, type Measured, type Phase } from '../support/closedLoop.js';
import { runMockerToExit, startMockerProcess, type MockerProcess } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';
import { MODEL } from '../support/vllmUpstream.js';

const DOUBLE = join(import.meta.dirname, '..', 'support', 'batchingEngine.ts');

const median = (xs: number[]) => {
  const sorted = [...xs].sort((a, b) => a - b);
  const middle = sorted.length >> 1;
  return sorted.length % 2 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2;
};
const medians = (runs: Measured[]) => ({ ttftMs: median(runs.map((r) => r.ttftMs)), itlMs: median(runs.flatMap((r) => r.gapsMs)) });

/** The capture: requests one at a time (idle-engine first tokens), then closed loops at 3, 6 and 8 in flight. */
const TRAINING: Phase[] = [
  { concurrency: 1, requests: requests(11, 20, [64, 1600], [6, 10]) },
  { concurrency: 3, requests: requests(12, 15, [64, 1200], [16, 48]) },
  { concurrency: 6, requests: requests(13, 18, [64, 1200], [16, 48]) },
  { concurrency: 8, requests: requests(14, 16, [64, 1200], [16, 48]) },
];

const WARM_UP: Phase[] = [{ concurrency: 2, requests: requests(1, 4, [64, 256], [8, 8]) }];

/** Never captured: another concurrency and other prompt and output lengths. */
const HELD_OUT: Phase[] = [{ concurrency: 5, requests: requests(21, 40, [300, 900], [24, 40]) }];

describe('mocker captures fit: a perf profile learnt from a capture of a batching engine', () => {
  const dir = mkdtempSync(join(testTmpdir(), 'mocker-captures-fit-'));
  const captures = join(dir, 'capture.db');
  const profile = join(dir, 'profile.npz');
  let upstream: MockerProcess;
  let upstreamUrl = '';
  let fitOutput = '';
  let fitted: PerfModel;
  const processes: MockerProcess[] = [];

  beforeAll(async () => {
    upstream = await startMockerProcess(['7'], 0, { launcher: [process.execPath, '--import', 'tsx', DOUBLE] });
    processes.push(upstream);
    upstreamUrl = `http://127.0.0.1:${upstream.port}`;
    await measureLoad(upstreamUrl, MODEL, WARM_UP, 1); // not captured
    const capture = await startMockerProcess(['capture', '--upstream', upstreamUrl, '--captures', captures]);
    processes.push(capture);
    await measureLoad(`http://127.0.0.1:${capture.port}`, MODEL, TRAINING, 2);
    await capture.stop();

    const fit = await runMockerToExit(['captures', 'fit', captures, '-o', profile]);
    fitOutput = fit.stdout;
    expect(fit.stderr).toBe('');
    expect(fit.code).toBe(0);
    fitted = await loadPerfModel(profile);
  }, 90_000);

  afterAll(async () => {
    await Promise.all(processes.map((p) => p.stop()));
  });

  it('reports the points it used and how well the forms fit', () => {
    process.stderr.write(`${fitOutput}\n`);
    const gaps = Number(/decode step: (\d+) output gaps/.exec(fitOutput)?.[1]);
    const steps = Number(/prefill: (\d+) steps under load/.exec(fitOutput)?.[1]);
    const idle = Number(/(\d+) requests that met an idle engine/.exec(fitOutput)?.[1]);
    // 20 sequential requests × 5–9 gaps, and most of the 49 loaded requests' 15–47 gaps.
    expect(gaps).toBeGreaterThan(600);
    // The loaded phases' requests mostly arrive while others decode; the sequential ones all meet an idle engine.
    expect(steps).toBeGreaterThan(15);
    expect(idle).toBeGreaterThanOrEqual(18);
    const r2 = [...fitOutput.matchAll(/R² (-?[\d.]+)/g)].map((m) => Number(m[1]));
    expect(r2).toHaveLength(2);
    // The double's 5 % noise and the VM's timer overshoot (1–3 ms a step under the suite's load) leave the
    // decode form explaining 0.58–0.8 of the gaps' variance in CI runs; a fit that missed the form explains ~0.
    for (const value of r2) expect(value).toBeGreaterThan(0.5);
    expect(existsSync(profile)).toBe(true);
  });

  // Within 10 %, or 2.5 ms for the shortest steps: the double's steps are setTimeout-timed on a shared 2-core VM,
  // where each overshoots by 1–3 ms under the suite's load, and the fit takes that into its intercept (a 200-token
  // prefill is 18.5 ms: 2.5 ms is 13 %); the acceptance figure is the held-out load's medians below, within 5 %.
  it('predicts the known step times within 10 % (2.5 ms for the shortest): prefill by new prompt tokens, decode by active KV and batch', () => {
    const TIMER_MS = 2.5;
    for (const tokens of [200, 800, 1400, 3000]) {
      const known = KNOWN.prefillMs([tokens]);
      expect(Math.abs(fitted.prefillMs(1, tokens, 0) - known), `prefill of ${tokens} tokens`).toBeLessThan(Math.max(0.1 * known, TIMER_MS));
    }
    // As the engine asks: active KV in whole blocks of 64 (the default), the mean context, the batch.
    // 1 × 500 tokens: 8 blocks; 4 × 700: 4 × 11 blocks; 8 × 1000: 8 × 16 blocks.
    for (const [batch, length, blocks] of [
      [1, 500, 8],
      [4, 700, 44],
      [8, 1000, 128],
    ]) {
      const known = KNOWN.decodeMs(batch * length, batch);
      expect(Math.abs(fitted.decodeMs(batch, blocks * 64, length, 16384 * 64) - known), `decode of ${batch} × ${length}`).toBeLessThan(
        Math.max(0.1 * known, TIMER_MS),
      );
    }
  });

  it('simulates a held-out load with the TTFT and ITL medians of the double within 5 %', async () => {
    const direct = medians(await measureLoad(upstreamUrl, MODEL, HELD_OUT, 3));
    const serve = await startMockerProcess(['serve', '--timing', 'model', '--planner-profile-data', profile, '--served-model-name', MODEL]);
    processes.push(serve);
    const url = `http://127.0.0.1:${serve.port}`;
    await measureLoad(url, MODEL, WARM_UP, 1);
    const simulated = medians(await measureLoad(url, MODEL, HELD_OUT, 3));
    process.stderr.write(
      `held-out load: double TTFT p50 ${direct.ttftMs.toFixed(2)} ms, ITL p50 ${direct.itlMs.toFixed(2)} ms; ` +
        `mocker ${simulated.ttftMs.toFixed(2)} ms (${pct(simulated.ttftMs, direct.ttftMs)}), ${simulated.itlMs.toFixed(2)} ms (${pct(simulated.itlMs, direct.itlMs)})\n`,
    );
    expect(Math.abs(simulated.ttftMs / direct.ttftMs - 1)).toBeLessThan(0.05);
    expect(Math.abs(simulated.itlMs / direct.itlMs - 1)).toBeLessThan(0.05);
  }, 60_000);
});

const pct = (value: number, reference: number) => `${value >= reference ? '+' : ''}${((value / reference - 1) * 100).toFixed(1)} %`;
