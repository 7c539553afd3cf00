/**
 * `GET /metrics` against vLLM's exposition (vllm-wire-reference §4), read with a real Prometheus text-format
 * parser, under a load the test controls.
 */
import parsePrometheusTextFormat from 'parse-prometheus-text-format';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readFileSync } from 'node:fs';
import { floatToGoString } from '../../src/metrics/exposition.js';
import { serveInProcess, type Running } from '../support/inProcess.js';
import { sleep } from '../support/kvEventsClient.js';
import type { EngineState } from '../../src/engine/index.js';
import { MODEL } from '../support/vllmUpstream.js';

type Families = ReturnType<typeof parsePrometheusTextFormat>;

const LENGTH_REQUESTS = 5;
const MAX_TOKENS = 12;

describe('floatToGoString', () => {
  it("prints every value as Python's prometheus_client does (fixture written by Python's own float repr)", () => {
    const rows = JSON.parse(readFileSync(new URL('../fixtures/prometheus/float-to-go-string.json', import.meta.url), 'utf8')) as {
      value: number | string;
      text: string;
    }[];
    expect(rows.length).toBeGreaterThan(30);
    for (const { value, text } of rows) {
      const n = value === 'inf' ? Infinity : value === '-inf' ? -Infinity : (value as number);
      expect(floatToGoString(n), String(value)).toBe(text);
    }
  });
});

