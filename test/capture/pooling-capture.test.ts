/**
 * Embeddings and rerank exchanges through `mocker capture` and back out of `mocker serve`: captured in front of the
 * vLLM double (whose numbers differ from mocker's synthetic ones), replayed with the double gone, keyed by route,
 * model and inputs; misses as `--on-miss` says; no secret in the file; a capture file written before pooling
 * exchanges existed still replays chat. Every mocker is the built CLI in its own process.
 */
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mockerProcesses, runMockerToExit } from '../support/mockerProcess.js';
import { oracleIdsWithSpecial } from '../support/qwen3Oracle.js';
import { testTmpdir } from '../support/tempRoot.js';
import { DOUBLE_EMBEDDING_DIMENSIONS, doubleEmbedding, encode, EOS, MODEL, promptIds, startUpstream, type Upstream } from '../support/vllmUpstream.js';

const SECRET = 'sk-pooling-secret-7Q2W';
/** Texts the tokenizer oracle knows (Python HF tokenizers' ids for Qwen3). */
const TEXTS = ['Hello world', 'Привет, мир!'];
const OTHER_TEXT = 'def f(x):\n    return x ** 2\n';
const RERANK = {
  model: MODEL,
  query: 'capital of France',
  documents: ['Berlin is the capital of Germany.', 'Paris is the capital of France.', 'Bananas are yellow.'],
};
const CHAT = { model: MODEL, messages: [{ role: 'user', content: 'Say hello' }], max_tokens: 16 };

const dir = mkdtempSync(join(testTmpdir(), 'pooling-capture-'));
const db = join(dir, 'captures.db');
const mockers = mockerProcesses();
let upstream: Upstream;
/** What the clients got through the capture proxy, by request name. */
const proxied = new Map<string, string>();

