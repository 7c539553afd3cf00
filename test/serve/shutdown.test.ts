/**
 * Graceful stop through the spawned CLI: SIGTERM drains the requests in flight (or cuts them off at
 * `--shutdown-timeout`, stored as aborted), `/health` answers 503 meanwhile, the capture file is closed
 * self-contained (the `.db` alone, copied elsewhere, replays everything), and a second signal exits at once.
 */
import { copyFileSync, mkdtempSync, readdirSync } from 'node:fs';
import { createServer, type ServerResponse } from 'node:http';
import { dirname, join } from 'node:path';
import Database from 'better-sqlite3';
import OpenAI from 'openai';
import { afterAll, describe, expect, it } from 'vitest';
import { freePorts } from '../support/kvEventsClient.js';
import { listenOnLoopback } from '../support/loopback.js';
import { spawnMockerProcess, mockerProcesses, type MockerProcess } from '../support/mockerProcess.js';
import { MODEL, startUpstream, type Script, type Upstream } from '../support/vllmUpstream.js';
import { testTmpdir } from '../support/tempRoot.js';

const mockers = mockerProcesses();
const upstreams: Upstream[] = [];
afterAll(async () => {
  await mockers.killAll();
  await Promise.all(upstreams.map((u) => u.close()));
});

const mocker = (args: string[], port = 0) => mockers.start(args, { port });

async function upstream(script: Script): Promise<Upstream> {
  const u = await startUpstream(script);
  upstreams.push(u);
  return u;
}

const tempDir = () => mkdtempSync(join(testTmpdir(), 'mocker-shutdown-'));
/** What the engine double answers to a prompt: the oracle of every replayed answer. */
const answerTo = (prompt: unknown) => `Answer to ${String(prompt)}.`;
const answering: Script = (body) => ({ content: answerTo(body.prompt) });
const client = (port: number) => new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'unused', maxRetries: 0 });
const prompts = Array.from({ length: 10 }, (_, i) => `question ${i}`);

/** Exchanges in a capture file by outcome, read with SQLite directly. */
function outcomes(db: string): Record<string, number> {
  const sqlite = new Database(db, { readonly: true });
  try {
    const rows = sqlite.prepare('select outcome, count(*) as n from exchanges group by outcome').all() as { outcome: string; n: number }[];
    return Object.fromEntries(rows.map((r) => [r.outcome, r.n]));
  } finally {
    sqlite.close();
  }
}

/** Sends a signal and resolves once the process has said it is draining. */
async function signalAndDrain(p: MockerProcess, signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
  const before = p.stdout().length;
  p.child.kill(signal);
  while (!p.stdout().slice(before).includes('draining')) await new Promise((resolve) => setTimeout(resolve, 20));
}

interface StreamOutcome {
  text: string;
  finishReason: string | null;
  /** `data: [DONE]` arrived: the stream ended as vLLM ends one. */
  done: boolean;
  /** The connection broke before the end. */
  broken: boolean;
}

/** A streamed completion: resolves `started` at its first text chunk, `ended` when it is over (or broken). */
function stream(port: number, prompt: string, extra: Record<string, unknown> = {}): { started: Promise<void>; ended: Promise<StreamOutcome> } {
  let started!: () => void;
  const startedPromise = new Promise<void>((resolve) => (started = resolve));
  const ended = (async (): Promise<StreamOutcome> => {
    const out: StreamOutcome = { text: '', finishReason: null, done: false, broken: false };
    const res = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, prompt, stream: true, max_tokens: 1000, ...extra }),
    });
    let buffered = '';
    try {
      for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
        buffered += Buffer.from(chunk).toString('utf8');
        let end: number;
        while ((end = buffered.indexOf('\n\n')) >= 0) {
          const data = buffered.slice(0, end).replace(/^data: /, '');
          buffered = buffered.slice(end + 2);
          if (data === '[DONE]') out.done = true;
          else {
            const choice = (JSON.parse(data) as { choices: { text: string; finish_reason: string | null }[] }).choices[0];
            out.text += choice.text;
            out.finishReason = choice.finish_reason ?? out.finishReason;
            started();
          }
        }
      }
    } catch {
      out.broken = true;
    }
    started();
    return out;
  })();
  return { started: startedPromise, ended };
}

