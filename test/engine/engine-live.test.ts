/**
 * The simulated engine in wall-clock time: §9.2 items 20–21 through the live driver, and end to end over
 * HTTP with the polynomial perf model (engine-reference §4.1), KV pressure, disconnects and DP ranks.
 */
import http from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
import { applyExtraEngineArgs, DEFAULT_ENGINE_ARGS } from '../../src/config/engineArgs.js';
import {
  fixedTiming,
  modelTiming,
  polynomialPerfModel,
  SimulatedEngine,
  zeroTiming,
  type AnySchedulerConfig,
  type EngineObserver,
  type EngineState,
  type SchedulerConfig,
} from '../../src/engine/index.js';
import { serveInProcess, type Running, type ServeOptions } from '../support/inProcess.js';
import { median } from '../support/sseTiming.js';
import { MODEL } from '../support/vllmUpstream.js';
import { VLLM_SCHEDULER_DEFAULTS } from '../support/schedulerDefaults.js';

/** engine-reference §4.1, written out here as the oracle. */
const prefillPolynomialMs = (tokens: number) => 4.209989e-7 * tokens * tokens + 1.518344e-2 * tokens + 16.50142;
const decodePolynomialMs = (usage: number) => Math.max(1, -25.74 * usage * usage + 54.01 * usage + 5.74);

const scheduler = (overrides: Partial<SchedulerConfig>): AnySchedulerConfig => ({
  engineType: 'vllm',
  numGpuBlocks: 100,
  blockSize: 64,
  ...VLLM_SCHEDULER_DEFAULTS,
  timing: modelTiming(polynomialPerfModel, 10, 1),
  seed: 3,
  ...overrides,
});

const ids = (n: number, from = 1000) => Array.from({ length: n }, (_, i) => from + i);
const idle = (state: EngineState) => state.ranks.every((r) => r.running === 0 && r.waiting === 0 && r.activeBlocks === 0);

