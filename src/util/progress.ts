/**
 * Progress of a long run, printed once each: a bar on a terminal; otherwise a line at the start, one every 5 s
 * of wall time (only when something was done since the last), and one at the end.
 */
import { SingleBar } from 'cli-progress';

export interface Progress {
  update(done: number, clockMs: number): void;
  stop(): void;
}

const LINE_EVERY_MS = 5000;

/**
 * `name` prefixes the lines (`mocker NAME:`); `clockName` names the run's clock when it is not the wall clock
 * (a simulated run's), else `elapsed`.
 */
export function progressReporter(name: string, enabled: boolean, total: number, clockName = 'elapsed'): Progress {
  if (!enabled) return { update: () => {}, stop: () => {} };
  const started = performance.now();
  if (process.stderr.isTTY) {
    const bar = new SingleBar(
      { format: `${name} [{bar}] {value}/{total} requests | ${clockName} {clock} s | ETA {eta_formatted}`, stream: process.stderr, hideCursor: true },
      undefined,
    );
    bar.start(total, 0, { clock: '0.0' });
    return { update: (done, clockMs) => bar.update(done, { clock: (clockMs / 1000).toFixed(1) }), stop: () => bar.stop() };
  }
  let last = { done: 0, clockMs: 0 };
  let printed: number | null = null;
  let lastLine = started;
  // Online, the run's clock is the wall clock: said once.
  const clock = () => (clockName === 'elapsed' ? '' : `${clockName} ${(last.clockMs / 1000).toFixed(1)} s, `);
  const line = () => {
    printed = last.done;
    lastLine = performance.now();
    console.error(`mocker ${name}: ${last.done}/${total} requests done, ${clock()}${((lastLine - started) / 1000).toFixed(1)} s elapsed`);
  };
  console.error(`mocker ${name}: ${total} requests`);
  return {
    update: (done, clockMs) => {
      last = { done, clockMs };
      if (performance.now() - lastLine >= LINE_EVERY_MS && printed !== done) line();
    },
    stop: () => {
      if (printed !== last.done) line();
    },
  };
}
