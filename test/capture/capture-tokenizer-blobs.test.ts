/**
 * The tokenizer a capture file carries, through the built CLI: stored compressed (a capture of 9 exchanges with
 * the bundled Qwen3 tokenizer fits in 3 MB, and replays the same answers), files that stored it as it is (before
 * migration 0004_blob_encoding) still replay, verify and merge, and a stored tokenizer that inflates past the bound
 * (a decompression bomb) is refused by name. Oracles: the answers the capture proxy gave, the file sizes on disk,
 * the stored blobs read with plain SQLite and Node's zlib.
 */
import { createHash } from 'node:crypto';
import { copyFileSync, existsSync, mkdtempSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { brotliDecompressSync, constants as zlibConstants, createBrotliCompress } from 'node:zlib';
import Database from 'better-sqlite3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runMockerToExit, startMockerProcess, type MockerProcess } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';
import { MODEL, startUpstream, type Upstream } from '../support/vllmUpstream.js';

type Json = Record<string, unknown>;

const dir = mkdtempSync(join(testTmpdir(), 'tokenizer-blobs-'));
const MB = 1_000_000;
const sha256 = (data: Buffer) => createHash('sha256').update(data).digest('hex');

const REQUESTS: { path: string; body: Json }[] = [
  { path: '/v1/chat/completions', body: { model: MODEL, messages: [{ role: 'user', content: 'Hi there' }], max_tokens: 16 } },
  { path: '/v1/chat/completions', body: { model: MODEL, messages: [{ role: 'user', content: 'Hi there' }], max_tokens: 16, stream: true } },
  {
    path: '/v1/chat/completions',
    body: { model: MODEL, messages: [{ role: 'user', content: 'Tell me a story' }], max_tokens: 16, stream: true, stream_options: { include_usage: true } },
  },
  {
    path: '/v1/chat/completions',
    body: {
      model: MODEL,
      messages: [
        { role: 'system', content: 'Be brief.' },
        { role: 'user', content: 'Why?' },
      ],
      max_tokens: 16,
    },
  },
  { path: '/v1/completions', body: { model: MODEL, prompt: 'Hello world', max_tokens: 16 } },
  { path: '/v1/completions', body: { model: MODEL, prompt: 'Hello world', max_tokens: 16, stream: true } },
  { path: '/v1/completions', body: { model: MODEL, prompt: 'Once upon a time', max_tokens: 16, n: 2 } },
  { path: '/v1/completions', body: { model: MODEL, prompt: [9707, 11, 1879, 0], max_tokens: 16 } },
  { path: '/v1/chat/completions', body: { model: MODEL, messages: [{ role: 'user', content: '日本語で答えて' }], max_tokens: 16, stream: true } },
];

/** What vLLM regenerates per request (top-level id and created). */
const normalize = (text: string) => text.replace(/\{"id":"[^"]*","object":"([^"]*)","created":\d+/g, '{"id":"X","object":"$1","created":0');
const post = (port: number, path: string, body: unknown) =>
  fetch(`http://127.0.0.1:${port}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });

const processes: MockerProcess[] = [];
let upstream: Upstream;
const captured = join(dir, 'captured.db');
/** The answers the capture proxy gave, in REQUESTS' order. */
const answers: string[] = [];

beforeAll(async () => {
  upstream = await startUpstream((body) => ({ content: `Answer ${JSON.stringify(body.messages ?? body.prompt).length}: naïve café 🚀 …`, gapMs: () => 1 }));
  const capture = await startMockerProcess(['capture', '--upstream', upstream.url, '--captures', captured]);
  processes.push(capture);
  for (const r of REQUESTS) {
    const res = await post(capture.port, r.path, r.body);
    expect(res.status).toBe(200);
    answers.push(await res.text());
  }
  await capture.stop();
  expect(await capture.exited).toEqual({ code: 0, signal: null });
}, 60_000);

afterAll(async () => {
  for (const p of processes) if (p.child.exitCode === null && p.child.signalCode === null) await p.stop();
  await upstream?.close();
});

async function expectReplaysAsCaptured(file: string): Promise<void> {
  const replay = await startMockerProcess(['serve', '--mode', 'replay', '--captures', file, '--timing', 'none']);
  processes.push(replay);
  for (const [i, r] of REQUESTS.entries()) {
    const res = await post(replay.port, r.path, r.body);
    expect(res.status, r.path).toBe(200);
    expect(normalize(await res.text())).toBe(normalize(answers[i]));
  }
  await replay.stop();
  expect(replay.stderr()).toBe('');
}

async function expectVerifies(file: string): Promise<void> {
  const r = await runMockerToExit(['captures', 'verify', file, '--json']);
  expect(r.code, r.stderr).toBe(0);
  expect(JSON.parse(r.stdout)).toMatchObject({ exchanges: REQUESTS.length, mismatched: 0 });
}

/** The stored tokenizer files' rows, read with plain SQLite. */
function blobRows(file: string): { sha256: string; size: number; data: Buffer }[] {
  const db = new Database(file, { readonly: true });
  try {
    return db.prepare('select sha256, size, data from blobs').all() as { sha256: string; size: number; data: Buffer }[];
  } finally {
    db.close();
  }
}

/**
 * A copy of the capture as a mocker before migration 0004_blob_encoding left it: that migration not recorded,
 * `blobs` without its `encoding` column, each tokenizer file stored as it is (inflated here with Node's zlib, and
 * checked against the sha256 the file names it by).
 */
function oldFormatCopy(out: string): void {
  copyFileSync(captured, out);
  const db = new Database(out);
  try {
    const last = db.prepare('select id from __drizzle_migrations order by id desc limit 1').pluck().get() as number;
    db.prepare('delete from __drizzle_migrations where id = ?').run(last);
    for (const row of db.prepare('select sha256, data from blobs').all() as { sha256: string; data: Buffer }[]) {
      const raw = brotliDecompressSync(row.data);
      expect(sha256(raw)).toBe(row.sha256);
      db.prepare('update blobs set data = ? where sha256 = ?').run(raw, row.sha256);
    }
    db.exec('alter table blobs drop column encoding');
    db.exec('vacuum');
  } finally {
    db.close();
  }
}

describe('a capture with the bundled Qwen3 tokenizer', () => {
  it('of 9 exchanges is at most 3 MB on disk once the capture has exited, and replays the same answers', async () => {
    expect(existsSync(`${captured}-wal`)).toBe(false);
    const size = statSync(captured).size;
    console.log(`capture of ${REQUESTS.length} exchanges: ${(size / MB).toFixed(2)} MB`);
    expect(size).toBeLessThanOrEqual(3 * MB);
    // The tokenizer is in it, whole: tokenizer.json alone is 11.4 MB.
    expect(blobRows(captured).reduce((n, r) => n + r.size, 0)).toBeGreaterThan(11 * MB);
    await expectReplaysAsCaptured(captured);
    await expectVerifies(captured);
  }, 60_000);
});

describe('a capture file that stored its tokenizer as it is (before migration 0004_blob_encoding)', () => {
  const old = join(dir, 'old.db');
  beforeAll(() => oldFormatCopy(old));

  it('replays and verifies from a read-only open, which changes nothing', async () => {
    expect(statSync(old).size).toBeGreaterThan(11 * MB);
    const digest = sha256(readFileSync(old));
    await expectReplaysAsCaptured(old);
    await expectVerifies(old);
    expect(sha256(readFileSync(old))).toBe(digest);
  }, 60_000);

  it('merged into a new file, its tokenizer is compressed: the merge is at most 3 MB and replays the same answers', async () => {
    const merged = join(dir, 'merged.db');
    const r = await runMockerToExit(['captures', 'merge', old, '-o', merged]);
    expect(r.code, r.stderr).toBe(0);
    expect(statSync(merged).size).toBeLessThanOrEqual(3 * MB);
    await expectReplaysAsCaptured(merged);
  }, 60_000);

  it('opened for writing (serve --on-miss record), migrates and still replays', async () => {
    const migrated = join(dir, 'migrated.db');
    copyFileSync(old, migrated);
    const recorder = await startMockerProcess([
      'serve',
      '--mode',
      'replay',
      '--captures',
      migrated,
      '--on-miss',
      'record',
      '--upstream',
      upstream.url,
      '--timing',
      'none',
    ]);
    processes.push(recorder);
    await recorder.stop();
    expect(recorder.stderr()).toBe('');
    await expectReplaysAsCaptured(migrated);
  }, 60_000);
});

describe('a stored tokenizer that inflates past the bound', () => {
  /** 1 GiB of zeros, brotli-compressed a MiB at a time (about 190 KB). */
  async function bomb(): Promise<Buffer> {
    const compress = createBrotliCompress({ params: { [zlibConstants.BROTLI_PARAM_QUALITY]: 1 } });
    const parts: Buffer[] = [];
    compress.on('data', (d: Buffer) => parts.push(d));
    const ended = new Promise((resolve) => compress.on('end', resolve));
    const zeros = Buffer.alloc(1 << 20);
    for (let i = 0; i < 1024; i++) if (!compress.write(zeros)) await new Promise((resolve) => compress.once('drain', resolve));
    compress.end();
    await ended;
    return Buffer.concat(parts);
  }

  it('is refused naming the file, the tokenizer file and the bound, by serve and captures verify', async () => {
    const file = join(dir, 'bomb.db');
    copyFileSync(captured, file);
    const data = await bomb();
    const db = new Database(file);
    const runs = db.prepare('select tokenizer_files from runs').pluck().all() as string[];
    const hash = (JSON.parse(runs[0]) as Record<string, string>)['tokenizer.json'];
    // The row claims a gigabyte: the bound is then the most a tokenizer file may be, 128 MiB.
    db.prepare('update blobs set data = ?, size = ? where sha256 = ?').run(data, 2 ** 30, hash);
    db.close();
    for (const args of [
      ['serve', '--mode', 'replay', '--captures', file, '--port', '0'],
      ['captures', 'verify', file],
    ]) {
      const r = await runMockerToExit(args);
      expect(r.code, args[0]).not.toBe(0);
      expect(r.code, args[0]).not.toBeNull();
      expect(r.stderr).toContain(
        `capture file ${file}: tokenizer file tokenizer.json (blob ${hash}): the blob's compressed data inflates to more than ${128 * 1024 * 1024} bytes`,
      );
    }
    // A gigabyte in a small file.
    expect(statSync(file).size).toBeLessThan(3 * MB);
  }, 60_000);
});

describe('a capture file written by a newer mocker (a migration this one does not know)', () => {
  it('is refused by name, read-only or for writing, and left as it was', async () => {
    const file = join(dir, 'newer.db');
    copyFileSync(captured, file);
    const db = new Database(file);
    db.prepare('insert into __drizzle_migrations (hash, created_at) values (?, ?)').run('a-future-migration', Date.now() + 86_400_000);
    db.close();
    const before = sha256(readFileSync(file));
    for (const args of [
      ['serve', '--mode', 'replay', '--captures', file, '--port', '0'],
      ['captures', 'prune', file, '--older-than', '1d'],
      ['captures', 'list', file],
    ]) {
      const r = await runMockerToExit(args);
      expect(r.code, args.join(' ')).not.toBe(0);
      expect(r.code, args.join(' ')).not.toBeNull();
      expect(r.stderr, args.join(' ')).toMatch(/written by a newer mocker \(schema \d+; this one knows \d+\): upgrade mocker to read it/);
    }
    expect(sha256(readFileSync(file))).toBe(before);
  }, 60_000);
});
