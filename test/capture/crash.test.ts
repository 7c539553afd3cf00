import { mkdtempSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { serveInProcess, type Running } from '../support/inProcess.js';
import { generatedTexts, post } from '../support/fuzzRig.js';
import { startMockerProcess } from '../support/mockerProcess.js';
import { MODEL, startUpstream, type Upstream } from '../support/vllmUpstream.js';
import { testTmpdir } from '../support/tempRoot.js';

const IN_FLIGHT = 32;

type Body = Record<string, unknown>;
const completed: { path: string; body: Body }[] = [
  { path: '/v1/completions', body: { model: MODEL, prompt: 'Quick answer one', max_tokens: 8 } },
  { path: '/v1/completions', body: { model: MODEL, prompt: 'Quick answer two', max_tokens: 8, stream: true } },
  { path: '/v1/chat/completions', body: { model: MODEL, messages: [{ role: 'user', content: 'Quick answer three' }], max_tokens: 8 } },
  { path: '/v1/chat/completions', body: { model: MODEL, messages: [{ role: 'user', content: 'Quick answer four' }], max_tokens: 8, stream: true } },
];
const slow = (i: number): Body => ({ model: MODEL, prompt: `A slow story number ${i}`, max_tokens: 200, stream: true });

const request = (port: number, path: string, body: Body) => post(port, path, JSON.stringify(body));
/** The generated text of a vLLM response, streamed or not. */
const content = (text: string) => generatedTexts(text).join('');

describe('kill -9 of the capture process with streams in flight', () => {
  let upstream: Upstream;
  let replay: Running;
  let dbPath: string;
  const answers: string[] = [];

  beforeAll(async () => {
    dbPath = join(mkdtempSync(join(testTmpdir(), 'mocker-crash-')), 'golden.db');
    upstream = await startUpstream((body) =>
      String(body.prompt ?? '').includes('slow') ? { content: 'and then '.repeat(100), gapMs: () => 50 } : { content: 'Done quickly.' },
    );
    const { child, port } = await startMockerProcess(['capture', '--upstream', upstream.url, '--captures', dbPath]);
    for (const c of completed) {
      const res = await request(port, c.path, c.body);
      expect(res.status).toBe(200);
      answers.push(content(res.text));
      expect(answers.at(-1)).toBe('Done quickly.');
    }
    // 32 streams, each mid-answer (its first chunk received) when the process dies.
    const streaming = Array.from(
      { length: IN_FLIGHT },
      (_, i) =>
        new Promise<http.ClientRequest>((resolve, reject) => {
          const req = http.request(
            { host: '127.0.0.1', port, path: '/v1/completions', method: 'POST', headers: { 'content-type': 'application/json' } },
            (res) => {
              res.once('data', () => resolve(req));
              res.on('error', () => undefined);
            },
          );
          req.on('error', (err) => reject(err));
          req.end(JSON.stringify(slow(i)));
        }),
    );
    const requests = await Promise.all(streaming);
    requests.forEach((r) => r.on('error', () => undefined));
    const exited = new Promise((resolve) => child.once('exit', resolve));
    child.kill('SIGKILL');
    await exited;
    requests.forEach((r) => r.destroy());
    await upstream.close();
  });

  afterAll(async () => {
    await replay?.close();
  });

  it('leaves a database that opens and passes PRAGMA integrity_check', () => {
    const db = new Database(dbPath);
    expect(db.pragma('integrity_check', { simple: true })).toBe('ok');
    db.close();
  });

  it('replays every exchange completed before the kill, and serves none of the in-flight ones', async () => {
    replay = await serveInProcess({ mode: 'replay', captures: dbPath, timing: 'none' });
    for (const [i, c] of completed.entries()) {
      const res = await request(replay.port, c.path, c.body);
      expect(res.status, c.path).toBe(200);
      expect(content(res.text)).toBe(answers[i]);
    }
    for (let i = 0; i < IN_FLIGHT; i++) {
      const res = await request(replay.port, '/v1/completions', slow(i));
      expect(res.status).toBe(404);
      expect((JSON.parse(res.text) as { error: { type: string } }).error.type).toBe('NotFoundError');
    }
  });
});
