/**
 * A worker thread of `mocker trace --sweep` (app/traceSweep.ts): one lane of the sweep. Started before the sweep is
 * planned, it loads the replay's code, waits for its lane, then claims the next
 * combination from the counter the lanes share, replays it in process (loading the workload from its options once),
 * posts its report, and ends when none is left or a lane has failed.
 */
import { parentPort, workerData } from 'node:worker_threads';
import type { ReplayReport } from '../trace/collector.js';
import { replayTrace, type Settings, type TraceOptions, type WorkloadCache } from './trace.js';

export interface SweepLane {
  /** The index of the next combination to claim (Atomics.add), shared by every lane. */
  next: Int32Array;
  combinations: TraceOptions[];
}

export interface SweepDone {
  index: number;
  report: ReplayReport;
  settings: Settings;
}

export type SweepAnswer = SweepDone | { index: number; error: string };

/** Replays combinations claimed from `lane` until none is left; `answer` hears each. A failure ends the claiming for every lane. */
export async function runLane(lane: SweepLane, answer: (a: SweepAnswer) => void): Promise<void> {
  const { next, combinations } = lane;
  const workloads: WorkloadCache = new Map();
  for (let index = Atomics.add(next, 0, 1); index < combinations.length; index = Atomics.add(next, 0, 1)) {
    try {
      const { report, settings } = await replayTrace(combinations[index], undefined, workloads);
      answer({ index, report, settings });
    } catch (err) {
      Atomics.store(next, 0, combinations.length);
      answer({ index, error: (err as Error).message });
      return;
    }
  }
}

const port = parentPort;
// Imported by the sweep itself too (runLane): only a lane's worker thread runs one here, once it is given it.
if (port !== null && (workerData as { sweepLane?: boolean } | null)?.sweepLane === true) {
  port.once('message', (lane: SweepLane) => {
    void runLane(lane, (a) => port.postMessage(a)).then(() => port.close());
  });
}
