/**
 * The capture file's compact layout (encoding 1, migration 0002_compact_store): a file of the layout before it
 * replays byte-identically through the CLI, read-only as it is and after it migrates; the compact encodings
 * round-trip arbitrary values; the prompt tree's nearest capture is a brute-force scan's; and a bench-shaped
 * exchange takes a fraction of the 104 KB it took.
 */
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { copyFileSync, existsSync, mkdtempSync, readFileSync, statSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CaptureStore, type Exchange, type Outcome, type StoredExchange } from '../../src/store/captureStore.js';
import {
  elideIdLists,
  packDeltas,
  packTimes,
  packRecord,
  packVarints,
  squeeze,
  unpackDeltas,
  unpackTimes,
  unpackRecord,
  unpackVarints,
  unsqueeze,
} from '../../src/store/pack.js';
import { benchExchange } from '../support/benchExchange.js';
import { formatExchanges } from '../support/formatExchanges.js';
import { mockerProcesses, startMockerProcess } from '../support/mockerProcess.js';
import { prng } from '../support/prng.js';
import { MODEL, startUpstream, type Upstream } from '../support/vllmUpstream.js';
import { testTmpdir } from '../support/tempRoot.js';

const dir = mkdtempSync(join(testTmpdir(), 'store-format-'));
const MIGRATIONS = join(import.meta.dirname, '..', '..', 'migrations');
const sha256 = (data: Buffer | string) => createHash('sha256').update(data).digest('hex');
const u32 = (ids: readonly number[]) => Buffer.from(Uint32Array.from(ids).buffer);
const f64 = (values: readonly number[]) => Buffer.from(Float64Array.from(values).buffer);

/** The database file with the tables of migrations 0000_init and 0001_run_engine, recorded as drizzle records them. */
function oldLayoutFile(path: string): Database.Database {
  const file = new Database(path);
  const journal = JSON.parse(readFileSync(join(MIGRATIONS, 'meta', '_journal.json'), 'utf8')) as { entries: { tag: string; when: number }[] };
  file.exec('CREATE TABLE __drizzle_migrations (id INTEGER PRIMARY KEY AUTOINCREMENT, hash text NOT NULL, created_at numeric)');
  for (const { tag, when } of journal.entries.filter((e) => ['0000_init', '0001_run_engine'].includes(e.tag))) {
    const sql = readFileSync(join(MIGRATIONS, `${tag}.sql`), 'utf8');
    for (const statement of sql.split('--> statement-breakpoint')) if (statement.trim()) file.exec(statement);
    file.prepare('INSERT INTO __drizzle_migrations (hash, created_at) VALUES (?, ?)').run(sha256(sql), when);
  }
  return file;
}

/** Writes `ex` row by row as the layout before encoding 1 did: ids and times as raw little-endian arrays, bodies as they are. */
function writeOldExchange(file: Database.Database, ex: StoredExchange): void {
  const key = ex.promptIds && ex.model !== null ? createHash('sha256').update(ex.model).update('\0').update(u32(ex.promptIds)).digest('hex') : null;
  file
    .prepare(
      `INSERT INTO exchanges (id, run_id, started_at, request_id, method, path, endpoint, outcome, error, status, model, stream, total_ms, token_source,
         prompt_ids, prompt_len, prompt_key, request_shape, injected, usage, request_headers, request_body, response_headers, response_body, event_ends, event_times, event_tokens)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
    )
    .run(
      ex.id,
      ex.runId,
      ex.startedAt,
      ex.requestId,
      ex.method,
      ex.path,
      ex.endpoint,
      ex.outcome,
      ex.error,
      ex.status,
      ex.model,
      ex.stream ? 1 : 0,
      ex.totalMs,
      ex.tokenSource,
      ex.promptIds ? u32(ex.promptIds) : null,
      ex.promptIds?.length ?? null,
      key,
      ex.requestShape,
      JSON.stringify(ex.injected),
      ex.usage === undefined ? null : JSON.stringify(ex.usage),
      JSON.stringify(ex.requestHeaders),
      ex.requestBody,
      JSON.stringify(ex.responseHeaders),
      ex.responseBody,
      u32(ex.eventEnds),
      f64(ex.eventTimes),
      u32(ex.eventTokens),
    );
  for (const g of ex.generations) {
    file
      .prepare(
        `INSERT INTO generations (exchange_id, choice_index, output_ids, token_times, chunk_tokens, chunk_deltas, text, finish_reason, stop_reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
      )
      .run(
        ex.id,
        g.choiceIndex,
        u32(g.outputIds),
        f64(g.tokenTimes),
        u32(g.chunkTokens),
        JSON.stringify(g.chunkDeltas),
        g.text,
        g.finishReason,
        JSON.stringify(g.stopReason),
      );
  }
}

