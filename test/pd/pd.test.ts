/**
 * Prefill/decode disaggregation over vLLM's NIXL-connector protocol (vllm-wire-reference.md §7): mocker
 * prefill and decode engines behind `mocker pd-proxy` (and `serve --pd`), driven by the official openai client
 * and by the toy proxy's exact request sequence.
 */
import http from 'node:http';
import OpenAI from 'openai';
import parsePrometheusTextFormat from 'parse-prometheus-text-format';
import { afterEach, describe, expect, it } from 'vitest';
import type { EngineState } from '../../src/engine/index.js';
import { kvBytesPerToken } from '../../src/pd/kvTransfer.js';
import { pdDeploymentInProcess, pdProxyInProcess, serveInProcess, type Running, type RunningProxy, type ServeOptions } from '../support/inProcess.js';
import { EventSubscriber, freePortRun, freePorts, sleep } from '../support/kvEventsClient.js';
import { listenOnLoopback, type LoopbackServer } from '../support/loopback.js';
import { mockerProcesses } from '../support/mockerProcess.js';
import { median } from '../support/sseTiming.js';
import { MODEL } from '../support/vllmUpstream.js';

const running: (Running | RunningProxy)[] = [];
afterEach(async () => {
  for (const r of running.splice(0).reverse()) await r.close();
});

const BASE: ServeOptions = { mode: 'simulate', captures: ':memory:', timing: 'model', seed: 5, engine: { blockSize: 16 } };

async function serve(options: Partial<ServeOptions>): Promise<{ server: Running; url: string }> {
  const server = await serveInProcess({ ...BASE, ...options });
  running.push(server);
  return { server, url: server.url };
}

/** `host:port` of a server on loopback, as a --kv-transfer-allowed-hosts entry. */
const peerOf = (url: string) => new URL(url).host;

async function pdPair(options: Partial<ServeOptions> = {}) {
  const prefill = await serve({ ...options, role: 'prefill' });
  const decode = await serve({ ...options, role: 'decode', kvTransferAllowedHosts: [peerOf(prefill.url)] });
  const proxy = await pdProxyInProcess({ prefill: [prefill.url], decode: [decode.url] });
  running.push(proxy);
  return { prefill: prefill.url, decode: decode.url, proxy: `http://127.0.0.1:${proxy.port}` };
}

const engineState = async (url: string) => (await (await fetch(`${url}/mocker/engine`)).json()) as EngineState;
const activeBlocks = async (url: string) => (await engineState(url)).ranks.reduce((n, r) => n + r.activeBlocks, 0);

async function counter(url: string, name: string, reason?: string): Promise<number> {
  const families = parsePrometheusTextFormat(await (await fetch(`${url}/metrics`)).text());
  const sample = families.find((f) => f.name === name)?.metrics.find((m) => reason === undefined || m.labels?.reason === reason);
  if (!sample) throw new Error(`no ${name}${reason ? `{reason="${reason}"}` : ''}`);
  return Number(sample.value);
}

/**
 * A 64-token completion (ids from `promptFrom`) sent to a decode engine whose `kv_transfer_params` name a prefill
 * engine at 127.0.0.1:`prefillPort` holding the prompt's KV (vllm-wire-reference.md §7): the decode engine pulls it.
 */
