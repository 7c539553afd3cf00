import { mkdtempSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, describe, expect, it } from 'vitest';
import { captureInProcess, serveInProcess, type Running } from '../support/inProcess.js';
import { encode, EOS, MODEL, startUpstream, type Script, type Upstream } from '../support/vllmUpstream.js';
import { testTmpdir } from '../support/tempRoot.js';

const cleanup: (() => Promise<unknown>)[] = [];
afterAll(async () => {
  for (const close of cleanup.reverse()) await close();
});

async function captureOf(upstreamUrl: string, timeoutMs = 10_000): Promise<{ port: number; db: string }> {
  const db = join(mkdtempSync(join(testTmpdir(), 'mocker-fail-')), 'capture.db');
  const capture = await captureInProcess({
    upstream: upstreamUrl,
    captures: db,
    host: '127.0.0.1',
    port: 0,
    upstreamTimeoutMs: timeoutMs,
    maxBodyBytes: 1 << 20,
    redactHeaders: [],
  });
  cleanup.push(() => capture.close());
  return { port: capture.port, db };
}

async function upstreamOf(script: Script, legacy = false): Promise<Upstream> {
  const upstream = await startUpstream(script, { legacy });
  cleanup.push(() => upstream.close());
  return upstream;
}

/** What the capture file says about its exchanges, read with plain SQL. */
function stored(db: string): { outcome: string; error: string | null; token_source: string | null }[] {
  const sqlite = new Database(db, { readonly: true });
  try {
    return sqlite.prepare('select outcome, error, token_source from exchanges order by id').all() as {
      outcome: string;
      error: string | null;
      token_source: string | null;
    }[];
  } finally {
    sqlite.close();
  }
}

