import { createSchedulerCore, type AnySchedulerConfig } from './scheduler.js';
import { LiveDriver } from './liveDriver.js';
import type { KvTraceEntry } from './contract.js';
import type { VllmKvEvent } from './kv/vllmKvEvents.js';
import {
  EngineRejection,
  type Engine,
  type EngineObserver,
  type EngineRequest,
  type EngineState,
  type EngineStream,
  type FinishedRequest,
  type PassStats,
} from './types.js';

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

/** Statistics calls made in one turn of the event loop (a call costs 10 to 50 µs with every metrics flavour observing). */
const FLUSHED_PER_TURN = 256;

/**
 * One observer that tells several (none: no statistics work at all). The statistics calls (a request, a pass,
 * a finished request) are queued and made a turn later, after the pass's tokens have been handed to the
 * responses and written: with every metrics flavour observing they cost more than the pass itself, and delayed
 * its tokens (a replayed prefill hop's last pass, 2026-11-27: 0.40-0.51 ms from the pass to its delivery, 0.04-0.08
 * with the calls queued). KV events and traces go at once, as vLLM publishes them with the step. `flush` makes
 * the queued calls now (before a scrape reads the metrics).
 */
class StatisticsFanOut implements EngineObserver {
  private readonly queued: (() => void)[] = [];
  private scheduled: NodeJS.Immediate | null = null;

  constructor(private readonly observers: EngineObserver[]) {}

  onRequest(rank: number, n: number): void {
    this.defer(() => this.observers.forEach((o) => o.onRequest?.(rank, n)));
  }

  onPass(rank: number, stats: PassStats): void {
    this.defer(() => this.observers.forEach((o) => o.onPass?.(rank, stats)));
  }

  onFinished(rank: number, request: FinishedRequest): void {
    this.defer(() => this.observers.forEach((o) => o.onFinished?.(rank, request)));
  }

  onKvEvents(rank: number, events: VllmKvEvent[]): void {
    this.observers.forEach((o) => o.onKvEvents?.(rank, events));
  }

  onKvTrace(rank: number, entries: KvTraceEntry[]): void {
    this.observers.forEach((o) => o.onKvTrace?.(rank, entries));
  }

  flush(): void {
    if (this.scheduled) clearImmediate(this.scheduled);
    this.scheduled = null;
    for (const call of this.queued.splice(0)) call();
  }

  private defer(call: () => void): void {
    this.queued.push(call);
    this.scheduled ??= setImmediate(() => this.flushSome());
  }

  /**
   * At most `FLUSHED_PER_TURN` calls, the rest a turn later: a batch of 10,000 prompts finishing in one pass
   * queues 10,000 requests' statistics, half a second of work that would otherwise hold the loop at once.
   */
  private flushSome(): void {
    this.scheduled = null;
    for (const call of this.queued.splice(0, FLUSHED_PER_TURN)) call();
    if (this.queued.length > 0) this.scheduled = setImmediate(() => this.flushSome());
  }
}

/** The `Engine` the server uses: one live-driven engine core per data-parallel rank. */
export class SimulatedEngine implements Engine {
  private readonly ranks: LiveDriver[];
  private readonly statistics: StatisticsFanOut | undefined;

  constructor(private readonly options: SimulatedEngineOptions) {
    if (!Number.isInteger(options.dataParallelSize) || options.dataParallelSize < 1) {
      throw new Error(`data parallel size must be a positive integer, got ${options.dataParallelSize}`);
    }
    const observers = options.observers ?? [];
    this.statistics = observers.length > 0 ? new StatisticsFanOut(observers) : undefined;
    this.ranks = Array.from(
      { length: options.dataParallelSize },
      (_, rank) => new LiveDriver(createSchedulerCore(options.scheduler), options.speedupRatio, rank, this.statistics, undefined, options.kvHoldTimeoutMs),
    );
  }

  flushStatistics(): void {
    this.statistics?.flush();
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
    return this.ranks.some((r) => r.releaseKvHold(holdId));
  }

  cachedBlockEventHashes(): bigint[][] {
    return this.ranks.map((r) => r.core.cachedBlockEventHashes());
  }

  state(): EngineState {
    return { ranks: this.ranks.map((r, rank) => ({ rank, ...r.stats() })), timing: this.options.timingDescription };
  }
}
