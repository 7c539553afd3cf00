import http from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServe, type Running } from '../src/cli/serve.js';
import { MODEL } from './support/vllmUpstream.js';
import { prng } from './support/prng.js';

const REQUESTS = 600;
const MAX_BODY = 64 * 1024;
const CONCURRENCY = 8;

type Json = Record<string, unknown>;
interface Case {
  method: string;
  path: string;
  headers: Record<string, string>;
  body: Buffer;
  /** The parsed request, when it is a JSON object, for checking a 200 answer against it. */
  request: Json | null;
}

const WEIRD: unknown[] = [
  null, true, false, 0, -1, 1, 2, 7, 1.5, -0.5, 1e9, -1e9, 1e308, 2 ** 53 + 1, '', 'x', '12', '\u0000', '日本語🚀',
  'a'.repeat(5000), [], {}, [1, 2, 3], ['a', 'b'], [[1, 2]], [null], [{}], { a: 1 }, { type: 'text' }, [[[[[[[[1]]]]]]]],
];
const FIELDS = [
  'model', 'prompt', 'messages', 'max_tokens', 'max_completion_tokens', 'n', 'stream', 'stream_options', 'stop', 'stop_token_ids',
  'temperature', 'top_p', 'top_k', 'seed', 'min_tokens', 'ignore_eos', 'logprobs', 'echo', 'suffix', 'return_token_ids',
  'add_special_tokens', 'skip_special_tokens', 'include_stop_str_in_output', 'chat_template', 'chat_template_kwargs', 'tools',
  'add_generation_prompt', 'continue_final_message', 'request_id', 'user',
];
const PATHS: [string, string][] = [
  ['GET', '/v1/completions'], ['DELETE', '/health'], ['PUT', '/v1/models'], ['POST', '/v1/embeddings'], ['GET', '/nope'],
  ['POST', '/v1/chat/completions/extra'], ['GET', '/%E2%98%83'], ['POST', '/v1/completions?x=%ZZ'], ['PATCH', '/version'], ['GET', '/health?probe=1'],
];

function validBody(kind: 'chat' | 'completion', r: ReturnType<typeof prng>): Json {
  const base: Json = { model: MODEL, max_tokens: 1 + Math.floor(r.next() * 12) };
  if (kind === 'chat') base.messages = [{ role: 'user', content: r.pick(['Hi', 'Tell me a story', '日本語で', 'Emoji 🚀 please']) }];
  else base.prompt = r.pick(['Once upon a time', 'The capital of France is', [9707, 11, 1879], '🚀🚀']);
  if (r.next() < 0.4) base.stream = true;
  return base;
}

function makeCase(r: ReturnType<typeof prng>): Case {
  const json = { 'content-type': 'application/json' };
  const roll = r.next();
  if (roll < 0.08) {
    const [method, path] = r.pick(PATHS);
    return { method, path, headers: json, body: Buffer.alloc(0), request: null };
  }
  const kind = r.next() < 0.5 ? 'chat' : 'completion';
  const path = kind === 'chat' ? '/v1/chat/completions' : '/v1/completions';
  if (roll < 0.2) {
    // Bytes that are not a JSON object: truncated JSON, other JSON values, garbage, nothing.
    const text = JSON.stringify(validBody(kind, r));
    const body = r.pick([
      text.slice(0, Math.floor(r.next() * text.length)),
      'null', '[]', '"text"', '42', '{"a":', '{,}', '\u00ff\u00fe', '',
      Buffer.from(Array.from({ length: 64 }, () => Math.floor(r.next() * 256))).toString('latin1'),
    ]);
    return { method: 'POST', path, headers: json, body: Buffer.from(body, 'latin1'), request: null };
  }
  if (roll < 0.23) {
    const body = Buffer.from(JSON.stringify({ ...validBody(kind, r), padding: 'x'.repeat(MAX_BODY) }));
    return { method: 'POST', path, headers: json, body, request: null };
  }
  const request = validBody(kind, r);
  // Zero to three fields replaced by odd values, or removed.
  const edits = Math.floor(r.next() * 4);
  for (let i = 0; i < edits; i++) {
    const field = r.pick(FIELDS);
    if (r.next() < 0.15) delete request[field];
    else request[field] = r.pick(WEIRD);
  }
  if (kind === 'chat' && r.next() < 0.15) request.messages = [{ role: r.pick(['user', 'system', 'assistant', 'tool', 7, null]), content: r.pick(WEIRD) }];
  const headers = r.next() < 0.05 ? { 'content-type': 'text/plain' } : json;
  return { method: 'POST', path, headers, body: Buffer.from(JSON.stringify(request)), request };
}

function send(port: number, c: Case): Promise<{ status: number; headers: http.IncomingHttpHeaders; text: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, method: c.method, path: c.path, headers: { ...c.headers, 'content-length': c.body.length }, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (d: Buffer) => chunks.push(d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, text: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', reject);
    });
    req.setTimeout(20_000, () => req.destroy(new Error('no answer within 20 s')));
    req.on('error', reject);
    req.end(c.body);
  });
}

