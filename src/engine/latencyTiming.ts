import { seededUniform } from '../util/mulberry32.js';
import type { PassTiming } from './timingModels.js';

/** `--ttft` / `--itl` and their standard deviations, in ms (AIPerf's mock server knobs). Changeable at run time. */
export interface LatencyKnobs {
  ttftMs: number;
  itlMs: number;
  ttftStdMs: number;
  itlStdMs: number;
}

/** AIPerf's mock server defaults: TTFT 20 ms, ITL 5 ms, no jitter. */
export const DEFAULT_LATENCY_KNOBS: Readonly<LatencyKnobs> = { ttftMs: 20, itlMs: 5, ttftStdMs: 0, itlStdMs: 0 };

/** The first knob that is not a non-negative number, as [key, value], else null. */
export function badLatencyKnob(knobs: LatencyKnobs): [keyof LatencyKnobs, unknown] | null {
  for (const key of Object.keys(DEFAULT_LATENCY_KNOBS) as (keyof LatencyKnobs)[]) {
    const value: unknown = knobs[key];
    if (typeof value !== 'number' || !(value >= 0) || !Number.isFinite(value)) return [key, value];
  }
  return null;
}

/**
 * `--timing latency`: a pass that prefills takes the TTFT (its first tokens come out when it ends), a pass that
 * only decodes takes the ITL, each with seeded Gaussian jitter clipped at 0, divided by `--speedup-ratio`. The
 * knobs are read at every pass, so a change at run time applies from the next pass.
 */
export function latencyTiming(knobs: LatencyKnobs, seed: number, speedupRatio: number): PassTiming {
  const uniform = seededUniform(seed);
  // Box–Muller: one standard normal draw from two uniforms (1 − u keeps the log's argument above 0).
  const normal = () => Math.sqrt(-2 * Math.log(1 - uniform())) * Math.cos(2 * Math.PI * uniform());
  const draw = (mean: number, std: number) => Math.max(0, std > 0 ? mean + std * normal() : mean) / speedupRatio;
  return {
    prefillMs: (batch) => (batch === 0 ? 0 : draw(knobs.ttftMs, knobs.ttftStdMs)),
    decodeMs: (ready) => (ready === 0 ? 0 : draw(knobs.itlMs, knobs.itlStdMs)),
    honoursCapturedTimes: false,
    prefillCoversPass: true,
  };
}
