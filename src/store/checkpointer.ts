/**
 * WAL checkpoints off the writer's thread. A checkpoint copies the write-ahead log into the database file and
 * syncs both; left to SQLite (every 1,000 pages, in the committing thread) it stalls the writer for the two
 * fsyncs every ~80 exchanges — and the capture proxy holds a client's last bytes until its exchange is stored.
 * Here a worker thread with its own connection runs a PASSIVE checkpoint (it never blocks the writer) every
 * `intervalMs`; the writer keeps SQLite's own, at a large threshold, only as the bound on the log's size while
 * writes never pause (the log restarts only at a write that finds it all copied).
 */
import { createRequire } from 'node:module';
import { Worker } from 'node:worker_threads';

/** The shared flags: the writer sets flags[STOP] to stop the worker, which sets flags[STOPPED] once its connection is closed. */
const STOP = 0;
const STOPPED = 1;

/**
 * The worker: plain JavaScript (it runs the same from the TypeScript sources and from dist/), blocked in
 * Atomics.wait between checkpoints.
 */
const WORKER_SOURCE = `
const { workerData } = require('node:worker_threads');
const flags = new Int32Array(workerData.flags);
let db;
try {
  db = new (require(workerData.sqliteModule))(workerData.path, { fileMustExist: true });
  while (Atomics.wait(flags, ${STOP}, 0, workerData.intervalMs) === 'timed-out') {
    try {
      db.pragma('wal_checkpoint(PASSIVE)');
    } catch {
      // Busy (another checkpoint, a closing writer): the next round copies it.
    }
  }
} finally {
  try {
    db?.close();
  } finally {
    Atomics.store(flags, ${STOPPED}, 1);
    Atomics.notify(flags, ${STOPPED});
  }
}
`;

/** How long `stop` waits for the worker's connection to close (it is between checkpoints almost always). */
const STOP_WAIT_MS = 5000;

export class BackgroundCheckpointer {
  private readonly flags = new Int32Array(new SharedArrayBuffer(8));
  private readonly worker: Worker;
  private failed = false;

  constructor(path: string, intervalMs: number) {
    const sqliteModule = createRequire(import.meta.url).resolve('better-sqlite3');
    this.worker = new Worker(WORKER_SOURCE, { eval: true, workerData: { path, intervalMs, sqliteModule, flags: this.flags.buffer } });
    this.worker.on('error', (err) => {
      // The writer's own checkpoints still bound the log: slower, never wrong.
      this.failed = true;
      console.error(`mocker: background WAL checkpoints stopped (${err.message}); the writer checkpoints instead`);
    });
    this.worker.unref();
  }

  /** Stops the worker and waits (synchronously) until its connection is closed, so the writer can close the file cleanly. */
  stop(): void {
    Atomics.store(this.flags, STOP, 1);
    Atomics.notify(this.flags, STOP);
    if (!this.failed) Atomics.wait(this.flags, STOPPED, 0, STOP_WAIT_MS);
    void this.worker.terminate();
  }
}
