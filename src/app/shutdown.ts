import { existsSync } from 'node:fs';
import { log } from '../util/log.js';
import { constants } from 'node:os';
import type { RawExchange } from '../capture/forward.js';
import type { DrainResult } from '../wire/drain.js';
import { CaptureFileError } from '../store/captureStore.js';

/** How a command stopped: what its drain did, and what it recorded (capture, `serve --on-miss record`). */
export interface StopReport extends DrainResult {
  recorded?: RecordedTally;
}

export interface RecordedTally {
  /** Exchanges (generations, embeddings, rerankings) stored by this process. */
  exchanges: number;
  /** Of those, the ones stored as aborted (the client left, or the shutdown cut them off). */
  aborted: number;
  file: string;
}

/**
 * Counts the exchanges a sink stores, and keeps the ones being stored so a shutdown can wait for
 * them before closing the file (the exchanges a drain cuts off reach the sink as it closes their connections).
 */
export class RecordingSink<Exchange extends Pick<RawExchange, 'endpoint' | 'outcome'> = RawExchange> {
  private readonly storing = new Set<Promise<void>>();
  private readonly tally: RecordedTally;

  /** `store`'s failures are reported naming `file`. */
  constructor(
    private readonly store: (exchange: Exchange) => Promise<void>,
    file: string,
  ) {
    this.tally = { exchanges: 0, aborted: 0, file };
  }

  readonly sink = (raw: Exchange): Promise<void> => {
    const stored = this.store(raw).then(
      () => {
        if (!raw.endpoint) return;
        this.tally.exchanges++;
        if (raw.outcome === 'aborted') this.tally.aborted++;
      },
      (err: unknown) => {
        throw err instanceof CaptureFileError ? err : new CaptureFileError(this.tally.file, err instanceof Error ? err.message : String(err));
      },
    );
    this.storing.add(stored);
    // Its failure is the caller's to report; here it only stops being waited for.
    void stored.finally(() => this.storing.delete(stored)).catch(() => undefined);
    return stored;
  };

  get recorded(): RecordedTally {
    return { ...this.tally };
  }

  /** Resolves once every exchange handed over so far (and those handed over meanwhile) is stored or failed. */
  async settled(): Promise<void> {
    // The connections a drain closes hand their aborted exchanges over in the following turns.
    await new Promise((resolve) => setImmediate(resolve));
    while (this.storing.size > 0) await Promise.allSettled([...this.storing]);
  }
}

/** What several engines recording into one file stored, as one tally (undefined when none recorded). */
export function totalRecorded(reports: StopReport[]): RecordedTally | undefined {
  const tallies = reports.flatMap((r) => (r.recorded ? [r.recorded] : []));
  return (
    tallies[0] && {
      exchanges: tallies.reduce((sum, t) => sum + t.exchanges, 0),
      aborted: tallies.reduce((sum, t) => sum + t.aborted, 0),
      file: tallies[0].file,
    }
  );
}

/** The stops of a command's parts (threads, processes) as one: their drains summed, and their tallies of the one file. */
export function totalStop(reports: StopReport[]): StopReport {
  return {
    finished: reports.reduce((sum, r) => sum + r.finished, 0),
    aborted: reports.reduce((sum, r) => sum + r.aborted, 0),
    recorded: totalRecorded(reports),
  };
}

/** The summary line a command prints when it has stopped. */
export function stopSummary(report: StopReport): string {
  const drained = `${report.finished} request(s) in flight finished, ${report.aborted} cut off at the shutdown timeout`;
  const tally = report.recorded;
  if (!tally) return `stopped: ${drained}`;
  // A file another connection still has open stays in WAL mode (see CaptureStore.close): not self-contained yet.
  const closed = existsSync(`${tally.file}-wal`)
    ? `${tally.file} closed, its -wal file kept (another connection has it open)`
    : `${tally.file} closed self-contained`;
  return `stopped: ${drained}; ${tally.exchanges} exchange(s) recorded (${tally.aborted} aborted), ${closed}`;
}

/** How often a command started by npm looks whether npm is still its parent. */
const ORPHAN_CHECK_MS = 250;

/**
 * Stops what `starting` starts gracefully on the first SIGINT/SIGTERM (stop taking requests, let those in flight
 * finish for up to `timeoutS` seconds, close everything, print one summary line, exit 0); a second signal exits
 * at once. The handlers are in place before the start, so a signal that arrives once the startup line is printed
 * (or while it starts) stops it gracefully instead of killing the process. Resolves once started; a failed start
 * removes the handlers and rejects, for the command to report.
 */
export async function stopOnSignal(command: string, starting: Promise<{ close(graceMs?: number): Promise<StopReport> }>, timeoutS: number): Promise<void> {
  let stopping = false;
  let orphaned: NodeJS.Timeout | undefined;
  const onSignal = (signal: NodeJS.Signals, why: string = signal) => {
    if (stopping) {
      log('warning', `mocker ${command}: ${signal} again: exiting at once`);
      process.exit(128 + constants.signals[signal]);
    }
    stopping = true;
    clearInterval(orphaned);
    log('info', `mocker ${command}: ${why}: draining the requests in flight (up to ${timeoutS} s; ${signal} again exits at once)`);
    starting.then(
      (running) =>
        running.close(timeoutS * 1000).then(
          (report) => {
            log('info', `mocker ${command}: ${stopSummary(report)}`);
            process.exit(0);
          },
          (err: unknown) => {
            log('error', `mocker ${command}: stopping failed: ${err instanceof Error ? err.message : String(err)}`);
            process.exit(1);
          },
        ),
      // A start that fails is the command's to report.
      () => undefined,
    );
  };
  // Node passes the signal's number as a second argument, which is not a reason to print: only the name is passed on.
  process.on('SIGINT', (signal) => onSignal(signal));
  process.on('SIGTERM', (signal) => onSignal(signal));
  // `npm start` and `npx mocker` exit on a SIGTERM without passing it on: started by npm, the command stops as on
  // SIGTERM once npm has gone (it is then another process's child), instead of serving on as an orphan.
  const parent = process.ppid;
  orphaned =
    process.env.npm_command === undefined
      ? undefined
      : setInterval(() => process.ppid !== parent && onSignal('SIGTERM', `npm (pid ${parent}), which started it, has exited`), ORPHAN_CHECK_MS);
  orphaned?.unref();
  try {
    await starting;
  } catch (err) {
    clearInterval(orphaned);
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    throw err;
  }
}
