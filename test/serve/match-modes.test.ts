/**
 * `mocker serve --match exact|prefix|sequence`, `--min-prefix-ratio` and `--ignore-field` as a user runs them: a
 * capture file made by the built CLI (`mocker capture`) in front of the vLLM double, which numbers its answers,
 * then `mocker serve --mode replay` with each mode. Oracles: the answers the capture proxy passed on while
 * recording (which capture answered is its number), the token-id prompts the test sent, hand-computed ratios.
 */
import { mkdtempSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mockerCounters } from '../support/mockerCounters.js';
import { mockerProcesses, runMockerToExit, startMockerProcess } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';
import { MODEL, startUpstream, type Upstream } from '../support/vllmUpstream.js';

type Json = Record<string, unknown>;

/** `n` ordinary Qwen3 token ids from `from` on (a token-id prompt: what is a prefix of what is exact). */
const ids = (from: number, n: number) => Array.from({ length: n }, (_, i) => from + i);

// SHORT (20 tokens) is a prefix of LONG (24 tokens).
const LONG = ids(3000, 24);
const SHORT = LONG.slice(0, 20);
/** Diverges from both captures' continuation. */
const OTHER = 9000;
/** One prompt captured three times (a multi-sample golden run). */
const SAMPLED = ids(5000, 12);
const SEEDED = ids(6000, 12);

interface Reply {
  status: number;
  headers: Headers;
  text: string;
  body: Json;
}

async function complete(url: string, request: Json): Promise<Reply> {
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, max_tokens: 16, ...request }),
  });
  const text = await res.text();
  return { status: res.status, headers: res.headers, text, body: JSON.parse(text) as Json };
}

const answerOf = (reply: Reply) => (reply.body.choices as { text: string }[])[0].text;
/** The bytes with the two fields a replay stamps anew replaced. */
const unstamped = (text: string) => text.replace(/"id":"[^"]*"/, '"id":"*"').replace(/"created":\d+/, '"created":*');

let upstream: Upstream;
let db: string;
/** What the capture proxy answered while recording, by capture. */
const captured: Record<string, Reply> = {};
const mockers = mockerProcesses();
/** A replay of the capture file with these flags: its URL. */
const serve = async (...flags: string[]) => (await mockers.start(['serve', '--mode', 'replay', '--captures', db, ...flags])).url;

beforeAll(async () => {
  db = join(mkdtempSync(join(testTmpdir(), 'mocker-match-')), 'golden.db');
  // Every answer numbered in the order the double made them: which capture a replay serves is visible.
  let made = 0;
  upstream = await startUpstream(() => ({ content: `answer number ${++made}` }));
  const capture = await startMockerProcess(['capture', '--upstream', upstream.url, '--captures', db]);
  const proxy = capture.url;
  try {
    captured.short = await complete(proxy, { prompt: SHORT });
    captured.long = await complete(proxy, { prompt: LONG });
    for (let sample = 1; sample <= 3; sample++) captured[`sample ${sample}`] = await complete(proxy, { prompt: SAMPLED });
    captured.seeded = await complete(proxy, { prompt: SEEDED, seed: 1 });
  } finally {
    await capture.stop();
  }
  expect(Object.values(captured).map(answerOf)).toEqual([1, 2, 3, 4, 5, 6].map((k) => `answer number ${k}`));
}, 120_000);

afterAll(async () => {
  await mockers.stopAll();
  await upstream?.close();
});

describe('--match prefix', () => {
  it('a prompt extending captured prompts is answered by the longest one (rendered, with its own usage); below --min-prefix-ratio it is a 404', async () => {
    const url = await serve('--match', 'prefix');
    const settings = ((await (await fetch(`${url}/mocker/engine`)).json()) as { config: Json }).config;
    expect(settings).toMatchObject({ match: 'prefix', min_prefix_ratio: 0.8, ignore_fields: [] });

    // 25 tokens: LONG (24) and SHORT (20 = 0.8 × 25, just enough) are both prefixes; the longest answers.
    const extended = await complete(url, { prompt: [...LONG, OTHER] });
    expect(extended.status).toBe(200);
    expect(answerOf(extended)).toBe(answerOf(captured.long));
    // Rendered for this request: its own prompt length, the capture's completion tokens.
    const longUsage = captured.long.body.usage as Json;
    expect(extended.body.usage).toMatchObject({
      prompt_tokens: 25,
      completion_tokens: longUsage.completion_tokens,
      total_tokens: 25 + Number(longUsage.completion_tokens),
    });
    expect(extended.headers.get('server')).toBeNull();

    // 24 tokens diverging from LONG at its last one: LONG shares 23, but SHORT (20 ≥ 0.8 × 24) is a whole prefix.
    const diverging = await complete(url, { prompt: [...LONG.slice(0, 23), OTHER] });
    expect(answerOf(diverging)).toBe(answerOf(captured.short));

    // 26 tokens sharing 20 with both: 20 / 26 < 0.8, a miss (replay's --on-miss error: vLLM's 404).
    const far = await complete(url, { prompt: [...SHORT, ...ids(OTHER, 6)] });
    expect(far.status).toBe(404);
    expect(far.body).toEqual({ error: { message: expect.any(String), type: 'NotFoundError', param: null, code: 404 } });
    expect((far.body.error as Json).message).toContain('--min-prefix-ratio 0.8');

    // The captured prompt itself is an exact hit, served verbatim.
    const exact = await complete(url, { prompt: SHORT });
    expect(unstamped(exact.text)).toBe(unstamped(captured.short.text));

    expect(await mockerCounters(Number(new URL(url).port))).toMatchObject({
      mocker_capture_hits_total: 1,
      mocker_capture_prefix_hits_total: 2,
      'mocker_capture_misses_total{no_match}': 1,
    });
  });

  it('--min-prefix-ratio 0.9: a prefix too short for it is passed over for the capture sharing the longest prefix', async () => {
    const url = await serve('--match', 'prefix', '--min-prefix-ratio', '0.9');
    // SHORT: 20 / 24 < 0.9; LONG shares 23 / 24.
    const diverging = await complete(url, { prompt: [...LONG.slice(0, 23), OTHER] });
    expect(answerOf(diverging)).toBe(answerOf(captured.long));
    expect(diverging.body.usage).toMatchObject({ prompt_tokens: 24 });
    // A prompt that is a prefix of a capture shares all of itself with it (SHORT: 20 / 23 < 0.9).
    const cut = await complete(url, { prompt: LONG.slice(0, 23) });
    expect(answerOf(cut)).toBe(answerOf(captured.long));
  });
});

