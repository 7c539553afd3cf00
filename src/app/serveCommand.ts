import type { ServeCommand } from '../config/resolveServe.js';
import { parsePdLayout, startPdDeployment } from './pd.js';
import { startServe } from './serve.js';
import { stopOnSignal } from './shutdown.js';
import { defaultThreads, startServeThreads } from './threads.js';

/** `mocker serve` from its resolved flags: one server, its engines over threads, or a PD deployment; stopped by a signal. */
export async function runServeCommand({ options, pd, threads: givenThreads, shutdownTimeoutS }: ServeCommand): Promise<void> {
  const workers = options.numWorkers;
  // More threads than engines would idle.
  const threads = Math.min(givenThreads ?? defaultThreads(workers), workers);
  if (pd) {
    if (options.role !== 'agg') throw new Error('--pd starts its own prefill and decode engines: drop --disaggregation-mode');
    if ((givenThreads ?? 1) > 1) throw new Error('--threads spreads --num-workers engines; --pd runs its engines in the main thread: drop --threads');
    await stopOnSignal('serve', startPdDeployment(options, parsePdLayout(pd)), shutdownTimeoutS);
  } else await stopOnSignal('serve', threads > 1 ? startServeThreads(options, threads) : startServe(options), shutdownTimeoutS);
}