/** Replays `prompts` from a copy of `db` alone (no -wal, no -shm) in a fresh directory; the answers. */
async function replayCopy(db: string): Promise<string[]> {
  const copy = join(tempDir(), 'copied.db');
  copyFileSync(db, copy);
  const replay = await mocker(['serve', '--mode', 'replay', '--captures', copy, '--timing', 'none']);
  expect(replay.stdout()).toContain(`${prompts.length} complete exchange(s)`);
  const answers = [];
  for (const prompt of prompts) answers.push((await client(replay.port).completions.create({ model: MODEL, prompt })).choices[0].text);
  await replay.stop();
  return answers;
}

describe('SIGTERM: a clean stop leaves a self-contained capture file', () => {
  it.each([
    ['capture', (db: string, up: Upstream) => ['capture', '--upstream', up.url, '--captures', db]],
    ['serve --on-miss record', (db: string, up: Upstream) => ['serve', '--mode', 'replay', '--on-miss', 'record', '--upstream', up.url, '--captures', db]],
  ])('%s: 10 requests, SIGTERM, exit 0; the .db copied alone replays all 10', async (_, args) => {
    const up = await upstream(answering);
    const db = join(tempDir(), 'golden.db');
    const recording = await mocker(args(db, up));
    for (const prompt of prompts) expect((await client(recording.port).completions.create({ model: MODEL, prompt })).choices[0].text).toBe(answerTo(prompt));
    recording.child.kill('SIGTERM');
    expect(await recording.exited).toEqual({ code: 0, signal: null });
    expect(recording.stdout()).toContain('10 exchange(s) recorded (0 aborted)');
    // Nothing beside the database: no -wal or -shm file holds any of it.
    expect(readdirSync(dirname(db))).toEqual(['golden.db']);
    expect(await replayCopy(db)).toEqual(prompts.map(answerTo));
  });
});

