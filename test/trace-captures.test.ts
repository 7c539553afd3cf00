/**
 * A capture file as a trace (`mocker trace --from-captures`): a file written by the real `mocker capture` in
 * front of the vLLM double, read back as sessions and checked against what this test sent and received; then
 * the sessions replayed online against `mocker serve` processes, whose answers are compared with the capture.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AnswerComparison, capturedWorkload, type CapturedWorkload } from '../src/trace/capturedWorkload.js';
import { runMockerToExit, startMockerProcess, type MockerProcess } from './support/mockerProcess.js';
import { testTmpdir } from './support/tempRoot.js';
import { MODEL, startUpstream, type Upstream } from './support/vllmUpstream.js';

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
  text: string;
}

async function post(url: string, body: Json): Promise<Response> {
  return fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
}

/** The output ids and text of a completion the client asked with `return_token_ids`, streamed or not. */
async function answerOf(res: Response, stream: boolean): Promise<{ ids: number[]; text: string }> {
  expect(res.status).toBe(200);
  if (!stream) {
    const [choice] = ((await res.json()) as { choices: { text: string; token_ids: number[] }[] }).choices;
    return { ids: choice.token_ids, text: choice.text };
  }
  const out = { ids: [] as number[], text: '' };
  for (const line of (await res.text()).split('\n')) {
    if (!line.startsWith('data: {')) continue;
    const chunk = JSON.parse(line.slice(6)) as { choices: { text: string; token_ids: number[] | null }[] };
    for (const choice of chunk.choices) {
      out.text += choice.text;
      out.ids.push(...(choice.token_ids ?? []));
    }
  }
  return out;
}

describe('capturedWorkload and AnswerComparison on a file written by mocker capture', () => {
  let dir: string;
  let file: string;
  let upstream: Upstream;
  const processes: MockerProcess[] = [];
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
      const answer = await answerOf(res, stream);
      sent.push({ prompt: prompt(k), before, after: Date.now(), ...answer });
    };
    // Saved in this order: exchange ids 1 to 7.
    await complete(0, false);
    await complete(1, true);
    expect((await post(url, { model: MODEL, prompt: [FAILING, 1, 2], max_tokens: 8 })).status).toBe(500);
    await complete(2, false);
    await (await post(url, { model: MODEL, prompt: [[7000, 7001], [7100, 7101]], max_tokens: 8 })).text();
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
    await Promise.all(processes.map((p) => p.stop()));
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
    expect(turns.map((t) => t.ref)).toEqual(['1', '2', '4', '6']);
    sessions.forEach((s, i) => {
      expect(s.startMs).toBeGreaterThanOrEqual(sent[i].before);
      expect(s.startMs).toBeLessThanOrEqual(sent[i].after);
    });
    expect([...captured.expected]).toEqual(turns.map((t, i) => [t.ref, { outputTokenIds: sent[i].ids, text: sent[i].text }]));
    expect(captured.models).toEqual([MODEL]);
    expect(captured.skipped).toEqual({ failed: 1, aborted: 1, batched: 1, withoutPromptIds: 0 });
    expect(captured.notes).toEqual(['3 exchange(s) skipped: 1 failed, 1 aborted, 1 with several choices (a batch of prompts or n > 1)']);
  });

  /** `mocker trace --from-captures FILE --target URL` against `mocker serve` with these flags: exit code and what it printed. */
  async function replayAgainst(args: string[]): Promise<{ code: number | null; stdout: string }> {
    const server = await startMockerProcess(['serve', ...args, '--captures', file, '--timing', 'none'], 0, { cwd: dir });
    processes.push(server);
    const { code, stdout, stderr } = await runMockerToExit(['trace', '--from-captures', file, '--target', `http://127.0.0.1:${server.port}`, '--report-json', join(dir, 'report.json'), '--force', '--no-progress'], { cwd: dir });
    // The skipped exchanges are said once, on stderr.
    expect(stderr).toBe(`mocker trace: ${captured.notes[0]}\n`);
    return { code, stdout };
  }

  it('finds no mismatch against mocker serve --mode replay of the same file', async () => {
    const { code, stdout } = await replayAgainst(['--mode', 'replay']);
    expect(stdout).toContain('Compared 4 answers with the capture: 0 mismatch(es)');
    expect(stdout).toMatch(/┃ Request Count \(requests\) +┃ +4\.00 ┃/);
    expect(code).toBe(0);
  });

  it('finds every answer different from mocker serve --mode random, and exits 1', async () => {
    const { code, stdout } = await replayAgainst(['--mode', 'random', '--seed', '7']);
    expect(stdout).toContain('Compared 4 answers with the capture: 4 mismatch(es)');
    const examples = stdout.split('\n').filter((line) => line.startsWith('  exchange '));
    expect(examples.map((line) => /exchange (\d+):/.exec(line)![1]).sort()).toEqual(['1', '2', '4', '6']);
    for (const line of examples) expect(line).toMatch(/: output token \d+: expected \d+/);
    expect(code).toBe(1);
  });
});

describe('AnswerComparison', () => {
  const ok = (outputTokenIds: number[] | null, text: string | null) => ({ outputTokenIds, text, error: null });

  it('compares output ids when both sides have them, naming the first differing position', () => {
    const comparison = new AnswerComparison(new Map([['a', { outputTokenIds: [5, 6, 7], text: 'x' }]]));
    comparison.check('a', ok([5, 6, 7], 'another spelling'));
    comparison.check('a', ok([5, 9, 7], 'x'));
    comparison.check('a', ok([5, 6], 'x'));
    comparison.check('a', ok([5, 6, 7, 8], 'x'));
    expect(comparison.summary()).toEqual({
      compared: 4,
      mismatches: 3,
      examples: [
        { ref: 'a', reason: 'output token 1: expected 6, got 9' },
        { ref: 'a', reason: 'output token 2: expected 3 tokens, got 2' },
        { ref: 'a', reason: 'output token 3: expected 3 tokens, got 4' },
      ],
    });
  });

  it('compares text when either side has no ids, naming the first differing offset; an error is a mismatch', () => {
    const comparison = new AnswerComparison(new Map([['t', { outputTokenIds: null, text: 'Hello world' }], ['u', { outputTokenIds: [1], text: 'Hi' }]]));
    comparison.check('t', ok([1, 2], 'Hello world'));
    comparison.check('t', ok([1, 2], 'Hello there'));
    comparison.check('u', ok(null, 'Hi!'));
    comparison.check('u', { outputTokenIds: null, text: null, error: 'HTTP 503: overloaded' });
    comparison.check('v', ok([1], 'Hi'));
    expect(comparison.summary().examples).toEqual([
      { ref: 't', reason: 'text offset 6: expected "world", got "there"' },
      { ref: 'u', reason: 'text offset 2: expected "", got "!"' },
      { ref: 'u', reason: 'error: HTTP 503: overloaded' },
      { ref: 'v', reason: 'not in the capture' },
    ]);
  });

  it('keeps the first 10 examples and counts every mismatch', () => {
    const comparison = new AnswerComparison(new Map([['r', { outputTokenIds: [1], text: '' }]]));
    for (let i = 0; i < 25; i++) comparison.check('r', ok([2], ''));
    const summary = comparison.summary();
    expect(summary).toMatchObject({ compared: 25, mismatches: 25 });
    expect(summary.examples).toHaveLength(10);
  });
});
