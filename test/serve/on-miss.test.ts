/** `--on-miss passthrough | record`: a miss goes to the real engine; `record` keeps the answer as a new capture. */
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, describe, expect, it } from 'vitest';
import { serveInProcess, type Running } from '../support/inProcess.js';
import { mockerCounters } from '../support/mockerCounters.js';
import { MODEL, startUpstream } from '../support/vllmUpstream.js';
import { testTmpdir } from '../support/tempRoot.js';

const ANSWER = 'Forwarded from the engine.';
const running: Running[] = [];
const dirs: string[] = [];
afterEach(async () => {
  for (const s of running.splice(0)) await s.close();
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

const ask = async (port: number) => {
  const res = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, prompt: 'Remember me', max_tokens: 16 }),
  });
  return { status: res.status, json: (await res.json()) as { choices?: { text: string }[] } };
};
const storedExchanges = (db: string) => {
  const sqlite = new Database(db, { readonly: true });
  try {
    return (sqlite.prepare("select count(*) as n from exchanges where outcome = 'complete'").get() as { n: number }).n;
  } finally {
    sqlite.close();
  }
};

describe('--on-miss', () => {
  for (const policy of ['passthrough', 'record'] as const) {
    it(`${policy}: a miss is answered by the upstream${policy === 'record' ? ', and replayed once it is gone' : ', and nothing is stored'}`, async () => {
      const dir = mkdtempSync(join(testTmpdir(), 'mocker-miss-'));
      dirs.push(dir);
      const db = join(dir, 'captures.db');
      const upstream = await startUpstream(() => ({ content: ANSWER }));
      const server = await serveInProcess({ mode: 'replay', captures: db, timing: 'none', onMiss: policy, upstream: upstream.url });
      running.push(server);
      const first = await ask(server.port);
      expect(first.status).toBe(200);
      expect(first.json.choices?.[0].text).toBe(ANSWER);
      await upstream.close();
      const again = await ask(server.port);
      const counters = await mockerCounters(server.port);
      const noErrors = {
        'mocker_upstream_errors_total{timeout}': 0,
        'mocker_upstream_errors_total{broken_stream}': 0,
        'mocker_upstream_errors_total{error_status}': 0,
      };
      if (policy === 'record') {
        expect(storedExchanges(db)).toBe(1);
        expect(again.status).toBe(200);
        expect(again.json.choices?.[0].text).toBe(ANSWER);
        // The first ask missed and was recorded; the second hit the new capture.
        expect(counters).toEqual({
          mocker_capture_hits_total: 1,
          mocker_capture_prefix_hits_total: 0,
          'mocker_capture_misses_total{no_match}': 1,
          'mocker_capture_misses_total{too_short}': 0,
          mocker_captures_written_total: 1,
          'mocker_upstream_errors_total{unreachable}': 0,
          ...noErrors,
        });
      } else {
        // The capture file is only read (not there: every request misses), never created.
        expect(existsSync(db)).toBe(false);
        expect(again.status).toBe(502);
        // Both asks missed; the second found the upstream gone.
        expect(counters).toEqual({
          mocker_capture_hits_total: 0,
          mocker_capture_prefix_hits_total: 0,
          'mocker_capture_misses_total{no_match}': 2,
          'mocker_capture_misses_total{too_short}': 0,
          mocker_captures_written_total: 0,
          'mocker_upstream_errors_total{unreachable}': 1,
          ...noErrors,
        });
      }
    });
  }
});

describe('several captures of one prompt', () => {
  it('a request for more tokens than one holds is answered by another that holds enough, never a partial hit', async () => {
    const dir = mkdtempSync(join(testTmpdir(), 'mocker-miss-'));
    dirs.push(dir);
    const db = join(dir, 'captures.db');
    const upstream = await startUpstream(() => ({ content: 'one two three four five six seven eight nine ten eleven twelve' }));
    const recorder = await serveInProcess({ mode: 'replay', captures: db, timing: 'none', onMiss: 'record', upstream: upstream.url });
    const askFor = async (port: number, maxTokens: number) => {
      const res = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, prompt: 'Count', max_tokens: maxTokens }),
      });
      return { status: res.status, text: res.ok ? ((await res.json()) as { choices: { text: string }[] }).choices[0].text : await res.text() };
    };
    // Recorded in this order: 4 tokens (cut by length), then 10 (the 4-token capture is too short for it).
    const short = await askFor(recorder.port, 4);
    const long = await askFor(recorder.port, 10);
    await recorder.close();
    await upstream.close();
    expect(storedExchanges(db)).toBe(2);
    expect(long.text.startsWith(short.text)).toBe(true);

    const replay = await serveInProcess({ mode: 'replay', captures: db, timing: 'none' });
    running.push(replay);
    // Asked again and again: whichever capture comes first, the answer is the one that holds 10 tokens.
    for (let i = 0; i < 4; i++) expect(await askFor(replay.port, 10)).toEqual(long);
    expect((await mockerCounters(replay.port))['mocker_capture_misses_total{too_short}']).toBe(0);
  });
});

describe('a recorded batch of prompts (completions with a list of prompts)', () => {
  it("is stored whole and never answers a replay of one of its prompts with another prompt's answer", async () => {
    const dir = mkdtempSync(join(testTmpdir(), 'mocker-miss-'));
    dirs.push(dir);
    const db = join(dir, 'captures.db');
    const engine = await serveInProcess({ mode: 'simulate', captures: ':memory:', timing: 'none' });
    running.push(engine);
    const recorder = await serveInProcess({ mode: 'replay', captures: db, timing: 'none', onMiss: 'record', upstream: `http://127.0.0.1:${engine.port}` });
    const complete = async (port: number, prompt: unknown) => {
      const res = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, prompt, max_tokens: 5 }),
      });
      return { status: res.status, text: await res.text() };
    };
    const batch = await complete(recorder.port, ['Alpha prompt', 'Beta prompt']);
    await recorder.close();
    expect(batch.status).toBe(200);
    expect((JSON.parse(batch.text) as { choices: unknown[] }).choices.length).toBe(2);
    expect(storedExchanges(db)).toBe(1);

    const replay = await serveInProcess({ mode: 'replay', captures: db, timing: 'none' });
    running.push(replay);
    for (const prompt of ['Alpha prompt', 'Beta prompt']) {
      const alone = await complete(replay.port, prompt);
      expect(alone.status, prompt).toBe(404);
      expect((JSON.parse(alone.text) as { error: { type: string } }).error.type).toBe('NotFoundError');
    }
  });
});