describe('GET /metrics', () => {
  let server: Running;
  let url: string;
  beforeAll(async () => {
    // Slow steps and room for 3 running requests: the test knows what is running and waiting.
    server = await serveInProcess({
      mode: 'random',
      captures: ':memory:',
      timing: 'fixed',
      forwardTimeMs: 40,
      engine: { maxNumSeqs: 3, maxNumBatchedTokens: 8192 },
    });
    url = `http://127.0.0.1:${server.port}`;
  });
  afterAll(async () => {
    await server?.close();
  });

  const scrape = async (): Promise<{ families: Families; contentType: string; text: string }> => {
    const res = await fetch(`${url}/metrics`);
    const text = await res.text();
    return { families: parsePrometheusTextFormat(text), contentType: res.headers.get('content-type') ?? '', text };
  };
  /**
   * A histogram's `_count` sample, read from the text itself: the parser folds labelled histograms into bucket
   * maps without their count and sum.
   */
  const histogramCount = (text: string, name: string) => {
    const line = text.split('\n').find((l) => l.startsWith(`${name}_count{`));
    if (!line) throw new Error(`no ${name}_count in /metrics`);
    return Number(line.slice(line.lastIndexOf(' ') + 1));
  };
  const family = (families: Families, name: string) => {
    const f = families.find((x) => x.name === name);
    if (!f) throw new Error(`no ${name} in /metrics`);
    return f;
  };
  const value = (families: Families, name: string, labels: Record<string, string> = {}) => {
    const sample = family(families, name).metrics.find((m) => Object.entries(labels).every(([k, v]) => m.labels?.[k] === v));
    return Number(sample?.value);
  };

  it('exposes vLLM names, types, help texts and labels before any request', async () => {
    const { families, contentType } = await scrape();
    expect(contentType).toMatch(/^text\/plain; version=0\.0\.4/);
    expect(family(families, 'vllm:num_requests_running')).toMatchObject({ type: 'GAUGE', help: 'Number of requests in model execution batches.' });
    expect(family(families, 'vllm:kv_cache_usage_perc')).toMatchObject({ type: 'GAUGE', help: 'KV-cache usage. 1 means 100 percent usage.' });
    expect(family(families, 'vllm:prompt_tokens_total')).toMatchObject({ type: 'COUNTER', help: 'Number of prefill tokens processed.' });
    expect(family(families, 'vllm:time_to_first_token_seconds')).toMatchObject({ type: 'HISTOGRAM', help: 'Histogram of time to first token in seconds.' });
    expect(family(families, 'vllm:num_requests_running').metrics[0].labels).toEqual({ model_name: MODEL, engine: '0' });
    const success = family(families, 'vllm:request_success_total')
      .metrics.map((m) => m.labels?.finished_reason)
      .sort();
    expect(success).toEqual(['abort', 'length', 'stop']);
    const ttftBuckets = Object.keys(family(families, 'vllm:time_to_first_token_seconds').metrics[0].buckets ?? {})
      .map((le) => (le === '+Inf' ? Infinity : Number(le)))
      .sort((a, b) => a - b);
    expect(ttftBuckets).toEqual([0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560, Infinity]);
    expect(histogramCount((await scrape()).text, 'vllm:time_to_first_token_seconds')).toBe(0);
    expect(family(families, 'vllm:cache_config_info').metrics[0].labels).toMatchObject({ block_size: '64', num_gpu_blocks: '16384', engine: '0' });
    // The deprecated gauge only with --show-hidden-metrics-for-version.
    expect(families.find((f) => f.name === 'vllm:gpu_cache_usage_perc')).toBeUndefined();
  });

  it("prints lines as vLLM's prometheus_client does: labels in alphabetical order, Go-style floats, _count before _sum", async () => {
    const { text } = await scrape();
    const lines = text.split('\n');
    const m = `model_name="${MODEL}"`;
    // vllm-wire-reference §4: `…_bucket{engine="0",le="0.1",model_name="m"}`, `request_success_total{engine="0",finished_reason="stop",model_name="m"}`.
    for (const line of [
      `vllm:num_requests_running{engine="0",${m}} 0.0`,
      `vllm:request_success_total{engine="0",finished_reason="stop",${m}} 0.0`,
      `vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",${m}} 0.0`,
      `vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",${m}} 0.0`,
      `vllm:time_to_first_token_seconds_bucket{engine="0",le="2560.0",${m}} 0.0`,
      `vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",${m}} 0.0`,
      `vllm:request_prompt_tokens_bucket{engine="0",le="20000.0",${m}} 0.0`,
    ]) {
      expect(lines, line).toContain(line);
    }
    const count = lines.indexOf(`vllm:time_to_first_token_seconds_count{engine="0",${m}} 0.0`);
    const sum = lines.indexOf(`vllm:time_to_first_token_seconds_sum{engine="0",${m}} 0.0`);
    expect(count).toBeGreaterThan(0);
    expect(sum).toBe(count + 1);
    expect(lines.slice(0, -1)).not.toContain('');
  });

  it('tracks a controlled load: gauges match what was sent, counters only rise, histograms count the finished requests', async () => {
    const prompts = Array.from({ length: LENGTH_REQUESTS }, (_, i) => Array.from({ length: 10 + i }, (_, t) => 1000 + 100 * i + t));
    const sent = prompts.map((prompt) =>
      fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, prompt, max_tokens: MAX_TOKENS, ignore_eos: true }),
      }).then((r) => r.json()),
    );
    // One chat answer that ends by EOS: a `stop` finish.
    const chat = fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hi' }] }),
    }).then((r) => r.json() as Promise<{ choices: { finish_reason: string }[]; usage: { prompt_tokens: number; completion_tokens: number } }>);
    // Until all 6 have reached the engine (the first ends after 12 steps of 40 ms, well after).
    let state = (await (await fetch(`${url}/mocker/engine`)).json()) as EngineState;
    for (let i = 0; i < 40 && state.ranks[0].running + state.ranks[0].waiting < 6; i++) {
      await sleep(10);
      state = (await (await fetch(`${url}/mocker/engine`)).json()) as EngineState;
    }
    // Gauges are set at each engine step: let one pass after the last arrival.
    await sleep(50);
    const during = (await scrape()).families;
    state = (await (await fetch(`${url}/mocker/engine`)).json()) as EngineState;
    // 6 requests sent, 3 may run.
    expect(value(during, 'vllm:num_requests_running')).toBe(3);
    expect(value(during, 'vllm:num_requests_waiting')).toBe(3);
    expect(state.ranks[0]).toMatchObject({ running: 3, waiting: 3 });
    expect(value(during, 'vllm:kv_cache_usage_perc')).toBeCloseTo(state.ranks[0].activeBlocks / state.ranks[0].totalBlocks, 9);

    const counters = ['vllm:prompt_tokens_total', 'vllm:generation_tokens_total', 'vllm:prefix_cache_queries_total'];
    let previous = counters.map((c) => value(during, c));
    const polls: Promise<void>[] = [];
    let done = false;
    const watch = (async () => {
      while (!done) {
        const now = (await scrape()).families;
        const current = counters.map((c) => value(now, c));
        current.forEach((v, i) => expect(v, counters[i]).toBeGreaterThanOrEqual(previous[i]));
        previous = current;
        await sleep(30);
      }
    })();
    polls.push(watch);
    let chatAnswer: Awaited<typeof chat>;
    try {
      await Promise.all(sent);
      chatAnswer = await chat;
    } finally {
      done = true;
      await Promise.all(polls);
    }
    expect(chatAnswer.choices[0].finish_reason).toBe('stop');

    const { families: after, text: afterText } = await scrape();
    const finished = LENGTH_REQUESTS + 1;
    expect(value(after, 'vllm:request_success_total', { finished_reason: 'length' })).toBe(LENGTH_REQUESTS);
    expect(value(after, 'vllm:request_success_total', { finished_reason: 'stop' })).toBe(1);
    for (const h of [
      'vllm:e2e_request_latency_seconds',
      'vllm:request_queue_time_seconds',
      'vllm:request_prefill_time_seconds',
      'vllm:request_decode_time_seconds',
      'vllm:request_prompt_tokens',
      'vllm:request_generation_tokens',
      'vllm:time_to_first_token_seconds',
    ]) {
      expect(histogramCount(afterText, h), h).toBe(finished);
    }
    // max_tokens was sent by the 5 completions only.
    expect(histogramCount(afterText, 'vllm:request_params_max_tokens')).toBe(LENGTH_REQUESTS);
    const promptTokens = prompts.reduce((n, p) => n + p.length, 0) + chatAnswer.usage.prompt_tokens;
    expect(value(after, 'vllm:prompt_tokens_total')).toBe(promptTokens);
    expect(value(after, 'vllm:generation_tokens_total')).toBe(LENGTH_REQUESTS * MAX_TOKENS + chatAnswer.usage.completion_tokens);
    const interTokenGaps = LENGTH_REQUESTS * (MAX_TOKENS - 1) + chatAnswer.usage.completion_tokens - 1;
    expect(histogramCount(afterText, 'vllm:inter_token_latency_seconds')).toBe(interTokenGaps);
    // vLLM 0.11 still observes the deprecated TPOT histogram with every inter-token latency.
    expect(histogramCount(afterText, 'vllm:time_per_output_token_seconds')).toBe(interTokenGaps);
    expect(value(after, 'vllm:prefix_cache_queries_total')).toBe(promptTokens);
    expect(value(after, 'vllm:num_requests_running')).toBe(0);
    expect(value(after, 'vllm:num_requests_waiting')).toBe(0);
    // Requests that waited for a slot spent measurable time queued: the queue-time histogram saw it.
    const queueSum = afterText.split('\n').find((l) => l.startsWith('vllm:request_queue_time_seconds_sum{'))!;
    expect(Number(queueSum.slice(queueSum.lastIndexOf(' ') + 1))).toBeGreaterThan(0);
  });
});

