/**
 * `mocker captures fit --validate` (issue 38 item 3): the observe → calibrate → validate loop as one command. The vLLM
 * double runs a batching engine whose prefill has a context term (CONTEXT_COSTS: each prompt's new tokens attend
 * over its context) with seeded 10 % step noise. A load at 1, 2, 6 and 4 in flight is captured through `mocker
 * capture`; the spawned `mocker captures fit --validate` fits the first 70 % and replays the arrivals through the
 * fitted simulator, scoring the last 30 %. Its errors are held to the double's own noise: what two runs of the double
 * on the same arrivals differ by (doublesOwnNoise).
 */
import { mkdtempSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CaptureStore } from '../../src/store/captureStore.js';
import { CONTEXT_COSTS, DOUBLE_RELATIVE_NOISE, simulateBatchingEngine } from '../support/batchingEngine.js';
import { reportPages } from '../support/chromiumPage.js';
import { measureLoad, randomRequests as requests, type Phase } from '../support/closedLoop.js';
import { runMockerToExit, startMockerProcess, type MockerProcess } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';
import { MODEL } from '../support/vllmUpstream.js';

const DOUBLE = join(import.meta.dirname, '..', 'support', 'batchingEngine.ts');

/**
 * One at a time (idle-engine first tokens), then closed loops; the held-out part is the last phase (4 in flight)
 * after its first 90 requests: not the burst of its start, whose requests leave in the same millisecond (the
 * capture's send-time resolution) and reach the engine in an order no replay knows. 70 held out: the median of 36
 * (the previous load's) moved by up to ±7 % between two runs of the double alone, as much as the bound itself.
 */
const LOAD: Phase[] = [
  { concurrency: 1, requests: requests(31, 30, [64, 1500], [2, 4]) },
  { concurrency: 2, requests: requests(32, 20, [64, 1200], [8, 24]) },
  { concurrency: 6, requests: requests(33, 25, [64, 1200], [8, 24]) },
  { concurrency: 4, requests: requests(34, 160, [64, 1200], [8, 24]) },
];
const TOTAL = LOAD.reduce((n, phase) => n + phase.requests.length, 0);
const HOLDOUT = 0.3;
/** The held-out requests: the last 30 % sent (the fitted part rounded up). */
const HELD_OUT = TOTAL - Math.ceil(TOTAL * (1 - HOLDOUT));

const METRICS = ['ttft', 'itl', 'e2e'] as const;
/**
 * The largest MAPE held to, as a multiple of the double's own (run-to-run) noise, and the largest |median error|:
 * issue 38's bounds. Twelve captures of this load on 2026-11-29 (eight alone, four in this test; quiet machine):
 * median errors TTFT +0.5…+3.0 %, ITL −2.2…+0.5 %, E2E −2.8…+1.6 %; MAPE 0.47–0.84 × the noise.
 */
const MAPE_OVER_NOISE = 1.2;
const MEDIAN_ERROR = 0.05;
type Metric = (typeof METRICS)[number];
type Latencies = Record<Metric, number | null>;

interface MetricReport {
  requests: number;
  medianError: number;
  mape: number;
  noise: number | null;
}

const latencies = (times: number[]): Latencies => ({
  ttft: times[0],
  itl: times.length > 1 ? (times[times.length - 1] - times[0]) / (times.length - 1) : null,
  e2e: times[times.length - 1],
});

const mapeOf = (metric: Metric, values: Latencies[], references: Latencies[]) => {
  const errors = values.flatMap((v, i) => (v[metric] === null ? [] : [Math.abs(v[metric]! - references[i][metric]!) / references[i][metric]!]));
  return errors.reduce((a, b) => a + b, 0) / errors.length;
};

/**
 * The oracle, per metric over the held-out requests, from the double's known costs and noise: its run-to-run noise,
 * what two runs of the double on the captured arrivals differ by (the MAPE between its simulations at different
 * noise seeds, each against the next: the real-vs-real floor of an engine, for the double); and the same with the
 * capture as one of the two runs (the noise the double actually had, which on a busy machine also holds its timers'
 * overshoot). The larger is the double's own noise. A model cannot be held to less: under a closed loop, a step a
 * few per cent longer or shorter moves which step each later request joins, so a model that is off by the noise
 * at all scatters per request as much as another run of the engine does.
 */
function doublesOwnNoise(capture: string): { parameters: Record<Metric, number>; realized: Record<Metric, number> } {
  const store = CaptureStore.open(capture, { readonly: true });
  const exchanges = store
    .exchangeIds()
    .map((id) => store.getExchange(id)!)
    .sort((a, b) => a.startedAt - b.startedAt);
  store.close();
  expect(exchanges).toHaveLength(TOTAL);
  const arrivals = exchanges.map((ex) => ({ sentMs: ex.startedAt, promptTokens: ex.promptIds!.length, outputTokens: ex.generations[0].outputIds.length }));
  const held = (runs: number[][]) => runs.slice(TOTAL - HELD_OUT).map(latencies);
  const captured = held(exchanges.map((ex) => ex.generations[0].tokenTimes));
  const seeds = [1, 2, 3, 4, 5, 6, 7, 8];
  const runs = seeds.map((seed) => held(simulateBatchingEngine(CONTEXT_COSTS, arrivals, { seed, relativeNoise: DOUBLE_RELATIVE_NOISE.context })));
  const perMetric = (f: (m: Metric) => number) => Object.fromEntries(METRICS.map((m) => [m, f(m)])) as Record<Metric, number>;
  const average = (values: number[]) => values.reduce((a, b) => a + b, 0) / values.length;
  return {
    parameters: perMetric((m) => average(runs.map((run, i) => mapeOf(m, run, runs[(i + 1) % runs.length])))),
    realized: perMetric((m) => average(runs.map((run) => mapeOf(m, run, captured)))),
  };
}

