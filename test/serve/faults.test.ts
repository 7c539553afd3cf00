/**
 * Failure injection as a user launches it (`mocker serve --error-rate … --error-types …`, the `X-Mocker-Error`
 * header, `/mocker/config`), through the built CLI. Oracles: the `openai` client's error classes and the bodies
 * OpenAI documents for 401 / 429, vLLM's error format and in-stream error event (vllm-wire-reference.md §1.6),
 * and counts computed by hand.
 */
import OpenAI from 'openai';
import parsePrometheusTextFormat from 'parse-prometheus-text-format';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { mockerProcesses, type MockerProcess } from '../support/mockerProcess.js';

type Json = Record<string, unknown>;

/** The user's environment without the variables that stand in for flags. */
const ENV = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^(VLLM_|DYN_MOCKER_|PYTHONHASHSEED$)/.test(k)));

const SERVE = ['serve', '--mode', 'random', '--served-model-name', 'm'];

const client = (url: string, options: ConstructorParameters<typeof OpenAI>[0] = {}) =>
  new OpenAI({ baseURL: `${url}/v1`, apiKey: 'sk-test-key-123456', maxRetries: 0, ...options });

/** A completion sent by hand: its status, headers and text. */
async function complete(url: string, body: Json, headers: Record<string, string> = {}) {
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'm', ...body }),
  });
  return { status: res.status, headers: res.headers, text: await res.text() };
}

async function metric(url: string, name: string): Promise<{ labels: Record<string, string>; value: number }[]> {
  const families = parsePrometheusTextFormat(await (await fetch(`${url}/metrics`)).text());
  return (families.find((f) => f.name === name)?.metrics ?? []).map((m) => ({ labels: m.labels ?? {}, value: Number(m.value) }));
}
const injected = async (url: string, type: string) => (await metric(url, 'mocker_injected_errors_total')).find((s) => s.labels.type === type)?.value;
const successes = async (url: string, reason: string) =>
  (await metric(url, 'vllm:request_success_total')).find((s) => s.labels.finished_reason === reason)?.value;

const engineRank = async (url: string) => ((await (await fetch(`${url}/mocker/engine`)).json()) as { ranks: Json[] }).ranks[0];

/** Ordinary Qwen3 token ids (no special tokens). */
const tokens = (n: number) => Array.from({ length: n }, (_, i) => 1000 + ((i * 7) % 20_000));

/** SSE `data:` payloads of a stream's text. */
const events = (text: string) =>
  text
    .split('\n\n')
    .filter((e) => e.startsWith('data: '))
    .map((e) => e.slice('data: '.length));
/** Output tokens carried by a stream's chunks (`return_token_ids`). */
const streamedTokens = (text: string) =>
  events(text)
    .filter((e) => e.startsWith('{"id"'))
    .reduce((n, e) => n + ((JSON.parse(e) as { choices: { token_ids: number[] | null }[] }).choices[0].token_ids ?? []).length, 0);

const perTest = mockerProcesses();
afterEach(perTest.stopAll);

