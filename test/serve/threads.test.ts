/**
 * `mocker serve --num-workers N --threads T` through the spawned CLI: every engine answers on its own port
 * with its own /metrics, the engines really run in T threads other than the main one (the kernel's per-thread
 * CPU accounting says so), a SIGTERM drains the streams of every thread, KV events flow from an engine in a
 * worker thread, misses recorded by two threads land in one self-contained file, and a thread that cannot
 * start takes the process down.
 */
import { existsSync, mkdtempSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import OpenAI from 'openai';
import parsePrometheusTextFormat from 'parse-prometheus-text-format';
import { afterAll, describe, expect, it } from 'vitest';
import { EventSubscriber, freePorts } from '../support/kvEventsClient.js';
import { mockerProcesses, runMockerToExit, type MockerProcess } from '../support/mockerProcess.js';
import { cpuTicks, threadsOf } from '../../bench/lib/procStat.js';
import { testTmpdir } from '../support/tempRoot.js';
import { MODEL, startUpstream, type Upstream } from '../support/vllmUpstream.js';

const mockers = mockerProcesses();
const subscribers: EventSubscriber[] = [];
const closers: (() => Promise<void>)[] = [];
afterAll(async () => {
  await mockers.killAll();
  for (const s of subscribers) s.close();
  for (const close of closers) await close();
});

const mocker = (args: string[]) => mockers.start(args);

const client = (port: number) => new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'unused', maxRetries: 0 });
/** The ports of the startup line ("… serving M on http://127.0.0.1:P, …"). */
const servedPorts = (p: MockerProcess) => [...(/serving .* on (.*)/.exec(p.stdout())?.[1] ?? '').matchAll(/127\.0\.0\.1:(\d+)/g)].map((m) => Number(m[1]));

async function requestSuccessTotal(port: number): Promise<number> {
  const families = parsePrometheusTextFormat(await (await fetch(`http://127.0.0.1:${port}/metrics`)).text());
  return (families.find((f) => f.name === 'vllm:request_success_total')?.metrics ?? []).reduce((sum, m) => sum + Number(m.value), 0);
}

/** CPU time (clock ticks, user + system) each thread of process `pid` has used. */
function threadTicks(pid: number): Map<number, number> {
  const ticks = new Map<number, number>();
  for (const tid of threadsOf(pid)) {
    try {
      ticks.set(tid, cpuTicks(pid, tid));
    } catch {
      // A thread that ended meanwhile.
    }
  }
  return ticks;
}

/** Streams `count` completions of `maxTokens` tokens to each port at once; resolves when all have ended. */
async function load(ports: number[], count: number, maxTokens: number): Promise<void> {
  await Promise.all(
    ports.flatMap((port) =>
      Array.from({ length: count }, async (_, i) => {
        const stream = await client(port).completions.create({
          model: MODEL,
          prompt: `load ${i}`,
          max_tokens: maxTokens,
          stream: true,
          ignore_eos: true,
        } as OpenAI.CompletionCreateParamsStreaming);
        for await (const chunk of stream) void chunk;
      }),
    ),
  );
}

/** Each thread's share of the CPU the process used while `work` ran, the main thread (tid = pid) apart. */
async function cpuShares(pid: number, work: () => Promise<void>): Promise<{ main: number; others: number[] }> {
  const before = threadTicks(pid);
  await work();
  const after = threadTicks(pid);
  const used = [...after].map(([tid, t]) => [tid, t - (before.get(tid) ?? 0)] as const);
  const total = used.reduce((sum, [, t]) => sum + t, 0);
  return {
    main: (used.find(([tid]) => tid === pid)?.[1] ?? 0) / total,
    others: used
      .filter(([tid]) => tid !== pid)
      .map(([, t]) => t / total)
      .sort((a, b) => b - a),
  };
}