describe('GET /metrics with several DP ranks and hidden metrics', () => {
  let server: Running;
  let url: string;
  beforeAll(async () => {
    server = await serveInProcess({
      mode: 'random',
      captures: ':memory:',
      timing: 'fixed',
      forwardTimeMs: 20,
      showHiddenMetrics: true,
      engine: { dataParallelSize: 2, blockSize: 16 },
    });
    url = `http://127.0.0.1:${server.port}`;
  });
  afterAll(async () => {
    await server?.close();
  });

  /** One scrape: each named family's value per `engine` label. */
  const scrape = async (...names: string[]) => {
    const families = parsePrometheusTextFormat(await (await fetch(`${url}/metrics`)).text());
    return names.map((name) => {
      const f = families.find((x) => x.name === name);
      if (!f) throw new Error(`no ${name} in /metrics`);
      return Object.fromEntries(f.metrics.map((m) => [m.labels?.engine, Number(m.value)]));
    });
  };
  const samples = async (name: string) => (await scrape(name))[0];

  it('one series per rank (engine label); a request sent to rank 1 counts on rank 1 only', async () => {
    expect(await samples('vllm:prompt_tokens_total')).toEqual({ '0': 0, '1': 0 });
    expect(Object.keys(await samples('vllm:cache_config_info')).sort()).toEqual(['0', '1']);
    const prompt = Array.from({ length: 40 }, (_, i) => 700 + i);
    const res = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-data-parallel-rank': '1' },
      body: JSON.stringify({ model: MODEL, prompt, max_tokens: 3, ignore_eos: true }),
    });
    expect(res.status).toBe(200);
    await res.json();
    expect(await samples('vllm:prompt_tokens_total')).toEqual({ '0': 0, '1': 40 });
    expect(await samples('vllm:generation_tokens_total')).toEqual({ '0': 0, '1': 3 });
    // The same prompt again hits the prefix cache, yet vLLM's IterationStats counts its whole prompt with its first token.
    const again = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-data-parallel-rank': '1' },
      body: JSON.stringify({ model: MODEL, prompt, max_tokens: 3, ignore_eos: true }),
    });
    await again.json();
    expect((await samples('vllm:prefix_cache_hits_total'))['1']).toBeGreaterThan(0);
    expect(await samples('vllm:prompt_tokens_total')).toEqual({ '0': 0, '1': 80 });
  });

  it('gauges follow an abort at once, without waiting for another engine step', async () => {
    const leave = new AbortController();
    const sent = fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-data-parallel-rank': '0' },
      body: JSON.stringify({ model: MODEL, prompt: Array.from({ length: 64 }, (_, i) => 1500 + i), max_tokens: 200, ignore_eos: true, stream: true }),
      signal: leave.signal,
    });
    const reader = (await sent).body!.getReader();
    await reader.read();
    let [running] = await scrape('vllm:num_requests_running');
    for (let i = 0; i < 50 && running['0'] !== 1; i++) [running] = await scrape('vllm:num_requests_running');
    expect(running['0']).toBe(1);
    leave.abort();
    await sleep(200);
    const [after, usage] = await scrape('vllm:num_requests_running', 'vllm:kv_cache_usage_perc');
    expect(after['0']).toBe(0);
    expect(usage['0']).toBe(0);
  });

  it('--show-hidden-metrics-for-version adds the deprecated gpu_cache_usage_perc, equal to kv_cache_usage_perc per rank', async () => {
    // 40 steps of 20 ms on rank 0: its blocks are in use while the test scrapes.
    const held = fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-data-parallel-rank': '0' },
      body: JSON.stringify({ model: MODEL, prompt: Array.from({ length: 64 }, (_, i) => 900 + i), max_tokens: 40, ignore_eos: true }),
    });
    let [kv, gpu] = await scrape('vllm:kv_cache_usage_perc', 'vllm:gpu_cache_usage_perc');
    for (let i = 0; i < 50 && !(kv['0'] > 0); i++) {
      await sleep(10);
      [kv, gpu] = await scrape('vllm:kv_cache_usage_perc', 'vllm:gpu_cache_usage_perc');
    }
    expect(kv['0']).toBeGreaterThan(0);
    expect(kv['1']).toBe(0);
    expect(gpu).toEqual(kv);
    await (await held).json();
  });
});
