/**
 * Offline trace replay (engine-reference §8.5, §5.4): a deterministic discrete-event simulation of one or
 * more engine cores on a virtual clock. Passes run back to back on each worker; arrivals and completions
 * are events; requests are routed when they arrive. Latencies are virtual ms; nothing here reads a clock.
 */
import { createSchedulerCore, type AnySchedulerConfig, type CacheEvent, type PassResult, type SchedulerCore, type TokenIds } from '../engine/index.js';
import type { PassSample, ReplayCollector } from './collector.js';
import type { Dispatch, WorkloadDriver } from './driver.js';
import type { Router, RoutedRequest } from './router.js';

/** How often (virtual ms) a worker's cache state is sampled for the charts, at most. */
const SAMPLE_GAP_MS = 50;

export interface AggregatedFleet {
  kind: 'aggregated';
  workers: AnySchedulerConfig[];
  router: Router;
}

export interface DisaggregatedFleet {
  kind: 'disaggregated';
  prefill: AnySchedulerConfig[];
  decode: AnySchedulerConfig[];
  prefillRouter: Router;
  decodeRouter: Router;
  /** §5.2: the prompt's KV crosses to the decode worker in `tokens × bytesPerToken / bandwidth` (0: instant). */
  handoff: { bytesPerToken: number; bandwidthGBps: number } | null;
}

export type Fleet = AggregatedFleet | DisaggregatedFleet;

/** Requests finished, and the virtual time (ms). */
export type OfflineProgress = (completed: number, nowMs: number) => void;

interface InFlight {
  dispatch: Dispatch;
  prompt: TokenIds;
  /** Its planned output, when the workload plans one (a later turn's prompt repeats it). */
  outputTokenIds: readonly number[] | undefined;
}

type Stage = 'aggregated' | 'prefill' | 'decode';

interface Worker {
  core: SchedulerCore;
  stage: Stage;
  /** Its cache state for the charts (made once: passes are many). */
  sample: () => PassSample;
  /** Index in the collector's worker list. */
  index: number;
  router: Router;
  /** Index of this worker within its router. */
  routerIndex: number;
  pass: PassResult | null;
  /** KV events the router sees when the pass ends (SGLang's visibility). */
  passEndEvents: CacheEvent[];
  /** Idle with work it cannot progress on until this time (null: until something new arrives). */
  blockedUntil: number | null;
  blocked: boolean;
}

/** Time-ordered pending decode enqueues (disaggregated handoffs), ties in order of scheduling. */
interface Handoff {
  atMs: number;
  order: number;
  uuid: string;
}

export class OfflineReplay {
  private readonly workers: Worker[] = [];
  /** Each stage's workers, in their router's order. */
  private readonly pools: Record<Stage, Worker[]> = { aggregated: [], prefill: [], decode: [] };
  private readonly requests = new Map<string, InFlight>();
  private handoffs: Handoff[] = [];
  private handoffOrder = 0;
  private completed = 0;
  private now = 0;
  /** Requests no worker can ever hold, by reason. */
  readonly rejections = new Map<string, number>();

  constructor(
    private readonly fleet: Fleet,
    private readonly driver: WorkloadDriver,
    private readonly collector: ReplayCollector,
    private readonly progress?: OfflineProgress,
  ) {
    const add = (configs: AnySchedulerConfig[], router: Router, stage: Stage) => {
      for (const [routerIndex, config] of configs.entries()) {
        // A decode worker's engine is an aggregated one that receives remote prefills.
        const core = createSchedulerCore({ ...config, workerType: stage === 'prefill' ? 'prefill' : 'aggregated', cacheEvents: router.usesKvEvents });
        const worker: Worker = {
          core,
          stage,
          sample: () => core.engineStats(),
          index: this.workers.length,
          router,
          routerIndex,
          pass: null,
          passEndEvents: [],
          blockedUntil: null,
          blocked: false,
        };
        this.workers.push(worker);
        this.pools[stage].push(worker);
      }
    };
    if (fleet.kind === 'aggregated') {
      add(fleet.workers, fleet.router, 'aggregated');
    } else {
      add(fleet.prefill, fleet.prefillRouter, 'prefill');
      add(fleet.decode, fleet.decodeRouter, 'decode');
    }
  }

