import type { EngineSequence, TimingConfig } from './types.js';

/**
 * When each token of a sequence is due, in ms after the request arrived. Pure: the live driver turns
 * these into timers, a virtual clock can consume them directly.
 */
export function tokenDueTimes(sequence: EngineSequence, timing: TimingConfig): number[] {
  const n = sequence.outputTokenIds.length;
  const out = new Array<number>(n);
  const speedup = timing.speedupRatio;
  for (let i = 0; i < n; i++) {
    if (timing.mode === 'none') out[i] = 0;
    else if (timing.mode === 'fixed') out[i] = ((i + 1) * timing.forwardTimeMs) / speedup;
    else {
      const captured = sequence.capturedTimesMs?.[i];
      // A sequence without captured times (e.g. random fill after a partial hit) continues at the last known time.
      out[i] = (captured ?? (i > 0 ? out[i - 1] * speedup : 0)) / speedup;
    }
  }
  // Tokens are never due before the previous one.
  for (let i = 1; i < n; i++) if (out[i] < out[i - 1]) out[i] = out[i - 1];
  return out;
}
