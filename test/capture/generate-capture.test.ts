/**
 * vLLM's token-in/token-out `/inference/v1/generate` through `mocker capture` in front of the vLLM double and back
 * out of `mocker serve --mode replay` with the double gone: the engine's own prompt and output ids stored, every
 * event's bytes and time, the same bytes replayed (ids restamped), and the `captures` commands reading it.
 * Every mocker is the built CLI in its own process.
 */
import { mkdtempSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mockerProcesses, runMockerToExit } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';
import { encode, EOS, MODEL, startUpstream, type Upstream } from '../support/vllmUpstream.js';

const dir = mkdtempSync(join(testTmpdir(), 'generate-capture-'));
const db = join(dir, 'captures.db');
const otherDb = join(dir, 'other-build.db');
const mockers = mockerProcesses();
let upstream: Upstream;
/** What the clients got through the capture proxy, by request name. */
const proxied = new Map<string, string>();

const ANSWER = 'Hello from the double, one token at a time.';
const PROMPT = [9707, 1879, 11, 1246, 525];
const OTHER_PROMPT = [785, 6722, 315, 9625, 374];
const REQUESTS = {
  whole: { model: MODEL, token_ids: PROMPT, sampling_params: { max_tokens: 32, temperature: 0 } },
  streamed: { model: MODEL, token_ids: OTHER_PROMPT, sampling_params: { max_tokens: 6 }, stream: true, stream_options: { include_usage: true } },
  // No model named, and a stream names none either: the engine's.
  unnamed: { token_ids: [40, 1079, 264], sampling_params: { max_tokens: 4, seed: 7 }, stream: true },
} as const;

const post = (url: string, body: unknown, requestId: string) =>
  fetch(`${url}/inference/v1/generate`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-request-id': requestId },
    body: JSON.stringify(body),
  });
/** What vLLM regenerates per request: `request_id` (and the non-streamed answer's `created`). */
const normalize = (text: string) => text.replaceAll(/"request_id":"[^"]*"/g, '"request_id":"X"').replace(/"created":\d+/, '"created":0');

beforeAll(async () => {
  upstream = await startUpstream(() => ({ content: ANSWER, finish: 'stop', gapMs: () => 5 }));
  const capture = await mockers.start(['capture', '--upstream', upstream.url, '--captures', db]);
  for (const [name, body] of Object.entries(REQUESTS)) {
    const res = await post(capture.url, body, `captured-${name}`);
    expect(res.status, name).toBe(200);
    proxied.set(name, await res.text());
  }
  await capture.stop();
  // A build that answers otherwise, asked one of the two requests.
  const other = await startUpstream(() => ({ content: 'Another answer entirely.', finish: 'stop' }));
  const otherCapture = await mockers.start(['capture', '--upstream', other.url, '--captures', otherDb]);
  expect((await post(otherCapture.url, REQUESTS.whole, 'other-build')).status).toBe(200);
  await otherCapture.stop();
  await other.close();
}, 60_000);

afterAll(async () => {
  await mockers.stopAll();
  await upstream?.close();
});

interface Row {
  endpoint: string;
  stream: number;
  path: string;
  id: number;
  model: string;
}

describe('capture of /inference/v1/generate', () => {
  it("forwards the double's answers: vLLM's GenerateResponse and its data:-only stream, the engine's ids", async () => {
    const answerIds = [...(await encode(ANSWER, false)), EOS];
    const whole = JSON.parse(proxied.get('whole')!) as { request_id: string; choices: { token_ids: number[]; finish_reason: string }[] };
    expect(whole.request_id).toBe('generate-tokens-captured-whole');
    expect(whole.choices[0]).toMatchObject({ token_ids: answerIds, finish_reason: 'stop' });
    const streamed = proxied.get('streamed')!;
    expect(streamed.endsWith('data: [DONE]\n\n')).toBe(true);
    expect(streamed).not.toContain('event:');
  });

  it("records them as endpoint 'generate': prompt ids = the request's token_ids, output ids = the answer's, every event's time", () => {
    const file = new Database(db, { readonly: true });
    try {
      const rows = file.prepare('select id, endpoint, stream, path, model from exchanges order by id').all() as Row[];
      expect(rows.map((r) => [r.endpoint, r.path, r.stream, r.model])).toEqual([
        ['generate', '/inference/v1/generate', 0, MODEL],
        ['generate', '/inference/v1/generate', 1, MODEL],
        ['generate', '/inference/v1/generate', 1, MODEL],
      ]);
    } finally {
      file.close();
    }
  });

  it('captures show prints the exchange with its endpoint, prompt ids and output ids', async () => {
    const answerIds = [...(await encode(ANSWER, false)), EOS];
    const shown = await runMockerToExit(['captures', 'show', db, '1', '--json']);
    expect(shown.code, shown.stderr).toBe(0);
    const json = JSON.parse(shown.stdout) as {
      endpoint: string;
      promptIds: number[];
      tokenSource: string;
      choices: { outputIds: number[]; finishReason: string }[];
    };
    expect(json.endpoint).toBe('generate');
    expect(json.promptIds).toEqual(PROMPT);
    expect(json.tokenSource).toBe('engine');
    expect(json.choices).toHaveLength(1);
    expect(json.choices[0]).toMatchObject({ outputIds: answerIds, finishReason: 'stop' });
    const streamed = JSON.parse((await runMockerToExit(['captures', 'show', db, '2', '--json'])).stdout) as typeof json & {
      choices: { chunks: { atMs: number; ids: number[] }[] }[];
    };
    expect(streamed.promptIds).toEqual(OTHER_PROMPT);
    // One chunk per event the double sent, each with its own arrival time.
    const chunks = streamed.choices[0].chunks;
    expect(chunks.map((c) => c.ids.length)).toEqual(chunks.map(() => 1));
    expect(chunks.flatMap((c) => c.ids)).toHaveLength(6);
    expect(chunks.every((c, i) => c.atMs > 0 && (i === 0 || c.atMs >= chunks[i - 1].atMs))).toBe(true);
    const text = await runMockerToExit(['captures', 'show', db, '2']);
    expect(text.code, text.stderr).toBe(0);
    expect(text.stdout).toContain('generate');
    expect(text.stdout).toContain('/inference/v1/generate');
    const listed = await runMockerToExit(['captures', 'list', db]);
    expect(listed.code, listed.stderr).toBe(0);
    expect(listed.stdout).toContain('0 chat, 0 completion, 3 generate)');
  });

  it('captures verify checks them and finds no mismatch; stats reads their timing', async () => {
    const verified = await runMockerToExit(['captures', 'verify', db, '--json']);
    expect(verified.code, verified.stdout + verified.stderr).toBe(0);
    expect(JSON.parse(verified.stdout)).toMatchObject({ exchanges: 3, verified: 3, matched: 3, skipped: 0, comparedBy: { bytes: 3 } });
    const stats = await runMockerToExit(['captures', 'stats', db]);
    expect(stats.code, stats.stderr).toBe(0);
    expect(stats.stdout).toContain('2 streamed, 1 not streamed generation exchanges');
    expect(stats.stdout).toMatch(/Time to First Token/);
  });

  it('captures diff pairs them: none differ against the file itself, the other build’s output does', async () => {
    const same = await runMockerToExit(['captures', 'diff', db, db, '--json']);
    expect(same.code, same.stdout + same.stderr).toBe(0);
    expect(JSON.parse(same.stdout)).toMatchObject({ paired: 3, identical: 3, differs: false });
    const changed = await runMockerToExit(['captures', 'diff', db, otherDb, '--json']);
    expect(changed.code, changed.stdout + changed.stderr).toBe(1);
    expect(JSON.parse(changed.stdout)).toMatchObject({ paired: 1, promptChanges: 0, outputChanges: 1, onlyInA: 2, onlyInB: 0 });
  });
});

