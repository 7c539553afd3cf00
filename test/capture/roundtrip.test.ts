import { mkdtempSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { captureInProcess, serveInProcess, type Running } from '../support/inProcess.js';
import { MODEL, startUpstream, type Answer, type Upstream } from '../support/vllmUpstream.js';
import { testTmpdir } from '../support/tempRoot.js';

const EMOJI = '你好，世界！🌍🚀 naïve café 👨‍👩‍👧';

function lastUser(body: Record<string, unknown>): string {
  if (typeof body.prompt === 'string') return body.prompt;
  const messages = (body.messages ?? []) as { content?: unknown }[];
  return String(messages[messages.length - 1]?.content ?? '');
}

function script(body: Record<string, unknown>): Answer {
  const text = lastUser(body);
  if (text.includes('weather')) return { toolCall: { name: 'get_weather', arguments: '{"city": "Paris", "unit": "celsius"}' } };
  if (text.includes('think')) return { reasoning: 'The user greets me. I should answer briefly.', content: 'Hi there!' };
  if (text.includes('emoji')) return { content: EMOJI };
  if (text.includes('fail')) return { errorStatus: 400 };
  return { content: 'Hello! How can I help you today? I am a test engine.' };
}

/** Removes what vLLM regenerates per request (top-level id and created). */
function normalize(text: string): string {
  return text.replace(/\{"id":"[^"]*","object":"([^"]*)","created":\d+/g, '{"id":"X","object":"$1","created":0');
}

interface Case {
  name: string;
  path: '/v1/chat/completions' | '/v1/completions';
  body: Record<string, unknown>;
}

const chat = (content: string, extra: Record<string, unknown> = {}) => ({ model: MODEL, messages: [{ role: 'user', content }], max_tokens: 64, ...extra });
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } },
];

const CASES: Case[] = [
  { name: 'chat', path: '/v1/chat/completions', body: chat('Say hello') },
  { name: 'chat stream', path: '/v1/chat/completions', body: chat('Say hello', { stream: true, stream_options: { include_usage: true } }) },
  { name: 'chat stream ids', path: '/v1/chat/completions', body: chat('Say hello again', { stream: true, return_token_ids: true }) },
  { name: 'completion', path: '/v1/completions', body: { model: MODEL, prompt: 'Once upon a time', max_tokens: 8 } },
  { name: 'completion stream', path: '/v1/completions', body: { model: MODEL, prompt: 'Once upon a time', max_tokens: 8, stream: true } },
  { name: 'completion ids', path: '/v1/completions', body: { model: MODEL, prompt: 'In a galaxy', max_tokens: 12, return_token_ids: true } },
  { name: 'tool call', path: '/v1/chat/completions', body: chat('What is the weather in Paris?', { tools }) },
  { name: 'tool call stream', path: '/v1/chat/completions', body: chat('What is the weather in Paris?', { tools, stream: true }) },
  { name: 'reasoning', path: '/v1/chat/completions', body: chat('Please think, then greet me') },
  { name: 'reasoning stream', path: '/v1/chat/completions', body: chat('Please think, then greet me', { stream: true }) },
  { name: 'utf8 split', path: '/v1/chat/completions', body: chat('emoji please', { stream: true, return_token_ids: true }) },
  { name: 'utf8 split non-stream', path: '/v1/chat/completions', body: chat('emoji please') },
];

async function post(url: string, c: Case, headers: Record<string, string> = {}): Promise<{ status: number; text: string }> {
  const res = await fetch(url + c.path, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(c.body) });
  return { status: res.status, text: await res.text() };
}