/** Every exchange of a file, read through the store. */
function allExchanges(path: string): StoredExchange[] {
  const store = CaptureStore.open(path, { readonly: true });
  try {
    return store.exchangeIds().map((id) => store.getExchange(id)!);
  } finally {
    store.close();
  }
}

/** The longest common prefix of two id lists. */
function lcp(a: readonly number[], b: readonly number[]): number {
  let k = 0;
  while (k < a.length && k < b.length && a[k] === b[k]) k++;
  return k;
}

/** The oracle of `nearest`: every complete capture of the model compared, the longest prefix, ties to the newest. */
function bruteNearest(exchanges: readonly StoredExchange[], model: string, probe: readonly number[]) {
  let best: { exchangeId: number; promptIds: number[]; commonPrefix: number } | null = null;
  for (const ex of exchanges) {
    if (ex.model !== model || ex.outcome !== 'complete' || ex.promptIds === null) continue;
    const k = lcp(ex.promptIds, probe);
    if (!best || k > best.commonPrefix || (k === best.commonPrefix && ex.id > best.exchangeId))
      best = { exchangeId: ex.id, promptIds: ex.promptIds, commonPrefix: k };
  }
  return best;
}

describe('a capture file of the layout before encoding 1', () => {
  const mockers = mockerProcesses();
  let upstream: Upstream;
  const oldFile = join(dir, 'old.db');
  /** What the clients got through the capture proxy, by request. */
  const proxied: { path: string; body: Record<string, unknown>; text: string }[] = [];
  /** What vLLM regenerates per request (top-level id and created). */
  const normalize = (text: string) => text.replace(/\{"id":"[^"]*","object":"([^"]*)","created":\d+/g, '{"id":"X","object":"$1","created":0');
  const post = (port: number, path: string, body: unknown) =>
    fetch(`http://127.0.0.1:${port}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const mocker = (...args: string[]) => mockers.start(args);
  const requests: { path: string; body: Record<string, unknown> }[] = [
    { path: '/v1/chat/completions', body: { model: MODEL, messages: [{ role: 'user', content: 'An old question' }], max_tokens: 16 } },
    { path: '/v1/chat/completions', body: { model: MODEL, messages: [{ role: 'user', content: 'An old streamed question' }], max_tokens: 16, stream: true } },
    { path: '/v1/completions', body: { model: MODEL, prompt: 'Once upon a time', max_tokens: 16, stream: true } },
    { path: '/v1/completions', body: { model: MODEL, prompt: [9707, 11, 1879, 0], max_tokens: 16 } },
  ];

  beforeAll(async () => {
    upstream = await startUpstream((body) => ({ content: `Answer ${JSON.stringify(body.messages ?? body.prompt).length}: naïve café 🚀 …`, gapMs: () => 1 }));
    const recorded = join(dir, 'recorded.db');
    const capture = await mocker('capture', '--upstream', upstream.url, '--captures', recorded);
    for (const r of requests) {
      const res = await post(capture.port, r.path, r.body);
      expect(res.status).toBe(200);
      proxied.push({ ...r, text: await res.text() });
    }
    await capture.stop();
    // The same exchanges, written into a file of the old layout row by row (runs as they are, tokenizer files
    // uncompressed as that layout stored them).
    const exchanges = allExchanges(recorded);
    expect(exchanges.map((e) => e.outcome)).toEqual(requests.map(() => 'complete'));
    const file = oldLayoutFile(oldFile);
    file.exec(`ATTACH '${recorded}' AS recorded`);
    file.exec('INSERT INTO runs SELECT * FROM recorded.runs');
    file.exec('DETACH recorded');
    const store = CaptureStore.open(recorded, { readonly: true });
    for (const run of store.runs()) {
      for (const data of store.tokenizerFiles(run).values())
        file.prepare('INSERT OR IGNORE INTO blobs (sha256, size, data) VALUES (?, ?, ?)').run(sha256(data), data.length, data);
    }
    store.close();
    for (const ex of exchanges) writeOldExchange(file, ex);
    file.close();
  });

  afterAll(async () => {
    await mockers.stopAll();
    await upstream?.close();
  });

  async function expectReplaysAsCaptured(file: string): Promise<void> {
    const replay = await mocker('serve', '--mode', 'replay', '--captures', file, '--timing', 'none');
    for (const r of proxied) {
      const res = await post(replay.port, r.path, r.body);
      expect(res.status, r.path).toBe(200);
      expect(normalize(await res.text())).toBe(normalize(r.text));
    }
    await replay.stop();
    expect(replay.stderr()).toBe('');
  }

  it('replays byte for byte (ids and created aside) from a read-only open, which reads the old layout and changes nothing', async () => {
    const digest = sha256(readFileSync(oldFile));
    await expectReplaysAsCaptured(oldFile);
    expect(sha256(readFileSync(oldFile))).toBe(digest);
  });

  it('opened for writing, migrates: every exchange reads as before, the nearest search finds them, and replay answers the same', async () => {
    const before = allExchanges(oldFile);
    const migrated = join(dir, 'migrated.db');
    copyFileSync(oldFile, migrated);
    const store = CaptureStore.open(migrated);
    const journal = JSON.parse(readFileSync(join(MIGRATIONS, 'meta', '_journal.json'), 'utf8')) as { entries: unknown[] };
    store.close();
    const file = new Database(migrated, { readonly: true });
    expect((file.prepare('select count(*) as n from __drizzle_migrations').get() as { n: number }).n).toBe(journal.entries.length);
    file.close();

    const after = allExchanges(migrated);
    expect(after).toEqual(before);
    const reopened = CaptureStore.open(migrated, { readonly: true });
    for (const ex of before) {
      const probe = [...ex.promptIds!, 7];
      expect(reopened.nearest(MODEL, probe)).toEqual(bruteNearest(before, MODEL, probe));
    }
    reopened.close();
    await expectReplaysAsCaptured(migrated);
  }, 60_000);
});

describe('the compact encodings round-trip', () => {
  const rng = prng(20261123);
  const SPECIAL = [0, 1, 127, 128, 16383, 16384, 2 ** 21, 2 ** 28, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 2, 2 ** 32 - 1];
  const randomIds = (n: number) => Array.from({ length: n }, () => (rng.next() < 0.3 ? rng.pick(SPECIAL) : rng.int(0, 2 ** 32 - 1)));
  const randomBytes = (n: number) => {
    // Half of them repetitive (what deflate finds), the others noise; neither need be UTF-8.
    const motif = Buffer.from(Array.from({ length: rng.int(1, 40) }, () => rng.int(0, 255)));
    return Buffer.from(Array.from({ length: n }, (_, i) => (rng.next() < 0.5 ? motif[i % motif.length] : rng.int(0, 255))));
  };

  it('token ids (u32) as varints and as deltas, empty lists included', () => {
    for (let i = 0; i < 300; i++) {
      const ids = randomIds(rng.pick([0, 1, 2, rng.int(0, 2000)]));
      expect(unpackVarints(packVarints(ids))).toEqual(ids);
      expect(unpackDeltas(packDeltas(ids))).toEqual(ids);
    }
  });

  it('bytes compressed or stored', () => {
    for (let i = 0; i < 300; i++) {
      const data = randomBytes(rng.pick([0, 1, 16, 17, rng.int(0, 20_000)]));
      expect(unsqueeze(squeeze(data)).equals(data)).toBe(true);
    }
  });

  it("the prompt's id lists cut out of bodies and put back byte for byte: both separators, several lists, near misses left in place", () => {
    for (let i = 0; i < 300; i++) {
      const prompt = randomIds(rng.pick([0, 1, 7, 8, 9, rng.int(8, 1500)]));
      const listed = (ids: number[], separator: string) => `[${ids.join(separator)}]`;
      // Lists that are the prompt (counted), and ones that only look like it: another id, a leading zero, the
      // prompt cut short or run on, other spacing, no closing bracket.
      const near = (): string => {
        if (prompt.length === 0) return '[]';
        const ids = [...prompt];
        switch (rng.int(0, 5)) {
          case 0:
            ids[rng.int(0, ids.length - 1)] += 1;
            return listed(ids, ',');
          case 1:
            return `[0${prompt.join(',')}]`;
          case 2:
            return listed(ids.slice(0, -1), ',');
          case 3:
            return listed([...ids, 7], ',');
          case 4:
            return listed(ids, ' ,');
          default:
            return `[${prompt.join(',')}`;
        }
      };
      let expected = 0;
      const body = () => {
        const pieces: string[] = [];
        for (let k = rng.int(0, 4); k > 0; k--) {
          const roll = rng.next();
          if (roll < 0.4 && prompt.length >= 8) {
            expected++;
            pieces.push(listed(prompt, rng.pick([',', ', '])));
          } else pieces.push(roll < 0.7 ? near() : randomBytes(rng.int(0, 50)).toString('latin1'));
          pieces.push(rng.pick(['{"prompt":', ',"prompt_token_ids":', 'data: ', '"x":[1,2],']));
        }
        return Buffer.from(pieces.join(''), 'latin1');
      };
      const record = { requestBody: body(), responseBody: body(), eventEnds: [], eventTimes: [], eventTokens: [], generations: [] };
      const cuts = [record.requestBody, record.responseBody].reduce((n, b) => n + elideIdLists(b, prompt).cuts.length / 2, 0);
      expect(cuts).toBe(expected);
      expect(unpackRecord(packRecord(record, prompt), 4, () => prompt)).toEqual(record);
    }
  });

  it("in an SSE stream, the lists of the leading events are cut (vLLM's first chunk of each choice), one after a chunk without any is left, and every byte comes back", () => {
    const prompt = randomIds(rng.int(8, 1500));
    const list = `[${prompt.join(',')}]`;
    // A completion stream of n choices with return_token_ids, as vllm-wire-reference.md describes it: the prompt's
    // ids on the first chunk of each choice, null on the others.
    const chunk = (choice: number, ids: string) =>
      `data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":${choice},"text":"a","prompt_token_ids":${ids},"token_ids":[7]}]}\n\n`;
    for (const choices of [1, 2, 4]) {
      const events = [
        ...Array.from({ length: choices }, (_, c) => chunk(c, list)),
        ...Array.from({ length: 20 }, (_, k) => chunk(k % choices, 'null')),
        // What no vLLM sends: the list again, after chunks without it.
        chunk(0, list),
        'data: [DONE]\n\n',
      ];
      let end = 0;
      const eventEnds = events.map((e) => (end += Buffer.byteLength(e)));
      const responseBody = Buffer.from(events.join(''));
      const { parts, cuts } = elideIdLists(responseBody, prompt, eventEnds);
      expect(cuts.length / 2).toBe(choices);
      expect(Buffer.concat(parts).length).toBe(responseBody.length - choices * (list.length - 2));
      // Without the events' bounds (a body that is not a stream), every list is cut.
      expect(elideIdLists(responseBody, prompt).cuts.length / 2).toBe(choices + 1);
      const record = {
        requestBody: Buffer.from(`{"prompt":${list},"n":${choices}}`),
        responseBody,
        eventEnds,
        eventTimes: eventEnds.map((_, k) => k),
        eventTokens: eventEnds.map(() => 1),
        generations: [],
      };
      expect(unpackRecord(packRecord(record, prompt), 4, () => prompt)).toEqual(record);
    }
  });

  it('times as byte planes, and token times as references to event times', () => {
    const ODD = [0, -0, NaN, Infinity, -Infinity, Number.MIN_VALUE, Number.MAX_VALUE, 1e-300, 0.1 + 0.2];
    for (let i = 0; i < 300; i++) {
      const events = Array.from({ length: rng.int(0, 300) }, () => (rng.next() < 0.1 ? rng.pick(ODD) : rng.next() * 10 ** rng.int(-3, 6)));
      expect(unpackTimes(packTimes(events))).toEqual(events);
      // Each token at an event's time, in order; or, for some, at a time no event has.
      const tokens = events.flatMap((t) => Array.from({ length: rng.int(0, 2) }, () => t));
      if (rng.next() < 0.3 && tokens.length > 0) tokens[rng.int(0, tokens.length - 1)] = 1234.5678;
      const generation = {
        choiceIndex: 0,
        outputIds: tokens.map((_, k) => k),
        tokenTimes: tokens,
        chunkTokens: [],
        chunkDeltas: [],
        text: '',
        finishReason: null,
        stopReason: null,
      };
      const record = { requestBody: null, responseBody: null, eventEnds: [], eventTimes: events, eventTokens: [], generations: [generation] };
      const decoded = unpackRecord(packRecord(record, null), 4, () => null).generations[0].tokenTimes;
      expect(decoded.map((t) => (Object.is(t, -0) ? 'minus zero' : t))).toEqual(tokens.map((t) => (Object.is(t, -0) ? 'minus zero' : t)));
    }
  });

  it('chunk deltas by column or as JSON: any strings (lone surrogates, emoji, empty), empty deltas, values that are not strings', () => {
    const PIECES = ['', 'a', 'é', '🚀', '\uD83D', '\uDE80', 'naïve text', '\u0000', '"quoted"\n'];
    const KEYS = ['text', 'content', 'reasoning_content', 'x'];
    for (let i = 0; i < 300; i++) {
      const deltas = Array.from({ length: rng.int(0, 40) }, () => {
        const delta: Record<string, unknown> = {};
        for (const key of KEYS) if (rng.next() < 0.4) delta[key] = Array.from({ length: rng.int(0, 3) }, () => rng.pick(PIECES)).join('');
        if (rng.next() < 0.03) delta.tool_calls = [{ index: 0, function: { arguments: rng.pick(PIECES) } }];
        return delta;
      });
      const generation = {
        choiceIndex: 0,
        outputIds: [],
        tokenTimes: [],
        chunkTokens: [],
        chunkDeltas: deltas,
        text: rng.pick(PIECES),
        finishReason: null,
        stopReason: null,
      };
      const record = {
        requestBody: randomBytes(rng.int(0, 100)),
        responseBody: randomBytes(rng.int(0, 100)),
        eventEnds: [],
        eventTimes: [],
        eventTokens: [],
        generations: [generation],
      };
      const prompt = randomIds(rng.int(0, 30));
      expect(unpackRecord(packRecord(record, prompt), 4, () => prompt)).toEqual(record);
    }
  });

  it('exchanges through the store: arbitrary bytes, ids up to 2^32-1, empty lists, no model', () => {
    const store = CaptureStore.open(join(dir, 'roundtrip.db'));
    const runId = store.startRun({ kind: 'capture' }, new Map());
    const saved: Exchange[] = [];
    for (let i = 0; i < 60; i++) {
      const events = Array.from({ length: rng.int(0, 30) }, (_, k) => k * 10.25 + rng.next());
      const outcome = rng.pick<Outcome>(['complete', 'complete', 'failed', 'aborted']);
      const ex: Exchange = {
        runId,
        startedAt: 1_700_000_000_000 + i,
        requestId: rng.next() < 0.5 ? null : `req-${i}`,
        method: 'POST',
        path: '/v1/completions',
        endpoint: rng.pick(['chat', 'completion', null] as const),
        outcome,
        error: outcome === 'complete' ? null : 'upstream closed',
        status: 200,
        model: rng.next() < 0.2 ? null : rng.pick(['m1', 'm2']),
        stream: rng.next() < 0.5,
        requestHeaders: { 'content-type': 'application/json', 'x-many': ['a', 'b'] },
        requestBody: randomBytes(rng.int(0, 3000)),
        responseHeaders: {},
        responseBody: randomBytes(rng.int(0, 9000)),
        eventEnds: randomIds(events.length),
        eventTimes: events,
        eventTokens: randomIds(events.length),
        totalMs: rng.next() * 1000,
        tokenSource: 'engine',
        promptIds: rng.next() < 0.15 ? null : randomIds(rng.pick([0, 1, rng.int(0, 500)])),
        requestShape: '{"stream":true}',
        injected: ['return_token_ids'],
        usage: rng.next() < 0.5 ? undefined : { prompt_tokens: 3 },
        generations: Array.from({ length: rng.int(0, 3) }, (_, c) => ({
          choiceIndex: c,
          outputIds: randomIds(rng.int(0, 300)),
          tokenTimes: events.filter(() => rng.next() < 0.7),
          chunkTokens: randomIds(rng.int(0, 20)),
          chunkDeltas: [{ text: 'é🚀\u0000' }, { content: null }],
          text: `naïve ${i} \u{1F680}`,
          finishReason: rng.pick(['stop', 'length', null]),
          stopReason: rng.pick(['\n', 151645, null]),
        })),
      };
      saved.push(ex);
      expect(store.saveExchange(ex)).toBe(i + 1);
    }
    store.close();
    const stored = allExchanges(join(dir, 'roundtrip.db'));
    expect(stored).toEqual(saved.map((ex, i) => ({ ...ex, id: i + 1, bodiesRedacted: false, poolingKey: null })));
  });
});

describe('files written by earlier versions (encodings 1, 2 and 3)', () => {
  const fixtures = join(import.meta.dirname, '..', 'fixtures', 'captures');
  /** The values those versions were given (test/support/formatExchanges.ts), as a store gives them back. */
  const expected = () =>
    formatExchanges(1).map(
      (ex, i): StoredExchange => ({
        ...ex,
        id: i + 1,
        poolingKey: null,
        bodiesRedacted: ex.bodiesRedacted === true,
        ...(ex.bodiesRedacted ? { requestBody: Buffer.alloc(0), responseBody: Buffer.alloc(0) } : {}),
      }),
    );

  for (const encoding of [1, 2, 3]) {
    it(`encoding ${encoding}: every exchange reads back as it was written, read-only and after a writer opened it (and new exchanges beside them)`, () => {
      const original = join(fixtures, `encoding-${encoding}.db`);
      const digest = sha256(readFileSync(original));
      expect(allExchanges(original)).toEqual(expected());
      expect(sha256(readFileSync(original))).toBe(digest);

      const copy = join(dir, `encoding-${encoding}.db`);
      copyFileSync(original, copy);
      const store = CaptureStore.open(copy);
      const added = formatExchanges(1).map((ex) => ({ ...ex, startedAt: ex.startedAt + 10_000 }));
      store.saveExchanges(added);
      const [bench] = expected();
      expect(store.findByPrompt(bench.model!, bench.promptIds!).map((ex) => ex.id)).toEqual([1, 6]);
      store.close();
      const all = allExchanges(copy);
      expect(all.slice(0, 5)).toEqual(expected());
      expect(all.slice(5)).toEqual(expected().map((ex, i) => ({ ...ex, id: i + 6, startedAt: ex.startedAt + 10_000 })));
    });
  }

  it.each([2, 3])(
    'encoding %i replays through the CLI: the streamed completion byte for byte',
    async (encoding) => {
      const [bench] = formatExchanges(1);
      const replay = await startMockerProcess(['serve', '--mode', 'replay', '--captures', join(fixtures, `encoding-${encoding}.db`), '--timing', 'none']);
      try {
        const res = await fetch(`http://127.0.0.1:${replay.port}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: bench.requestBody,
        });
        expect(res.status).toBe(200);
        const normalize = (text: string) => text.replace(/"id":"[^"]*"/g, '"id":"X"').replace(/"created":\d+/g, '"created":0');
        // The proxy asked for the token ids (return_token_ids), this client did not: vLLM then sends them as null.
        const asVllmWithoutIds = bench.responseBody.toString('utf8').replace(/"(prompt_token_ids|token_ids)":\[[\d,]*\]/g, '"$1":null');
        expect(normalize(await res.text())).toBe(normalize(asVllmWithoutIds));
      } finally {
        await replay.stop();
      }
    },
    30_000,
  );
});

describe('the nearest capture through the prompt tree', () => {
  it("is the brute-force scan's on a few hundred prompts with shared prefixes, duplicates and prefixes of each other", () => {
    const rng = prng(7);
    const path = join(dir, 'nearest.db');
    const store = CaptureStore.open(path);
    const runId = store.startRun({ kind: 'capture' }, new Map());
    // A small vocabulary (and the largest id) makes prompts share prefixes of every length, and ties.
    const token = () => (rng.next() < 0.05 ? 2 ** 32 - 1 : rng.int(0, 3));
    const run = (n: number) => Array.from({ length: n }, token);
    const stems = Array.from({ length: 8 }, () => run(rng.int(0, 200)));
    const saved: StoredExchange[] = [];
    const models = ['m-a', 'm-b'];
    const checkProbes = (count: number) => {
      for (let k = 0; k < count; k++) {
        const model = rng.next() < 0.05 ? 'never-captured' : rng.pick(models);
        const base = saved.length > 0 && rng.next() < 0.8 ? (rng.pick(saved).promptIds ?? []) : rng.pick(stems);
        const probe = [...base];
        const change = rng.int(0, 3);
        if (change === 0 && probe.length > 0) probe[rng.int(0, probe.length - 1)] = token();
        else if (change === 1) probe.length = rng.int(0, probe.length);
        else if (change === 2) probe.push(...run(rng.int(1, 70)));
        expect(store.nearest(model, probe), `probe ${JSON.stringify(probe)}`).toEqual(bruteNearest(saved, model, probe));
      }
    };
    for (let i = 0; i < 400; i++) {
      const earlier = saved.length > 0 ? (rng.pick(saved).promptIds ?? []) : [];
      const shape = rng.int(0, 9);
      const prompt =
        shape === 0
          ? [...earlier] // the same prompt again
          : shape === 1
            ? earlier.slice(0, rng.int(0, earlier.length)) // a prefix of an earlier one
            : shape === 2
              ? [...earlier, ...run(rng.int(1, 100))] // an earlier one continued
              : [...rng.pick(stems), ...run(rng.int(0, 150))];
      const ex = benchExchange(runId, i);
      const stored: StoredExchange = {
        bodiesRedacted: false,
        ...ex,
        id: i + 1,
        model: rng.pick(models),
        promptIds: prompt,
        outcome: rng.next() < 0.85 ? 'complete' : 'failed',
        generations: [],
        requestBody: Buffer.from(JSON.stringify({ prompt })),
        responseBody: Buffer.alloc(0),
        eventEnds: [],
        eventTimes: [],
        eventTokens: [],
      };
      expect(store.saveExchange(stored)).toBe(i + 1);
      saved.push(stored);
      if (i % 50 === 49) checkProbes(40);
    }
    // `captures prune`: a third deleted, the tree names only what is left.
    const gone = new Set(saved.filter(() => rng.next() < 1 / 3).map((ex) => ex.id));
    store.deleteExchanges([...gone]);
    saved.splice(0, saved.length, ...saved.filter((ex) => !gone.has(ex.id)));
    checkProbes(100);
    store.close();
    // Read back from the file, read-only: the same answers.
    const reopened = CaptureStore.open(path, { readonly: true });
    for (let k = 0; k < 100; k++) {
      const probe = [...rng.pick(saved).promptIds!, token()];
      const model = rng.pick(models);
      expect(reopened.nearest(model, probe)).toEqual(bruteNearest(saved, model, probe));
    }
    reopened.close();
  });
});

describe("a read-only store's reads", () => {
  it('let a writer in another process in while a synchronous run of lookups goes on (a whole-file command never yields)', async () => {
    const path = join(dir, 'sliced.db');
    const writer = CaptureStore.open(path);
    const runId = writer.startRun({ kind: 'capture' }, new Map());
    writer.saveExchanges([0, 1].map((i) => benchExchange(runId, i)));
    writer.close();
    const reader = CaptureStore.open(path, { readonly: true });
    expect(reader.findByPrompt(benchExchange(runId, 0).model!, benchExchange(runId, 0).promptIds!)).toHaveLength(1);

    // A plain SQLite writer that gives up after a second of a locked file.
    const done = join(dir, 'sliced.written');
    const sqlite = createRequire(import.meta.url).resolve('better-sqlite3');
    const code = `const db = new (require(${JSON.stringify(sqlite)}))(${JSON.stringify(path)}); db.pragma('busy_timeout = 1000'); db.pragma('user_version = 7'); db.close(); require('fs').writeFileSync(${JSON.stringify(done)}, '')`;
    const child = spawn(process.execPath, ['-e', code], { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    const exited = new Promise<number | null>((resolve) => child.on('exit', resolve));
    // Lookups of prompts the file does not have, each one a query, without yielding until the writer is done.
    const deadline = performance.now() + 4_000;
    let lookups = 0;
    while (!existsSync(done) && performance.now() < deadline) reader.findByPrompt(MODEL, [lookups++, 1, 2, 3]);
    expect(await exited, stderr).toBe(0);
    expect(existsSync(done)).toBe(true);
    expect(lookups).toBeGreaterThan(0);
    reader.close();
    const file = new Database(path, { readonly: true });
    expect(file.pragma('user_version', { simple: true })).toBe(7);
    file.close();
  });
});

describe('group commit', () => {
  it('saveExchanges stores a batch whole, or (one exchange cannot be stored) none of it', () => {
    const store = CaptureStore.open(join(dir, 'batch.db'));
    const runId = store.startRun({ kind: 'capture' }, new Map());
    const batch = [0, 1, 2].map((i) => benchExchange(runId, i));
    const ids = store.saveExchanges(batch);
    expect(ids).toEqual([1, 2, 3]);
    const found = store.getExchange(2)!;
    expect(found.responseBody.equals(batch[1].responseBody)).toBe(true);
    expect(found.generations).toEqual(batch[1].generations);
    // The second names a run the file does not have: the foreign key fails, and the first is not kept either.
    expect(() => store.saveExchanges([benchExchange(runId, 3), benchExchange(runId + 1, 4)])).toThrow(/FOREIGN KEY/);
    expect(store.counts().complete).toBe(3);
    expect(store.findByPrompt(benchExchange(runId, 3).model!, benchExchange(runId, 3).promptIds!)).toEqual([]);
    store.close();
  });
});

describe("background checkpoints (the recorder's writer)", () => {
  it('fold the log into the database file while the writer saves, and close still leaves one self-contained file', async () => {
    const path = join(dir, 'checkpointed.db');
    const store = CaptureStore.open(path, { backgroundCheckpoints: true });
    const runId = store.startRun({ kind: 'capture' }, new Map());
    const sizeAtStart = statSync(path).size;
    for (let i = 0; i < 200; i += 10) store.saveExchanges(Array.from({ length: 10 }, (_, k) => benchExchange(runId, i + k)));
    // ~2,400 pages of log: far below the writer's own threshold, so only the worker can have copied them.
    expect(statSync(`${path}-wal`).size).toBeGreaterThan(200 * 8_000);
    let size = statSync(path).size;
    for (let waited = 0; size < sizeAtStart + 200 * 8_000 && waited < 5_000; waited += 50) {
      await new Promise((resolve) => setTimeout(resolve, 50));
      size = statSync(path).size;
    }
    expect(size).toBeGreaterThan(sizeAtStart + 200 * 8_000);
    store.close();
    expect(existsSync(`${path}-wal`)).toBe(false);
    const file = new Database(path, { readonly: true });
    expect(file.pragma('journal_mode', { simple: true })).toBe('delete');
    expect((file.prepare('select count(*) as n from exchanges').get() as { n: number }).n).toBe(200);
    file.close();
  });
});

describe('the file size', () => {
  it("is under 20 KB an exchange for bench/store.ts's exchange (it was 104 KB before encoding 1)", () => {
    const N = 300;
    const path = join(dir, 'size.db');
    const store = CaptureStore.open(path);
    const runId = store.startRun({ kind: 'capture' }, new Map());
    for (let i = 0; i < N; i++) store.saveExchange(benchExchange(runId, i));
    store.close();
    expect(statSync(path).size / N).toBeLessThan(20_000);
  });
});
