/**
 * Fuzzing through the real processes, as users launch them: a spawned `serve`, a spawned `capture` in front
 * of it, and a spawned `pd-proxy` in front of spawned prefill and decode `serve`s. Shared by
 * test/fuzz/fuzz-processes.test.ts (a seeded slice) and bench/fuzz.ts (the full run, with latencies).
 */
import { readFileSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { CaptureStore } from '../../src/store/captureStore.js';
import { classifyReply, describeCase, promptCount, send, sendCases, type CaseOutcome, type FuzzCase, type Json, type Rng } from './fuzzRequests.js';
import { startMockerProcess, type MockerProcess } from './mockerProcess.js';

/** Largest body the fuzzed processes accept: hostile giant strings go up to just past it. */
export const FUZZ_MAX_BODY = 1 << 20;
/** Keeps a request's cost small: a request without max_tokens generates up to this many tokens. */
const MAX_MODEL_LEN = 2048;

/**
 * Resident memory one process may reach during fuzzing: generous on purpose. Here they peaked at 140–320 MB over
 * 30,000 fuzzed requests (bench:fuzz); requests are at most 1 MiB and 2,048 tokens long, so anything near this
 * bound means memory is kept per request (the issue saw 2.2 GB kept after one 25 MB prompt).
 */
export const RSS_BOUND_MB = 1024;

export type DoorName = 'serve' | 'capture' | 'pd-proxy';

export interface FuzzRig {
  /** Where clients send requests. */
  doors: { name: DoorName; port: number }[];
  /** Every spawned process, by role. */
  processes: Record<'serve' | 'capture' | 'prefill' | 'decode' | 'pd-proxy', MockerProcess>;
  captureFile: string;
  stop(): Promise<void>;
}

const engineArgs = ['--timing', 'none', '--max-model-len', String(MAX_MODEL_LEN), '--max-body-bytes', String(FUZZ_MAX_BODY)];

export async function startFuzzRig(dir: string): Promise<FuzzRig> {
  const started: MockerProcess[] = [];
  const spawn = async (args: string[]) => {
    const p = await startMockerProcess(args);
    started.push(p);
    return p;
  };
  try {
    const captureFile = join(dir, 'fuzz.db');
    const serve = await spawn(['serve', '--mode', 'simulate', '--captures', join(dir, 'serve.db'), ...engineArgs]);
    const capture = await spawn([
      'capture',
      '--upstream',
      `http://127.0.0.1:${serve.port}`,
      '--captures',
      captureFile,
      '--max-body-bytes',
      String(FUZZ_MAX_BODY),
    ]);
    const pdEngine = (mode: string) => [
      'serve',
      '--disaggregation-mode',
      mode,
      '--kv-transfer-bandwidth',
      '0',
      '--captures',
      join(dir, `${mode}.db`),
      ...engineArgs,
    ];
    const prefill = await spawn(pdEngine('prefill'));
    // The decode engine pulls KV only from the prefill engines it is told of.
    const decode = await spawn([...pdEngine('decode'), '--kv-transfer-allowed-hosts', `127.0.0.1:${prefill.port}`]);
    const pdProxy = await spawn([
      'pd-proxy',
      '--prefill',
      `http://127.0.0.1:${prefill.port}`,
      '--decode',
      `http://127.0.0.1:${decode.port}`,
      '--max-body-bytes',
      String(FUZZ_MAX_BODY),
    ]);
    return {
      doors: [
        { name: 'serve', port: serve.port },
        { name: 'capture', port: capture.port },
        { name: 'pd-proxy', port: pdProxy.port },
      ],
      processes: { serve, capture, prefill, decode, 'pd-proxy': pdProxy },
      captureFile,
      stop: async () => void (await Promise.all(started.map((p) => p.stop()))),
    };
  } catch (err) {
    await Promise.all(started.map((p) => p.stop()));
    throw err;
  }
}

/** Processes that exited (a crash: nothing stops them during fuzzing). */
export function deadProcesses(rig: FuzzRig): string[] {
  return Object.entries(rig.processes)
    .filter(([, p]) => p.child.exitCode !== null || p.child.signalCode !== null)
    .map(([name, p]) => `${name} (exit ${p.child.exitCode ?? p.child.signalCode})`);
}

/** Resident memory of each process now (VmRSS, MB). */
export function rssMb(rig: FuzzRig): Record<string, number> {
  return Object.fromEntries(
    Object.entries(rig.processes).map(([name, p]) => {
      const kb = /^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${p.child.pid}/status`, 'utf8'));
      return [name, kb ? Number(kb[1]) / 1024 : NaN];
    }),
  );
}

function get(port: number, path: string): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: '127.0.0.1', port, path, agent: false }, (res) => {
      let text = '';
      res.on('data', (d: Buffer) => (text += d.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, text }));
    });
    req.setTimeout(10_000, () => req.destroy(new Error(`GET ${path} unanswered for 10 s`)));
    req.on('error', reject);
  });
}

/** `GET /health` on every process (pd-proxy: vLLM's toy proxy's `/healthcheck`): its status (0: no answer). */
export async function health(rig: FuzzRig): Promise<{ name: string; status: number }[]> {
  return Promise.all(
    Object.entries(rig.processes).map(async ([name, p]) => {
      const res = await get(p.port, name === 'pd-proxy' ? '/healthcheck' : '/health').catch(() => ({ status: 0 }));
      return { name, status: res.status };
    }),
  );
}

interface RankState {
  rank: number;
  running: number;
  waiting: number;
  activeBlocks: number;
  waitingForRemoteKvs: number;
}

/** Per engine, the ranks still holding something (running or waiting requests, active KV blocks). */
export async function busyEngines(rig: FuzzRig): Promise<string[]> {
  const busy: string[] = [];
  for (const name of ['serve', 'prefill', 'decode'] as const) {
    const state = JSON.parse((await get(rig.processes[name].port, '/mocker/engine')).text) as { ranks: RankState[] };
    for (const r of state.ranks) {
      if (r.running + r.waiting + r.activeBlocks + r.waitingForRemoteKvs > 0) busy.push(`${name} rank ${r.rank}: ${JSON.stringify(r)}`);
    }
  }
  return busy;
}

/** Polls until every engine is idle (requests a client left may take an engine step to be dropped). */
export async function settledEngines(rig: FuzzRig, attempts = 50): Promise<string[]> {
  let busy = await busyEngines(rig);
  for (let i = 0; i < attempts && busy.length > 0; i++) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    busy = await busyEngines(rig);
  }
  return busy;
}

export type FuzzOutcome = CaseOutcome<DoorName>;

/**
 * Sends `cases` (numbered from `firstIndex`), each to a door picked at random, with `concurrency` clients.
 * Returns one outcome per case; a reply that is not a valid answer or a well-formed vLLM error is a violation.
 */
export function fuzzBatch(rig: FuzzRig, cases: FuzzCase[], options: { concurrency: number; firstIndex: number; seed: number; r: Rng }): Promise<FuzzOutcome[]> {
  const routed = cases.map((c) => ({ door: options.r.pick(rig.doors), case: c }));
  return sendCases(routed, (c, reply) => (reply.disconnected ? 'disconnected' : classifyReply(c, reply)), options);
}

/** The generated text of each choice of a vLLM response, streamed or not, in index order. */
export function generatedTexts(text: string): string[] {
  const objects = text.startsWith('data: ')
    ? text
        .split('\n\n')
        .filter((e) => e.startsWith('data: {'))
        .map((e) => JSON.parse(e.slice(6)) as Json)
    : [JSON.parse(text) as Json];
  const byChoice = new Map<number, string>();
  for (const ch of objects.flatMap((o) => (o.choices as Json[]) ?? [])) {
    const piece = String(ch.text ?? (ch.delta as Json | undefined)?.content ?? (ch.message as Json | undefined)?.content ?? '');
    byChoice.set(Number(ch.index), (byChoice.get(Number(ch.index)) ?? '') + piece);
  }
  return [...byChoice.entries()].sort(([a], [b]) => a - b).map(([, t]) => t);
}

/** `PRAGMA integrity_check` of a capture file, opened read-only (as found: a crash may have left a WAL). */
export function integrity(file: string): string {
  const db = new Database(file, { readonly: true });
  try {
    return String(db.pragma('integrity_check', { simple: true }));
  } finally {
    db.close();
  }
}

/** A POST of raw bytes, read to the end. */
export function post(port: number, path: string, body: Buffer | string): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path, method: 'POST', headers: { 'content-type': 'application/json' }, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (d: Buffer) => chunks.push(d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', reject);
    });
    req.setTimeout(30_000, () => req.destroy(new Error(`POST ${path} unanswered for 30 s`)));
    req.on('error', reject);
    req.end(body);
  });
}

/**
 * Stops capture (cleanly: its file is then self-contained), checks the file's integrity, then replays, through a
 * spawned `serve --mode replay` of that file, every request that completed through capture: each must be served
 * (200, a valid completion) with text from an answer a client saw whole through capture.
 */
export async function verifyCaptureFile(
  rig: FuzzRig,
  outcomes: FuzzOutcome[],
  dir: string,
  seed: number,
): Promise<{
  integrity: string /** Complete exchanges in the file, each replayed. */;
  replayed: number /** Batches of prompts, stored whole. */;
  batches: number;
  problems: string[];
}> {
  // A batch of several prompts is stored whole and never replayed (counted apart, until batches are stored per prompt).
  const answered = outcomes.filter((o) => o.door === 'capture' && o.kind === '200 completion');
  const completed = answered.filter((o) => promptCount(o.case) === 1);
  const seen = completed.flatMap((o) => generatedTexts(o.reply!.text));
  await rig.processes.capture.stop();
  const check = integrity(rig.captureFile);
  const replay = await startMockerProcess(
    ['serve', '--mode', 'replay', '--captures', rig.captureFile, '--timing', 'none', '--max-body-bytes', String(FUZZ_MAX_BODY)],
    0,
    { cwd: dir },
  );
  const problems: string[] = [];
  let stored: { id: number; path: string; body: Buffer }[] = [];
  let unkeyed = 0;
  try {
    // Every exchange the file holds as complete is served, from the request as stored.
    const db = new Database(rig.captureFile, { readonly: true });
    const file = CaptureStore.open(rig.captureFile, { readonly: true });
    // Bodies read through the store (it keeps them compressed).
    const withBodies = (rows: { id: number; path: string }[]) => rows.map((r) => ({ ...r, body: file.getExchange(r.id)!.requestBody }));
    stored = withBodies(
      db.prepare("select id, path from exchanges where outcome = 'complete' and endpoint is not null and prompt_key is not null").all() as {
        id: number;
        path: string;
      }[],
    );
    // Only a batch of prompts is stored without a lookup key.
    const withoutKey = withBodies(
      db.prepare("select id, path from exchanges where outcome = 'complete' and endpoint is not null and prompt_key is null").all() as {
        id: number;
        path: string;
      }[],
    );
    for (const ex of withoutKey) {
      const c: FuzzCase = { kind: 'stored', method: 'POST', path: ex.path, headers: {}, body: ex.body, request: JSON.parse(ex.body.toString('utf8')) as Json };
      if (promptCount(c) === 1) problems.push(`complete exchange #${ex.id} stored without a lookup key: ${ex.body.toString('utf8').slice(0, 300)}`);
    }
    unkeyed = withoutKey.length;
    // A client that left once the engine had answered in full (its exchange was stored before the response
    // could end): what the engine answered it counts as seen too (the body is stored byte for byte).
    const left = new Set(
      outcomes.filter((o) => o.door === 'capture' && o.kind === 'disconnected').map((o) => `${o.case.path} ${o.case.body.toString('latin1')}`),
    );
    for (const ex of stored.filter((e) => left.has(`${e.path} ${e.body.toString('latin1')}`)))
      seen.push(...file.getExchange(ex.id)!.generations.map((g) => g.text));
    file.close();
    db.close();
    for (const ex of stored) {
      const res = await post(replay.port, ex.path, ex.body);
      if (res.status !== 200) problems.push(`replay of stored exchange #${ex.id} answered ${res.status} ${res.text.slice(0, 300)}`);
    }
    for (const o of completed) {
      const c: FuzzCase = { ...o.case, disconnect: undefined };
      const res = await send(replay.port, c);
      const where = describeCase(c, o.index, seed);
      if (res.status !== 200) {
        problems.push(`replay answered ${res.status} ${res.text.slice(0, 300)} — ${where}`);
        continue;
      }
      try {
        classifyReply(c, res);
      } catch (err) {
        problems.push(`replay: ${(err as Error).message} — ${where}`);
        continue;
      }
      // Any capture of the prompt may answer, cut to the request's max_tokens (a cut inside a character may
      // end in U+FFFD): each choice is the start of an answer some client saw in full through capture.
      for (const served of generatedTexts(res.text)) {
        const start = served.replace(/\uFFFD$/, '');
        if (!seen.some((t) => t.startsWith(start))) problems.push(`replay served ${JSON.stringify(served)}, which no client saw through capture — ${where}`);
      }
    }
  } finally {
    await replay.stop();
  }
  return { integrity: check, replayed: stored.length, batches: unkeyed, problems };
}