const client = (url: string) => new OpenAI({ baseURL: `${url}/v1`, apiKey: SECRET, maxRetries: 0 });
const post = (url: string, path: string, body: unknown) =>
  fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${SECRET}` }, body: JSON.stringify(body) });
const mocker = (...args: string[]) => mockers.start(args);
/** What vLLM regenerates per request: the top-level id (and created where the answer has one). */
const normalize = (text: string) => text.replace(/^\{"id":"[^"]*"(,"object":"[^"]*","created":\d+)?/, '{"id":"X"');
const doubleVectors = (texts: string[], dimensions = DOUBLE_EMBEDDING_DIMENSIONS) => texts.map((t) => doubleEmbedding(oracleIdsWithSpecial(t), dimensions));

beforeAll(async () => {
  upstream = await startUpstream(() => ({ content: 'Hello from the double.' }));
  const capture = await mocker('capture', '--upstream', upstream.url, '--captures', db);
  const embeddings = client(capture.url).embeddings;
  // The openai client's two encodings: float, and base64 (its default, decoded by the client).
  const float = await embeddings.create({ model: MODEL, input: TEXTS, encoding_format: 'float' });
  const base64 = await embeddings.create({ model: MODEL, input: TEXTS });
  expect(float.data.map((d) => d.embedding)).toEqual(doubleVectors(TEXTS));
  expect(base64.data.map((d) => d.embedding)).toEqual(doubleVectors(TEXTS));
  for (const [name, path, body] of [
    ['embeddings', '/v1/embeddings', { model: MODEL, input: TEXTS, dimensions: 8 }],
    ['rerank', '/rerank', RERANK],
    ['v1 rerank', '/v1/rerank', { ...RERANK, top_n: 2 }],
    ['v2 rerank', '/v2/rerank', RERANK],
    ['chat', '/v1/chat/completions', CHAT],
  ] as const) {
    const res = await post(capture.url, path, body);
    expect(res.status, name).toBe(200);
    proxied.set(name, await res.text());
  }
  // SIGTERM: the capture closes its file self-contained.
  await capture.stop();
}, 60_000);

afterAll(async () => {
  await mockers.stopAll();
  await upstream?.close();
});

describe('capture of embeddings and rerank exchanges', () => {
  it('forwards them byte for byte: the double answers in vLLM shapes with its own numbers', () => {
    const embeddings = JSON.parse(proxied.get('embeddings')!) as { id: string; data: { embedding: number[] }[]; usage: unknown };
    expect(embeddings.id).toMatch(/^embd-[0-9a-f]{32}$/);
    expect(embeddings.data.map((d) => d.embedding)).toEqual(doubleVectors(TEXTS, 8));
    const tokens = TEXTS.reduce((n, t) => n + oracleIdsWithSpecial(t).length, 0);
    expect(embeddings.usage).toEqual({ prompt_tokens: tokens, total_tokens: tokens, completion_tokens: 0, prompt_tokens_details: null });
    const rerank = JSON.parse(proxied.get('v1 rerank')!) as { id: string; results: { index: number; document: { text: string }; relevance_score: number }[] };
    expect(rerank.id).toMatch(/^rerank-[0-9a-f]{32}$/);
    // (words shared with the query + 1) / (words + 2): Paris 4/8, Berlin 3/8, Bananas 1/5; best first, top 2.
    expect(rerank.results).toEqual([
      { index: 1, document: { text: RERANK.documents[1] }, relevance_score: 0.5 },
      { index: 0, document: { text: RERANK.documents[0] }, relevance_score: 0.375 },
    ]);
  });

  it('stores them with route, model and usage, and never the Authorization header', () => {
    const bytes = readFileSync(db);
    expect(bytes.includes(SECRET)).toBe(false);
    // The double did receive it: the proxy forwards it, it only never stores it.
    expect(upstream.received.filter((r) => r.path === '/v1/embeddings').every((r) => r.headers.authorization === `Bearer ${SECRET}`)).toBe(true);
    const file = new Database(db, { readonly: true });
    try {
      const rows = file.prepare(`select path, endpoint, outcome, status, model, usage, prompt_key is not null as keyed from exchanges order by id`).all();
      expect(rows).toEqual([
        ...Array.from({ length: 3 }, () => ({
          path: '/v1/embeddings',
          endpoint: 'embeddings',
          outcome: 'complete',
          status: 200,
          model: MODEL,
          usage: expect.any(String),
          keyed: 1,
        })),
        ...['/rerank', '/v1/rerank', '/v2/rerank'].map((path) => ({
          path,
          endpoint: 'rerank',
          outcome: 'complete',
          status: 200,
          model: MODEL,
          usage: expect.any(String),
          keyed: 1,
        })),
        { path: '/v1/chat/completions', endpoint: 'chat', outcome: 'complete', status: 200, model: MODEL, usage: expect.any(String), keyed: 1 },
      ]);
    } finally {
      file.close();
    }
  });
});

describe('serve --mode replay with the double stopped', () => {
  let replay: string;
  let random: string;
  beforeAll(async () => {
    await upstream.close();
    [{ url: replay }, { url: random }] = await Promise.all([
      mocker('serve', '--mode', 'replay', '--captures', db, '--timing', 'none'),
      mocker('serve', '--mode', 'replay', '--captures', db, '--timing', 'none', '--on-miss', 'random'),
    ]);
  }, 60_000);

  it("answers the openai client from the capture, in float and base64: the double's vectors, not synthetic ones", async () => {
    const float = await client(replay).embeddings.create({ model: MODEL, input: TEXTS, encoding_format: 'float' });
    const base64 = await client(replay).embeddings.create({ model: MODEL, input: TEXTS });
    expect(float.data.map((d) => d.embedding)).toEqual(doubleVectors(TEXTS));
    expect(base64.data.map((d) => d.embedding)).toEqual(doubleVectors(TEXTS));
  });

  it('serves the captured bytes with a new id (and created)', async () => {
    for (const [name, path, body] of [
      ['embeddings', '/v1/embeddings', { model: MODEL, input: TEXTS, dimensions: 8 }],
      ['rerank', '/rerank', RERANK],
      ['v1 rerank', '/v1/rerank', { ...RERANK, top_n: 2 }],
      ['v2 rerank', '/v2/rerank', RERANK],
    ] as const) {
      const res = await post(replay, path, body);
      expect(res.status, name).toBe(200);
      expect(res.headers.get('content-type'), name).toBe('application/json');
      const text = await res.text();
      expect(normalize(text), name).toBe(normalize(proxied.get(name)!));
      const id = (JSON.parse(text) as { id: string }).id;
      expect(id, name).not.toBe((JSON.parse(proxied.get(name)!) as { id: string }).id);
      expect(id, name).toMatch(name === 'embeddings' ? /^embd-[0-9a-f]{32}$/ : /^rerank-[0-9a-f]{32}$/);
    }
    // X-Request-Id names the answer, as vLLM's `embd-<request id>`.
    const named = await fetch(`${replay}/v1/embeddings`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-request-id': 'my-request' },
      body: JSON.stringify({ model: MODEL, input: TEXTS, dimensions: 8 }),
    });
    expect(((await named.json()) as { id: string }).id).toBe('embd-my-request');
  });

  it('survive captures export | import: the imported file replays the same bytes', async () => {
    const jsonl = join(dir, 'pooling.jsonl');
    expect((await runMockerToExit(['captures', 'export', db, '-o', jsonl])).code).toBe(0);
    const imported = join(dir, 'imported.db');
    expect((await runMockerToExit(['captures', 'import', jsonl, '-o', imported])).code).toBe(0);
    const server = await mocker('serve', '--mode', 'replay', '--captures', imported);
    const { url } = server;
    for (const [name, path, body] of [
      ['embeddings', '/v1/embeddings', { model: MODEL, input: TEXTS, dimensions: 8 }],
      ['v2 rerank', '/v2/rerank', RERANK],
    ] as const) {
      const res = await post(url, path, body);
      expect(res.status, name).toBe(200);
      expect(normalize(await res.text()), name).toBe(normalize(proxied.get(name)!));
    }
    await server.stop();
  });

  it('still replays the chat captured beside them', async () => {
    const res = await post(replay, '/v1/chat/completions', CHAT);
    expect(res.status).toBe(200);
    expect(((await res.json()) as { choices: { message: { content: string } }[] }).choices[0].message.content).toBe('Hello from the double.');
  });

  it('a different input (or top_n, or dimensions) is a miss: the vLLM-format 404 under --on-miss error', async () => {
    for (const [path, body] of [
      ['/v1/embeddings', { model: MODEL, input: [OTHER_TEXT] }],
      ['/v1/embeddings', { model: MODEL, input: TEXTS, dimensions: 4 }],
      ['/v1/rerank', { ...RERANK, top_n: 1 }],
      ['/rerank', { ...RERANK, query: 'capital of Germany' }],
    ] as const) {
      const res = await post(replay, path, body);
      expect(res.status, path).toBe(404);
      const error = ((await res.json()) as { error: { message: string; type: string; param: unknown; code: number } }).error;
      expect(error, path).toEqual({
        message: expect.stringContaining(`No capture matches this request: POST ${path}, model \`${MODEL}\``),
        type: 'NotFoundError',
        param: null,
        code: 404,
      });
    }
  });

  it('a miss under --on-miss random gets the synthetic answer; a hit still the captured one', async () => {
    const missed = await client(random).embeddings.create({ model: MODEL, input: [OTHER_TEXT], encoding_format: 'float' });
    // mocker's synthetic vectors: 768 components (its default), a unit vector.
    expect(missed.data[0].embedding).toHaveLength(768);
    expect(Math.hypot(...missed.data[0].embedding)).toBeCloseTo(1, 5);
    const hit = await client(random).embeddings.create({ model: MODEL, input: TEXTS, encoding_format: 'float' });
    expect(hit.data.map((d) => d.embedding)).toEqual(doubleVectors(TEXTS));
  });
});

