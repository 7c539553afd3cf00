import { createSchedulerCore, type AnySchedulerConfig } from './scheduler.js';
import { LiveDriver } from './liveDriver.js';
import { EngineRejection, type Engine, type EngineObserver, type EngineRequest, type EngineState, type EngineStream } from './types.js';

export interface SimulatedEngineOptions {
  scheduler: AnySchedulerConfig;
  /** --data-parallel-size: ranks, each with its own scheduler and KV cache. */
  dataParallelSize: number;
  speedupRatio: number;
  /** Shown in `/mocker/engine`. */
  timingDescription: string;
  /** See every pass and request of every rank (metrics, logs). */
  observers?: EngineObserver[];
  /** VLLM_NIXL_ABORT_REQUEST_TIMEOUT: held KV blocks are freed after this if no decode pulled them. Default 480 s. */
  kvHoldTimeoutMs?: number;
}

/** One observer that tells several (none: no statistics work at all). */
function fanOut(observers: EngineObserver[]): EngineObserver | undefined {
  if (observers.length <= 1) return observers[0];
  return {
    onRequest: (rank, n) => observers.forEach((o) => o.onRequest?.(rank, n)),
    onPass: (rank, stats) => observers.forEach((o) => o.onPass?.(rank, stats)),
    onFinished: (rank, request) => observers.forEach((o) => o.onFinished?.(rank, request)),
    onKvEvents: (rank, events) => observers.forEach((o) => o.onKvEvents?.(rank, events)),
    onKvTrace: (rank, entries) => observers.forEach((o) => o.onKvTrace?.(rank, entries)),
  };
}

/** The `Engine` the server uses: one live-driven engine core per data-parallel rank. */
export class SimulatedEngine implements Engine {
  private readonly ranks: LiveDriver[];

  constructor(private readonly options: SimulatedEngineOptions) {
    if (!Number.isInteger(options.dataParallelSize) || options.dataParallelSize < 1) {
      throw new Error(`data parallel size must be a positive integer, got ${options.dataParallelSize}`);
    }
    this.ranks = Array.from(
      { length: options.dataParallelSize },
      (_, rank) =>
        new LiveDriver(createSchedulerCore(options.scheduler), options.speedupRatio, rank, fanOut(options.observers ?? []), undefined, options.kvHoldTimeoutMs),
    );
  }

  submit(request: EngineRequest, signal: AbortSignal): EngineStream {
    const asked = request.dataParallelRank;
    if (asked !== undefined && !(Number.isInteger(asked) && asked >= 0 && asked < this.ranks.length)) {
      throw new EngineRejection(`data parallel rank ${asked} is out of range: this engine has ${this.ranks.length} rank(s)`);
    }
    // Least loaded rank, lowest index on ties.
    const driver = asked !== undefined ? this.ranks[asked] : this.ranks.reduce((best, r) => (r.load < best.load ? r : best));
    return driver.submit(request, signal);
  }

  resetPrefixCache(resetRunningRequests = false): boolean {
    // Every rank tries, as vLLM's reset reaches every engine core.
    return this.ranks.map((r) => r.resetPrefixCache(resetRunningRequests)).every(Boolean);
  }

  releaseKvHold(holdId: string): boolean {
    const match = /^(\d+)\.(.+)$/.exec(holdId);
    const driver = match ? this.ranks[Number(match[1])] : undefined;
    return driver ? driver.releaseHeld(match![2]) : false;
  }

  cachedBlockEventHashes(): bigint[][] {
    return this.ranks.map((r) => r.core.cachedBlockEventHashes());
  }

  state(): EngineState {
    return { ranks: this.ranks.map((r, rank) => ({ rank, ...r.stats() })), timing: this.options.timingDescription };
  }
}