  /** Runs to the end; returns the virtual time of the last event. */
  run(): number {
    for (;;) {
      // Everything due now, repeated until nothing changes (a zero-time pass can free a worker at once).
      let changed = true;
      while (changed) {
        changed = this.applyCompletions();
        changed = this.releaseHandoffs() || changed;
        changed = this.releaseArrivals() || changed;
        changed = this.startPasses() || changed;
      }
      const next = this.nextEventMs();
      if (next === null) break;
      this.now = next;
    }
    if (!this.driver.done) {
      const stuck = this.workers
        .filter((w) => !w.core.isIdle)
        .map((w) => `worker ${w.index}: ${w.core.engineStats().running} running, ${w.core.engineStats().waiting} waiting`);
      throw new Error(`the simulation made no progress at ${this.now} ms (${stuck.join('; ') || 'no requests in the engines'})`);
    }
    return this.now;
  }

  private nextEventMs(): number | null {
    let next = Infinity;
    for (const w of this.workers) {
      if (w.pass) next = Math.min(next, w.pass.endMs);
      else if (w.blocked && w.blockedUntil !== null && w.blockedUntil > this.now) next = Math.min(next, w.blockedUntil);
    }
    if (this.handoffs.length > 0) next = Math.min(next, this.handoffs[0].atMs);
    const ready = this.driver.nextReadyMs();
    if (ready !== null) next = Math.min(next, Math.max(ready, this.now));
    return next === Infinity ? null : next;
  }

  private applyCompletions(): boolean {
    let changed = false;
    for (const w of this.workers) {
      const pass = w.pass;
      if (!pass || pass.endMs > this.now) continue;
      w.pass = null;
      changed = true;
      if (w.passEndEvents.length > 0) {
        w.router.applyKvEvents(w.routerIndex, w.passEndEvents);
        w.passEndEvents = [];
      }
      const stage = w.stage;
      for (const token of pass.tokens) {
        if (stage === 'prefill') {
          // The hidden prefill copy's one token: its KV goes to a decode worker (§5.4).
          w.router.markPrefillCompleted(token.id, pass.endMs);
          w.router.free(token.id, pass.endMs);
          this.scheduleHandoff(token.id, pass.endMs);
          continue;
        }
        this.collector.onTokens(token.id, pass.endMs);
        if (token.generated === 1) w.router.markPrefillCompleted(token.id, pass.endMs);
        if (token.completed) {
          w.router.free(token.id, pass.endMs);
          this.requests.delete(token.id);
          this.driver.onComplete(token.id, pass.endMs);
          this.completed++;
          this.progress?.(this.completed, pass.endMs);
        }
      }
      this.routeReleased(w.router, stage);
    }
    return changed;
  }

  private scheduleHandoff(uuid: string, atMs: number): void {
    const fleet = this.fleet as DisaggregatedFleet;
    const tokens = this.requests.get(uuid)!.prompt.length;
    const delayMs =
      fleet.handoff && fleet.handoff.bandwidthGBps > 0 ? ((tokens * fleet.handoff.bytesPerToken) / (fleet.handoff.bandwidthGBps * 1e9)) * 1000 : 0;
    const handoff = { atMs: atMs + delayMs, order: this.handoffOrder++, uuid };
    this.handoffs.push(handoff);
    this.handoffs.sort((a, b) => a.atMs - b.atMs || a.order - b.order);
  }

  private releaseHandoffs(): boolean {
    let changed = false;
    while (this.handoffs.length > 0 && this.handoffs[0].atMs <= this.now) {
      const { uuid } = this.handoffs.shift()!;
      const fleet = this.fleet as DisaggregatedFleet;
      this.route(fleet.decodeRouter, uuid, 'decode');
      changed = true;
    }
    return changed;
  }