/** A 200 answer must be a well-formed vLLM response honouring the request's n and max_tokens. */
function checkAnswer(c: Case, text: string): void {
  const req = c.request!;
  const events = req.stream === true ? text.split('\n\n').filter(Boolean) : null;
  const objects = events ? events.slice(0, -1).map((e) => JSON.parse(e.replace(/^data: /, '')) as Json) : [JSON.parse(text) as Json];
  if (events) expect(events.at(-1)).toBe('data: [DONE]');
  for (const o of objects) {
    expect(o.error, JSON.stringify(o)).toBeUndefined();
    expect(String(o.id)).toMatch(/^(chatcmpl|cmpl)-/);
  }
  const choices = objects.flatMap((o) => (o.choices as Json[]) ?? []);
  const indices = new Set(choices.map((ch) => ch.index));
  // A list of strings or of token-id lists is a batch: n choices per prompt (vLLM's batched completions).
  const batch = !c.path.includes('chat') && Array.isArray(req.prompt) && req.prompt.length > 0 && typeof req.prompt[0] !== 'number';
  const prompts = batch ? (req.prompt as unknown[]).length : 1;
  expect(indices.size).toBe((typeof req.n === 'number' ? req.n : 1) * prompts);
  const finishes = choices.map((ch) => ch.finish_reason).filter((f) => f !== null && f !== undefined);
  expect(finishes.length).toBe(indices.size);
  for (const f of finishes) expect(['stop', 'length']).toContain(f);
  const usage = objects.map((o) => o.usage as Json | null | undefined).find((u) => u);
  // max_completion_tokens is a chat field; completions ignore it as vLLM ignores unknown fields.
  const limit = (c.path.includes('chat') ? (req.max_completion_tokens ?? req.max_tokens) : req.max_tokens) as number | undefined;
  if (usage && typeof limit === 'number') expect(usage.completion_tokens as number).toBeLessThanOrEqual(limit * indices.size);
}

describe(`fuzz: ${REQUESTS} random or malformed requests`, () => {
  let server: Running;
  beforeAll(async () => {
    server = await startServe({ mode: 'random', captures: ':memory:', forwardTimeMs: 0, maxBodyBytes: MAX_BODY });
  });
  afterAll(async () => {
    await server?.close();
  });

  it('answers each with a vLLM-format error or a valid answer, and /health stays 200 throughout', async () => {
    const seed = 20261122;
    const r = prng(seed);
    const cases = Array.from({ length: REQUESTS }, () => makeCase(r));
    const health: number[] = [];
    let running = true;
    const poller = (async () => {
      while (running) {
        const res = await send(server.port, { method: 'GET', path: '/health', headers: {}, body: Buffer.alloc(0), request: null }).catch(() => ({ status: 0 }));
        health.push(res.status);
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    })();

    const statuses = new Map<number, number>();
    let next = 0;
    const worker = async () => {
      while (next < cases.length) {
        const i = next++;
        const c = cases[i];
        const where = `case ${i} (seed ${seed}): ${c.method} ${c.path} ${c.body.toString('latin1').slice(0, 300)}`;
        const res = await send(server.port, c);
        statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1);
        expect([200, 400, 404, 405, 413], where).toContain(res.status);
        if (res.status === 200 && c.method === 'POST') {
          checkAnswer(c, res.text);
          continue;
        }
        if (res.status === 200) continue;
        expect(res.headers['content-type'], where).toMatch(/^application\/json/);
        const body = JSON.parse(res.text) as { error?: { message: unknown; type: unknown; code: unknown }; detail?: unknown };
        if (body.detail !== undefined) {
          // FastAPI's own answers for unknown paths and methods.
          expect([404, 405], where).toContain(res.status);
          expect(body.detail).toBe(res.status === 404 ? 'Not Found' : 'Method Not Allowed');
        } else {
          expect(body.error, where).toBeDefined();
          expect(body.error!.code, where).toBe(res.status);
          expect(typeof body.error!.type).toBe('string');
          expect(typeof body.error!.message).toBe('string');
          expect((body.error!.message as string).length, where).toBeGreaterThan(0);
        }
      }
    };
    try {
      await Promise.all(Array.from({ length: CONCURRENCY }, worker));
    } finally {
      running = false;
      await poller;
    }

    // The generator reached every kind of answer, and the server never stopped being healthy.
    expect([...statuses.values()].reduce((a, b) => a + b, 0)).toBe(REQUESTS);
    for (const status of [200, 400, 404, 405, 413]) expect(statuses.get(status) ?? 0, `status ${status}`).toBeGreaterThan(0);
    expect(health.length).toBeGreaterThan(5);
    expect(health.every((s) => s === 200)).toBe(true);
  });
});
