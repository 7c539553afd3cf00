import { setTimeout as sleep } from 'node:timers/promises';
import { tokenDueTimes } from './timing.js';
import type { Engine, EngineRequest, TimingConfig, TokenEvent } from './types.js';

/** How close to a deadline the driver stops sleeping on a timer and yields to the event loop instead. */
const SPIN_MS = 1.5;

function yieldToLoop(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

/** Waits until `deadline` (performance.now() ms): a timer for the bulk, event-loop turns for the last ms. */
async function waitUntil(deadline: number, signal: AbortSignal): Promise<void> {
  const remaining = deadline - performance.now();
  if (remaining > SPIN_MS) {
    try {
      await sleep(remaining - SPIN_MS, undefined, { signal });
    } catch {
      return;
    }
  }
  while (!signal.aborted && performance.now() < deadline) await yieldToLoop();
}

/**
 * The trivial engine: every request runs alone, its tokens due at the times the timing config gives.
 * The simulated scheduler will replace it behind the same `Engine` interface.
 */
export class LiveEngine implements Engine {
  constructor(private readonly timing: TimingConfig) {}

  async *submit(request: EngineRequest, signal: AbortSignal): AsyncIterable<TokenEvent[]> {
    const start = request.arrivalMs;
    const due: { at: number; sequence: number; emitted: number }[] = [];
    request.sequences.forEach((seq, s) => {
      tokenDueTimes(seq, this.timing).forEach((at, i) => due.push({ at, sequence: s, emitted: i + 1 }));
    });
    due.sort((a, b) => a.at - b.at || a.sequence - b.sequence || a.emitted - b.emitted);
    let i = 0;
    while (i < due.length && !signal.aborted) {
      const at = due[i].at;
      if (at > 0) await waitUntil(start + at, signal);
      if (signal.aborted) return;
      const batch: TokenEvent[] = [];
      while (i < due.length && due[i].at <= at) {
        batch.push({ sequence: due[i].sequence, emitted: due[i].emitted });
        i++;
      }
      yield batch;
    }
  }
}