describe('serve --on-miss record', () => {
  it('forwards a pooling miss, records it, and replays it once the upstream is gone', async () => {
    const recordDb = join(dir, 'record.db');
    const second = await startUpstream(() => ({ content: 'unused' }));
    const recorder = await mocker('serve', '--mode', 'replay', '--captures', recordDb, '--timing', 'none', '--on-miss', 'record', '--upstream', second.url);
    const body = { model: MODEL, input: OTHER_TEXT, encoding_format: 'float' };
    const forwarded = await post(recorder.url, '/v1/embeddings', body);
    expect(forwarded.status).toBe(200);
    const text = await forwarded.text();
    expect((JSON.parse(text) as { data: { embedding: number[] }[] }).data[0].embedding).toEqual(doubleVectors([OTHER_TEXT])[0]);
    await recorder.stop();
    await second.close();
    const replay = await mocker('serve', '--mode', 'replay', '--captures', recordDb, '--timing', 'none');
    const replayed = await post(replay.url, '/v1/embeddings', body);
    expect(replayed.status).toBe(200);
    expect(normalize(await replayed.text())).toBe(normalize(text));
    expect(readFileSync(recordDb).includes(SECRET)).toBe(false);
  }, 60_000);
});

/**
 * A capture file as mocker wrote it before pooling exchanges were recorded: its tables made by the migrations of
 * that version, one chat exchange written row by row as the schema lays it out.
 */