describe('serve --threads', () => {
  it('--num-workers 4 --threads 2: one startup line, every port answers the openai client, each /metrics counts its own requests', async () => {
    const serve = await mocker(['serve', '--mode', 'random', '--timing', 'none', '--num-workers', '4', '--threads', '2']);
    const ports = servedPorts(serve);
    expect(ports).toHaveLength(4);
    expect(new Set(ports).size).toBe(4);
    expect(serve.stdout().match(/serving /g)).toHaveLength(1);
    // Port i gets i + 1 chat completions: its counter must say i + 1, whatever the others got.
    for (const [i, port] of ports.entries()) {
      for (let k = 0; k <= i; k++) {
        const answer = await client(port).chat.completions.create({
          model: MODEL,
          messages: [{ role: 'user', content: `engine ${i}, question ${k}` }],
          max_tokens: 5,
        });
        expect(answer.choices[0].message.role).toBe('assistant');
        expect(answer.usage?.completion_tokens).toBeLessThanOrEqual(5);
      }
    }
    expect(await Promise.all(ports.map(requestSuccessTotal))).toEqual([1, 2, 3, 4]);
  });

  // The oracle: the kernel's CPU time per thread. With --threads 1 the main thread does the engines' work; with
  // --threads 2 two other threads share it and the main thread only started them.
  it('the engines run in threads of their own: the main thread carries the load with --threads 1, two others with --threads 2', async () => {
    const shares: Record<string, { main: number; others: number[] }> = {};
    for (const threads of ['1', '2']) {
      const serve = await mocker(['serve', '--mode', 'random', '--timing', 'none', '--num-workers', '2', '--threads', threads]);
      shares[threads] = await cpuShares(serve.child.pid!, () => load(servedPorts(serve), 40, 500));
      await serve.stop();
    }
    // V8's own helper threads (garbage collection) take the rest, under a tenth each.
    expect(shares['1'].main).toBeGreaterThan(0.35);
    expect(shares['1'].others[0]).toBeLessThan(shares['1'].main / 3);
    expect(shares['2'].main).toBeLessThan(0.05);
    expect(shares['2'].others[1]).toBeGreaterThan(0.15);
  });

  it('SIGTERM with streams in flight on both threads: both finish, exit 0', async () => {
    const serve = await mocker(['serve', '--mode', 'random', '--timing', 'fixed', '--forward-time-ms', '100', '--num-workers', '2', '--threads', '2']);
    const ports = servedPorts(serve);
    // Each stream under way (its first chunk here) before the signal; the rest read after it.
    const inFlight = await Promise.all(
      ports.map(async (port) => {
        const stream = await client(port).completions.create({
          model: MODEL,
          prompt: `drain ${port}`,
          max_tokens: 10,
          ignore_eos: true,
          stream: true,
          stream_options: { include_usage: true },
        } as OpenAI.CompletionCreateParamsStreaming);
        const iterator = stream[Symbol.asyncIterator]();
        const chunks = [(await iterator.next()).value as OpenAI.Completion];
        const rest = async () => {
          for (let next = await iterator.next(); !next.done; next = await iterator.next()) chunks.push(next.value);
          return chunks;
        };
        return { rest: rest() };
      }),
    );
    serve.child.kill('SIGTERM');
    for (const { rest } of inFlight) {
      const chunks = await rest;
      expect(chunks.flatMap((c) => c.choices.map((choice) => choice.finish_reason)).filter(Boolean)).toEqual(['length']);
      expect(chunks.at(-1)?.usage?.completion_tokens).toBe(10);
    }
    expect(await serve.exited).toEqual({ code: 0, signal: null });
    expect(serve.stdout()).toContain('stopped: 2 request(s) in flight finished, 0 cut off');
  });

  it("KV events: an engine in a worker thread publishes its blocks on its own port, the other engine's stay silent", async () => {
    const [events0, events1] = await freePorts(2);
    const serve = await mocker([
      'serve',
      '--mode',
      'random',
      '--num-workers',
      '2',
      '--threads',
      '2',
      '--zmq-kv-events-ports',
      `${events0},${events1}`,
      '--block-size',
      '16',
    ]);
    const ports = servedPorts(serve);
    const [sub0, sub1] = await Promise.all([EventSubscriber.connect(`tcp://127.0.0.1:${events0}`), EventSubscriber.connect(`tcp://127.0.0.1:${events1}`)]);
    subscribers.push(sub0, sub1);
    // 64 prompt token ids in blocks of 16: 4 full blocks stored (the one generated token fills none).
    const prompt = Array.from({ length: 64 }, (_, i) => 1000 + i);
    await client(ports[1]).completions.create({ model: MODEL, prompt, max_tokens: 1 });
    await sub1.settle();
    const stored = sub1.batches.flatMap((b) => (b.payload[1] as unknown[][]).filter((e) => e[0] === 'BlockStored').flatMap((e) => e[1] as unknown[]));
    expect(stored).toHaveLength(4);
    expect(sub0.batches).toHaveLength(0);
  });

  it('--on-miss record over two threads: every exchange lands in one self-contained file', async () => {
    const upstream: Upstream = await startUpstream((body) => ({ content: `Answer to ${String(body.prompt)}.` }));
    closers.push(() => upstream.close());
    const db = join(mkdtempSync(join(testTmpdir(), 'mocker-threads-')), 'recorded.db');
    const serve = await mocker([
      'serve',
      '--mode',
      'replay',
      '--on-miss',
      'record',
      '--upstream',
      upstream.url,
      '--captures',
      db,
      '--num-workers',
      '2',
      '--threads',
      '2',
    ]);
    const ports = servedPorts(serve);
    const asked = ['a', 'b', 'c', 'd', 'e'].map((p, i) => ({ prompt: `question ${p}`, port: ports[i % 2] }));
    for (const { prompt, port } of asked) {
      const answer = await client(port).completions.create({ model: MODEL, prompt, max_tokens: 20 });
      expect(answer.choices[0].text).toBe(`Answer to ${prompt}.`);
    }
    await serve.stop();
    expect(await serve.exited).toEqual({ code: 0, signal: null });
    expect(serve.stdout()).toContain(`5 exchange(s) recorded (0 aborted), ${db} closed self-contained`);
    expect(existsSync(`${db}-wal`)).toBe(false);
    const sqlite = new Database(db, { readonly: true });
    try {
      expect(sqlite.prepare('select outcome, count(*) as n from exchanges group by outcome').all()).toEqual([{ outcome: 'complete', n: 5 }]);
    } finally {
      sqlite.close();
    }
  });

  it('a thread that cannot listen takes the process down: exit 1, the reason, no startup line', async () => {
    // Engine 1 (thread 1) wants the port held here.
    const held: Server = await new Promise((resolve) => {
      const s = createServer();
      s.listen(0, '127.0.0.1', () => resolve(s));
    });
    closers.push(() => new Promise((resolve) => held.close(() => resolve())));
    const port = (held.address() as { port: number }).port;
    const run = await runMockerToExit(['serve', '--mode', 'random', '--num-workers', '2', '--threads', '2', '--host', '127.0.0.1', '--port', String(port - 1)]);
    expect(run.code).toBe(1);
    // Thread 1's engine, or thread 0's too when the port below happens to be taken as well.
    expect([port, port - 1].map((p) => `mocker: port ${p} on 127.0.0.1 is already in use`)).toContain(run.stderr.trim());
    expect(run.stdout).not.toContain('serving');
  });

  it('--pd with --threads is refused', async () => {
    const run = await runMockerToExit(['serve', '--pd', '1P1D', '--threads', '2', '--port', '0']);
    expect(run.code).toBe(1);
    expect(run.stderr).toContain('--threads spreads --num-workers engines; --pd runs its engines in the main thread');
  });
});