describe('§9.2 items 20–21 through the live driver', () => {
  it('20: ten identical 65-token requests 100 ms apart (speedup 10) all complete and the engine goes idle', async () => {
    const engine = new SimulatedEngine({ scheduler: scheduler({}), dataParallelSize: 1, speedupRatio: 10, timingDescription: 'model' });
    const prompt = ids(65);
    const runs: Promise<number>[] = [];
    for (let i = 0; i < 10; i++) {
      const stream = engine.submit(
        { requestId: `r${i}`, arrivalMs: performance.now(), promptTokenIds: prompt, sequences: [{ outputTokenIds: ids(10, 5) }] },
        new AbortController().signal,
      );
      runs.push(
        (async () => {
          let last = 0;
          for await (const batch of stream) for (const e of batch) last = e.emitted;
          return last;
        })(),
      );
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    const received = (await Promise.all(runs)).reduce((a, b) => a + b, 0);
    expect(received).toBe(100);
    expect(idle(engine.state())).toBe(true);
    // Identical prompts: all but the first found their full blocks in the prefix cache.
    expect(engine.state().ranks[0].prefixCacheHits).toBe(9 * 64);
  });

  it("a pass's tokens reach its stream before its statistics reach the observers; flushStatistics makes them current at once", async () => {
    const seen: string[] = [];
    const observer: EngineObserver = {
      onPass: (_rank, stats) => void (stats.generationTokens > 0 && seen.push(`observer: pass of ${stats.generationTokens} token(s)`)),
      onFinished: (_rank, request) => void seen.push(`observer: finished (${request.finishReason})`),
    };
    const engine = new SimulatedEngine({
      scheduler: scheduler({ timing: zeroTiming(false) }),
      dataParallelSize: 1,
      speedupRatio: 1,
      timingDescription: 'none',
      observers: [observer],
    });
    const stream = engine.submit(
      { requestId: 'r', arrivalMs: performance.now(), promptTokenIds: ids(10), sequences: [{ outputTokenIds: ids(1, 5), finishReason: 'length' }] },
      new AbortController().signal,
    );
    for await (const batch of stream) for (const e of batch) seen.push(`stream: ${e.emitted} token(s)`);
    // The stream has ended: its one pass is over, and its statistics are still queued.
    expect(seen).toEqual(['stream: 1 token(s)']);
    engine.flushStatistics();
    expect(seen).toEqual(['stream: 1 token(s)', 'observer: finished (length)', 'observer: pass of 1 token(s)']);
  });

  it('a request whose client leaves during the pass that finishes it is counted once, as finished', async () => {
    const finished: string[] = [];
    const observer: EngineObserver = { onFinished: (_rank, request) => void finished.push(request.finishReason) };
    // Every pass that emits tokens takes 300 ms: the driver runs it at once and sleeps until it ends.
    const engine = new SimulatedEngine({
      scheduler: scheduler({ timing: fixedTiming(300, 1) }),
      dataParallelSize: 1,
      speedupRatio: 1,
      timingDescription: 'fixed',
      observers: [observer],
    });
    const client = new AbortController();
    const stream = engine.submit(
      { requestId: 'r', arrivalMs: performance.now(), promptTokenIds: ids(10), sequences: [{ outputTokenIds: ids(1, 5), finishReason: 'length' }] },
      client.signal,
    );
    // The pass that generates its only token is under way: the client leaves before it ends.
    client.abort();
    for await (const batch of stream) void batch;
    await new Promise((resolve) => setTimeout(resolve, 400));
    engine.flushStatistics();
    expect(finished).toEqual(['length']);
    expect(idle(engine.state())).toBe(true);
  });

  it('21: dropping the receiver after 129 of 200 tokens frees every block', async () => {
    const engine = new SimulatedEngine({
      scheduler: scheduler({ numGpuBlocks: 10, timing: modelTiming(polynomialPerfModel, 100, 1) }),
      dataParallelSize: 1,
      speedupRatio: 100,
      timingDescription: 'model',
    });
    const abort = new AbortController();
    const stream = engine.submit(
      { requestId: 'r', arrivalMs: performance.now(), promptTokenIds: ids(256), sequences: [{ outputTokenIds: ids(200, 7) }] },
      abort.signal,
    );
    let seen = 0;
    for await (const batch of stream) {
      seen = batch[batch.length - 1].emitted;
      if (seen >= 129) abort.abort();
    }
    expect(seen).toBeGreaterThanOrEqual(129);
    expect(seen).toBeLessThan(200);
    expect(engine.state().ranks[0].activeBlocks).toBe(0);
    expect(idle(engine.state())).toBe(true);
  });
});

describe('over HTTP with --timing model', () => {
  const servers: Running[] = [];
  afterEach(async () => {
    for (const s of servers.splice(0)) await s.close();
  });
  const serve = async (options: ServeOptions) => {
    const s = await serveInProcess(options);
    servers.push(s);
    return s.url;
  };

  const agent = new http.Agent({ keepAlive: true, maxSockets: 64 });
  /** Streams a completion; returns the client's time to the first token and the final usage. */
  function complete(
    url: string,
    body: Record<string, unknown>,
    onChunk?: (n: number, req: http.ClientRequest) => void,
  ): Promise<{ ttftMs: number; tokens: number; usage: Record<string, unknown> | null; finish: string | null }> {
    // Serialized before the clock starts: 8,192 ids take the client a millisecond or more, no part of the server's TTFT.
    const payload = JSON.stringify({ model: MODEL, stream: true, stream_options: { include_usage: true }, return_token_ids: true, ...body });
    return new Promise((resolve, reject) => {
      const t0 = performance.now();
      let ttftMs = -1;
      let tokens = 0;
      let usage: Record<string, unknown> | null = null;
      let finish: string | null = null;
      let buffer = '';
      const req = http.request(`${url}/v1/completions`, { method: 'POST', agent, headers: { 'content-type': 'application/json' } }, (res) => {
        if (res.statusCode !== 200) reject(new Error(`status ${res.statusCode}`));
        res.on('data', (d: Buffer) => {
          buffer += d.toString();
          let at: number;
          while ((at = buffer.indexOf('\n\n')) >= 0) {
            const event = buffer.slice(0, at);
            buffer = buffer.slice(at + 2);
            if (event === 'data: [DONE]') continue;
            const chunk = JSON.parse(event.slice(6)) as {
              choices: { token_ids: number[] | null; finish_reason: string | null }[];
              usage: Record<string, unknown> | null;
            };
            if (chunk.usage) usage = chunk.usage;
            for (const c of chunk.choices) {
              if (ttftMs < 0) ttftMs = performance.now() - t0;
              tokens += c.token_ids?.length ?? 0;
              finish = c.finish_reason ?? finish;
            }
            onChunk?.(tokens, req);
          }
        });
        res.on('end', () => resolve({ ttftMs, tokens, usage, finish }));
        res.on('error', reject);
      });
      req.on('error', reject);
      req.end(payload);
    });
  }

  const engineState = async (url: string) => (await (await fetch(`${url}/mocker/engine`)).json()) as EngineState;
  /** Polls until some request is running (the one just sent has reached the engine), at most 2 s. */
  async function whileRunning(urls: string[]): Promise<EngineState[]> {
    for (let i = 0; i < 200; i++) {
      const states = await Promise.all(urls.map(engineState));
      if (states.some((s) => s.ranks.some((r) => r.running > 0))) return states;
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    throw new Error('no request reached the engine within 2 s');
  }

  it('an 8,192-token prompt takes the polynomial prefill plus one decode step; a shared 4,096-token prefix shortens it by what the polynomial predicts', async () => {
    const url = await serve({ mode: 'random', captures: ':memory:', timing: 'model', enablePromptTokensDetails: true });
    // Warm the path with a tiny request, so the measured ones carry no first-request costs.
    await complete(url, { prompt: ids(8), max_tokens: 1 });
    // What the client sees beyond the engine's time (the HTTP round trip, the token's delivery) is measured by a
    // 16-token request through the same path, whose own time the polynomial also gives: TTFT minus that is the
    // engine's. Three rounds with fresh ids (each 8,192-token prompt misses the cache; all ids below Qwen3's
    // 151,669), judged by their medians: one process serves and measures, so single samples carry its noise.
    // A decode step sees the prompt's blocks of 64 active out of 16,384.
    const modelMs = (prefilled: number, promptTokens: number) => prefillPolynomialMs(prefilled) + decodePolynomialMs(Math.ceil(promptTokens / 64) / 16384);
    const delivery: number[] = [];
    const full: number[] = [];
    const cached: number[] = [];
    for (let round = 0; round < 3; round++) {
      const first = ids(8192, 10_000 + round * 30_000);
      const second = [...first.slice(0, 4096), ...ids(4096, 20_000 + round * 30_000)];
      delivery.push((await complete(url, { prompt: ids(16, 100_000 + round * 100), max_tokens: 2 })).ttftMs - modelMs(16, 16));
      const a = await complete(url, { prompt: first, max_tokens: 2 });
      expect(a.usage).toMatchObject({ prompt_tokens: 8192, completion_tokens: 2, prompt_tokens_details: { cached_tokens: 0 } });
      const b = await complete(url, { prompt: second, max_tokens: 2 });
      expect(b.usage).toMatchObject({ prompt_tokens: 8192, prompt_tokens_details: { cached_tokens: 4096 } });
      full.push(a.ttftMs);
      cached.push(b.ttftMs);
    }
    expect(Math.abs(median(full) - median(delivery) - modelMs(8192, 8192))).toBeLessThanOrEqual(5);
    expect(Math.abs(median(cached) - median(delivery) - modelMs(4096, 8192))).toBeLessThanOrEqual(5);
    expect(Math.abs(median(full) - median(cached) - (prefillPolynomialMs(8192) - prefillPolynomialMs(4096)))).toBeLessThanOrEqual(5);
  });

  it('64 blocks of 16 tokens and 50 concurrent long requests: answers throughout, preempts, completes every request', async () => {
    const url = await serve({ mode: 'random', captures: ':memory:', timing: 'model', engine: { numGpuBlocks: 64, blockSize: 16, speedupRatio: 100 } });
    let healthy = true;
    let polls = 0;
    let done = false;
    const poller = (async () => {
      while (!done) {
        const res = await fetch(`${url}/health`);
        healthy &&= res.status === 200;
        polls++;
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    })();
    const results = await Promise.all(
      Array.from({ length: 50 }, (_, i) => complete(url, { prompt: ids(100, 1000 + i * 200), max_tokens: 100, ignore_eos: true })),
    );
    done = true;
    await poller;
    for (const r of results) {
      expect(r.tokens).toBe(100);
      expect(r.finish).toBe('length');
    }
    expect(healthy).toBe(true);
    expect(polls).toBeGreaterThan(2);
    const state = await engineState(url);
    expect(state.ranks[0].preemptions).toBeGreaterThan(0);
    expect(idle(state)).toBe(true);
  });

  it('a client that disconnects mid-stream frees its blocks', async () => {
    const url = await serve({ mode: 'random', captures: ':memory:', timing: 'model', engine: { speedupRatio: 20 } });
    const others = [0, 1, 2].map((i) => complete(url, { prompt: ids(300, 5000 + 400 * i), max_tokens: 60, ignore_eos: true }));
    const dropped = complete(url, { prompt: ids(300, 9000), max_tokens: 500, ignore_eos: true }, (n, req) => {
      if (n >= 10) req.destroy();
    }).catch(() => null);
    await dropped;
    const finished = await Promise.all(others);
    expect(finished.map((r) => r.tokens)).toEqual([60, 60, 60]);
    const state = await engineState(url);
    expect(state.ranks[0].activeBlocks).toBe(0);
    expect(idle(state)).toBe(true);
  });

  it('X-data-parallel-rank picks the rank; a rank out of range is a 400', async () => {
    const url = await serve({ mode: 'random', captures: ':memory:', timing: 'model', engine: { dataParallelSize: 2, speedupRatio: 1 } });
    const slow = fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-data-parallel-rank': '1' },
      body: JSON.stringify({ model: MODEL, prompt: 'hello', max_tokens: 200, ignore_eos: true }),
    });
    const [during] = await whileRunning([url]);
    expect(during.ranks.map((r) => r.running)).toEqual([0, 1]);
    expect((await slow).status).toBe(200);
    const bad = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-data-parallel-rank': '2' },
      body: JSON.stringify({ model: MODEL, prompt: 'hello', max_tokens: 2 }),
    });
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as { error: { message: string } }).error.message).toMatch(/rank 2 is out of range/);
  });

  it('--num-workers runs independent engines on consecutive servers', async () => {
    const s = await serveInProcess({ mode: 'random', captures: ':memory:', timing: 'model', numWorkers: 2, engine: { speedupRatio: 1 } });
    servers.push(s);
    expect(s.ports).toHaveLength(2);
    const [first, second] = s.ports!.map((p) => `http://127.0.0.1:${p}`);
    const slow = fetch(`${second}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, prompt: 'hello', max_tokens: 200, ignore_eos: true }),
    });
    const [onFirst, onSecond] = await whileRunning([first, second]);
    expect(onFirst.ranks[0].running).toBe(0);
    expect(onSecond.ranks[0].running).toBe(1);
    expect((await slow).status).toBe(200);
  });

  it('a request larger than the whole KV cache gets a 400, never a hang', async () => {
    const url = await serve({ mode: 'random', captures: ':memory:', timing: 'model', engine: { numGpuBlocks: 4, blockSize: 16 } });
    const res = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, prompt: ids(60), max_tokens: 10 }),
    });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: { message: string; type: string } }).error).toMatchObject({ type: 'BadRequestError' });
  });
});

describe('engine arguments', () => {
  it("--extra-engine-args takes Dynamo's keys and names unknown or unsupported ones", () => {
    const args = applyExtraEngineArgs(DEFAULT_ENGINE_ARGS, '{"num_gpu_blocks": 512, "block_size": 16, "preemption_mode": "fifo", "max_num_seqs": null}');
    expect(args).toMatchObject({ numGpuBlocks: 512, blockSize: 16, preemptionMode: 'fifo', maxNumSeqs: null });
    expect(() => applyExtraEngineArgs(DEFAULT_ENGINE_ARGS, '{"num_gpu_blockz": 5}')).toThrow(/unknown key "num_gpu_blockz"/);
    expect(() => applyExtraEngineArgs(DEFAULT_ENGINE_ARGS, '{"sglang": {"page_sise": 4}}')).toThrow(/"sglang".*page_sise/);
    // Dynamo's SglangArgs: the page size becomes the block size when no block size is given; "fcfs" is FIFO.
    const sglang = applyExtraEngineArgs(
      DEFAULT_ENGINE_ARGS,
      '{"engine_type": "sglang", "sglang": {"page_size": 16, "schedule_policy": "fcfs", "clip_max_new_tokens": 256}}',
    );
    expect([sglang.engineType, sglang.blockSize, sglang.sglang.pageSize, sglang.sglang.schedulePolicy, sglang.sglang.clipMaxNewTokens]).toEqual([
      'sglang',
      16,
      16,
      'fifo',
      256,
    ]);
    expect(() => applyExtraEngineArgs(DEFAULT_ENGINE_ARGS, '{"engine_type": "sglang", "block_size": 32, "sglang": {"page_size": 16}}')).toThrow(
      /page size .* 16 and the block size .* 32 must be equal/,
    );
    expect(() => applyExtraEngineArgs(DEFAULT_ENGINE_ARGS, '{"engine_type": "tgi"}')).toThrow(/"engine_type"/);
    expect(() => applyExtraEngineArgs(DEFAULT_ENGINE_ARGS, '{"worker_type": "prefill"}')).toThrow(/--disaggregation-mode/);
    expect(() => applyExtraEngineArgs(DEFAULT_ENGINE_ARGS, '{"block_size": 1}')).toThrow(/block size \(--block-size\) must be at least 2/);
    expect(() => applyExtraEngineArgs(DEFAULT_ENGINE_ARGS, '{"preemption_mode": "random"}')).toThrow(/"preemption_mode"/);
  });

  it('an impossible combination fails at startup', async () => {
    await expect(serveInProcess({ mode: 'random', captures: ':memory:', engine: { blockSize: 1 } })).rejects.toThrow(
      /block size \(--block-size\) must be at least 2/,
    );
    await expect(serveInProcess({ mode: 'random', captures: ':memory:', engine: { maxNumBatchedTokens: 8, maxNumSeqs: 16 } })).rejects.toThrow(
      /max_num_batched_tokens/,
    );
  });
});