async function eventually<T>(read: () => T, ok: (value: T) => boolean): Promise<T> {
  for (let i = 0; i < 200; i++) {
    const value = read();
    if (ok(value)) return value;
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  return read();
}

const completion = (prompt: string, extra: Record<string, unknown> = {}) => ({ model: MODEL, prompt, max_tokens: 16, ...extra });

async function post(port: number, body: unknown): Promise<{ status: number; json: { error?: { message: string; type: string; code: number } } }> {
  const res = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return { status: res.status, json: (await res.json()) as never };
}

describe('upstream failures reach the client as they happened and are stored as failed', () => {
  it('refused connection: 502 in vLLM error format', async () => {
    // A port nothing listens on: bind one, then close it.
    const probe = net.createServer();
    await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
    const port = (probe.address() as net.AddressInfo).port;
    await new Promise((resolve) => probe.close(resolve));

    const capture = await captureOf(`http://127.0.0.1:${port}`);
    const res = await post(capture.port, completion('hello'));
    expect(res.status).toBe(502);
    expect(res.json.error?.code).toBe(502);
    expect(res.json.error?.message).toContain('ECONNREFUSED');
    expect(stored(capture.db)).toMatchObject([{ outcome: 'failed' }]);
  });

  it('no answer within --upstream-timeout: 504', async () => {
    const upstream = await upstreamOf(() => ({ hang: true }));
    const capture = await captureOf(upstream.url, 300);
    const res = await post(capture.port, completion('hello'));
    expect(res.status).toBe(504);
    expect(res.json.error?.code).toBe(504);
    expect(res.json.error?.message).toContain('timed out');
    expect(stored(capture.db)).toMatchObject([{ outcome: 'failed' }]);
  });

  it('reset mid-stream: the client sees the same break after the chunks that arrived', async () => {
    const upstream = await upstreamOf(() => ({ content: 'one two three four five six seven', resetAfterChunks: 3 }));
    const capture = await captureOf(upstream.url);
    const received = await new Promise<{ events: number; error: string | null }>((resolve) => {
      const req = http.request(
        { host: '127.0.0.1', port: capture.port, path: '/v1/completions', method: 'POST', headers: { 'content-type': 'application/json' } },
        (res) => {
          let text = '';
          res.on('data', (d: Buffer) => (text += d.toString()));
          const done = (error: string | null) => resolve({ events: text.split('\n\n').filter(Boolean).length, error });
          res.on('error', (err) => done(err.message));
          res.on('aborted', () => done('aborted'));
          res.on('end', () => done(null));
        },
      );
      req.on('error', (err) => resolve({ events: -1, error: err.message }));
      req.end(JSON.stringify(completion('reset me', { stream: true })));
    });
    expect(received.error).not.toBeNull();
    expect(received.events).toBe(3);
    const rows = await eventually(
      () => stored(capture.db),
      (r) => r.length > 0,
    );
    expect(rows).toMatchObject([{ outcome: 'failed' }]);
    expect(rows[0].error).toContain('reset');
  });

  it('client disconnect: the upstream request is aborted and the exchange stored as aborted', async () => {
    const upstream = await upstreamOf(() => ({ content: 'slow '.repeat(100), gapMs: () => 30 }));
    const capture = await captureOf(upstream.url);
    await new Promise<void>((resolve) => {
      const req = http.request(
        { host: '127.0.0.1', port: capture.port, path: '/v1/completions', method: 'POST', headers: { 'content-type': 'application/json' } },
        (res) => {
          res.once('data', () => {
            req.destroy();
            resolve();
          });
        },
      );
      req.on('error', () => undefined);
      req.end(JSON.stringify(completion('abandon me', { stream: true, max_tokens: 100 })));
    });
    const rows = await eventually(
      () => stored(capture.db),
      (r) => r.length > 0,
    );
    expect(rows).toMatchObject([{ outcome: 'aborted' }]);
    expect(
      await eventually(
        () => upstream.abandoned,
        (n) => n > 0,
      ),
    ).toBe(1);
  });

  it('an upstream 4xx answer is forwarded verbatim and never replayed', async () => {
    const upstream = await upstreamOf(() => ({ errorStatus: 400 }));
    const capture = await captureOf(upstream.url);
    const res = await post(capture.port, completion('bad'));
    expect(res.status).toBe(400);
    expect(res.json.error).toMatchObject({ message: 'scripted upstream error', type: 'BadRequestError', code: 400 });
    expect(stored(capture.db)).toMatchObject([{ outcome: 'failed' }]);
  });
});

describe('an engine without return_token_ids (vLLM before 0.10.2)', () => {
  let replay: Running;
  afterAll(async () => {
    await replay?.close();
  });

  it('takes prompt and output ids from the /tokenize endpoint and marks the capture so', async () => {
    const upstream = await upstreamOf(() => ({ content: 'An older engine answers.' }), true);
    const capture = await captureOf(upstream.url);
    const direct = await fetch(`${upstream.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(completion('Old engine')),
    });
    const directJson = (await direct.json()) as { choices: Record<string, unknown>[] };
    // The injected field is ignored by the old engine: no token-id fields at all.
    expect(directJson.choices[0]).not.toHaveProperty('token_ids');

    const res = await fetch(`http://127.0.0.1:${capture.port}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(completion('Old engine')),
    });
    const proxied = (await res.json()) as { choices: Record<string, unknown>[] };
    expect(proxied.choices[0]).not.toHaveProperty('token_ids');
    expect(stored(capture.db)).toMatchObject([{ outcome: 'complete', token_source: 'tokenize-endpoint' }]);

    // The capture answers a token-id request for the same prompt with the engine's tokenization.
    replay = await serveInProcess({ mode: 'replay', captures: capture.db, timing: 'none' });
    const ids = await encode('Old engine', true);
    const again = await fetch(`http://127.0.0.1:${replay.port}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(completion('Old engine', { return_token_ids: true })),
    });
    const json = (await again.json()) as { choices: { text: string; finish_reason: string; prompt_token_ids: number[]; token_ids: number[] }[] };
    expect(json.choices[0].text).toBe('An older engine answers.');
    expect(json.choices[0].prompt_token_ids).toEqual(ids);
    // The text's ids, then the EOS the engine generated to end it.
    expect(json.choices[0].token_ids).toEqual([...(await encode('An older engine answers.', false)), EOS]);
    expect(json.choices[0].finish_reason).toBe('stop');
  });
});
