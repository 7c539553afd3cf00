/**
 * A capture file as a trace (`mocker trace --from-captures`): a file written by the real `mocker capture` in
 * front of the vLLM double, read back as sessions and checked against what this test sent and received; then
 * sent as load to `mocker serve --mode replay` of the same file (answers are `mocker rerun`'s to check).
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { capturedWorkload, type CapturedWorkload } from '../../src/trace/capturedWorkload.js';
import { runMockerToExit, startMockerProcess, type MockerProcess } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';
import { MODEL, startUpstream, type Upstream } from '../support/vllmUpstream.js';

type Json = Record<string, unknown>;

const ANSWERS = ['The first captured answer.', 'A second one, streamed to the client.', 'Third: digits 12345 and more.', 'And the fourth, last answer.'];
/** Ordinary Qwen3 token ids; the first one names the request. */
const prompt = (k: number) => Array.from({ length: 16 + 7 * k }, (_, i) => 1000 + 500 * k + i);
const FAILING = 5000;
const SLOW = 6000;

interface Sent {
  prompt: number[];
  /** Date.now() just before sending and just after the answer ended: the captured start lies between. */
  before: number;
  after: number;
  ids: number[];
}

async function post(url: string, body: Json, path = '/v1/completions'): Promise<Response> {
  return fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
}

/** The output ids of an answer the client asked with `return_token_ids`, streamed or not. */
async function idsOf(res: Response, stream: boolean): Promise<number[]> {
  expect(res.status).toBe(200);
  if (!stream) return ((await res.json()) as { choices: { token_ids: number[] }[] }).choices[0].token_ids;
  const ids: number[] = [];
  for (const line of (await res.text()).split('\n')) {
    if (!line.startsWith('data: {')) continue;
    const chunk = JSON.parse(line.slice(6)) as { choices: { token_ids?: number[] | null }[] };
    for (const choice of chunk.choices) ids.push(...(choice.token_ids ?? []));
  }
  return ids;
}

