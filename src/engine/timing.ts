import type { EngineSequence } from './types.js';

/**
 * The earliest time each token of a sequence may come out under captured timing, in ms after the request
 * arrived (captured offsets ÷ speedup). Tokens without a captured time (a random extension of a partial
 * hit) may follow the last captured one at once.
 */
export function capturedDueTimes(sequence: EngineSequence, speedupRatio: number): number[] {
  const n = sequence.outputTokenIds.length;
  const out = new Array<number>(n);
  const captured = sequence.capturedTimesMs ?? [];
  for (let i = 0; i < n; i++) {
    const at = i < captured.length ? captured[i] / speedupRatio : i > 0 ? out[i - 1] : 0;
    out[i] = i > 0 ? Math.max(at, out[i - 1]) : at;
  }
  return out;
}