function completeWithRemoteKv(
  decode: string,
  prefillPort: number,
  options: { promptFrom: number; maxTokens: number; signal?: AbortSignal },
): Promise<Response> {
  const kv = {
    do_remote_prefill: true,
    do_remote_decode: false,
    remote_block_ids: [1, 2, 3, 4],
    remote_engine_id: 'no-such-engine',
    remote_request_id: 'r-1',
    remote_host: '127.0.0.1',
    remote_port: prefillPort,
    tp_size: 1,
  };
  const prompt = Array.from({ length: 64 }, (_, i) => options.promptFrom + i);
  return fetch(`${decode}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, prompt, max_tokens: options.maxTokens, kv_transfer_params: kv }),
    signal: options.signal,
  });
}

/** A stand-in for a prefill engine's KV pull endpoint, on loopback. */
function pullEndpoint(answer: http.RequestListener): Promise<LoopbackServer> {
  return listenOnLoopback(http.createServer(answer));
}

/** Everything a client reads from one request, streamed or not, chat or completion. */
async function ask(baseUrl: string, kind: 'chat' | 'completion', stream: boolean): Promise<{ text: string; finish: string | null; ttftMs: number }> {
  const client = new OpenAI({ baseURL: `${baseUrl}/v1`, apiKey: 'unused', maxRetries: 0 });
  const prompt = 'Explain how a prefill engine hands its KV cache to a decode engine, in a few words.';
  const start = performance.now();
  let ttftMs = -1;
  if (kind === 'completion') {
    if (!stream) {
      const r = await client.completions.create({ model: MODEL, prompt, max_tokens: 12, seed: 3 });
      return { text: r.choices[0].text, finish: r.choices[0].finish_reason, ttftMs: performance.now() - start };
    }
    let text = '';
    let finish: string | null = null;
    for await (const chunk of await client.completions.create({ model: MODEL, prompt, max_tokens: 12, seed: 3, stream: true })) {
      if (ttftMs < 0) ttftMs = performance.now() - start;
      text += chunk.choices[0]?.text ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    return { text, finish, ttftMs };
  }
  const messages = [{ role: 'user' as const, content: prompt }];
  if (!stream) {
    const r = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 12, seed: 3 });
    return { text: r.choices[0].message.content ?? '', finish: r.choices[0].finish_reason, ttftMs: performance.now() - start };
  }
  let text = '';
  let finish: string | null = null;
  for await (const chunk of await client.chat.completions.create({ model: MODEL, messages, max_tokens: 12, seed: 3, stream: true })) {
    if (ttftMs < 0 && chunk.choices[0]?.delta?.content) ttftMs = performance.now() - start;
    text += chunk.choices[0]?.delta?.content ?? '';
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  return { text, finish, ttftMs };
}

const CASES = [
  ['completion', false],
  ['completion', true],
  ['chat', false],
  ['chat', true],
] as const;

describe('mocker prefill + decode engines behind mocker pd-proxy', () => {
  it('answer the openai client exactly as an aggregated mocker with the same seed (stream and not, chat and completions); both end with zero active blocks', async () => {
    const pd = await pdPair();
    const agg = await serve({});
    for (const [kind, stream] of CASES) {
      const viaPd = await ask(pd.proxy, kind, stream);
      const direct = await ask(agg.url, kind, stream);
      expect(viaPd.text, `${kind} stream=${stream}`).toBe(direct.text);
      expect(viaPd.text.length).toBeGreaterThan(0);
      expect(viaPd.finish).toBe(direct.finish);
    }
    expect(await activeBlocks(pd.prefill)).toBe(0);
    expect(await activeBlocks(pd.decode)).toBe(0);
    // The prefill engine computed every prompt; the decode engine pulled them and charged no prefill compute.
    expect((await engineState(pd.prefill)).ranks[0].prefillMs).toBeGreaterThan(0);
    expect((await engineState(pd.decode)).ranks[0].prefillMs).toBe(0);
    expect(await counter(pd.decode, 'mocker_kv_pulls_total')).toBe(CASES.length);
  });

  it('TTFT includes the transfer: prompt tokens × --kv-bytes-per-token ÷ --kv-transfer-bandwidth', async () => {
    // 1 MB per token over 1 GB/s: 1 ms per prompt token; no compute time (--timing none). The same pair without
    // a transfer delay is the baseline.
    const slow = await pdPair({ timing: 'none', kvBytesPerToken: 1_000_000, kvTransferBandwidthGBps: 1 });
    const instant = await pdPair({ timing: 'none', kvTransferBandwidthGBps: 0 });
    let nextPrompt = 2000;
    const ttft = async (url: string, promptTokens: number) => {
      // A fresh prompt each time: a prefix-cache hit on the decode side would shorten the transfer.
      const prompt = Array.from({ length: promptTokens }, (_, k) => nextPrompt + k);
      nextPrompt += promptTokens;
      const start = performance.now();
      const res = await fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, prompt, max_tokens: 2, stream: true }),
      });
      const reader = res.body!.getReader();
      await reader.read();
      const first = performance.now() - start;
      while (!(await reader.read()).done);
      return first;
    };
    await ttft(instant.proxy, 300);
    await ttft(slow.proxy, 300);
    const slow300: number[] = [];
    const slow600: number[] = [];
    const instant300: number[] = [];
    for (let i = 0; i < 3; i++) {
      slow300.push(await ttft(slow.proxy, 300));
      slow600.push(await ttft(slow.proxy, 600));
      instant300.push(await ttft(instant.proxy, 300));
    }
    // The client waits for the whole transfer...
    expect(median(slow300)).toBeGreaterThanOrEqual(300);
    expect(median(slow600)).toBeGreaterThanOrEqual(600);
    // ...which grows by 1 ms per prompt token...
    expect(median(slow600) - median(slow300)).toBeGreaterThan(300 - 5);
    expect(median(slow600) - median(slow300)).toBeLessThan(300 + 15);
    // ...and adds nothing beyond it (the decode engine's pull call to the prefill engine falls inside the transfer).
    expect(median(slow300) - median(instant300)).toBeLessThan(300 + 15);
  });
});

describe("vLLM's toy-proxy request sequence, sent directly", () => {
  it('prefill answers with kv_transfer_params and holds the blocks; decode pulls them (same X-Request-Id) and the hold is gone', async () => {
    const { prefill, decode } = await pdPair({ timing: 'none' });
    const requestId = crypto.randomUUID();
    const original = { model: MODEL, prompt: Array.from({ length: 40 }, (_, i) => 500 + i), max_tokens: 6, stream: false, min_tokens: 2 };
    const toPrefill = {
      ...original,
      kv_transfer_params: {
        do_remote_decode: true,
        do_remote_prefill: false,
        remote_engine_id: null,
        remote_block_ids: null,
        remote_host: null,
        remote_port: null,
      },
      stream: false,
      max_tokens: 1,
    } as Record<string, unknown>;
    delete toPrefill.min_tokens;
    const headers = { 'content-type': 'application/json', 'X-Request-Id': requestId };
    const p = await fetch(`${prefill}/v1/completions`, { method: 'POST', headers, body: JSON.stringify(toPrefill) });
    expect(p.status).toBe(200);
    const pJson = (await p.json()) as {
      id: string;
      choices: { finish_reason: string }[];
      usage: { completion_tokens: number };
      kv_transfer_params: Record<string, unknown>;
    };
    expect(pJson.id).toBe(`cmpl-${requestId}`);
    expect(pJson.choices[0].finish_reason).toBe('length');
    expect(pJson.usage.completion_tokens).toBe(1);
    const kv = pJson.kv_transfer_params;
    expect(Object.keys(kv)).toEqual([
      'do_remote_prefill',
      'do_remote_decode',
      'remote_block_ids',
      'remote_engine_id',
      'remote_request_id',
      'remote_host',
      'remote_port',
      'tp_size',
    ]);
    expect(kv).toMatchObject({
      do_remote_prefill: true,
      do_remote_decode: false,
      remote_host: '127.0.0.1',
      remote_port: Number(new URL(prefill).port),
      tp_size: 1,
    });
    // 40 prompt tokens + the sampled one in blocks of 16: 3 blocks held.
    expect(kv.remote_block_ids).toHaveLength(3);
    expect(typeof kv.remote_engine_id).toBe('string');
    expect(typeof kv.remote_request_id).toBe('string');
    expect(await activeBlocks(prefill)).toBe(3);

    const d = await fetch(`${decode}/v1/completions`, { method: 'POST', headers, body: JSON.stringify({ ...original, kv_transfer_params: kv }) });
    expect(d.status).toBe(200);
    const dJson = (await d.json()) as { id: string; usage: { completion_tokens: number }; kv_transfer_params: unknown };
    expect(dJson.id).toBe(`cmpl-${requestId}`);
    expect(dJson.usage.completion_tokens).toBe(6);
    expect(dJson.kv_transfer_params).toBeNull();
    expect(await activeBlocks(prefill)).toBe(0);
    expect(await activeBlocks(decode)).toBe(0);
    // A second pull of the same hold finds nothing.
    const again = await fetch(`${decode}/v1/completions`, { method: 'POST', headers, body: JSON.stringify({ ...original, kv_transfer_params: kv }) });
    expect(again.status).toBe(200);
    expect(await counter(decode, 'mocker_kv_pull_failures_total', 'unknown_blocks')).toBe(1);
  });

  it('a prefill that ends other than by length answers kv_transfer_params null and holds nothing', async () => {
    const { url: prefill } = await serve({ role: 'prefill', timing: 'none' });
    const body = {
      model: MODEL,
      prompt: Array.from({ length: 40 }, (_, i) => 600 + i),
      max_tokens: 1,
      seed: 9,
      kv_transfer_params: { do_remote_decode: true },
    };
    const post = async (extra: Record<string, unknown>) =>
      (await (
        await fetch(`${prefill}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ ...body, ...extra, return_token_ids: true }),
        })
      ).json()) as {
        choices: { finish_reason: string; token_ids: number[] }[];
        kv_transfer_params: unknown;
      };
    // The same seed samples the same token: asked to stop on it, the request ends by stop.
    const first = await post({});
    expect(first.choices[0].finish_reason).toBe('length');
    expect(first.kv_transfer_params).not.toBeNull();
    const held = await activeBlocks(prefill);
    const stopped = await post({ stop_token_ids: first.choices[0].token_ids });
    expect(stopped.choices[0].finish_reason).toBe('stop');
    expect(stopped.kv_transfer_params).toBeNull();
    expect(await activeBlocks(prefill)).toBe(held);
  });

  it('a client that leaves during the prefill hop: no decode hop is sent, nothing stays held', async () => {
    // One 800 ms engine step on the prefill side: the client is gone long before it ends.
    const prefill = await serve({ role: 'prefill', timing: 'fixed', forwardTimeMs: 800 });
    const decode = await serve({ role: 'decode', timing: 'none', kvTransferAllowedHosts: [peerOf(prefill.url)] });
    const proxy = await pdProxyInProcess({ prefill: [prefill.url], decode: [decode.url] });
    running.push(proxy);
    const leave = new AbortController();
    const sent = fetch(`http://127.0.0.1:${proxy.port}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      signal: leave.signal,
      body: JSON.stringify({ model: MODEL, prompt: Array.from({ length: 40 }, (_, i) => 700 + i), max_tokens: 4, stream: true }),
    });
    // The client leaves once the prefill engine's step has begun (not after a fixed sleep: on a busy machine the
    // request could still be waiting, and would then end as aborted).
    for (let i = 0; i < 100 && (await engineState(prefill.url)).ranks[0].passes === 0; i++) await sleep(10);
    leave.abort();
    await expect(sent).rejects.toThrow();
    await sleep(1000);
    // The prefill engine saw the request end once (its step had already computed it, as vLLM's step would).
    const ended = parsePrometheusTextFormat(await (await fetch(`${prefill.url}/metrics`)).text())
      .find((f) => f.name === 'vllm:request_success_total')!
      .metrics.reduce((n, m) => n + Number(m.value), 0);
    expect(ended).toBe(1);
    expect(await activeBlocks(prefill.url)).toBe(0);
    expect((await engineState(decode.url)).ranks[0].passes).toBe(0);
    expect(await (await fetch(`http://127.0.0.1:${proxy.port}/healthcheck`)).json()).toMatchObject({ status: 'ok' });
  });

  it('a decode hop the decode engine refuses: the prefill engine is told to free its hold at once (no 480 s wait)', async () => {
    const { prefill, proxy } = await pdPair({ timing: 'none' });
    // The prefill hop asks for one token and drops min_tokens, so it is served; the decode engine gets the
    // client's body, where min_tokens > max_tokens is vLLM's 400.
    const res = await fetch(`${proxy}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, prompt: Array.from({ length: 40 }, (_, i) => 700 + i), max_tokens: 4, min_tokens: 10 }),
    });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: { type: string } }).error.type).toBe('BadRequestError');
    expect((await engineState(prefill)).ranks[0].passes).toBeGreaterThan(0);
    for (let i = 0; i < 50 && (await activeBlocks(prefill)) > 0; i++) await sleep(20);
    expect(await activeBlocks(prefill)).toBe(0);
  });

  it("a body nested deeper than JSON.stringify can write back is a 400 in vLLM's format, not a 502 or a 500, and leaves nothing held", async () => {
    const { prefill, proxy } = await pdPair({ timing: 'none' });
    const deep = `${'['.repeat(100_000)}${']'.repeat(100_000)}`;
    // In a field the prefill hop keeps, and in one it drops (stream: the decode hop alone gets it).
    for (const field of ['user', 'stream']) {
      const res = await fetch(`${proxy}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: `{"model":"${MODEL}","prompt":"Hi","max_tokens":2,"${field}":${deep}}`,
      });
      expect(res.status, field).toBe(400);
      const { error } = (await res.json()) as { error: { code: number; message: string; param: unknown } };
      expect(error.code).toBe(400);
      expect(error.message.length).toBeGreaterThan(0);
      expect(error).toHaveProperty('param');
    }
    for (let i = 0; i < 50 && (await activeBlocks(prefill)) > 0; i++) await sleep(20);
    expect(await activeBlocks(prefill)).toBe(0);
  });

  it("passes the client's bytes on to the decode engine: n = -1e999 (not a JSON number JavaScript can write back) is a 400, not n = null", async () => {
    const { proxy } = await pdPair({ timing: 'none' });
    const res = await fetch(`${proxy}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: `{"model":"${MODEL}","prompt":"Hi","max_tokens":2,"n":-1e999}`,
    });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: { code: number } }).error.code).toBe(400);
  });

  it('a prefill engine holds ceil(prompt / block size) blocks: the sampled token has no KV (as vLLM)', async () => {
    const { url: prefill } = await serve({ role: 'prefill', timing: 'none' });
    for (const [promptTokens, blocks] of [
      [32, 2],
      [33, 3],
      [47, 3],
      [48, 3],
    ]) {
      const res = await fetch(`${prefill}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          model: MODEL,
          prompt: Array.from({ length: promptTokens }, (_, i) => 1000 * promptTokens + i),
          max_tokens: 1,
          kv_transfer_params: { do_remote_decode: true },
        }),
      });
      const kv = ((await res.json()) as { kv_transfer_params: { remote_block_ids: number[] } }).kv_transfer_params;
      expect(kv.remote_block_ids, `${promptTokens} prompt tokens`).toHaveLength(blocks);
    }
    expect(await activeBlocks(prefill)).toBe(2 + 3 + 3 + 3);
  });

  it('pd-proxy /healthcheck reports the instances', async () => {
    const { proxy } = await pdPair({ timing: 'none' });
    expect(await (await fetch(`${proxy}/healthcheck`)).json()).toEqual({ status: 'ok', prefill_instances: 1, decode_instances: 1 });
  });
});

