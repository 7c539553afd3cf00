import { existsSync } from 'node:fs';
import { configureLogs, log, logStart } from '../util/log.js';
import { availableParallelism } from 'node:os';
import { Worker } from 'node:worker_threads';
import { CaptureStore } from '../store/captureStore.js';
import { startupLineText, type Running, type StartupLine } from './serve.js';
import type { ServeOptions } from '../config/serveOptions.js';
import { totalStop, type StopReport } from './shutdown.js';

/**
 * `mocker serve --num-workers N --threads T`: the N engines spread round-robin over T `node:worker_threads`
 * threads (engine e in thread e mod T), each thread running `startServe` for its share, so the fleet's engines
 * use T cores instead of one event loop. Each engine keeps what it has in one thread: its port (--port + e), its
 * /metrics, its KV event sockets, its log lines. The main thread runs no engine: it starts the threads, prints
 * the startup line once every engine listens, and stops them together.
 */

/** What a serve thread tells the main thread (serveThread.ts). */
export type ThreadReport =
  | { type: 'listening'; ports: number[]; startupLine: StartupLine }
  | { type: 'failed'; message: string }
  | { type: 'stopped'; report: StopReport }
  | { type: 'stopFailed'; message: string };

/** What the main thread tells a serve thread: drain for up to `graceMs`, close, exit. */
export interface StopCommand {
  type: 'stop';
  graceMs: number;
}

/** `--threads`' default: one per core, no more than there are engines. */
export function defaultThreads(numWorkers: number): number {
  return Math.min(availableParallelism(), numWorkers);
}

/** The engines thread `thread` of `threads` runs: round-robin, so consecutive ports land on different threads. */
export function threadShare(numWorkers: number, threads: number, thread: number): number[] {
  return Array.from({ length: numWorkers }, (_, e) => e).filter((e) => e % threads === thread);
}

interface ServeThread {
  listening: Promise<{ ports: number[]; startupLine: StartupLine }>;
  stop(graceMs: number): Promise<StopReport>;
}

/**
 * One serve thread. Once it listens, its end is the process's: an uncaught error or an exit nobody asked for
 * takes the whole process down (exit 1, said on stderr), never leaving a fleet with engines missing.
 */
function startThread(options: ServeOptions, engines: number[], first: boolean): ServeThread {
  const share: ServeOptions = { ...options, share: { engines, first } };
  const worker = new Worker(new URL('./serveThread.js', import.meta.url), { workerData: share });
  const name = `thread of engine(s) ${engines.join(', ')}`;
  let last: ThreadReport | undefined;
  let stopping = false;
  let listened = false;
  const exited = new Promise<number>((resolve) => worker.once('exit', resolve));
  const listening = new Promise<{ ports: number[]; startupLine: StartupLine }>((resolve, reject) => {
    worker.on('message', (report: ThreadReport) => {
      last = report;
      if (report.type !== 'listening') return;
      listened = true;
      resolve(report);
    });
    worker.on('error', (err) => {
      if (!listened) return reject(err);
      log('error', `mocker serve: the ${name} failed: ${err.stack ?? err.message}`);
      process.exit(1);
    });
    void exited.then((code) => {
      if (!listened) return reject(new Error(last?.type === 'failed' ? last.message : `the ${name} exited with code ${code} before listening`));
      if (stopping) return;
      log('error', `mocker serve: the ${name} exited (code ${code}) while serving`);
      process.exit(1);
    });
  });
  return {
    listening,
    stop: async (graceMs) => {
      stopping = true;
      worker.postMessage({ type: 'stop', graceMs } satisfies StopCommand);
      const code = await exited;
      if (last?.type === 'stopped') return last.report;
      throw new Error(last?.type === 'stopFailed' ? last.message : `the ${name} exited with code ${code} while stopping`);
    },
  };
}

/** `startServe` over `threads` worker threads (2 or more): the same ports, startup line and stop report. */
export async function startServeThreads(options: ServeOptions, threads: number): Promise<Running> {
  configureLogs(options.logs);
  const numWorkers = options.numWorkers ?? 1;
  // Drawn once here, as startServe would: each engine's DCGM exporters keep seeds following the previous engine's.
  const shared: ServeOptions = { ...options, dcgm: { ...options.dcgm, seed: options.dcgm?.seed ?? Math.floor(Math.random() * 2 ** 32) } };
  const started: ServeThread[] = [];
  const start = (t: number) => started.push(startThread(shared, threadShare(numWorkers, threads, t), t === 0));
  start(0);
  // A recorded file is created and migrated by the first thread alone (two migrating at once would both apply them).
  if (options.onMiss === 'record') await started[0].listening.catch(() => undefined);
  for (let t = 1; t < threads; t++) start(t);
  const outcomes = await Promise.allSettled(started.map((t) => t.listening));
  const failed = outcomes.find((o) => o.status === 'rejected');
  if (failed) {
    await Promise.all(started.filter((_, t) => outcomes[t].status === 'fulfilled').map((t) => t.stop(0)));
    throw failed.reason;
  }
  const listening = outcomes.map((o) => (o as PromiseFulfilledResult<{ ports: number[]; startupLine: StartupLine }>).value);
  const ports = Array.from({ length: numWorkers }, (_, e) => listening[e % threads].ports[Math.floor(e / threads)]);
  logStart(startupLineText(listening[0].startupLine, ports));
  return {
    port: ports[0],
    ports,
    close: async (graceMs = 0) => {
      const total = totalStop(await Promise.all(started.map((t) => t.stop(graceMs))));
      // Threads closing together may each find another's connection still open: the last one out folds the log.
      if (total.recorded && existsSync(`${total.recorded.file}-wal`)) CaptureStore.open(total.recorded.file).close();
      return total;
    },
  };
}
