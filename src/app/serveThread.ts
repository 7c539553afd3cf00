/**
 * A serve thread of `mocker serve --threads` (threads.ts): runs `startServe` for its share of the engines,
 * reports their ports, and on the main thread's stop command drains, closes and exits.
 *
 * Each thread loads its own tokenizer: the native tokenizer cannot be shared between threads, and with one
 * thread per core at most, its memory and start-up time are paid a few times, not once per engine.
 */
import { parentPort, workerData } from 'node:worker_threads';
import { startServe } from './serve.js';
import type { ServeOptions } from '../config/serveOptions.js';
import type { StopCommand, ThreadReport } from './threads.js';

const main = parentPort!;
const report = (message: ThreadReport) => main.postMessage(message);
const messageOf = (err: unknown) => (err instanceof Error ? err.message : String(err));

try {
  const running = await startServe(workerData as ServeOptions);
  report({ type: 'listening', ports: running.ports ?? [running.port], startupLine: running.startupLine! });
  main.once('message', (command: StopCommand) => {
    running
      .close(command.graceMs)
      .then(
        (stopped) => report({ type: 'stopped', report: stopped }),
        (err: unknown) => report({ type: 'stopFailed', message: messageOf(err) }),
      )
      .finally(() => process.exit(0));
  });
} catch (err) {
  report({ type: 'failed', message: messageOf(err) });
  process.exit(1);
}
