import { mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, describe, expect, it } from 'vitest';
import { hideTokenIds, hideTokenIdsInBytes, type RawExchange } from '../../src/capture/forward.js';
import { RecorderThread } from '../../src/capture/recorderThread.js';
import { CaptureStore } from '../../src/store/captureStore.js';
import { loadModelFiles } from '../../src/tokenizer/index.js';
import { captureInProcess } from '../support/inProcess.js';
import { startMockerProcess } from '../support/mockerProcess.js';
import { MODEL, startUpstream } from '../support/vllmUpstream.js';
import { prng } from '../support/prng.js';
import { testTmpdir } from '../support/tempRoot.js';

describe('hideTokenIdsInBytes', () => {
  const FRAGMENTS = [
    '"token_ids":[',
    '"prompt_token_ids":[',
    'token_ids":[',
    '"xtoken_ids":[',
    '"my_prompt_token_ids":[',
    'prompt_',
    '"',
    '1',
    '23',
    '456789',
    ',',
    ' ',
    '\n',
    '\t',
    '\r',
    ']',
    '[',
    'null',
    '{"a":',
    '}',
    'data: ',
    '\n\n',
    '日本語',
    '🚀',
    'é',
    '\\"token_ids\\":[1]',
    '"token_ids":null',
    '-1',
    '1.5',
    'e',
  ];

  it('does on bytes exactly what hideTokenIds does on text (5000 random events)', () => {
    const { next, pick } = prng(20240611);
    for (let n = 0; n < 5000; n++) {
      const text = Array.from({ length: 1 + Math.floor(next() * 40) }, () => pick(FRAGMENTS)).join('');
      const pad = Buffer.from('xx');
      const buf = Buffer.concat([pad, Buffer.from(text), pad]);
      const out = hideTokenIdsInBytes(buf, pad.length, buf.length - pad.length);
      expect(out.toString('utf8'), JSON.stringify(text)).toBe(hideTokenIds(text));
    }
  });

  it('hides real vLLM events and leaves others as views of the same bytes', () => {
    const event =
      'data: {"id":"cmpl-1","choices":[{"index":0,"text":" a \\"token_ids\\":[1]","token_ids":[1, 2,3],"prompt_token_ids":[7,8]}],"usage":null}\n\n';
    const buf = Buffer.from(event);
    expect(hideTokenIdsInBytes(buf, 0, buf.length).toString()).toBe(hideTokenIds(event));
    expect(hideTokenIdsInBytes(buf, 0, buf.length).toString()).toContain('"token_ids":null,"prompt_token_ids":null}');
    const done = Buffer.from('data: [DONE]\n\n');
    const view = hideTokenIdsInBytes(done, 0, done.length);
    expect(view.buffer).toBe(done.buffer);
    expect(view.toString()).toBe('data: [DONE]\n\n');
  });
});

const cleanup: (() => Promise<void> | void)[] = [];
afterAll(async () => {
  for (const close of cleanup.reverse()) await close();
});

function newCaptureFile(): { path: string; runId: number } {
  const path = join(mkdtempSync(join(testTmpdir(), 'mocker-worker-')), 'capture.db');
  const store = CaptureStore.open(path);
  const model = loadModelFiles();
  const runId = store.startRun({ kind: 'capture', tokenizerName: model.name }, model.files);
  store.close();
  return { path, runId };
}

function rawExchange(responseBody: Buffer, requestBody: Buffer): RawExchange {
  const event = responseBody.toString('utf8');
  return {
    startedAt: Date.now(),
    method: 'POST',
    path: '/v1/completions',
    endpoint: 'completion',
    tokenize: 'vllm',
    requestHeaders: { 'content-type': 'application/json', authorization: 'Bearer sk-never-stored' },
    requestBody,
    request: JSON.parse(requestBody.toString('utf8')) as Record<string, unknown>,
    injected: ['return_token_ids'],
    status: 200,
    responseHeaders: { 'content-type': 'text/event-stream' },
    responseBody,
    stream: true,
    eventEnds: [event.indexOf('\n\n') + 2, responseBody.length],
    eventTimes: [1.5, 2.5],
    totalMs: 3,
    outcome: 'complete',
    error: null,
  };
}

