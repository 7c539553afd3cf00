/**
 * `mocker captures fit` (issue 15 item 6). The vLLM double runs a small batching engine whose step times are
 * KNOWN functions (prefill of the new prompt tokens; decode of active KV tokens and batch size) with seeded
 * noise. A load captured through `mocker capture` is fitted with the spawned `mocker captures fit`; the NPZ
 * must (i) predict the known functions, and (ii) make `mocker serve --timing model --planner-profile-data`
 * answer a different, held-out load with the TTFT and ITL medians the double itself gives on that load.
 */
import { existsSync, mkdtempSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadPerfModel, type PerfModel } from '../src/engine/perf/perfModel.js';
import { BatchingEngine, type StepCosts } from './support/batchingEngine.js';
import { runMockerToExit, startMockerProcess, type MockerProcess } from './support/mockerProcess.js';
import { prng } from './support/prng.js';
import { testTmpdir } from './support/tempRoot.js';
import { MODEL, startUpstream, type Upstream } from './support/vllmUpstream.js';

/** The double's engine, in ms: the oracle the fitted profile is held to. */
const KNOWN: StepCosts = {
  prefillMs: (tokens) => 12 + 0.03 * tokens + 1.2e-5 * tokens * tokens,
  decodeMs: (activeKvTokens, batch) => 6 + 0.5 * batch + 0.002 * activeKvTokens,
};

interface LoadRequest {
  promptTokens: number;
  outputTokens: number;
}

interface Phase {
  concurrency: number;
  requests: LoadRequest[];
}

interface Measured {
  ttftMs: number;
  gapsMs: number[];
}

/** Requests of seeded random lengths. */
function requests(seed: number, count: number, prompt: [number, number], output: [number, number]): LoadRequest[] {
  const random = prng(seed);
  return Array.from({ length: count }, () => ({ promptTokens: random.int(...prompt), outputTokens: random.int(...output) }));
}

/** Prompts of random token ids, a fresh stream per load: no two prompts share a cached block. */
let promptSeed = 1;

/** One streamed completion of token-id prompt: when each token's event arrived (ms after sending). */
function streamCompletion(url: string, agent: http.Agent, request: LoadRequest, ids: number[]): Promise<Measured> {
  const body = JSON.stringify({ model: MODEL, prompt: ids, max_tokens: request.outputTokens, ignore_eos: true, stream: true });
  return new Promise((resolve, reject) => {
    const sent = performance.now();
    const arrivals: number[] = [];
    const req = http.request(`${url}/v1/completions`, { method: 'POST', agent, headers: { 'content-type': 'application/json' } }, (res) => {
      let buffer = '';
      res.on('data', (chunk: Buffer) => {
        const now = performance.now() - sent;
        buffer += chunk.toString('utf8');
        let at: number;
        while ((at = buffer.indexOf('\n\n')) >= 0) {
          const event = buffer.slice(0, at);
          buffer = buffer.slice(at + 2);
          if (event.startsWith('data: {') && (JSON.parse(event.slice(6)) as { choices: unknown[] }).choices.length > 0) arrivals.push(now);
        }
      });
      res.on('end', () => {
        if (res.statusCode !== 200 || arrivals.length !== request.outputTokens) return reject(new Error(`status ${res.statusCode}, ${arrivals.length} of ${request.outputTokens} tokens`));
        resolve({ ttftMs: arrivals[0], gapsMs: arrivals.slice(1).map((t, i) => t - arrivals[i]) });
      });
    });
    req.on('error', reject);
    req.end(body);
  });
}

/** Runs the phases in order, each a closed loop of `concurrency` clients. */
async function runLoad(url: string, phases: Phase[]): Promise<Measured[]> {
  const random = prng(promptSeed++);
  const measured: Measured[] = [];
  for (const { concurrency, requests: queue } of phases) {
    const agent = new http.Agent({ keepAlive: true, maxSockets: concurrency });
    const pending = [...queue];
    await Promise.all(
      Array.from({ length: concurrency }, async () => {
        for (let next = pending.shift(); next; next = pending.shift()) {
          const ids = Array.from({ length: next.promptTokens }, () => random.int(1000, 140_000));
          measured.push(await streamCompletion(url, agent, next, ids));
        }
      }),
    );
    agent.destroy();
  }
  return measured;
}

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