  private releaseArrivals(): boolean {
    const ready = this.driver.popReady(this.now);
    for (const dispatch of ready) {
      const prompt = dispatch.turn.prompt();
      this.requests.set(dispatch.uuid, { dispatch, prompt, outputTokenIds: dispatch.turn.outputTokenIds?.() });
      this.collector.onArrival(dispatch.uuid, dispatch.arrivalMs, dispatch.turn.inputLength, dispatch.turn.outputLength, dispatch);
      const stage = this.fleet.kind === 'aggregated' ? 'aggregated' : 'prefill';
      this.route(this.fleet.kind === 'aggregated' ? this.fleet.router : this.fleet.prefillRouter, dispatch.uuid, stage);
    }
    return ready.length > 0;
  }

  private route(router: Router, uuid: string, stage: Stage): void {
    const { dispatch, prompt } = this.requests.get(uuid)!;
    const request: RoutedRequest = { uuid, tokens: prompt, arrivalMs: dispatch.arrivalMs };
    const worker = router.admit(request, this.now);
    if (worker !== null) this.enqueue(stage, worker, uuid);
  }

  private routeReleased(router: Router, stage: Stage): void {
    for (const { request, worker } of router.released(this.now)) this.enqueue(stage, worker, request.uuid);
  }

  private enqueue(stage: Stage, routerIndex: number, uuid: string): void {
    const { dispatch, prompt, outputTokenIds } = this.requests.get(uuid)!;
    const worker = this.pools[stage][routerIndex];
    this.collector.onRouted(uuid, worker.index, stage === 'decode' ? 'decode' : 'prefill');
    const maxOutputTokens = stage === 'prefill' ? 1 : Math.max(1, dispatch.turn.outputLength);
    const why = worker.core.rejection(prompt.length, maxOutputTokens);
    if (why !== null) {
      // Like an engine answering 400: the request ends unserved and its session goes on.
      this.rejections.set(why, (this.rejections.get(why) ?? 0) + 1);
      worker.router.free(uuid, this.now);
      this.requests.delete(uuid);
      this.driver.onComplete(uuid, this.now);
      return;
    }
    worker.core.add({
      id: uuid,
      promptTokenIds: prompt,
      maxOutputTokens,
      ...(outputTokenIds !== undefined ? { outputTokenIds } : {}),
      // The decode worker receives the prefilled KV: it allocates the prompt's blocks but computes none of it.
      remotePrefill: stage === 'decode',
    });
    worker.blocked = false;
  }

  private startPasses(): boolean {
    let started = false;
    for (const w of this.workers) {
      if (w.pass || w.core.isIdle) continue;
      if (w.blocked && (w.blockedUntil === null || w.blockedUntil > this.now)) continue;
      const pass = w.core.executePass(this.now);
      for (const admission of pass.admitted) {
        // The report counts the cache reuse of the stage that computes the prompt.
        if (w.stage !== 'decode') this.collector.onAdmit(admission.id, this.now, admission.cachedTokens);
      }
      const progressed = pass.tokens.length > 0 || pass.scheduledTokens > 0 || pass.preempted.length > 0 || pass.endMs > this.now;
      // vLLM's KV events are visible at the pass's start, SGLang's at its end (§8.5).
      const events = w.core.takeCacheEvents();
      if (events.length > 0) {
        if (progressed && w.core.kvEventVisibility === 'pass-end') w.passEndEvents = events;
        else w.router.applyKvEvents(w.routerIndex, events);
      }
      this.collector.onPass(w.index, this.now, w.sample, SAMPLE_GAP_MS);
      if (progressed) {
        w.pass = pass;
        w.blocked = false;
        started = true;
      } else {
        w.blocked = true;
        w.blockedUntil = pass.wakeAtMs;
        // A transfer that lands now: the next pass at this same time makes progress.
        if (pass.wakeAtMs !== null && pass.wakeAtMs <= this.now) {
          w.blockedUntil = this.now;
          started = pass.admitted.length > 0;
        }
      }
    }
    return started;
  }
}
