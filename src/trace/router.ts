/**
 * Routing requests across workers (engine-reference §8.5, §8.7): round robin, or Dynamo's KV-aware router.
 * A router sees only what a real one would: requests, their lifecycle (first token, completion) and the
 * workers' KV events in local block hashes (`chainHash(contentHash(block tokens))`, as the engine's blocks).
 */
import type { TokenIds } from '../engine/index.js';

/** A request as the router sees it. */
export interface RoutedRequest {
  uuid: string;
  /** The prompt's token ids. */
  tokens: TokenIds;
  /** Arrival on the run's clock (ms): orders the queue (fcfs/lcfs). */
  arrivalMs: number;
}

/** A worker's KV cache change, in local block hashes (what the engine's block manager stores). */
export type RouterKvEvent =
  | { kind: 'stored'; blocks: readonly number[]; parent: number | null }
  | { kind: 'removed'; blocks: readonly number[] }
  | { kind: 'cleared' };

/** A parked request the router now lets go, and where. */
export interface Release {
  request: RoutedRequest;
  worker: number;
}

export interface Router {
  /** Picks the request's worker, or returns null when it is parked (it comes back from `released`). */
  admit(request: RoutedRequest, nowMs: number): number | null;
  /** The request's first token came out: its prefill no longer loads the worker. */
  markPrefillCompleted(uuid: string, nowMs: number): void;
  /** The request finished (or failed): everything it held on its worker is released. */
  free(uuid: string, nowMs: number): void;
  /** Parked requests that may go now, in the queue policy's order, each with its worker. */
  released(nowMs: number): Release[];
  /** A worker's KV events, oldest first. */
  applyKvEvents(worker: number, events: readonly RouterKvEvent[]): void;
  /** Whether KV events matter to it (simulated workers keep none for a router that ignores them). */
  readonly usesKvEvents: boolean;
  /** Cached prefix blocks of `tokens` on each worker, as the router believes (tests, reports). */
  overlaps(tokens: TokenIds): number[];
}

/** `next % workers` at dispatch (§8.5); never parks, ignores KV events. */
export class RoundRobinRouter implements Router {
  readonly usesKvEvents = false;
  private next = 0;

  constructor(private readonly workers: number) {
    if (!Number.isInteger(workers) || workers < 1) throw new Error(`round robin needs at least one worker, got ${workers}`);
  }

  admit(): number {
    return this.next++ % this.workers;
  }

  markPrefillCompleted(): void {}
  free(): void {}
  released(): Release[] {
    return [];
  }
  applyKvEvents(): void {}
  overlaps(): number[] {
    return new Array<number>(this.workers).fill(0);
  }
}