/** Never captured: another concurrency and other prompt and output lengths. */
const HELD_OUT: Phase[] = [{ concurrency: 5, requests: requests(21, 25, [300, 900], [24, 40]) }];

describe('mocker captures fit: a perf profile learnt from a capture of a batching engine', () => {
  const dir = mkdtempSync(join(testTmpdir(), 'mocker-captures-fit-'));
  const captures = join(dir, 'capture.db');
  const profile = join(dir, 'profile.npz');
  let upstream: Upstream;
  let fitOutput = '';
  let fitted: PerfModel;
  const processes: MockerProcess[] = [];

  beforeAll(async () => {
    const engine = new BatchingEngine(KNOWN, { seed: 7, relativeNoise: 0.05 });
    upstream = await startUpstream((body) => ({ content: ' a'.repeat(Number(body.max_tokens) + 8), finish: 'length' }), { engine });
    await runLoad(upstream.url, [{ concurrency: 2, requests: requests(1, 4, [64, 256], [8, 8]) }]); // warm-up, not captured
    const capture = await startMockerProcess(['capture', '--upstream', upstream.url, '--captures', captures]);
    processes.push(capture);
    await runLoad(`http://127.0.0.1:${capture.port}`, TRAINING);
    await capture.stop();

    const fit = await runMockerToExit(['captures', 'fit', captures, '-o', profile]);
    fitOutput = fit.stdout;
    expect(fit.stderr).toBe('');
    expect(fit.code).toBe(0);
    fitted = await loadPerfModel(profile);
  }, 90_000);

  afterAll(async () => {
    await Promise.all(processes.map((p) => p.stop()));
    await upstream?.close();
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
    for (const value of r2) expect(value).toBeGreaterThan(0.6);
    expect(existsSync(profile)).toBe(true);
  });

  it('predicts the known step times: prefill by new prompt tokens, decode by active KV and batch', () => {
    for (const tokens of [200, 800, 1400, 3000]) {
      const known = KNOWN.prefillMs(tokens);
      expect(Math.abs(fitted.prefillMs(1, tokens, 0) / known - 1), `prefill of ${tokens} tokens`).toBeLessThan(0.05);
    }
    // As the engine asks: active KV in whole blocks of 64 (the default), the mean context, the batch.
    // 1 × 500 tokens: 8 blocks; 4 × 700: 4 × 11 blocks; 8 × 1000: 8 × 16 blocks.
    for (const [batch, length, blocks] of [[1, 500, 8], [4, 700, 44], [8, 1000, 128]]) {
      const known = KNOWN.decodeMs(batch * length, batch);
      expect(Math.abs(fitted.decodeMs(batch, blocks * 64, length, 16384 * 64) / known - 1), `decode of ${batch} × ${length}`).toBeLessThan(0.05);
    }
  });

  it('simulates a held-out load with the TTFT and ITL medians of the double within 5 %', async () => {
    const direct = medians(await runLoad(upstream.url, HELD_OUT));
    const serve = await startMockerProcess(['serve', '--timing', 'model', '--planner-profile-data', profile, '--served-model-name', MODEL]);
    processes.push(serve);
    const url = `http://127.0.0.1:${serve.port}`;
    await runLoad(url, [{ concurrency: 2, requests: requests(2, 4, [64, 256], [8, 8]) }]); // warm-up
    const simulated = medians(await runLoad(url, HELD_OUT));
    process.stderr.write(
      `held-out load: double TTFT p50 ${direct.ttftMs.toFixed(2)} ms, ITL p50 ${direct.itlMs.toFixed(2)} ms; ` +
        `mocker ${simulated.ttftMs.toFixed(2)} ms (${pct(simulated.ttftMs, direct.ttftMs)}), ${simulated.itlMs.toFixed(2)} ms (${pct(simulated.itlMs, direct.itlMs)})\n`,
    );
    expect(Math.abs(simulated.ttftMs / direct.ttftMs - 1)).toBeLessThan(0.05);
    expect(Math.abs(simulated.itlMs / direct.itlMs - 1)).toBeLessThan(0.05);
  }, 60_000);
});

const pct = (value: number, reference: number) => `${value >= reference ? '+' : ''}${((value / reference - 1) * 100).toFixed(1)} %`;