describe('serve --mode replay of /inference/v1/generate, the double stopped', () => {
  let replay: string;
  beforeAll(async () => {
    await upstream.close();
    replay = (await mockers.start(['serve', '--mode', 'replay', '--captures', db])).url;
  }, 60_000);

  it('answers each captured request with its captured bytes, request_id restamped from X-Request-Id, created now', async () => {
    const capturedCreated = (JSON.parse(proxied.get('whole')!) as { created: number }).created;
    // A second later than the capture's, so that a fresh `created` shows.
    while (Math.floor(Date.now() / 1000) <= capturedCreated) await new Promise((r) => setTimeout(r, 100));
    const whole = (await (await post(replay, REQUESTS.whole, 'fresh')).json()) as { created: number };
    expect(whole.created).toBeGreaterThan(capturedCreated);
    expect(whole.created).toBeLessThanOrEqual(Math.floor(Date.now() / 1000));
    for (const [name, body] of Object.entries(REQUESTS)) {
      const res = await post(replay, body, `replayed-${name}`);
      expect(res.status, name).toBe(200);
      const text = await res.text();
      expect(text, name).toContain('"request_id":"generate-tokens-replayed-');
      expect(text, name).not.toContain('captured-');
      expect(normalize(text), name).toBe(normalize(proxied.get(name)!));
    }
  });

  it('rerun of the capture against its own replay: every exchange the same', async () => {
    const rerun = await runMockerToExit(['rerun', db, '--target', replay, '-o', join(dir, 'rerun.db'), '--json']);
    expect(rerun.code, rerun.stdout + rerun.stderr).toBe(0);
    const report = JSON.parse(rerun.stdout) as { exchanges: { endpoint: string; verdict: string }[] };
    expect(report.exchanges.map((e) => [e.endpoint, e.verdict])).toEqual([
      ['generate', 'same'],
      ['generate', 'same'],
      ['generate', 'same'],
    ]);
  });

  it('rerun against another build (random tokens): the greedy request regresses, the sampled one is reported', async () => {
    const random = (await mockers.start(['serve', '--mode', 'random', '--timing', 'none'])).url;
    const rerun = await runMockerToExit(['rerun', db, '--target', random, '-o', join(dir, 'rerun-random.db'), '--json']);
    expect(rerun.code, rerun.stdout + rerun.stderr).toBe(1);
    const report = JSON.parse(rerun.stdout) as { exchanges: { verdict: string }[] };
    // `whole` asks for temperature 0 in its sampling_params, `unnamed` a seed; `streamed` samples.
    expect(report.exchanges.map((e) => e.verdict)).toEqual(['regression', 'sampled', 'regression']);
  });

  it('answers another shape of the same prompt with the captured ids, rendered', async () => {
    const res = await post(replay, { ...REQUESTS.whole, stream: true }, 'other-shape');
    const text = await res.text();
    const ids = text
      .split('\n\n')
      .filter((e) => e.startsWith('data: {'))
      .flatMap((e) => (JSON.parse(e.slice(6)) as { choices: { token_ids: number[] }[] }).choices.flatMap((c) => c.token_ids));
    const captured = JSON.parse(proxied.get('whole')!) as { choices: { token_ids: number[] }[] };
    expect(ids).toEqual(captured.choices[0].token_ids);
  });
});