describe('kv_bytes_per_token', () => {
  it('is layers × 2 × KV heads × head dim × dtype bytes (engine-reference §5.2)', () => {
    // Qwen3-0.6B: 28 layers, 8 KV heads of 128, bfloat16.
    const qwen3 = { num_hidden_layers: 28, num_attention_heads: 16, num_key_value_heads: 8, head_dim: 128, hidden_size: 1024, torch_dtype: 'bfloat16' };
    expect(kvBytesPerToken(qwen3, 'auto')).toBe(28 * 2 * 8 * 128 * 2);
    expect(kvBytesPerToken(qwen3, 'fp8')).toBe(28 * 2 * 8 * 128);
    expect(kvBytesPerToken({ ...qwen3, torch_dtype: 'float32' }, 'auto')).toBe(28 * 2 * 8 * 128 * 4);
    // No head_dim: hidden_size ÷ attention heads; no KV heads: the attention heads (MHA).
    expect(kvBytesPerToken({ num_hidden_layers: 32, num_attention_heads: 32, hidden_size: 4096, torch_dtype: 'float16' }, 'auto')).toBe(32 * 2 * 32 * 128 * 2);
    expect(kvBytesPerToken({ max_position_embeddings: 4096 }, 'auto')).toBeNull();
  });
});

