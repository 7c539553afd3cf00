/**
 * A worker thread of `mocker trace --sweep` (app/traceSweep.ts): one lane of the sweep. It claims the next
 * combination from the counter the lanes share, replays it in process (loading the workload from its options),
 * posts its report, and ends when none is left or a lane has failed.
 */
import { parentPort, workerData } from 'node:worker_threads';
import type { ReplayReport } from '../trace/collector.js';
import { replayTrace, type Settings, type TraceOptions } from './trace.js';

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
  for (let index = Atomics.add(next, 0, 1); index < combinations.length; index = Atomics.add(next, 0, 1)) {
    try {
      const { report, settings } = await replayTrace(combinations[index]);
      answer({ index, report, settings });
    } catch (err) {
      Atomics.store(next, 0, combinations.length);
      answer({ index, error: (err as Error).message });
      return;
    }
  }
}

const port = parentPort;
const lane = (workerData as { sweepLane?: SweepLane } | null)?.sweepLane;
// Imported by the sweep itself too (runLane): only a lane's worker thread runs one here.
if (port !== null && lane !== undefined) await runLane(lane, (a) => port.postMessage(a));
