/**
 * `--timing latency` (`--ttft` / `--itl` and their jitter), `--fast` and `--startup-time`. The wall-clock parts
 * run the built CLI and a measuring client in their own processes (test/support/sseTiming.ts), with tolerant
 * bounds; the engine's own times are checked on the virtual clock, exactly, against hand-computed numbers.
 */
import { afterEach, describe, expect, it } from 'vitest';
import type { EngineCore } from '../../src/engine/core.js';
import { latencyTiming } from '../../src/engine/latencyTiming.js';
import { runOffline } from '../../src/engine/offlineDriver.js';
import { SglangCore } from '../../src/engine/sglang/core.js';
import { SGLANG_SERVER_DEFAULTS, smallVllmCore } from '../support/schedulerDefaults.js';
import { mockerProcesses } from '../support/mockerProcess.js';
import { measureInProcess, median } from '../support/sseTiming.js';

type Json = Record<string, unknown>;

const ENV = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^(VLLM_|DYN_MOCKER_|PYTHONHASHSEED$)/.test(k)));
const mockers = mockerProcesses();
afterEach(mockers.stopAll);
const SERVE = ['serve', '--mode', 'random', '--served-model-name', 'm'];

const knobs = (ttftMs: number, itlMs: number, ttftStdMs = 0, itlStdMs = 0) => ({ ttftMs, itlMs, ttftStdMs, itlStdMs });
const tokens = (n: number, from = 1) => Array.from({ length: n }, (_, i) => from + i);
const within = (value: number, target: number, fraction: number) =>
  expect(Math.abs(value - target), `${value} vs ${target}`).toBeLessThanOrEqual(target * fraction);

describe('the latency timing on the virtual clock', () => {
  it('vLLM flavour: a lone request has its first token at TTFT, then one every ITL; a pass that prefills takes TTFT for everyone in it', () => {
    const result = runOffline(smallVllmCore(latencyTiming(knobs(50, 10), 1, 1)), [
      { request: { id: 'a', promptTokenIds: tokens(100), maxOutputTokens: 4 }, arrivalMs: 0 },
      // Arrives while a's third token is computed: admitted in the pass after, which prefills and so takes 50 ms.
      { request: { id: 'b', promptTokenIds: tokens(100, 500), maxOutputTokens: 2 }, arrivalMs: 65 },
    ]);
    expect(result.records.get('a')!.tokenTimesMs).toEqual([50, 60, 70, 120]);
    expect(result.records.get('b')!.tokenTimesMs).toEqual([120, 130]);
  });

  it('SGLang flavour: the same rule', () => {
    const core = new SglangCore({
      ...SGLANG_SERVER_DEFAULTS,
      numGpuBlocks: 1024,
      pageSize: 16,
      enablePrefixCaching: false,
      timing: latencyTiming(knobs(50, 10), 1, 1),
      seed: 1,
    });
    const result = runOffline(core as unknown as EngineCore, [{ request: { id: 'a', promptTokenIds: tokens(100), maxOutputTokens: 3 }, arrivalMs: 0 }]);
    expect(result.records.get('a')!.tokenTimesMs).toEqual([50, 60, 70]);
  });

  it('--speedup-ratio divides both; jitter is Gaussian (mean and std as given), seeded, and clipped at 0; knobs changed later apply to the next pass', () => {
    expect(latencyTiming(knobs(50, 10), 1, 2).prefillMs(1, 100, 0, 100)).toBe(25);
    expect(latencyTiming(knobs(50, 10), 1, 2).decodeMs(1, 0, 0, 0)).toBe(5);
    const draws = (seed: number, mean: number, std: number) => {
      const timing = latencyTiming(knobs(mean, 0, std), seed, 1);
      return Array.from({ length: 20_000 }, () => timing.prefillMs(1, 100, 0, 100));
    };
    const sample = draws(42, 50, 10);
    const mean = sample.reduce((a, b) => a + b, 0) / sample.length;
    const std = Math.sqrt(sample.reduce((a, b) => a + (b - mean) ** 2, 0) / sample.length);
    // Standard error of the mean: 10 / √20000 ≈ 0.07 ms; of the std ≈ 0.05 ms.
    expect(Math.abs(mean - 50)).toBeLessThan(0.4);
    expect(Math.abs(std - 10)).toBeLessThan(0.4);
    // Within one std of the mean: 68.3 % of a Gaussian.
    expect(Math.abs(sample.filter((x) => Math.abs(x - 50) < 10).length / sample.length - 0.683)).toBeLessThan(0.015);
    expect(draws(42, 50, 10)).toEqual(sample);
    expect(draws(43, 50, 10)).not.toEqual(sample);
    const clipped = draws(42, 0, 10);
    expect(Math.min(...clipped)).toBe(0);
    expect(Math.abs(clipped.filter((x) => x === 0).length / clipped.length - 0.5)).toBeLessThan(0.02);
    const live = knobs(50, 10);
    const timing = latencyTiming(live, 1, 1);
    live.ttftMs = 80;
    expect(timing.prefillMs(1, 100, 0, 100)).toBe(80);
  });
});