describe('failed pulls fall back to local recompute, counted', () => {
  it('unknown remote blocks, and a prefill engine that is down', async () => {
    // A prefill engine that never held this request.
    const { url: prefill } = await serve({ role: 'prefill', timing: 'none' });
    const [closedPort] = await freePorts(1);
    const { url: decode } = await serve({ role: 'decode', timing: 'model', kvTransferAllowedHosts: [peerOf(prefill), `127.0.0.1:${closedPort}`] });
    const send = async (prefillPort: number) => {
      const res = await completeWithRemoteKv(decode, prefillPort, { promptFrom: 900, maxTokens: 4 });
      return { status: res.status, json: (await res.json()) as { usage: { completion_tokens: number } } };
    };
    const unknown = await send(Number(new URL(prefill).port));
    expect(unknown.status).toBe(200);
    expect(unknown.json.usage.completion_tokens).toBe(4);
    const down = await send(closedPort);
    expect(down.status).toBe(200);
    expect(down.json.usage.completion_tokens).toBe(4);
    expect(await counter(decode, 'mocker_kv_pull_failures_total', 'unknown_blocks')).toBe(1);
    expect(await counter(decode, 'mocker_kv_pull_failures_total', 'unreachable')).toBe(1);
    expect(await counter(decode, 'mocker_kv_pulls_total')).toBe(0);
    // Recomputed here: prefill compute is charged.
    expect((await engineState(decode)).ranks[0].prefillMs).toBeGreaterThan(0);
  });
});

