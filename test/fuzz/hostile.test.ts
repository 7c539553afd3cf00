/**
 * Issue #33's findings 1, 2 and 5 through the spawned CLI: one request, or one capture file, can no longer take
 * `serve` down. Expected behaviour is vLLM's where it has one: a schema vLLM accepts is served, its model writing
 * until max_tokens (finish_reason "length"); a prompt longer than the context is its 400 (serving_engine
 * `_validate_input`; /tokenize capped at max_model_len as vLLM's 2026 renderer does); expected token counts come
 * from the Python tokenizer's fixtures (test/support/qwen3Oracle.ts). Memory is the server's own VmHWM (/proc).
 */
import { readFileSync, rmSync, mkdtempSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CaptureStore } from '../../src/store/captureStore.js';
import { loadModelFiles } from '../../src/tokenizer/index.js';
import { HOSTILE_CAPTURE_TEMPLATE } from '../support/hostileFuzz.js';
import { mockerProcesses, runMockerToExit, type MockerProcess } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';

type Json = Record<string, unknown>;

/** The bundled Qwen3-0.6B's context length (its config.json `max_position_embeddings`). */
const QWEN3_MAX_MODEL_LEN = 40960;
/** The audit saw 11.1 GB (nested minItems), 2.05 → 5.45 GB (/tokenize): a bounded server stays far under this. */
const PEAK_BOUND_MB = 1024;
/** The fixture text ("ab ab ab …") that Python's tokenizer encodes in exactly 201 tokens. */
const TEXT_201 = readFileSync(join(import.meta.dirname, '..', 'fixtures', 'tokenizer', 'qwen3.jsonl'), 'utf8')
  .split('\n')
  .filter(Boolean)
  .map((line) => JSON.parse(line) as { kind: string; text?: string; ids_without_special?: number[] })
  .find((row) => row.kind === 'encode' && row.ids_without_special?.length === 201)!.text!;

function peakMb(pid: number): number {
  return Number(/^VmHWM:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))![1]) / 1024;
}