describe('capture then replay through a vLLM-like upstream', () => {
  let upstream: Upstream;
  let capture: Running;
  let replay: Running;
  let dbPath: string;
  const direct = new Map<string, string>();
  const proxied = new Map<string, string>();
  const openaiCaptured = new Map<string, unknown>();
  const secrets = {
    authorization: 'Bearer sk-secret-AAAA1111',
    'api-key': 'azure-key-BBBB2222',
    'x-api-key': 'xkey-CCCC3333',
    cookie: 'session=cookie-DDDD4444',
  };

  beforeAll(async () => {
    dbPath = join(mkdtempSync(join(testTmpdir(), 'mocker-')), 'golden.db');
    upstream = await startUpstream(script);
    capture = await captureInProcess({
      upstream: upstream.url,
      captures: dbPath,
      redactHeaders: ['authorization', 'api-key', 'x-api-key', 'cookie', 'set-cookie'],
    });
  });

  afterAll(async () => {
    await replay?.close();
    await capture?.close();
    await upstream?.close();
  });

  it('is transparent: the same bytes directly and through the proxy (ids and timestamps aside)', async () => {
    for (const c of CASES) {
      const a = await post(upstream.url, c);
      const b = await post(`http://127.0.0.1:${capture.port}`, c, secrets);
      expect(b.status, c.name).toBe(a.status);
      // Tool-call ids are random per request in vLLM too.
      const toolIds = (t: string) => normalize(t).replace(/chatcmpl-tool-[0-9a-f]{32}/g, 'chatcmpl-tool-X');
      expect(toolIds(b.text), c.name).toBe(toolIds(a.text));
      direct.set(c.name, a.text);
      proxied.set(c.name, b.text);
    }
  });

  it('forwards upstream errors as they happened', async () => {
    const bad = await post(`http://127.0.0.1:${capture.port}`, { name: 'fail', path: '/v1/chat/completions', body: chat('please fail') });
    expect(bad.status).toBe(400);
    expect(JSON.parse(bad.text)).toEqual({ error: { message: 'scripted upstream error', type: 'BadRequestError', param: null, code: 400 } });
  });

  it('records through the official openai client, chat and completions, stream and non-stream', async () => {
    const client = new OpenAI({ baseURL: `http://127.0.0.1:${capture.port}/v1`, apiKey: 'sk-secret-AAAA1111' });
    const full = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Hi from openai' }], max_tokens: 32 });
    openaiCaptured.set('chat', full);
    expect(full.choices[0].message.content).toBe('Hello! How can I help you today? I am a test engine.');
    const stream = await client.completions.create({ model: MODEL, prompt: 'openai stream', max_tokens: 5, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
    openaiCaptured.set('completion stream', text);
    expect(text.length).toBeGreaterThan(0);
  });

  it('never writes secrets into the capture file', async () => {
    await capture.close();
    const bytes = readFileSync(dbPath);
    const wal = (() => {
      try {
        return readFileSync(`${dbPath}-wal`);
      } catch {
        return Buffer.alloc(0);
      }
    })();
    for (const value of Object.values(secrets)) {
      const needle = value.replace(/^Bearer /, '');
      expect(bytes.includes(needle), value).toBe(false);
      expect(wal.includes(needle), value).toBe(false);
    }
    // The upstream did receive them: the proxy forwards, it only never stores.
    expect(upstream.received.some((r) => r.headers['x-api-key'] === secrets['x-api-key'])).toBe(true);
  });

  it('replays every capture with the upstream gone: identical shapes get identical bytes', async () => {
    await upstream.close();
    replay = await serveInProcess({ mode: 'replay', captures: dbPath, timing: 'none' });
    for (const c of CASES) {
      const r = await post(`http://127.0.0.1:${replay.port}`, c);
      expect(r.status, c.name).toBe(200);
      expect(normalize(r.text), c.name).toBe(normalize(proxied.get(c.name) as string));
    }
  });

  it('restamps a captured stream with the X-Request-Id of each request, whatever its length', async () => {
    const streams = CASES.filter((c) => c.body.stream === true);
    // Six lengths, some repeated: more than the layouts a captured stream keeps (and twice the same one in a row).
    for (const requestId of ['r', 'a-much-longer-request-id-0123456789', 'r', 'ab', 'abc', 'request-'.repeat(12), '7', 'abcd']) {
      for (const c of streams) {
        const r = await post(`http://127.0.0.1:${replay.port}`, c, { 'x-request-id': requestId });
        const prefix = c.path === '/v1/chat/completions' ? 'chatcmpl' : 'cmpl';
        const ids = [...r.text.matchAll(/^data: \{"id":"([^"]*)","object":"[^"]*","created":(\d+)/gm)];
        expect(ids.length, c.name).toBe(r.text.split('\n\n').filter((e) => e.startsWith('data: {')).length);
        for (const [, id] of ids) expect(id, c.name).toBe(`${prefix}-${requestId}`);
        expect(new Set(ids.map((m) => m[2])).size, c.name).toBe(1);
        expect(normalize(r.text), c.name).toBe(normalize(proxied.get(c.name) as string));
      }
    }
  });

  it('answers the official client with the captured content, finish reason and usage', async () => {
    const client = new OpenAI({ baseURL: `http://127.0.0.1:${replay.port}/v1`, apiKey: 'unused' });
    const full = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Hi from openai' }], max_tokens: 32 });
    const captured = openaiCaptured.get('chat') as typeof full;
    expect(full.choices[0].message.content).toBe(captured.choices[0].message.content);
    expect(full.choices[0].finish_reason).toBe(captured.choices[0].finish_reason);
    expect(full.usage).toEqual(captured.usage);
  });

  it('renders other request shapes from the captured tokens', async () => {
    const url = `http://127.0.0.1:${replay.port}`;
    // Captured non-stream with ids; asked as a stream: same tokens and text, vLLM stream format.
    const original = JSON.parse(direct.get('completion ids') as string) as { choices: { text: string; token_ids: number[] }[]; usage: unknown };
    const streamed = await post(url, {
      name: 'x',
      path: '/v1/completions',
      body: { model: MODEL, prompt: 'In a galaxy', max_tokens: 12, stream: true, return_token_ids: true, stream_options: { include_usage: true } },
    });
    const events = streamed.text.split('\n\n').filter(Boolean);
    expect(events.at(-1)).toBe('data: [DONE]');
    const chunks = events
      .slice(0, -1)
      .map((e) => JSON.parse(e.slice(6)) as { choices: { text: string; token_ids: number[] | null; finish_reason: string | null }[]; usage: unknown });
    const ids = chunks.flatMap((c) => c.choices.flatMap((ch) => ch.token_ids ?? []));
    expect(ids).toEqual(original.choices[0].token_ids);
    expect(chunks.map((c) => c.choices.map((ch) => ch.text).join('')).join('')).toBe(original.choices[0].text);
    expect(chunks.at(-1)?.usage).toEqual({
      prompt_tokens: (original.usage as { prompt_tokens: number }).prompt_tokens,
      total_tokens: (original.usage as { total_tokens: number }).total_tokens,
      completion_tokens: 12,
    });

    // A smaller max_tokens cuts the captured answer with finish_reason length.
    const short = await post(url, { name: 'x', path: '/v1/completions', body: { model: MODEL, prompt: 'In a galaxy', max_tokens: 4, return_token_ids: true } });
    const shortJson = JSON.parse(short.text) as { choices: { token_ids: number[]; finish_reason: string }[]; usage: { completion_tokens: number } };
    expect(shortJson.choices[0].token_ids).toEqual(original.choices[0].token_ids.slice(0, 4));
    expect(shortJson.choices[0].finish_reason).toBe('length');
    expect(shortJson.usage.completion_tokens).toBe(4);

    // A captured stream asked without streaming: the same message, as vLLM's non-streamed body.
    const capturedStream = direct.get('tool call stream') as string;
    const toolFull = await post(url, {
      name: 'x',
      path: '/v1/chat/completions',
      body: chat('What is the weather in Paris?', { tools, stream: false, max_tokens: 64 }),
    });
    const body = JSON.parse(toolFull.text) as {
      choices: { message: { tool_calls: { function: { name: string; arguments: string } }[] }; finish_reason: string }[];
    };
    expect(body.choices[0].finish_reason).toBe('tool_calls');
    expect(body.choices[0].message.tool_calls[0].function).toEqual({ name: 'get_weather', arguments: '{"city": "Paris", "unit": "celsius"}' });
    expect(capturedStream).toContain('get_weather');

    // A stop string found earlier in the captured text ends the answer there, with vLLM's stop_reason.
    const stopped = await post(url, { name: 'x', path: '/v1/chat/completions', body: chat('Say hello', { stop: ['help'] }) });
    const stopJson = JSON.parse(stopped.text) as { choices: { message: { content: string }; finish_reason: string; stop_reason: string }[] };
    expect(stopJson.choices[0].message.content).toBe('Hello! How can I ');
    expect(stopJson.choices[0].finish_reason).toBe('stop');
    expect(stopJson.choices[0].stop_reason).toBe('help');
  });

  it('does not serve failed exchanges as goldens', async () => {
    const r = await post(`http://127.0.0.1:${replay.port}`, { name: 'fail', path: '/v1/chat/completions', body: chat('please fail') });
    expect(r.status).toBe(404);
    expect(JSON.parse(r.text).error.type).toBe('NotFoundError');
  });
});