describe('RecorderThread', () => {
  it('stores in its worker before the sink resolves, takes an owned body without copying, copies a pooled one', async () => {
    const { path, runId } = newCaptureFile();
    const recorder = await RecorderThread.start({ captures: path, runId, upstream: 'http://127.0.0.1:9', redacted: ['authorization'] });
    cleanup.push(() => recorder.close());
    const events = 'data: {"model":"m","choices":[{"index":0,"text":"Hi","finish_reason":null,"prompt_token_ids":[5,6],"token_ids":[42]}]}\n\ndata: [DONE]\n\n';
    const owned = Buffer.allocUnsafeSlow(Buffer.byteLength(events));
    owned.write(events);
    const request = Buffer.from(JSON.stringify({ model: 'm', prompt: 'Hi', stream: true }));
    await recorder.sink(rawExchange(owned, request));
    // Transferred: the proxy's view of it is detached; the request body was copied and is intact.
    expect(owned.buffer.byteLength).toBe(0);
    expect(JSON.parse(request.toString()).prompt).toBe('Hi');

    const pooled = Buffer.from(events);
    expect(pooled.buffer.byteLength).toBeGreaterThan(pooled.byteLength);
    await recorder.sink(rawExchange(pooled, request));
    expect(pooled.toString()).toBe(events);

    const stored = CaptureStore.open(path, { readonly: true });
    const rows = stored.exchangeIds().map((id) => stored.getExchange(id)!);
    stored.close();
    expect(rows.map((r) => [r.outcome, r.tokenSource])).toEqual([
      ['complete', 'engine'],
      ['complete', 'engine'],
    ]);
    expect(rows.every((r) => r.responseBody.toString() === events)).toBe(true);
    expect(JSON.stringify(rows[0].requestHeaders)).not.toContain('sk-never-stored');
    expect(await recorder.counts()).toEqual({ complete: 2, failed: 0, aborted: 0 });
  });

  it('is closed cleanly: pending exchanges are flushed first, later ones are refused', async () => {
    const { path, runId } = newCaptureFile();
    const recorder = await RecorderThread.start({ captures: path, runId, upstream: 'http://127.0.0.1:9', redacted: [] });
    const events = 'data: {"model":"m","choices":[{"index":0,"text":"Hi","finish_reason":"length","token_ids":[42]}]}\n\ndata: [DONE]\n\n';
    const request = Buffer.from(JSON.stringify({ model: 'm', prompt: [1, 2, 3] }));
    const sinks = Array.from({ length: 20 }, () => recorder.sink(rawExchange(Buffer.from(events), request)));
    const closed = recorder.close();
    await Promise.all(sinks);
    await closed;
    await expect(recorder.sink(rawExchange(Buffer.from(events), request))).rejects.toThrow('closed');
    const db = new Database(path, { readonly: true });
    expect(db.prepare('select count(*) as n from exchanges').get()).toEqual({ n: 20 });
    db.close();
  });
});

describe('mocker capture shutdown', () => {
  it('stores the streams its close() cuts off as aborted before it resolves', async () => {
    const upstream = await startUpstream(() => ({ content: 'slow '.repeat(100), gapMs: () => 30 }));
    cleanup.push(() => upstream.close());
    const db = join(mkdtempSync(join(testTmpdir(), 'mocker-close-')), 'capture.db');
    const capture = await captureInProcess({
      upstream: upstream.url,
      captures: db,
    });
    const streams = await Promise.all(
      Array.from(
        { length: 4 },
        (_, i) =>
          new Promise<void>((resolve, reject) => {
            const req = http.request(
              { host: '127.0.0.1', port: capture.port, path: '/v1/completions', method: 'POST', headers: { 'content-type': 'application/json' } },
              (res) => {
                res.on('error', () => undefined);
                res.once('data', () => resolve());
              },
            );
            req.on('error', (err) => (err.message.includes('socket hang up') || err.message.includes('ECONNRESET') ? undefined : reject(err)));
            req.end(JSON.stringify({ model: MODEL, prompt: `cut me off ${i}`, max_tokens: 100, stream: true }));
          }),
      ),
    );
    expect(streams).toHaveLength(4);
    await capture.close();
    const sqlite = new Database(db, { readonly: true });
    const rows = sqlite.prepare('select outcome from exchanges').all() as { outcome: string }[];
    sqlite.close();
    expect(rows.map((r) => r.outcome)).toEqual(['aborted', 'aborted', 'aborted', 'aborted']);
  });
});

/** Each thread of process `pid` and its nice value (proc(5): field 19 of /proc/PID/task/TID/stat). */
function threadNices(pid: number): Map<number, number> {
  const nices = new Map<number, number>();
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    const stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8');
    // Fields after the command name, which may hold spaces and parentheses: the 3rd (state) first.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    nices.set(Number(tid), Number(fields[19 - 3]));
  }
  return nices;
}

describe("the built CLI's capture", () => {
  it('records on threads at the lowest priority (nice 19), below the thread that forwards the bytes', async () => {
    const upstream = await startUpstream(() => ({ content: 'Hello there' }));
    cleanup.push(() => upstream.close());
    const db = join(mkdtempSync(join(testTmpdir(), 'mocker-nice-')), 'capture.db');
    const capture = await startMockerProcess(['capture', '--upstream', upstream.url, '--captures', db]);
    cleanup.push(() => capture.stop());
    const res = await fetch(`http://127.0.0.1:${capture.port}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, prompt: 'Once upon a time', max_tokens: 4, stream: true }),
    });
    expect(res.status).toBe(200);
    await res.text();
    const nices = threadNices(capture.child.pid as number);
    // The main thread's id is the process's.
    expect(nices.get(capture.child.pid as number)).toBe(0);
    // The recorder's worker, and the checkpointer it started (a thread inherits its creator's nice value).
    expect([...nices.values()].filter((nice) => nice === 19)).toHaveLength(2);
    // Recorded all the same.
    const sqlite = new Database(db, { readonly: true });
    expect(sqlite.prepare('select outcome from exchanges').all()).toEqual([{ outcome: 'complete' }]);
    sqlite.close();
  });
});
