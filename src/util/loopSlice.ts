/** Longest stretch of one request's work between two turns of the event loop. */
const SLICE_MS = 10;

/**
 * A long loop over a request's items (a batch of 10,000 prompts, 10,000 inputs to embed) gives the event loop a
 * turn every `SLICE_MS` of work, so other requests, `/health` among them, wait no longer than that for it.
 */
export class LoopSlice {
  private since = performance.now();

  /** Resolves at once within the slice; past it, on the event loop's next turn (after its I/O). */
  async pause(): Promise<void> {
    if (performance.now() - this.since < SLICE_MS) return;
    await new Promise<void>((resolve) => setImmediate(resolve));
    this.since = performance.now();
  }
}
