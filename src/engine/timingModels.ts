import type { PerfModel } from './perf/perfModel.js';

/**
 * How long a pass takes (ms of simulated time, speedups applied). Tokens of a pass are out at its end.
 */
export interface PassTiming {
  /** Prefill part of a pass: `batchCount` prefilling requests, integer means of their prompt and prefix lengths. */
  prefillMs(batchCount: number, meanIsl: number, meanPrefix: number): number;
  /** Decode part of a pass emitting `ready` tokens. */
  decodeMs(ready: number, activeKvTokens: number, contextLength: number, totalKvTokens: number): number;
  /** Tokens wait for their captured arrival times (replay): passes themselves cost nothing. */
  readonly honoursCapturedTimes: boolean;
  /** A pass that prefills costs its prefill time only: the tokens it emits are out when the prefill ends (`--ttft` is the whole first pass). */
  readonly prefillCoversPass?: boolean;
}

const scale = (ms: number, ratio: number) => (ratio > 0 ? ms / ratio : ms);

/** A perf model (polynomial or interpolated), divided by `--speedup-ratio` (and `--decode-speedup-ratio` for decode). */
export function modelTiming(model: PerfModel, speedupRatio: number, decodeSpeedupRatio: number): PassTiming {
  return {
    prefillMs: (batch, isl, prefix) => (batch === 0 ? 0 : scale(model.prefillMs(batch, isl, prefix), speedupRatio)),
    decodeMs: (ready, active, context, total) => (ready === 0 ? 0 : scale(model.decodeMs(ready, active, context, total), speedupRatio * decodeSpeedupRatio)),
    honoursCapturedTimes: false,
  };
}

/** `--forward-time-ms`: every pass that emits tokens takes the same time (the seeds' FORWARD_TIME). */
export function fixedTiming(forwardTimeMs: number, speedupRatio: number): PassTiming {
  return { prefillMs: () => 0, decodeMs: (ready) => (ready === 0 ? 0 : scale(forwardTimeMs, speedupRatio)), honoursCapturedTimes: false };
}

/** No simulated time at all (`--timing none`), or only the captured times (`--timing captured`). */
export function zeroTiming(honoursCapturedTimes: boolean): PassTiming {
  return { prefillMs: () => 0, decodeMs: () => 0, honoursCapturedTimes };
}
