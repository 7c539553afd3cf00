import type { PerfModel } from './perf/perfModel.js';

/**
 * How long a pass takes (ms of simulated time, speedups applied). Tokens of a pass are out at its end.
 */
export interface PassTiming {
  /**
   * Prefill part of a pass: `batchCount` prefilling requests, integer means of their prompt and prefix lengths, and
   * the context their new tokens attend over (PrefillBatch.attendedContext).
   */
  prefillMs(batchCount: number, meanIsl: number, meanPrefix: number, attendedContext: number): number;
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
    prefillMs: (batch, isl, prefix, attended) => (batch === 0 ? 0 : scale(model.prefillMs(batch, isl, prefix, attended), speedupRatio)),
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

/**
 * The prefilling requests of one pass, as the timing models read them: each adds the tokens it had before the pass
 * (cached prefix, earlier chunks) and its length after it; `sign` -1 takes one back (a preempted request).
 */
export class PrefillBatch {
  count = 0;
  private islSum = 0;
  private prefixSum = 0;
  private attendedSum = 0;

  add(prefix: number, isl: number, sign: 1 | -1 = 1): void {
    this.count += sign;
    this.islSum += sign * isl;
    this.prefixSum += sign * prefix;
    this.attendedSum += sign * (isl - prefix) * isl;
  }

  /**
   * The context the new tokens attend over: each request's length weighted by its new tokens, so that new tokens ×
   * context sums every request's own (the attention term of a Vidur-style prefill cost, which the mean length
   * undercounts when the lengths differ: 1,200 and 100 new tokens attend over 1,115 on average, not 650).
   */
  get attendedContext(): number {
    const fresh = this.islSum - this.prefixSum;
    if (fresh > 0) return this.attendedSum / fresh;
    return this.count > 0 ? this.islSum / this.count : 0;
  }

  /** Its prefill time under `timing`: Dynamo's integer means of prompt and prefix lengths, and the attended context. */
  prefillMs(timing: PassTiming): number {
    const n = this.count;
    return n === 0 ? 0 : timing.prefillMs(n, Math.floor(this.islSum / n), Math.floor(this.prefixSum / n), this.attendedContext);
  }
}

/** The attended context of requests prefilled together (PrefillBatch.attendedContext). */
export function attendedContext(requests: readonly { prefix: number; isl: number }[]): number {
  const batch = new PrefillBatch();
  for (const { prefix, isl } of requests) batch.add(prefix, isl);
  return batch.attendedContext;
}