describe('--match sequence', () => {
  it('one prompt captured three times is answered by each capture in turn, in capture order, then again from the first', async () => {
    const url = await serve('--match', 'sequence');
    const samples = [1, 2, 3].map((k) => answerOf(captured[`sample ${k}`]));
    // Three at once: each takes a capture of its own.
    const together = await Promise.all([0, 1, 2].map(() => complete(url, { prompt: SAMPLED })));
    expect(together.map(answerOf).sort()).toEqual([...samples].sort());
    const after: string[] = [];
    for (let i = 0; i < 4; i++) after.push(answerOf(await complete(url, { prompt: SAMPLED })));
    expect(after).toEqual([samples[0], samples[1], samples[2], samples[0]]);
  });
});

describe('--match exact (the default)', () => {
  it('answers a prompt with the same capture every time, and a prompt extending a capture not at all', async () => {
    const url = await serve();
    const settings = ((await (await fetch(`${url}/mocker/engine`)).json()) as { config: Json }).config;
    expect(settings).toMatchObject({ match: 'exact', min_prefix_ratio: 0.8, ignore_fields: [] });
    for (let i = 0; i < 4; i++) expect(answerOf(await complete(url, { prompt: SAMPLED }))).toBe(answerOf(captured['sample 1']));
    expect((await complete(url, { prompt: [...LONG, OTHER] })).status).toBe(404);

    // The same request as captured gets the captured bytes (and the engine's headers); another seed a rendered answer.
    const same = await complete(url, { prompt: SEEDED, seed: 1 });
    expect(unstamped(same.text)).toBe(unstamped(captured.seeded.text));
    expect(same.headers.get('server')).toBe('uvicorn');
    const reseeded = await complete(url, { prompt: SEEDED, seed: 2 });
    expect(answerOf(reseeded)).toBe(answerOf(captured.seeded));
    expect(reseeded.headers.get('server')).toBeNull();
  });
});

describe('--ignore-field', () => {
  it('seed: a request differing from the capture only by its seed gets the captured bytes verbatim', async () => {
    const url = await serve('--ignore-field', 'seed', '--ignore-field', 'user');
    const settings = ((await (await fetch(`${url}/mocker/engine`)).json()) as { config: Json }).config;
    expect(settings).toMatchObject({ match: 'exact', ignore_fields: ['seed', 'user'] });
    const reseeded = await complete(url, { prompt: SEEDED, seed: 2 });
    expect(unstamped(reseeded.text)).toBe(unstamped(captured.seeded.text));
    expect(reseeded.headers.get('server')).toBe('uvicorn');
    // Any other difference still renders.
    const longer = await complete(url, { prompt: SEEDED, seed: 2, max_tokens: 17 });
    expect(answerOf(longer)).toBe(answerOf(captured.seeded));
    expect(longer.headers.get('server')).toBeNull();
  });
});

describe('bad values are refused, naming the flag', () => {
  it.each([
    [['--match', 'fuzzy'], '--match'],
    [['--min-prefix-ratio', '2'], '--min-prefix-ratio'],
    [['--min-prefix-ratio', '0'], '--min-prefix-ratio'],
    [['--ignore-field', 'stream'], '--ignore-field stream'],
    [['--ignore-field', 'messages'], '--ignore-field messages'],
  ])('serve %j', async (flags, named) => {
    const { code, stderr } = await runMockerToExit(['serve', '--mode', 'replay', '--captures', db, '--port', '0', ...flags]);
    expect(code).not.toBe(0);
    expect(code).not.toBeNull();
    expect(stderr).toContain(named);
  });
});