describe('a pull whose answer breaks off', () => {
  it('mid-body (the prefill engine died while answering): recomputed locally, counted unreachable', async () => {
    // It promises a body and dies after a few bytes of it.
    const dying = await pullEndpoint((req, res) => {
      req.resume();
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': '100' });
      res.write('{"remote_', () => res.destroy());
    });
    const { url: decode } = await serve({ role: 'decode', timing: 'model', kvTransferAllowedHosts: [`127.0.0.1:${dying.port}`] });
    try {
      const res = await completeWithRemoteKv(decode, dying.port, { promptFrom: 700, maxTokens: 4 });
      expect(res.status).toBe(200);
      expect(((await res.json()) as { usage: { completion_tokens: number } }).usage.completion_tokens).toBe(4);
      expect(await counter(decode, 'mocker_kv_pull_failures_total', 'unreachable')).toBe(1);
      expect(await counter(decode, 'mocker_kv_pulls_total')).toBe(0);
      expect((await engineState(decode)).ranks[0].prefillMs).toBeGreaterThan(0);
    } finally {
      await dying.close();
    }
  });
});

describe('a client that leaves while its KV is pulled', () => {
  it('never reaches the decode engine: no tokens generated, nothing counted as finished', async () => {
    let pulled!: () => void;
    const pullArrived = new Promise<void>((resolve) => (pulled = resolve));
    // Slow to answer, and then not holding the blocks: the decode side would recompute.
    const slow = await pullEndpoint((req, res) => {
      req.resume();
      pulled();
      setTimeout(() => res.writeHead(404, { 'content-type': 'application/json' }).end('{"error":{"message":"unknown request"}}'), 300);
    });
    const { url: decode } = await serve({ role: 'decode', timing: 'model', kvTransferAllowedHosts: [`127.0.0.1:${slow.port}`] });
    try {
      const client = new AbortController();
      const answer = completeWithRemoteKv(decode, slow.port, { promptFrom: 500, maxTokens: 20, signal: client.signal }).catch(() => null);
      await pullArrived;
      client.abort();
      await answer;
      // The pull's answer comes 300 ms later; a request that ran anyway would have finished within this wait.
      await sleep(1500);
      expect(await counter(decode, 'mocker_kv_pull_failures_total', 'unknown_blocks')).toBe(1);
      expect(await counter(decode, 'vllm:generation_tokens_total')).toBe(0);
      expect(await activeBlocks(decode)).toBe(0);
    } finally {
      await slow.close();
    }
  });
});

