import { mkdtempSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { captureInProcess, serveInProcess, type Running } from '../support/inProcess.js';
import { CHAT_TEMPLATE, decode, MODEL, promptIds, startUpstream } from '../support/vllmUpstream.js';
import { testTmpdir } from '../support/tempRoot.js';

const SYSTEM = 'You are a careful assistant. Answer in one short sentence.';
const messages = [
  { role: 'system', content: SYSTEM },
  { role: 'user', content: 'What is the capital of France?' },
];
const captured = { model: MODEL, messages, max_tokens: 16 };

/** The shipped template with one character added: a full stop after the system prompt. */
const SYSTEM_LINE = "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}";
const EDITED_TEMPLATE = CHAT_TEMPLATE.replace(SYSTEM_LINE, "{{- '<|im_start|>system\\n' + messages[0].content + '.<|im_end|>\\n' }}");

describe('miss diagnostics', () => {
  let replay: Running;

  beforeAll(async () => {
    const dbPath = join(mkdtempSync(join(testTmpdir(), 'mocker-miss-')), 'golden.db');
    const upstream = await startUpstream(() => ({ content: 'Paris is the capital of France.' }));
    const capture = await captureInProcess({
      upstream: upstream.url,
      captures: dbPath,
    });
    const res = await fetch(`http://127.0.0.1:${capture.port}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(captured),
    });
    expect(res.status).toBe(200);
    await capture.close();
    await upstream.close();
    // The edited template travels in the request, as vLLM takes it only with --trust-request-chat-template.
    replay = await serveInProcess({ mode: 'replay', captures: dbPath, timing: 'none', trustRequestChatTemplate: true });
  });

  afterAll(async () => {
    await replay?.close();
  });

  const ask = (body: Record<string, unknown>) =>
    fetch(`http://127.0.0.1:${replay.port}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });

  it('the unchanged request hits', async () => {
    const res = await ask(captured);
    expect(res.status).toBe(200);
    expect(((await res.json()) as { choices: { message: { content: string } }[] }).choices[0].message.content).toBe('Paris is the capital of France.');
  });

  it('a chat template changed by one character misses, naming the diverging token and the text on both sides', async () => {
    expect(EDITED_TEMPLATE).not.toBe(CHAT_TEMPLATE);
    expect(EDITED_TEMPLATE.length).toBe(CHAT_TEMPLATE.length + 1);
    // The oracle: both prompts rendered and tokenized by the reference implementation.
    const want = await promptIds(captured, true);
    const got = await promptIds({ ...captured, chat_template: EDITED_TEMPLATE }, true);
    let at = 0;
    while (got[at] === want[at]) at++;

    const res = await ask({ ...captured, chat_template: EDITED_TEMPLATE });
    expect(res.status).toBe(404);
    const body = (await res.json()) as { error: { message: string; type: string; code: number } };
    expect(body.error.type).toBe('NotFoundError');
    expect(body.error.code).toBe(404);
    const message = body.error.message;
    expect(message).toContain(`${got.length} prompt tokens`);
    expect(message).toContain(`diverge at token position ${at}`);
    expect(message).toContain(`token id ${got[at]}`);
    expect(message).toContain(`token id ${want[at]}`);
    // The differing text itself, decoded on each side (JSON-quoted in the message).
    const requestSide = await decode(got.slice(at, at + 1), false);
    const captureSide = await decode(want.slice(at, at + 1), false);
    expect(requestSide).toContain('.');
    expect(message).toContain(JSON.stringify(requestSide).slice(1, -1));
    expect(message).toContain(JSON.stringify(captureSide).slice(1, -1));
    // And the common text just before it (the end of the system prompt, without its full stop).
    const before = await decode(want.slice(at - 4, at), false);
    expect(SYSTEM).toContain(before);
    expect(message).toContain(`${JSON.stringify(before).slice(1)}.`);
  });
});