describe('mocker captures fit --validate: a capture of a batching engine with a context-dependent prefill', () => {
  const dir = mkdtempSync(join(testTmpdir(), 'mocker-captures-validate-'));
  const capture = join(dir, 'capture.db');
  const report = join(dir, 'report.html');
  const pages = reportPages('mocker-captures-validate-html-');
  const processes: MockerProcess[] = [];
  let run: { code: number | null; stdout: string; stderr: string };
  let text: { code: number | null; stdout: string; stderr: string };
  let metrics: Record<Metric, MetricReport>;

  beforeAll(async () => {
    const upstream = await startMockerProcess(['5', 'context'], 0, { launcher: [process.execPath, '--import', 'tsx', DOUBLE] });
    processes.push(upstream);
    const upstreamUrl = `http://127.0.0.1:${upstream.port}`;
    await measureLoad(upstreamUrl, MODEL, [{ concurrency: 2, requests: requests(1, 4, [64, 256], [8, 8]) }], 1); // not captured
    const proxy = await startMockerProcess(['capture', '--upstream', upstreamUrl, '--captures', capture]);
    processes.push(proxy);
    await measureLoad(`http://127.0.0.1:${proxy.port}`, MODEL, LOAD, 2);
    await proxy.stop();
    await upstream.stop();

    const args = ['captures', 'fit', capture, '--validate', '--holdout-fraction', String(HOLDOUT)];
    run = await runMockerToExit([...args, '--report-html', report, '--json']);
    text = await runMockerToExit(args);
    metrics = (JSON.parse(run.stdout) as { validation: { metrics: Record<Metric, MetricReport> } }).validation.metrics;
  }, 150_000);

  afterAll(async () => {
    await Promise.all(processes.map((p) => p.stop()));
    await pages.close();
  });

  it('prints median error and MAPE of TTFT, ITL and E2E and the capture noise, exit code 0', () => {
    process.stderr.write(`${text.stdout}\n`);
    expect(run.code).toBe(0);
    expect(text.code).toBe(0);
    expect(text.stdout).toMatch(/validation: fitted on the first \d+ streamed requests of .*, validated on the last \d+/);
    for (const label of ['TTFT', 'ITL', 'E2E'])
      expect(text.stdout).toMatch(new RegExp(`^  ${label} +[\\d.]+ ms +[\\d.]+ ms +[-+][\\d.]+ % +[\\d.]+ % +[\\d.]+ %$`, 'm'));
    for (const metric of METRICS) expect(metrics[metric].requests).toBe(HELD_OUT);
  });

  it('predicts the held-out medians within 5 % and per-request MAPE within 1.2 × the double’s own run-to-run noise', () => {
    const { parameters, realized } = doublesOwnNoise(capture);
    const pct = (x: number | null) => (x === null ? '—' : `${(x * 100).toFixed(2)} %`);
    for (const metric of METRICS) {
      const m = metrics[metric];
      process.stderr.write(
        `${metric}: median error ${pct(m.medianError)}, MAPE ${pct(m.mape)}; the double's own run-to-run noise: ${pct(parameters[metric])} from its parameters, ` +
          `${pct(realized[metric])} with the capture as one run (oracle); the capture's as the CLI estimates it ${pct(m.noise)}\n`,
      );
    }
    for (const metric of METRICS) {
      expect(Math.abs(metrics[metric].medianError), `${metric} median error`).toBeLessThanOrEqual(MEDIAN_ERROR);
      expect(metrics[metric].mape, `${metric} MAPE`).toBeLessThanOrEqual(MAPE_OVER_NOISE * Math.max(parameters[metric], realized[metric]));
    }
  });

  it("validates in another flavour given as serve's --extra-engine-args (llama.cpp slots), and refuses bad engine args naming the key", async () => {
    const args = ['captures', 'fit', capture, '--validate', '--holdout-fraction', String(HOLDOUT)];
    const slots = await runMockerToExit([...args, '--extra-engine-args', '{"engine_type":"llamacpp","max_num_seqs":4,"max_num_batched_tokens":2048}']);
    expect(slots.code, slots.stderr).toBe(0);
    expect(slots.stdout).toMatch(/^ {2}TTFT +[\d.]+ ms/m);
    const bad = await runMockerToExit([...args, '--extra-engine-args', '{"engine_type":"tgi"}']);
    expect(bad.code).not.toBe(0);
    expect(bad.stderr).toContain('engine_type');
  });

  it('writes an HTML report that renders a chart per metric in Chromium, offline, without errors', async () => {
    const { readFileSync } = await import('node:fs');
    const { page, errors, offFileRequests } = await pages.open('validation', readFileSync(report, 'utf8'));
    for (const metric of METRICS) {
      // uPlot draws into a canvas with its legend: a chart, not a "no data" placeholder.
      await expect(page.locator(`#chart-${metric} .plot canvas`).count()).resolves.toBe(1);
      await expect(page.locator(`#chart-${metric} .u-legend`).textContent()).resolves.toContain('simulated');
    }
    await expect(page.locator('table.errors tr[data-metric]').count()).resolves.toBe(3);
    expect(errors).toEqual([]);
    expect(offFileRequests).toEqual([]);
  });
});