describe('capturedWorkload on a file written by mocker capture', () => {
  let dir: string;
  let file: string;
  let upstream: Upstream;
  const sent: Sent[] = [];
  let captured: CapturedWorkload;

  beforeAll(async () => {
    dir = mkdtempSync(join(testTmpdir(), 'mocker-trace-captures-'));
    file = join(dir, 'captures.db');
    upstream = await startUpstream((body) => {
      const first = (body.prompt as unknown[])[0];
      if (Array.isArray(first)) return { content: 'One answer for a batch.' };
      if (first === FAILING) return { errorStatus: 500 };
      if (first === SLOW) return { content: ' slowly'.repeat(40), gapMs: () => 50 };
      return { content: ANSWERS[((first as number) - 1000) / 500] };
    });
    const capture = await startMockerProcess(['capture', '--upstream', upstream.url, '--captures', file], 0, { cwd: dir });
    const url = `http://127.0.0.1:${capture.port}`;
    const complete = async (k: number, stream: boolean) => {
      const before = Date.now();
      const res = await post(url, { model: MODEL, prompt: prompt(k), max_tokens: 64, stream, return_token_ids: true });
      const ids = await idsOf(res, stream);
      sent.push({ prompt: prompt(k), before, after: Date.now(), ids });
    };
    // Saved in this order: exchange ids 1 to 7.
    await complete(0, false);
    await complete(1, true);
    expect((await post(url, { model: MODEL, prompt: [FAILING, 1, 2], max_tokens: 8 })).status).toBe(500);
    await complete(2, false);
    await (
      await post(url, {
        model: MODEL,
        prompt: [
          [7000, 7001],
          [7100, 7101],
        ],
        max_tokens: 8,
      })
    ).text();
    await complete(3, true);
    // Cut by the client after its first chunk: aborted.
    const slow = (await post(url, { model: MODEL, prompt: [SLOW, 1, 2], max_tokens: 40, stream: true })).body!.getReader();
    await slow.read();
    await slow.cancel();
    await new Promise((resolve) => setTimeout(resolve, 300));
    await capture.stop();
    captured = capturedWorkload(file);
  });

  afterAll(async () => {
    await upstream?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('makes each complete exchange with prompt ids a single-turn session, in captured order, and counts the others', () => {
    const sessions = captured.workload.sessions;
    expect(captured.workload.requests).toBe(4);
    expect(sessions.map((s) => s.turns.length)).toEqual([1, 1, 1, 1]);
    const turns = sessions.map((s) => s.turns[0]);
    expect(turns.map((t) => t.prompt())).toEqual(sent.map((s) => s.prompt));
    expect(turns.map((t) => t.inputLength)).toEqual(sent.map((s) => s.prompt.length));
    // Every answer ended on EOS, which is among the output ids.
    expect(turns.map((t) => t.outputLength)).toEqual(sent.map((s) => s.ids.length));
    expect(turns.map((t) => t.delayMs)).toEqual([0, 0, 0, 0]);
    expect(sessions.map((s) => s.id)).toEqual(['exchange-1', 'exchange-2', 'exchange-4', 'exchange-6']);
    sessions.forEach((s, i) => {
      expect(s.startMs).toBeGreaterThanOrEqual(sent[i].before);
      expect(s.startMs).toBeLessThanOrEqual(sent[i].after);
    });
    expect(captured.models).toEqual([MODEL]);
    expect(captured.skipped).toEqual({ failed: 1, aborted: 1, batched: 1, withoutPromptIds: 0 });
    // Distinct prompts, none extending another: four conversations of one turn.
    expect(captured.notes).toEqual([
      '3 exchange(s) skipped: 1 failed, 1 aborted, 1 with several choices (a batch of prompts or n > 1)',
      '4 turn(s) in 4 conversation(s): 0 continue an earlier exchange after its tool or think time',
    ]);
  });
});

describe('mocker trace --from-captures --target: a load, not a comparison', () => {
  let dir: string;
  let upstream: Upstream;
  let replay: MockerProcess | undefined;

  beforeAll(async () => {
    dir = mkdtempSync(join(testTmpdir(), 'mocker-trace-captures-load-'));
    upstream = await startUpstream((body) => ({ content: body.messages ? 'A chat answer, templated.' : ANSWERS[0] }));
  });

  afterAll(async () => {
    await replay?.stop();
    await upstream?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('sends a chat and completion capture to a replay of itself: exit 0, no mismatch, and points to mocker rerun', async () => {
    const file = join(dir, 'golden.db');
    const capture = await startMockerProcess(['capture', '--upstream', upstream.url, '--captures', file], 0, { cwd: dir });
    const url = `http://127.0.0.1:${capture.port}`;
    const answered = async (res: Response) => {
      expect(res.status).toBe(200);
      await res.text();
    };
    const chat = (content: string, stream: boolean) =>
      post(url, { model: MODEL, messages: [{ role: 'user', content }], max_tokens: 32, stream }, '/v1/chat/completions');
    await answered(await chat('First question?', false));
    await answered(await chat('Second question?', true));
    await answered(await post(url, { model: MODEL, prompt: 'Complete this', max_tokens: 32 }));
    await answered(await post(url, { model: MODEL, prompt: prompt(1), max_tokens: 32, stream: true }));
    await capture.stop();

    replay = await startMockerProcess(['serve', '--mode', 'replay', '--captures', file, '--timing', 'none'], 0, { cwd: dir });
    const target = `http://127.0.0.1:${replay.port}`;
    const { code, stdout, stderr } = await runMockerToExit(
      ['trace', '--from-captures', file, '--target', target, '--report-json', join(dir, 'report.json'), '--no-progress'],
      { cwd: dir },
    );
    expect(`${stdout}${stderr}`).not.toMatch(/mismatch/i);
    // Every exchange was sent (a load: how the target answered is counted, not judged).
    expect((JSON.parse(readFileSync(join(dir, 'report.json'), 'utf8')) as { num_requests: number }).num_requests).toBe(4);
    expect(stdout.trim().split('\n').at(-1)).toBe(`Answers are not compared here: mocker rerun ${file} --target ${target} checks them against the capture`);
    expect(code).toBe(0);
  });
});
