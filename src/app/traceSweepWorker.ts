/**
 * A worker thread of `mocker trace --sweep` (app/traceSweep.ts): replays each combination it is given, in
 * process, loading the workload from the combination's options, and posts back its report; null ends it.
 */
import { parentPort } from 'node:worker_threads';
import type { ReplayReport } from '../trace/collector.js';
import { replayTrace, type Settings, type TraceOptions } from './trace.js';

export interface SweepJob {
  index: number;
  options: TraceOptions;
}

export interface SweepDone {
  index: number;
  report: ReplayReport;
  settings: Settings;
}

export type SweepAnswer = SweepDone | { index: number; error: string };

const port = parentPort;
if (port === null) throw new Error('traceSweepWorker.js runs as a worker thread of mocker trace --sweep');
port.on('message', async (job: SweepJob | null) => {
  if (job === null) return port.close();
  let answer: SweepAnswer;
  try {
    const { report, settings } = await replayTrace(job.options);
    answer = { index: job.index, report, settings };
  } catch (err) {
    answer = { index: job.index, error: (err as Error).message };
  }
  port.postMessage(answer);
});