describe('mocker serve --ttft 50 --itl 10 (wall clock)', () => {
  const BODY = { model: 'm', prompt: 'Tell me a story', max_tokens: 12, stream: true };

  it('TTFT ≈ 50 ms and gaps ≈ 10 ms (medians within ±30 %); POST /mocker/config {"ttft":150} makes the TTFT ≈ 150 ms', async () => {
    const url = (await mockers.start([...SERVE, '--ttft', '50', '--itl', '10', '--ttft-std', '0', '--itl-std', '0', '--enable-control-routes'], { env: ENV }))
      .url;
    const config = (await (await fetch(`${url}/mocker/config`)).json()) as Json;
    expect(config).toMatchObject({ timing: 'latency', ttft: 50, itl: 10, ttft_std: 0, itl_std: 0 });
    const { rttMs, arrivalsMs, gapsMs } = await measureInProcess(url, BODY);
    expect(arrivalsMs).toHaveLength(12);
    within(arrivalsMs[0] - rttMs, 50, 0.3);
    within(median(gapsMs), 10, 0.3);
    const posted = await fetch(`${url}/mocker/config`, { method: 'POST', body: JSON.stringify({ ttft: 150 }) });
    expect(posted.status).toBe(200);
    const later = await measureInProcess(url, BODY);
    within(later.arrivalsMs[0] - later.rttMs, 150, 0.3);
    within(median(later.gapsMs), 10, 0.3);
  });

  it("--timing latency alone takes AIPerf's defaults (TTFT 20, ITL 5); --fast is --timing none", async () => {
    const url = (await mockers.start([...SERVE, '--timing', 'latency', '--enable-control-routes'], { env: ENV })).url;
    expect((await (await fetch(`${url}/mocker/config`)).json()) as Json).toMatchObject({ timing: 'latency', ttft: 20, itl: 5, ttft_std: 0, itl_std: 0 });
    const fast = (await mockers.start([...SERVE, '--fast', '--enable-control-routes'], { env: ENV })).url;
    expect((await (await fetch(`${fast}/mocker/config`)).json()) as Json).toMatchObject({ timing: 'none', ttft: null, itl: null });
    expect(((await (await fetch(`${fast}/mocker/engine`)).json()) as { config: Json }).config.timing).toBe('none');
  });
});

describe('mocker serve --startup-time 2', () => {
  it("answers 503 (vLLM's error format, Retry-After) on /health and the API until then, /metrics throughout; then 200", async () => {
    const url = (await mockers.start([...SERVE, '--startup-time', '2'], { env: ENV })).url;
    const listening = performance.now();
    const health = await fetch(`${url}/health`);
    expect(health.status).toBe(503);
    expect(Number(health.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    expect(await health.json()).toEqual({ error: { message: expect.stringContaining('starting up'), type: 'Service Unavailable', param: null, code: 503 } });
    expect((await fetch(`${url}/v1/models`)).status).toBe(503);
    const completion = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm', prompt: 'Hi', max_tokens: 1 }),
    });
    expect(completion.status).toBe(503);
    expect((await fetch(`${url}/metrics`)).status).toBe(200);
    let readyAfterMs = 0;
    for (;;) {
      if ((await fetch(`${url}/health`)).status === 200) {
        readyAfterMs = performance.now() - listening;
        break;
      }
      expect(performance.now() - listening).toBeLessThan(10_000);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    // The 2 s count from the end of start-up, just before the server says it listens.
    expect(readyAfterMs).toBeGreaterThan(1000);
    expect(readyAfterMs).toBeLessThan(3000);
    expect((await fetch(`${url}/v1/models`)).status).toBe(200);
  });
});