describe('SIGTERM with streams in flight', () => {
  /** 20 tokens, 100 ms apart: in flight for about 2 s. */
  const slow: Script = (body) => ({ content: answerTo(body.prompt), gapMs: () => 100 });

  // --threads 2: the connections are dealt between the proxy and a forwarding process, which drains on the proxy's word.
  it.each([1, 2])('capture --threads %i: the 8 streams complete, /health answers 503 meanwhile, all 8 are stored complete', async (threads) => {
    const up = await upstream((body) => ({ ...slow(body, 0), content: `${answerTo(body.prompt)} ${'More words follow here. '.repeat(4)}` }));
    const db = join(tempDir(), 'drain.db');
    const capture = await mocker(['capture', '--upstream', up.url, '--captures', db, '--threads', String(threads)]);
    expect((await fetch(`http://127.0.0.1:${capture.port}/health`)).status).toBe(200);
    const streams = prompts.slice(0, 8).map((p) => stream(capture.port, p));
    await Promise.all(streams.map((s) => s.started));
    await signalAndDrain(capture);
    expect((await fetch(`http://127.0.0.1:${capture.port}/health`)).status).toBe(503);
    const ended = await Promise.all(streams.map((s) => s.ended));
    ended.forEach((s, i) =>
      expect(s).toEqual({ text: `${answerTo(prompts[i])} ${'More words follow here. '.repeat(4)}`, finishReason: 'stop', done: true, broken: false }),
    );
    expect(await capture.exited).toEqual({ code: 0, signal: null });
    expect(capture.stdout()).toContain('8 request(s) in flight finished, 0 cut off');
    expect(outcomes(db)).toEqual({ complete: 8 });
  });

  it.each([1, 2])('capture --threads %i --shutdown-timeout 1: longer streams are cut off and stored as aborted; exit 0', async (threads) => {
    // 200 tokens, 200 ms apart: 40 s, far beyond the shutdown timeout.
    const up = await upstream(() => ({ content: 'word '.repeat(200), gapMs: () => 200 }));
    const db = join(tempDir(), 'cut.db');
    const capture = await mocker(['capture', '--upstream', up.url, '--captures', db, '--shutdown-timeout', '1', '--threads', String(threads)]);
    const streams = prompts.slice(0, 8).map((p) => stream(capture.port, p));
    await Promise.all(streams.map((s) => s.started));
    capture.child.kill('SIGTERM');
    const ended = await Promise.all(streams.map((s) => s.ended));
    for (const s of ended) {
      expect(s.done).toBe(false);
      expect(s.text.length).toBeLessThan('word '.repeat(200).length);
    }
    expect(await capture.exited).toEqual({ code: 0, signal: null });
    expect(capture.stdout()).toContain('0 request(s) in flight finished, 8 cut off');
    expect(capture.stdout()).toContain('8 exchange(s) recorded (8 aborted)');
    expect(outcomes(db)).toEqual({ aborted: 8 });
  });

  it('serve --pd 1P1D: streams through the PD proxy complete; /health 503 meanwhile; exit 0', async () => {
    const [port] = await freePorts(1);
    const serve = await mocker(['serve', '--pd', '1P1D', '--mode', 'random', '--timing', 'fixed', '--forward-time-ms', '100'], port);
    const streams = prompts.slice(0, 8).map((p) => stream(port, p, { max_tokens: 20, ignore_eos: true }));
    await Promise.all(streams.map((s) => s.started));
    await signalAndDrain(serve);
    expect((await fetch(`http://127.0.0.1:${port}/healthcheck`)).status).toBe(503);
    for (const s of await Promise.all(streams.map((x) => x.ended))) {
      expect(s).toMatchObject({ finishReason: 'length', done: true, broken: false });
    }
    expect(await serve.exited).toEqual({ code: 0, signal: null });
    expect(serve.stdout()).toContain('8 request(s) in flight finished, 0 cut off');
  });

  it('serve --num-workers 2: streams on both workers complete; /health and new requests get 503 meanwhile; exit 0', async () => {
    const serve = await mocker(['serve', '--mode', 'random', '--timing', 'fixed', '--forward-time-ms', '100', '--num-workers', '2']);
    // With --port 0 each worker takes a free port: the serving line lists them.
    const ports = [...(/serving .* on (.*)/.exec(serve.stdout())?.[1] ?? '').matchAll(/127\.0\.0\.1:(\d+)/g)].map((m) => Number(m[1]));
    expect(ports).toHaveLength(2);
    const streams = prompts.slice(0, 8).map((p, i) => stream(ports[i % 2], p, { max_tokens: 20, ignore_eos: true }));
    await Promise.all(streams.map((s) => s.started));
    for (const port of ports) expect((await fetch(`http://127.0.0.1:${port}/health`)).status).toBe(200);
    await signalAndDrain(serve);
    for (const port of ports) {
      expect((await fetch(`http://127.0.0.1:${port}/health`)).status).toBe(503);
      const refused = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, prompt: 'late' }),
      });
      expect(refused.status).toBe(503);
      expect(((await refused.json()) as { error: { code: number } }).error.code).toBe(503);
    }
    for (const s of await Promise.all(streams.map((x) => x.ended))) expect(s).toMatchObject({ finishReason: 'length', done: true, broken: false });
    expect(await serve.exited).toEqual({ code: 0, signal: null });
    expect(serve.stdout()).toContain('8 request(s) in flight finished, 0 cut off');
  });

  it('a second SIGTERM during the drain exits at once, non-zero', async () => {
    const up = await upstream(() => ({ content: 'word '.repeat(200), gapMs: () => 200 }));
    // Without the second signal this drain would outlast the test.
    const capture = await mocker(['capture', '--upstream', up.url, '--captures', join(tempDir(), 'twice.db'), '--shutdown-timeout', '600']);
    const inFlight = stream(capture.port, 'question');
    await inFlight.started;
    await signalAndDrain(capture);
    capture.child.kill('SIGTERM');
    const exit = await capture.exited;
    expect(exit.code).not.toBe(0);
    expect(exit.code).not.toBeNull();
    expect((await inFlight.ended).done).toBe(false);
  });
});

describe('a signal while it starts', () => {
  it('capture: SIGTERM while it asks the upstream what it is stops it gracefully once started (exit 0, not killed)', async () => {
    // An upstream that holds every probe until released: capture is still starting while they wait.
    const held: ServerResponse[] = [];
    let probed!: () => void;
    const firstProbe = new Promise<void>((resolve) => (probed = resolve));
    const slowUpstream = createServer((_req, res) => {
      held.push(res);
      probed();
    });
    const { url, close } = await listenOnLoopback(slowUpstream);
    try {
      const db = join(tempDir(), 'starting.db');
      const { child, stdout, exited } = spawnMockerProcess(['capture', '--upstream', url, '--captures', db, '--host', '127.0.0.1', '--port', '0']);
      await firstProbe;
      child.kill('SIGTERM');
      // Killed by the signal, it would never say so.
      while (!stdout().includes('draining') && child.exitCode === null && child.signalCode === null) await new Promise((resolve) => setTimeout(resolve, 20));
      for (const res of held) res.writeHead(404, { 'content-type': 'application/json' }).end('{"detail":"Not Found"}');
      expect(await exited).toEqual({ code: 0, signal: null });
      expect(stdout()).toContain('0 exchange(s) recorded (0 aborted)');
      expect(readdirSync(dirname(db))).toEqual(['starting.db']);
    } finally {
      await close();
    }
  });
});