async function writeChatOnlyFile(path: string, answer: string): Promise<{ request: Record<string, unknown>; response: string }> {
  const file = new Database(path);
  try {
    const migrations = join(import.meta.dirname, '..', '..', 'migrations');
    const journal = JSON.parse(readFileSync(join(migrations, 'meta', '_journal.json'), 'utf8')) as { entries: { tag: string; when: number }[] };
    file.exec('CREATE TABLE __drizzle_migrations (id INTEGER PRIMARY KEY AUTOINCREMENT, hash text NOT NULL, created_at numeric)');
    for (const { tag, when } of journal.entries.filter((e) => ['0000_init', '0001_run_engine'].includes(e.tag))) {
      const sql = readFileSync(join(migrations, `${tag}.sql`), 'utf8');
      for (const statement of sql.split('--> statement-breakpoint')) if (statement.trim()) file.exec(statement);
      file.prepare('INSERT INTO __drizzle_migrations (hash, created_at) VALUES (?, ?)').run(createHash('sha256').update(sql).digest('hex'), when);
    }
    const request = { model: MODEL, messages: [{ role: 'user', content: 'An old question' }], max_tokens: 8 };
    const prompt = await promptIds(request, true);
    const output = [...(await encode(answer, false)), EOS];
    const u32 = (ids: number[]) => Buffer.from(Uint32Array.from(ids).buffer);
    const usage = { prompt_tokens: prompt.length, total_tokens: prompt.length + output.length, completion_tokens: output.length, prompt_tokens_details: null };
    const response = JSON.stringify({
      id: 'chatcmpl-old',
      object: 'chat.completion',
      created: 1_700_000_000,
      model: MODEL,
      choices: [{ index: 0, message: { role: 'assistant', content: answer }, logprobs: null, finish_reason: 'stop', stop_reason: null }],
      usage,
    });
    file
      .prepare(
        `INSERT INTO runs (started_at, kind, upstream, engine, tokenizer_files) VALUES (1700000000000, 'capture', 'http://127.0.0.1:8000/', 'vllm', '{}')`,
      )
      .run();
    file
      .prepare(
        `INSERT INTO exchanges (run_id, started_at, method, path, endpoint, outcome, status, model, stream, total_ms, token_source, prompt_ids, prompt_len, prompt_key, request_shape, injected, usage, request_headers, request_body, response_headers, response_body)
         VALUES (1, 1700000000000, 'POST', '/v1/chat/completions', 'chat', 'complete', 200, ?, 0, 12.5, 'engine', ?, ?, ?, '{"endpoint":"chat","max_tokens":8}', '[]', ?, '{}', ?, '{"content-type":"application/json"}', ?)`,
      )
      .run(
        MODEL,
        u32(prompt),
        prompt.length,
        createHash('sha256').update(MODEL).update('\0').update(u32(prompt)).digest('hex'),
        JSON.stringify(usage),
        Buffer.from(JSON.stringify(request)),
        Buffer.from(response),
      );
    file
      .prepare(
        `INSERT INTO generations (exchange_id, choice_index, output_ids, token_times, chunk_tokens, chunk_deltas, text, finish_reason, stop_reason) VALUES (1, 0, ?, ?, ?, ?, ?, 'stop', 'null')`,
      )
      .run(u32(output), Buffer.from(Float64Array.from(output.map(() => 12.5)).buffer), u32([output.length]), JSON.stringify([{ content: answer }]), answer);
    return { request, response };
  } finally {
    file.close();
  }
}

describe('a capture file written before pooling exchanges were recorded', () => {
  it('opens and replays its chat; an embeddings request is a miss', async () => {
    const path = join(dir, 'old.db');
    const { request, response } = await writeChatOnlyFile(path, 'An old answer.');
    const serve = await mocker('serve', '--mode', 'replay', '--captures', path, '--timing', 'none');
    const res = await post(serve.url, '/v1/chat/completions', request);
    expect(res.status).toBe(200);
    const text = await res.text();
    expect(normalize(text)).toBe(normalize(response));
    expect(text).not.toContain('chatcmpl-old');
    const miss = await post(serve.url, '/v1/embeddings', { model: MODEL, input: 'Hello world' });
    expect(miss.status).toBe(404);
    expect(((await miss.json()) as { error: { message: string } }).error.message).toBe(
      `No capture matches this request: POST /v1/embeddings, model \`${MODEL}\`, 1 input(s). The capture file holds no complete capture of POST /v1/embeddings.`,
    );
  }, 60_000);
});