const post = (port: number, path: string, body: unknown) =>
  fetch(`http://127.0.0.1:${port}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });

async function errorOf(res: Response): Promise<{ status: number; error: Json }> {
  return { status: res.status, error: ((await res.json()) as { error: Json }).error };
}

const health = async (port: number) => (await fetch(`http://127.0.0.1:${port}/health`)).status;

let dir: string;
const mockers = mockerProcesses();
const serve = (args: string[]) => mockers.start(['serve', '--timing', 'none', ...args], { cwd: dir });

beforeAll(() => {
  dir = mkdtempSync(join(testTmpdir(), 'mocker-hostile-'));
});
afterAll(async () => {
  await mockers.stopAll();
  rmSync(dir, { recursive: true, force: true });
});

describe('finding 1: a tool schema cannot exhaust the server', () => {
  let server: MockerProcess;
  let client: OpenAI;
  beforeAll(async () => {
    server = await serve(['--mode', 'random']);
    client = new OpenAI({ baseURL: `http://127.0.0.1:${server.port}/v1`, apiKey: 'unused', maxRetries: 0 });
  });

  const callWith = (parameters: Json) =>
    client.chat.completions.create({
      model: 'Qwen/Qwen3-0.6B',
      messages: [{ role: 'user', content: 'Call the tool.' }],
      tools: [{ type: 'function', function: { name: 'write', parameters } }],
      tool_choice: 'required',
      max_tokens: 50,
    });

  it('"minLength": 1e9 with tool_choice "required" is answered as a model out of tokens (finish_reason length), /health answering', async () => {
    const answer = await callWith({ type: 'object', properties: { text: { type: 'string', minLength: 1e9 } }, required: ['text'] });
    expect(answer.choices[0].finish_reason).toBe('length');
    expect(answer.usage?.completion_tokens).toBe(50);
    expect(answer.choices[0].message.tool_calls ?? []).toEqual([]);
    expect(await health(server.port)).toBe(200);
    expect(peakMb(server.child.pid!)).toBeLessThan(PEAK_BOUND_MB);
  });

  it('minItems 10 nested seven deep (10^7 values) is answered the same way, within the memory bound', async () => {
    let items: Json = { type: 'integer' };
    for (let depth = 0; depth < 7; depth++) items = { type: 'array', items, minItems: 10 };
    const answer = await callWith({ type: 'object', properties: { grid: items }, required: ['grid'] });
    expect(answer.choices[0].finish_reason).toBe('length');
    expect(answer.usage?.completion_tokens).toBe(50);
    expect(await health(server.port)).toBe(200);
    expect(peakMb(server.child.pid!)).toBeLessThan(PEAK_BOUND_MB);
  });
});

describe("finding 2: a capture's chat template and tokenizer are bounded as a request's template is", () => {
  /** A capture file (written with the store's API) carrying the bundled tokenizer with `changes` to its files. */
  function captureWith(name: string, changes: Record<string, string>): string {
    const file = join(dir, name);
    const model = loadModelFiles();
    const files = new Map(model.files);
    for (const [file, text] of Object.entries(changes)) files.set(file, Buffer.from(text));
    const store = CaptureStore.open(file);
    store.startRun({ kind: 'capture', tokenizerName: model.name }, files);
    store.close();
    return file;
  }

  let server: MockerProcess;
  beforeAll(async () => {
    server = await serve(['--captures', captureWith('hostile-template.db', { 'chat_template.jinja': HOSTILE_CAPTURE_TEMPLATE }), '--on-miss', 'random']);
  });
  const chat = (content: string) => post(server.port, '/v1/chat/completions', { messages: [{ role: 'user', content }], max_tokens: 4 });

  it('a chat its template loops forever on is stopped with a 400, /health answering before it', async () => {
    const looping = chat('loop forever');
    // Sent after the looping chat: answered while the template runs (in-process, the loop held the server for good).
    expect(await health(server.port)).toBe(200);
    const { status, error } = await errorOf(await looping);
    expect(status).toBe(400);
    expect(error).toMatchObject({ type: 'BadRequestError', code: 400, message: 'Chat template error: rendering was stopped after 2000 ms' });
  });

  it('a chat its template allocates without bound on (range(200000000), which aborted V8) is a 400; the server serves on', async () => {
    const { status, error } = await errorOf(await chat('allocate without bound'));
    expect(status).toBe(400);
    expect(error.message).toMatch(/^Chat template error: rendering was stopped: its process ended \(.+\), most likely beyond its \d+ MB heap$/);
    expect(server.child.exitCode).toBeNull();
    // The capture's own template still renders the next chat: its first line says so.
    const tokenized = (await (await post(server.port, '/tokenize', { messages: [{ role: 'user', content: 'Hello' }] })).json()) as { tokens: number[] };
    const text = ((await (await post(server.port, '/detokenize', { tokens: tokenized.tokens })).json()) as { prompt: string }).prompt;
    expect(text).toBe('<|im_start|>system\ncaptured template<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n');
    expect((await chat('Hello')).status).toBe(200);
    expect(peakMb(server.child.pid!)).toBeLessThan(PEAK_BOUND_MB);
  });

  it('a capture whose tokenizer splits text with an exponentially backtracking regex (which aborts the process) is refused at start, naming it', async () => {
    const tokenizer = JSON.parse(loadModelFiles().files.get('tokenizer.json')!.toString('utf8')) as Json;
    tokenizer.pre_tokenizer = {
      type: 'Sequence',
      pretokenizers: [{ type: 'Split', pattern: { Regex: '(a|aa)+$' }, behavior: 'Isolated', invert: false }, tokenizer.pre_tokenizer],
    };
    const file = captureWith('hostile-regex.db', { 'tokenizer.json': JSON.stringify(tokenizer) });
    const run = await runMockerToExit(['serve', '--captures', file, '--on-miss', 'random', '--port', '0', '--host', '127.0.0.1'], { cwd: dir });
    expect(run.code).toBe(1);
    expect(run.stderr).toContain(`the capture's tokenizer (Qwen/Qwen3-0.6B) is not served: its regular expression "(a|aa)+$" repeats "(a|aa)+"`);
  });
});

describe('finding 5: /tokenize and the pooling routes honour the context length; a big batch does not hold the loop', () => {
  let bounded: MockerProcess;
  let small: MockerProcess;
  beforeAll(async () => {
    [bounded, small] = await Promise.all([serve(['--mode', 'random']), serve(['--mode', 'random', '--max-model-len', '201'])]);
  });

  it('a 10 MB /tokenize is a 400 naming the context length, refused without tokenizing all of it (peak RSS bounded)', async () => {
    const prompt = 'the quick brown fox jumps over the lazy dog '.repeat(Math.ceil(10_000_000 / 44));
    const { status, error } = await errorOf(await post(bounded.port, '/tokenize', { prompt }));
    expect(status).toBe(400);
    expect(error).toMatchObject({ type: 'BadRequestError', code: 400 });
    expect(error.message).toMatch(
      new RegExp(
        `^This model's maximum context length is ${QWEN3_MAX_MODEL_LEN} tokens\\. However, your request has more than ${QWEN3_MAX_MODEL_LEN} input tokens`,
      ),
    );
    expect(peakMb(bounded.child.pid!)).toBeLessThan(PEAK_BOUND_MB);
    expect(await health(bounded.port)).toBe(200);
  });

  it('/tokenize may fill the context (201 of 201 tokens) where a completion keeps a token for its output; one more is refused', async () => {
    const fits = (await (await post(small.port, '/tokenize', { prompt: TEXT_201 })).json()) as { count: number; max_model_len: number };
    expect(fits).toMatchObject({ count: 201, max_model_len: 201 });
    const completion = await errorOf(await post(small.port, '/v1/completions', { prompt: TEXT_201, max_tokens: 1 }));
    expect(completion.error.message).toBe(
      "This model's maximum context length is 201 tokens. However, your request has 201 input tokens. Please reduce the length of the input messages.",
    );
    const over = await errorOf(await post(small.port, '/tokenize', { prompt: `${TEXT_201} ${TEXT_201}` }));
    expect(over.status).toBe(400);
    expect(over.error.message).toMatch(
      /^This model's maximum context length is 201 tokens\. However, your request has \d+ input tokens\. Please reduce the length of the input messages\.$/,
    );
    // A chat is rendered first, then counted the same way.
    const chat = await errorOf(await post(small.port, '/tokenize', { messages: [{ role: 'user', content: TEXT_201 }] }));
    expect(chat.status).toBe(400);
  });

  it("embeddings and rerank refuse an input longer than the context in vLLM's words for pooling", async () => {
    const ids = (n: number) => Array.from({ length: n }, (_, i) => 100 + i);
    expect((await post(small.port, '/v1/embeddings', { input: ids(201) })).status).toBe(200);
    const embedding = await errorOf(await post(small.port, '/v1/embeddings', { input: [ids(3), ids(202)] }));
    expect(embedding).toEqual({
      status: 400,
      error: {
        message:
          "This model's maximum context length is 201 tokens. However, you requested 202 tokens in the input for embedding generation. Please reduce the length of the input.",
        type: 'BadRequestError',
        param: null,
        code: 400,
      },
    });
    const text = await errorOf(await post(small.port, '/v1/embeddings', { input: `${TEXT_201} ${TEXT_201}` }));
    expect(text.error.message).toMatch(
      /^This model's maximum context length is 201 tokens\. However, you requested \d+ tokens in the input for embedding generation\./,
    );
    // A rerank pair is the query and a document together: more than 201 + 1.
    const rerank = await errorOf(await post(small.port, '/v2/rerank', { query: 'ab', documents: ['ab', TEXT_201] }));
    const pairTokens = Number(
      /^This model's maximum context length is 201 tokens\. However, you requested (\d+) tokens in the input for embedding generation\./.exec(
        String(rerank.error.message),
      )?.[1],
    );
    expect(pairTokens).toBeGreaterThan(201);
    expect((await post(small.port, '/v2/rerank', { query: 'ab', documents: ['ab', 'ab ab'] })).status).toBe(200);
  });

  it('a batch of 10,000 prompts does not hold the loop: a completion and /health sent after it are answered before its first byte', async () => {
    // Token-id prompts: nothing to tokenize, so nothing but the server's own slicing gives the loop a turn.
    const body = JSON.stringify({ prompt: Array.from({ length: 10_000 }, () => [9707, 1879]), max_tokens: 1, stream: true });
    const order: string[] = [];
    let uploaded!: () => void;
    const upload = new Promise<void>((resolve) => (uploaded = resolve));
    const batch = new Promise<number>((resolve, reject) => {
      const req = http.request(
        { host: '127.0.0.1', port: bounded.port, method: 'POST', path: '/v1/completions', headers: { 'content-type': 'application/json' } },
        (res) => {
          res.once('data', () => order.push('batch streams'));
          res.resume().on('end', () => resolve(res.statusCode ?? 0));
        },
      );
      req.on('error', reject);
      req.end(body, () => uploaded());
    });
    // Sent once the batch is uploaded. Held, the loop read them only after the batch's 10,000 prompts had been
    // planned and queued in the engine: the batch was streaming before they were answered.
    await upload;
    const [single, healthStatus] = await Promise.all([
      post(bounded.port, '/v1/completions', { prompt: 'Hello', max_tokens: 1 }).then(async (r) => (await r.text(), order.push('single answered'), r.status)),
      health(bounded.port).then((s) => (order.push('health answered'), s)),
    ]);
    expect(await batch).toBe(200);
    expect([single, healthStatus]).toEqual([200, 200]);
    expect(order.indexOf('single answered')).toBeLessThan(order.indexOf('batch streams'));
    expect(order.indexOf('health answered')).toBeLessThan(order.indexOf('batch streams'));
  });
});
