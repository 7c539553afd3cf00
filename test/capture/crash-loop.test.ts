/**
 * Crash safety under load: `mocker capture` (the spawned CLI) killed with SIGKILL while 64 short streams are in
 * flight, 20 times over on one capture file. Each answer of the vLLM double is known in advance, so what a
 * replay serves can be checked against it: whole, or not at all.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { generatedTexts, integrity, post } from '../support/fuzzRig.js';
import { startMockerProcess, type MockerProcess } from '../support/mockerProcess.js';
import { prng } from '../support/prng.js';
import { testTmpdir } from '../support/tempRoot.js';
import { MODEL, startUpstream, type Upstream } from '../support/vllmUpstream.js';

const ROUNDS = 20;
const IN_FLIGHT = 64;
const SEED = 20261124;

interface Sent {
  round: number;
  path: string;
  body: string;
  /** The double's whole answer to it. */
  answer: string;
  /** What the client had read when the response ended before the kill; null if it had not ended. */
  seen: string[] | null;
}

/**
 * The double answers each request with a text of its own, 4 ms a token: 1 to 24 tokens long, and one request in
 * eight 300 tokens longer (over a second), so that some are mid-way whenever the kill comes, even when a busy
 * machine holds this test's loop for a few hundred milliseconds (with 36 more, every answer had once ended before
 * the kill). The longest, 331 tokens, fit within max_tokens (512): a replay of one stored just before the kill
 * must equal its whole answer.
 */
const answerFor = (round: number, k: number) => `Round ${round} answer ${k}:${' go'.repeat((k % 24) + (k % 8 === 7 ? 300 : 0))}`;

function request(port: number, round: number, k: number): { sent: Sent; done: Promise<void> } {
  const chat = k % 2 === 1;
  const stream = k % 4 < 3;
  const ask = `Crash round ${round}, request ${k}`;
  const body = JSON.stringify(
    chat ? { model: MODEL, messages: [{ role: 'user', content: ask }], max_tokens: 512, stream } : { model: MODEL, prompt: ask, max_tokens: 512, stream },
  );
  const sent: Sent = { round, path: chat ? '/v1/chat/completions' : '/v1/completions', body, answer: answerFor(round, k), seen: null };
  const done = new Promise<void>((resolve) => {
    const req = http.request(
      { host: '127.0.0.1', port, path: sent.path, method: 'POST', headers: { 'content-type': 'application/json' }, agent: false },
      (res) => {
        let text = '';
        res.on('data', (d: Buffer) => (text += d.toString()));
        res.on('end', () => {
          if (res.statusCode === 200) sent.seen = generatedTexts(text);
          resolve();
        });
        res.on('error', () => resolve());
      },
    );
    req.on('error', () => resolve());
    req.end(body);
  });
  return { sent, done };
}

describe(`kill -9 of capture with ${IN_FLIGHT} streams in flight, ${ROUNDS} times on one file`, () => {
  let dir: string;
  let dbPath: string;
  let upstream: Upstream;
  let replay: MockerProcess | undefined;
  const sent: Sent[] = [];
  const integrityAfterKill: string[] = [];
  const killedMidway: number[] = [];

  beforeAll(async () => {
    dir = mkdtempSync(join(testTmpdir(), 'mocker-crash-loop-'));
    dbPath = join(dir, 'golden.db');
    upstream = await startUpstream((body) => {
      const [, round, k] = /round (\d+), request (\d+)/.exec(JSON.stringify(body)) ?? [];
      return { content: answerFor(Number(round), Number(k)), ttftMs: 2, gapMs: () => 4 };
    });
    const r = prng(SEED);
    for (let round = 0; round < ROUNDS; round++) {
      const capture = await startMockerProcess(['capture', '--upstream', upstream.url, '--captures', dbPath]);
      const generations = () => upstream.received.filter((q) => q.path.endsWith('completions')).length;
      const before = generations();
      const requests = Array.from({ length: IN_FLIGHT }, (_, k) => request(capture.port, round, k));
      // Killed once the engine has all 64 requests and two answers have ended (on a loaded machine, where the
      // recorder at nice 19 gets little CPU, that comes later), a little later each round.
      const ended = () => requests.filter((q) => q.sent.seen !== null).length;
      while (generations() - before < IN_FLIGHT || ended() < 2) await new Promise((resolve) => setTimeout(resolve, 2));
      await new Promise((resolve) => setTimeout(resolve, r.int(0, 20)));
      capture.child.kill('SIGKILL');
      await new Promise((resolve) => capture.child.once('exit', resolve));
      await Promise.all(requests.map((q) => q.done));
      sent.push(...requests.map((q) => q.sent));
      killedMidway.push(requests.filter((q) => q.sent.seen === null).length);
      integrityAfterKill.push(integrity(dbPath));
    }
    replay = await startMockerProcess(['serve', '--mode', 'replay', '--captures', dbPath, '--timing', 'none']);
  }, 180_000);

  afterAll(async () => {
    await replay?.stop();
    await upstream?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('kills each round with some answers ended and some mid-way', () => {
    expect(killedMidway).toHaveLength(ROUNDS);
    expect(killedMidway.every((n) => n > 0)).toBe(true);
    expect(killedMidway.some((n) => n < IN_FLIGHT)).toBe(true);
  });

  it('leaves a file that passes PRAGMA integrity_check after every kill', () => {
    expect(integrityAfterKill).toEqual(Array.from({ length: ROUNDS }, () => 'ok'));
  });

  it('replays every answer that ended before its kill, as the client saw it, and serves nothing half-written', async () => {
    const ended = sent.filter((s) => s.seen !== null);
    expect(ended.length).toBeGreaterThan(ROUNDS);
    for (const s of ended) expect(s.seen, s.body).toEqual([s.answer]);
    const problems: string[] = [];
    let replayedCut = 0;
    for (const s of sent) {
      const res = await post(replay!.port, s.path, s.body);
      if (s.seen !== null) {
        if (res.status !== 200 || generatedTexts(res.text)[0] !== s.answer)
          problems.push(`ended before the kill, replayed ${res.status} ${res.text.slice(0, 200)}: ${s.body}`);
        continue;
      }
      // Cut by the kill: never stored (404), or stored whole just before it (its engine had answered in full).
      if (res.status === 200) {
        replayedCut++;
        if (generatedTexts(res.text)[0] !== s.answer) problems.push(`cut by the kill, replayed half: ${res.text.slice(0, 300)}: ${s.body}`);
      } else if (res.status !== 404) problems.push(`cut by the kill, answered ${res.status} ${res.text.slice(0, 200)}: ${s.body}`);
    }
    expect(problems).toEqual([]);
    // Most cut answers were cut mid-way: they were never stored.
    expect(replayedCut).toBeLessThan(sent.length - ended.length);
  });
});
