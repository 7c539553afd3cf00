/**
 * The engine seam: everything the HTTP layer serves goes through `Engine.submit`. The engine decides
 * when each planned output token becomes available; it never sees text or HTTP.
 */

export interface EngineSequence {
  /** The output token ids this sequence will produce (decided by the output source). */
  outputTokenIds: readonly number[];
  /** When each token arrived in the capture, ms after the request was sent (captured timing only). */
  capturedTimesMs?: readonly number[];
}

export interface EngineRequest {
  requestId: string;
  /** When the request arrived (performance.now() ms): simulated durations count from here. */
  arrivalMs: number;
  promptTokenIds: readonly number[];
  /** One per choice (`n`). */
  sequences: readonly EngineSequence[];
}

/** Tokens that became available at the same moment: sequence `sequence` now has `emitted` tokens out. */
export interface TokenEvent {
  sequence: number;
  emitted: number;
}

export interface Engine {
  /**
   * Runs a request; yields batches of token events in time order, then ends. Aborting the signal
   * stops the request and frees what it holds at once.
   */
  submit(request: EngineRequest, signal: AbortSignal): AsyncIterable<TokenEvent[]>;
}

export type TimingMode = 'captured' | 'fixed' | 'none';

export interface TimingConfig {
  mode: TimingMode;
  /** Duration of one engine step for `fixed` timing (prefill = one step, then one step per token). */
  forwardTimeMs: number;
  /** Divides every simulated duration. */
  speedupRatio: number;
}