describe('the prefill side releases held blocks', () => {
  it('after VLLM_NIXL_ABORT_REQUEST_TIMEOUT when no decode comes; a late pull then recomputes', async () => {
    const { url: prefill } = await serve({ role: 'prefill', timing: 'none', kvHoldTimeoutMs: 300 });
    const { url: decode } = await serve({ role: 'decode', timing: 'none', kvTransferAllowedHosts: [peerOf(prefill)] });
    const body = { model: MODEL, prompt: Array.from({ length: 20 }, (_, i) => 300 + i), max_tokens: 1, kv_transfer_params: { do_remote_decode: true } };
    const res = await fetch(`${prefill}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    const kv = ((await res.json()) as { kv_transfer_params: Record<string, unknown> }).kv_transfer_params;
    expect(await activeBlocks(prefill)).toBe(2);
    await sleep(600);
    expect(await activeBlocks(prefill)).toBe(0);
    const late = await fetch(`${decode}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ ...body, max_tokens: 3, kv_transfer_params: kv }),
    });
    expect(late.status).toBe(200);
    expect(await counter(decode, 'mocker_kv_pull_failures_total', 'unknown_blocks')).toBe(1);
  });
});

describe('VLLM_NIXL_ABORT_REQUEST_TIMEOUT', () => {
  it('must be a number of seconds setTimeout can wait: anything else is refused at start, naming the variable', async () => {
    const before = process.env.VLLM_NIXL_ABORT_REQUEST_TIMEOUT;
    try {
      for (const bad of ['soon', '-1', '0', '3000000']) {
        process.env.VLLM_NIXL_ABORT_REQUEST_TIMEOUT = bad;
        await expect(serveInProcess({ ...BASE, role: 'prefill' }), bad).rejects.toThrow(/VLLM_NIXL_ABORT_REQUEST_TIMEOUT/);
      }
      process.env.VLLM_NIXL_ABORT_REQUEST_TIMEOUT = '30';
      await serve({ role: 'prefill' });
    } finally {
      if (before === undefined) delete process.env.VLLM_NIXL_ABORT_REQUEST_TIMEOUT;
      else process.env.VLLM_NIXL_ABORT_REQUEST_TIMEOUT = before;
    }
  });
});

