/**
 * What a replay must synthesize (a shorter `max_tokens` than captured, a stream from a non-streamed capture) is
 * rendered in the captured engine's own shape, whatever `--wire` says: here SGLang's (the double of
 * test/support/sglangUpstream.ts; its shapes are test/fixtures/engines/sglang-shapes.md §2–§5, the oracle).
 * Captured and replayed through the spawned CLI, read with the `openai` client's raw responses.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mockerProcesses } from '../support/mockerProcess.js';
import { oracleChat, oracleIds } from '../support/qwen3Oracle.js';
import { startSglangUpstream, type SglangUpstream } from '../support/sglangUpstream.js';
import { testTmpdir } from '../support/tempRoot.js';
import { jsonEvents } from '../support/sseEvents.js';

type Json = Record<string, unknown>;

const MODEL = 'Qwen/Qwen3-0.6B';
const ANSWER = 'Привет, мир!';
/** Qwen3's <|im_end|>: the EOS SGLang names in `matched_stop`. */
const IM_END = oracleIds('<|im_start|>user\nhi<|im_end|>').at(-1)!;
const COMPLETION = { model: MODEL, prompt: 'Hello world', max_tokens: 16 };
const CHAT = { model: MODEL, messages: oracleChat('Hi there').messages, max_tokens: 16 };

const mockers = mockerProcesses();
const dir = mkdtempSync(join(testTmpdir(), 'mocker-replay-wire-'));
let engine: SglangUpstream;
let replay: OpenAI;

afterAll(async () => {
  await mockers.stopAll();
  await engine?.close();
  rmSync(dir, { recursive: true, force: true });
});

const client = (url: string) => new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0 });

async function raw(to: OpenAI, chat: boolean, body: Json): Promise<string> {
  const res = await (chat ? to.chat.completions.create(body as never) : to.completions.create(body as never)).asResponse();
  const text = await res.text();
  expect(res.status, text).toBe(200);
  return text;
}

const events = jsonEvents;

const choiceOf = (value: Json) => (value.choices as Json[])[0];

beforeAll(async () => {
  engine = await startSglangUpstream(() => ANSWER);
  const captures = join(dir, 'sglang.db');
  const capture = await mockers.start(['capture', '--upstream', engine.url, '--captures', captures]);
  // Captured whole and not streamed: both end on the EOS.
  await raw(client(capture.url), false, COMPLETION);
  await raw(client(capture.url), true, CHAT);
  await capture.stop();
  // --wire names another engine: the capture's own wins.
  replay = client((await mockers.start(['serve', '--mode', 'replay', '--captures', captures, '--timing', 'none', '--wire', 'vllm-main'])).url);
});

describe('replay of an SGLang capture renders what it synthesizes in SGLang’s shape', () => {
  it('a completion cut by a shorter max_tokens: matched_stop, SGLang’s usage and metadata, a bare hex id', async () => {
    const body = JSON.parse(await raw(replay, false, { ...COMPLETION, max_tokens: 3 })) as Json;
    expect(Object.keys(body)).toEqual(['id', 'object', 'created', 'model', 'choices', 'usage', 'metadata']);
    expect(body.id).toMatch(/^[0-9a-f]{32}$/);
    expect(choiceOf(body)).toEqual({ index: 0, text: 'Привет', logprobs: null, finish_reason: 'length', matched_stop: null });
    expect(body.usage).toEqual({ prompt_tokens: 2, total_tokens: 5, completion_tokens: 3, prompt_tokens_details: null, reasoning_tokens: 0 });
    expect(body.metadata).toEqual({ weight_version: 'default' });
  });

  it('a chat cut by a shorter max_tokens: SGLang’s message (reasoning_content and tool_calls null)', async () => {
    const body = JSON.parse(await raw(replay, true, { ...CHAT, max_tokens: 3 })) as Json;
    expect(Object.keys(body)).toEqual(['id', 'object', 'created', 'model', 'choices', 'usage', 'metadata']);
    expect(choiceOf(body)).toEqual({
      index: 0,
      message: { role: 'assistant', content: 'Привет', reasoning_content: null, tool_calls: null },
      logprobs: null,
      finish_reason: 'length',
      matched_stop: null,
    });
  });

  it('a chat streamed from the non-streamed capture: SGLang’s chunks, the finish on its own naming the EOS', async () => {
    const chunks = events(await raw(replay, true, { ...CHAT, stream: true, stream_options: { include_usage: true } }));
    expect(choiceOf(chunks[0])).toEqual({
      index: 0,
      delta: { reasoning_content: null, role: 'assistant', content: '' },
      logprobs: null,
      finish_reason: null,
      matched_stop: null,
    });
    const content = chunks.slice(1, -2).map((c) => choiceOf(c).delta as Json);
    expect(content.every((d) => Object.keys(d).join() === 'reasoning_content,content' && d.reasoning_content === null && d.content !== '')).toBe(true);
    expect(content.map((d) => d.content).join('')).toBe(ANSWER);
    expect(choiceOf(chunks.at(-2)!)).toEqual({ index: 0, delta: { reasoning_content: null }, logprobs: null, finish_reason: 'stop', matched_stop: IM_END });
    expect(chunks.at(-1)!.usage).toMatchObject({ prompt_tokens_details: null, reasoning_tokens: 0 });
  });

  it('a completion streamed from the non-streamed capture: a chunk per token, the last with the finish and the EOS', async () => {
    const chunks = events(await raw(replay, false, { ...COMPLETION, stream: true }));
    for (const chunk of chunks) expect(Object.keys(choiceOf(chunk))).toEqual(['index', 'text', 'logprobs', 'finish_reason', 'matched_stop']);
    expect(chunks.map((c) => choiceOf(c).text).join('')).toBe(ANSWER);
    expect(choiceOf(chunks.at(-1)!)).toMatchObject({ finish_reason: 'stop', matched_stop: IM_END });
    expect(chunks.every((c) => c.usage === null)).toBe(true);
  });
});