describe('each error type: the status, headers and body of the server that sends it', () => {
  const mockers = mockerProcesses();
  afterAll(mockers.stopAll);
  let server: MockerProcess;
  beforeAll(
    async () => void (server = await mockers.start([...SERVE, '--timing', 'none', '--max-model-len', '1000', '--enable-control-routes'], { env: ENV })),
  );

  /** The type forced by X-Mocker-Error, as the openai client reports it. */
  const failure = (type: string) =>
    client(server.url)
      .completions.create({ model: 'm', prompt: 'Hello', max_tokens: 2 }, { headers: { 'X-Mocker-Error': type } })
      .then(
        () => null,
        (err: unknown) => err as InstanceType<typeof OpenAI.APIError>,
      );

  it("rate_limit: 429 with Retry-After, OpenAI's body (RateLimitError)", async () => {
    const err = await failure('rate_limit');
    expect(err).toBeInstanceOf(OpenAI.RateLimitError);
    expect(err!.status).toBe(429);
    expect(err!.headers?.get('retry-after')).toBe('1');
    expect(err!.error).toMatchObject({
      type: 'requests',
      code: 'rate_limit_exceeded',
      param: null,
      message: expect.stringContaining('Rate limit reached for m'),
    });
  });

  it("invalid_api_key: 401, OpenAI's body (AuthenticationError), the key masked", async () => {
    const err = await failure('invalid_api_key');
    expect(err).toBeInstanceOf(OpenAI.AuthenticationError);
    expect(err!.error).toMatchObject({ type: 'invalid_request_error', code: 'invalid_api_key', param: null });
    const message = (err!.error as Json).message as string;
    expect(message).toMatch(/^Incorrect API key provided: sk-\*+3456\./);
    expect(message).not.toContain('sk-test-key-123456');
  });

  it("context_length: 400, vLLM's message with --max-model-len (BadRequestError)", async () => {
    const err = await failure('context_length');
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect(err!.error).toMatchObject({
      type: 'BadRequestError',
      code: 400,
      message: expect.stringMatching(/^This model's maximum context length is 1000 tokens\. However, your request has \d+ input tokens\./),
    });
  });

  it("server_error: 500 InternalServerError; invalid_request: 400; timeout: 504 (a gateway's)", async () => {
    const server500 = await failure('server_error');
    expect(server500).toBeInstanceOf(OpenAI.InternalServerError);
    expect(server500!.error).toMatchObject({ type: 'InternalServerError', code: 500, param: null });
    const invalid = await failure('invalid_request');
    expect(invalid).toBeInstanceOf(OpenAI.BadRequestError);
    expect(invalid!.error).toMatchObject({ type: 'BadRequestError', code: 400 });
    const timeout = await failure('timeout');
    expect(timeout).toBeInstanceOf(OpenAI.InternalServerError);
    expect(timeout!.status).toBe(504);
    expect(timeout!.error).toMatchObject({ type: 'Gateway Timeout', code: 504 });
  });

  it("model_not_found: 404, vLLM's message naming the model (NotFoundError)", async () => {
    const err = await failure('model_not_found');
    expect(err).toBeInstanceOf(OpenAI.NotFoundError);
    expect(err!.error).toEqual({ message: 'The model `m` does not exist.', type: 'NotFoundError', param: 'model', code: 404 });
  });

  it('every immediate failure: a JSON body {"error":{message,type,param,code}} and X-Mocker-Injected-Error; an unknown type is a 400 naming the header', async () => {
    for (const type of ['rate_limit', 'invalid_api_key', 'context_length', 'server_error', 'invalid_request', 'model_not_found', 'timeout']) {
      const res = await complete(server.url, { prompt: 'Hello', max_tokens: 2 }, { 'x-mocker-error': type });
      expect(res.headers.get('content-type')).toBe('application/json');
      expect(res.headers.get('x-mocker-injected-error')).toBe(type);
      expect(Object.keys((JSON.parse(res.text) as { error: Json }).error).sort()).toEqual(['code', 'message', 'param', 'type']);
    }
    const unknown = await complete(server.url, { prompt: 'Hello', max_tokens: 2 }, { 'x-mocker-error': 'meltdown' });
    expect(unknown.status).toBe(400);
    expect(unknown.text).toContain('X-Mocker-Error');
    // A request without the header is served.
    expect((await complete(server.url, { prompt: 'Hello', max_tokens: 2 })).status).toBe(200);
    // Immediate failures never reached the engine: vLLM counts none of them.
    const finished = await metric(server.url, 'vllm:request_success_total');
    expect(finished.reduce((n, s) => n + s.value, 0)).toBe(1);
    expect(await injected(server.url, 'rate_limit')).toBe(2);
  });

  it('POST /mocker/config changes the rate and the types at run time; GET shows them; a bad value changes nothing', async () => {
    const post = (body: unknown) => fetch(`${server.url}/mocker/config`, { method: 'POST', body: JSON.stringify(body) });
    expect((await complete(server.url, { prompt: 'Hello', max_tokens: 1 })).status).toBe(200);
    expect((await post({ error_rate: 100 })).status).toBe(200);
    // The default type: AIPerf's 500.
    expect((await complete(server.url, { prompt: 'Hello', max_tokens: 1 })).status).toBe(500);
    expect((await post({ error_types: ['timeout'] })).status).toBe(200);
    expect((await complete(server.url, { prompt: 'Hello', max_tokens: 1 })).status).toBe(504);
    for (const [body, param] of [
      [{ error_rate: 101 }, 'error_rate'],
      [{ error_types: ['bogus'] }, 'error_types'],
      [{ fail_first: -1 }, 'fail_first'],
      [{ ttft: 5 }, 'ttft'],
      [{ error_rate: 0, colour: 'red' }, 'colour'],
    ] as const) {
      const res = await post(body);
      expect(res.status, JSON.stringify(body)).toBe(400);
      expect(((await res.json()) as { error: Json }).error).toMatchObject({ type: 'BadRequestError', param });
    }
    const shown = (await (await fetch(`${server.url}/mocker/config`)).json()) as Json;
    expect(shown).toMatchObject({ error_rate: 100, error_types: ['timeout'], fail_first: 0, timing: 'none', ttft: null, itl: null });
    expect((await post({ error_rate: 0 })).status).toBe(200);
    expect((await complete(server.url, { prompt: 'Hello', max_tokens: 1 })).status).toBe(200);
  });
});

describe('--error-rate 10 --random-seed 42', () => {
  const REQUESTS = 2000;

  /** Sends the requests one after another; the indices of those that failed (all 500s: the default type). */
  async function failedRequests(): Promise<{ failed: number[]; url: string }> {
    const { url } = await perTest.start([...SERVE, '--timing', 'none', '--error-rate', '10', '--random-seed', '42'], { env: ENV });
    const failed: number[] = [];
    for (let i = 0; i < REQUESTS; i++) {
      const res = await complete(url, { prompt: tokens(4), max_tokens: 1 });
      if (res.status !== 200) {
        expect(res.status).toBe(500);
        failed.push(i);
      }
    }
    return { failed, url };
  }

  it('fails the same ≈10 % of 2,000 requests on two separate runs; /metrics counts them as vLLM and mocker would', async () => {
    const first = await failedRequests();
    expect(first.failed.length).toBeGreaterThanOrEqual(0.07 * REQUESTS);
    expect(first.failed.length).toBeLessThanOrEqual(0.13 * REQUESTS);
    expect(await injected(first.url, 'server_error')).toBe(first.failed.length);
    // Only the requests that reached the engine finish in vLLM's counter.
    expect(await successes(first.url, 'length')).toBe(REQUESTS - first.failed.length);
    await perTest.stopAll();
    const second = await failedRequests();
    expect(second.failed).toEqual(first.failed);
  }, 120_000);
});

describe('--fail-first 1 --error-types rate_limit', () => {
  it('the openai client (maxRetries 1) waits for the 429 and succeeds on its retry', async () => {
    const { url } = await perTest.start([...SERVE, '--timing', 'none', '--fail-first', '1', '--error-types', 'rate_limit', '--enable-control-routes'], {
      env: ENV,
    });
    const seen: [number, string | null][] = [];
    const recording: typeof fetch = async (input, init) => {
      const res = await fetch(input, init);
      seen.push([res.status, res.headers.get('retry-after')]);
      return res;
    };
    const completion = await client(url, { maxRetries: 1, fetch: recording }).completions.create({ model: 'm', prompt: 'Hello', max_tokens: 3 });
    expect(completion.usage?.completion_tokens).toBe(3);
    expect(seen).toEqual([
      [429, '1'],
      [200, null],
    ]);
    // Only the first request failed.
    expect((await complete(url, { prompt: 'Hello', max_tokens: 1 })).status).toBe(200);
    expect(((await (await fetch(`${url}/mocker/config`)).json()) as Json).fail_first).toBe(0);
  });
});

describe('mid-stream failures (--midstream-after-tokens 4)', () => {
  // 20 ms per step and 200 tokens: unbroken, each request would run for 4 s.
  const body = { prompt: tokens(100), max_tokens: 200, stream: true, return_token_ids: true };
  const mockers = mockerProcesses();
  afterAll(mockers.stopAll);
  let url: string;
  beforeAll(async () => {
    ({ url } = await mockers.start([...SERVE, '--timing', 'fixed', '--forward-time-ms', '20', '--block-size', '16', '--midstream-after-tokens', '4'], {
      env: ENV,
    }));
  });

  /** After `breaks` more broken requests: nothing running or waiting, no block held (cached prompt blocks are inactive, not used), each an abort to vLLM. */
  let aborted = 0;
  async function expectFreed(breaks: number) {
    expect(await engineRank(url)).toMatchObject({ running: 0, waiting: 0, activeBlocks: 0 });
    aborted += breaks;
    expect(await successes(url, 'abort')).toBe(aborted);
  }

  it("midstream: 4 tokens, then vLLM's error event and [DONE]; the request's blocks are freed", async () => {
    const res = await complete(url, body, { 'x-mocker-error': 'midstream' });
    expect(res.status).toBe(200);
    expect(res.headers.get('x-mocker-injected-error')).toBe('midstream');
    expect(streamedTokens(res.text)).toBe(4);
    const tail = events(res.text).slice(-2);
    expect(JSON.parse(tail[0])).toEqual({ error: { message: expect.any(String), type: 'InternalServerError', param: null, code: 500 } });
    // Python's json.dumps separators, as vLLM writes it.
    expect(tail[0]).toMatch(/^\{"error": \{"message": /);
    expect(tail[1]).toBe('[DONE]');
    await expectFreed(1);
    expect(await injected(url, 'midstream')).toBe(1);
  });

  it('midstream through the openai client: a chat stream throws APIError; a non-streamed request is a 500', async () => {
    const openai = client(url);
    const stream = await openai.chat.completions.create(
      { model: 'm', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 50, stream: true },
      { headers: { 'X-Mocker-Error': 'midstream' } },
    );
    let contentChunks = 0;
    await expect(
      (async () => {
        for await (const chunk of stream) if (chunk.choices[0]?.delta.role === undefined) contentChunks++;
      })(),
    ).rejects.toBeInstanceOf(OpenAI.APIError);
    expect(contentChunks).toBeGreaterThan(0);
    expect(contentChunks).toBeLessThanOrEqual(4);
    await expect(
      openai.completions.create({ model: 'm', prompt: 'Hi', max_tokens: 50 }, { headers: { 'X-Mocker-Error': 'midstream' } }),
    ).rejects.toBeInstanceOf(OpenAI.InternalServerError);
    await expectFreed(2);
  });

  it('disconnect: 4 tokens, then the connection is cut (no [DONE]); the blocks are freed', async () => {
    const res = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-mocker-error': 'disconnect' },
      body: JSON.stringify({ model: 'm', ...body }),
    });
    expect(res.status).toBe(200);
    const reader = res.body!.getReader();
    let text = '';
    const read = async () => {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) return;
        text += Buffer.from(value).toString('utf8');
      }
    };
    await expect(read()).rejects.toThrow();
    expect(streamedTokens(text)).toBe(4);
    expect(text).not.toContain('[DONE]');
    await expectFreed(1);
    expect(await injected(url, 'disconnect')).toBe(1);
  });

  it('a shorter answer breaks before its last token', async () => {
    const res = await complete(url, { ...body, max_tokens: 3 }, { 'x-mocker-error': 'midstream' });
    expect(streamedTokens(res.text)).toBe(2);
    expect(events(res.text).at(-1)).toBe('[DONE]');
    // The engine may have computed the last token already (then vLLM counts a finished request, not an abort).
    expect(await engineRank(url)).toMatchObject({ running: 0, waiting: 0, activeBlocks: 0 });
  });
});