describe('mocker serve --pd', () => {
  const mockers = mockerProcesses();
  afterEach(mockers.stopAll);

  it('`serve --pd 2P2D` (CLI) answers like separate prefill and decode processes behind `mocker pd-proxy`', async () => {
    const common = ['--mode', 'simulate', '--captures', ':memory:', '--timing', 'none', '--seed', '5', '--block-size', '16'];
    const [onePort, proxyPort] = await freePorts(2);
    const spawnCli = async (args: string[], port = 0) => (await mockers.start(args, { port })).url;
    const onePortUrl = await spawnCli(['serve', '--pd', '2P2D', ...common], onePort);
    const prefill = await spawnCli(['serve', '--disaggregation-mode', 'prefill', ...common]);
    const decode = await spawnCli(['serve', '--is-decode-worker', '--kv-transfer-allowed-hosts', peerOf(prefill), ...common]);
    const proxy = await spawnCli(['pd-proxy', '--prefill', prefill, '--decode', decode], proxyPort);
    expect(await (await fetch(`${onePortUrl}/healthcheck`)).json()).toEqual({ status: 'ok', prefill_instances: 2, decode_instances: 2 });
    for (const [kind, stream] of CASES) {
      const inOne = await ask(onePortUrl, kind, stream);
      expect(inOne.text.length).toBeGreaterThan(0);
      expect(inOne.text, `${kind} stream=${stream}`).toBe((await ask(proxy, kind, stream)).text);
    }
    expect(await counter(decode, 'mocker_kv_pulls_total')).toBe(CASES.length);
  });

  it('1P1D with one --kv-events-config: each engine publishes on its own port (engine i on port + i), the same vLLM hashes', async () => {
    // Engine i publishes on pubPort + i: one run of free ports for both engines and the proxy.
    const pubPort = await freePortRun(3);
    const port = pubPort + 2;
    const kvEvents = [{ endpoint: `tcp://*:${pubPort}`, replayEndpoint: null, topic: '', bufferSteps: 10_000, hwm: 100_000, format: 'array' as const }];
    const deployment = await pdDeploymentInProcess({ ...BASE, timing: 'none', host: '127.0.0.1', port, kvEvents }, { prefill: 1, decode: 1 });
    running.push(deployment);
    const subscribers = [await EventSubscriber.connect(`tcp://127.0.0.1:${pubPort}`), await EventSubscriber.connect(`tcp://127.0.0.1:${pubPort + 1}`)];
    try {
      const res = await fetch(`http://127.0.0.1:${deployment.port}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, prompt: Array.from({ length: 40 }, (_, i) => 4000 + i), max_tokens: 2 }),
      });
      expect(res.status).toBe(200);
      await res.json();
      // Both engines cached the prompt's two full blocks of 16 (the prefill computed them, the decode pulled them).
      const storedHashes = async (sub: EventSubscriber) =>
        (await sub.settle()).flatMap((b) =>
          (b.payload[1] as unknown[][]).filter((e) => e[0] === 'BlockStored').flatMap((e) => (e[1] as (number | bigint)[]).map(String)),
        );
      const [prefillHashes, decodeHashes] = [await storedHashes(subscribers[0]), await storedHashes(subscribers[1])];
      expect(prefillHashes.slice(0, 2)).toHaveLength(2);
      expect(decodeHashes.slice(0, 2)).toEqual(prefillHashes.slice(0, 2));
    } finally {
      subscribers.forEach((s) => s.close());
    }
  });

  it('2P2D answers like the separate engines behind pd-proxy, and round-robins both roles', async () => {
    const [port] = await freePorts(1);
    const deployment = await pdDeploymentInProcess({ ...BASE, host: '127.0.0.1', port }, { prefill: 2, decode: 2 });
    running.push(deployment);
    const url = `http://127.0.0.1:${deployment.port}`;
    expect(await (await fetch(`${url}/healthcheck`)).json()).toEqual({ status: 'ok', prefill_instances: 2, decode_instances: 2 });
    const separate = await pdPair();
    for (const [kind, stream] of CASES) {
      const inProcess = await ask(url, kind, stream);
      expect(inProcess.text, `${kind} stream=${stream}`).toBe((await ask(separate.proxy, kind, stream)).text);
    }
    // Four requests over two engines per role: each engine served two.
    const engines = deployment.ports!.map((p) => `http://127.0.0.1:${p}`);
    const served = await Promise.all(engines.map(async (e) => (await engineState(e)).ranks[0].passes > 0));
    expect(served).toEqual([true, true, true, true]);
    for (const engine of engines) expect(await activeBlocks(engine)).toBe(0);
  });
});
