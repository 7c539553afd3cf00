import type { EngineStats, PassResult, TokenOut } from './contract.js';
import type { SchedulerCore } from './contract.js';
import { capturedDueTimes } from './timing.js';
import { EngineRejection, type EngineObserver, type EngineRequest, type EngineStream, type FinishedRequest, type KvHold, type TokenEvent } from './types.js';

/** How close to a deadline the driver stops sleeping on a timer and yields to the event loop instead (timers fire a few ms late on a busy machine). */
const SPIN_MS = 4;

/**
 * Longest run of back-to-back zero-time passes before the driver lets I/O happen. Each slice's tokens go out as
 * one write per stream, and those writes were the largest part of the server's busy time at 256 streams.
 * `bench:replay` on 2026-11-27, replay ÷ bare, two sets of three rounds with 4 ms and 8 ms alternated: at 256
 * streams 0.55–0.89 against 0.75–1.03 (medians 0.58, 0.66 against 0.85, 0.97); at 16 streams 0.79–1.11 against
 * 0.89–1.15. The cost: new requests are read (and /health answered) up to 8 ms later while the engine runs flat out.
 */
const ZERO_TIME_SLICE_MS = 8;

const nextTurn = () => new Promise<void>((resolve) => setImmediate(resolve));

/** A word to `Atomics.wait` on (nobody notifies it): a precise, allocation-free pause of the thread. */
const PAUSE = new Int32Array(new SharedArrayBuffer(4));
/** Longest blocking pause before the loop gets a turn to do I/O. */
const MAX_PAUSE_MS = 0.25;

const progressed = (pass: PassResult) => pass.tokens.length > 0 || pass.scheduledTokens > 0 || pass.preempted.length > 0 || pass.endMs > pass.startMs;

/** One request's token events, queued by the driver and read by the HTTP layer. */
class TokenQueue implements EngineStream {
  cachedPromptTokens = 0;
  kvHold: KvHold | null = null;
  admitted = false;
  private readonly batches: TokenEvent[][] = [];
  private ended = false;
  private waiter: (() => void) | null = null;

  push(batch: TokenEvent[]): void {
    this.batches.push(batch);
    this.notify();
  }

  end(): void {
    this.ended = true;
    this.notify();
  }

  private notify(): void {
    const waiter = this.waiter;
    this.waiter = null;
    waiter?.();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<TokenEvent[]> {
    for (;;) {
      const batch = this.batches.shift();
      if (batch) yield batch;
      else if (this.ended) return;
      else await new Promise<void>((resolve) => (this.waiter = resolve));
    }
  }
}

interface Member {
  queue: TokenQueue;
  sequence: number;
  /** For metrics: engine-clock times of arrival, first admission, first and latest token. */
  arrivalMs: number;
  admittedMs: number | null;
  firstTokenMs: number | null;
  lastTokenMs: number | null;
  generated: number;
  promptTokens: number;
  finishReason: FinishedRequest['finishReason'];
  maxTokensParam: number | null;
  /** Its last token was computed (and counted): a disconnect before delivery is no abort. */
  completed: boolean;
  /** The request's `holdKv`: the id its held blocks are released by. */
  holdId?: string;
}

const seconds = (ms: number) => Math.max(0, ms) / 1000;

/**
 * Drives an engine core in wall-clock time: runs a pass, sleeps until the pass ends (durations are already
 * divided by the speedup), hands out the tokens, and idles until a request arrives or a held-back captured
 * token is due. One per data-parallel rank.
 */
export class LiveDriver {
  private readonly members = new Map<string, Member>();
  private readonly pending = new Map<TokenQueue, number>();
  /** Held KV by hold id (the caller's), to the core's request id. */
  private readonly holds = new Map<string, string>();
  private nextId = 0;
  private looping = false;
  private wake: (() => void) | null = null;
  /** Earliest arrival since the engine went idle: the first pass counts from it, not from when it runs. */
  private idleArrivalMs: number | null = null;
  private lastPassEndMs = -Infinity;

  private lastStats: EngineStats;

  constructor(
    readonly core: SchedulerCore,
    /** `--speedup-ratio`, for captured token times. */
    private readonly speedupRatio: number,
    private readonly rank = 0,
    private readonly observer?: EngineObserver,
    private readonly clock: () => number = () => performance.now(),
    /** How long held KV blocks wait for a remote decode before they are freed anyway. */
    private readonly kvHoldTimeoutMs = 480_000,
  ) {
    this.lastStats = core.engineStats();
  }

  /** Requests in this rank (running and waiting): the load used to pick a rank. */
  get load(): number {
    const s = this.core.engineStats();
    return s.running + s.waiting;
  }

  resetPrefixCache(resetRunningRequests: boolean): boolean {
    const reset = this.core.resetPrefixCache(resetRunningRequests);
    this.publishKv();
    return reset;
  }

  /** Frees the blocks a finished prefill kept for a remote decode (false: none held); waiting requests may now fit. */
  releaseKvHold(holdId: string): boolean {
    const id = this.holds.get(holdId);
    if (id === undefined) return false;
    this.holds.delete(holdId);
    if (!this.core.releaseHeld(id)) return false;
    this.publishKv();
    this.refreshStats();
    const wake = this.wake;
    this.wake = null;
    wake?.();
    return true;
  }

  /** The KV events and trace entries of what the core just did (vLLM publishes them at the step's start). */
  private publishKv(): void {
    if (!this.observer) return;
    const events = this.core.takeKvEvents();
    if (events.length > 0) this.observer.onKvEvents?.(this.rank, events);
    const trace = this.core.takeKvTrace();
    if (trace.length > 0) this.observer.onKvTrace?.(this.rank, trace);
    const cache = this.core.takeCacheEvents();
    if (cache.length > 0) this.observer.onCacheEvents?.(this.rank, cache);
  }

  stats(): EngineStats {
    return this.core.engineStats();
  }

  submit(request: EngineRequest, signal: AbortSignal): EngineStream {
    const queue = new TokenQueue();
    const prompt = request.promptTokenIds.length;
    for (const seq of request.sequences) {
      const planned = seq.outputTokenIds.length;
      const why = planned > 0 ? this.core.rejection(prompt, planned) : null;
      if (why) throw new EngineRejection(`This request cannot be served: ${why}.`);
      // The answer is planned whole before the engine runs: a flavour that would stop it early refuses it instead.
      const limit = planned > 0 ? (this.core.outputLimit?.(prompt, planned) ?? planned) : planned;
      if (limit < planned)
        throw new EngineRejection(
          `This request cannot be served: after its ${prompt}-token prompt the KV cache has room for ${limit} output tokens, not ${planned}. Lower max_tokens.`,
        );
    }
    if (signal.aborted) {
      queue.end();
      return queue;
    }
    const ids: string[] = [];
    const captured = this.core.config.timing.honoursCapturedTimes;
    request.sequences.forEach((seq, sequence) => {
      if (seq.outputTokenIds.length === 0) return;
      const id = `${this.nextId++}`;
      ids.push(id);
      const finishReason = seq.finishReason === 'length' ? 'length' : 'stop';
      this.members.set(id, {
        queue,
        sequence,
        arrivalMs: request.arrivalMs,
        admittedMs: null,
        firstTokenMs: null,
        lastTokenMs: null,
        generated: 0,
        promptTokens: request.promptTokenIds.length,
        finishReason,
        maxTokensParam: request.maxTokensParam ?? null,
        completed: false,
        holdId: request.holdKv,
      });
      this.core.add({
        id,
        promptTokenIds: request.promptTokenIds,
        maxOutputTokens: seq.outputTokenIds.length,
        outputTokenIds: seq.outputTokenIds,
        remotePrefill: request.remotePrefill,
        holdBlocksOnFinish: request.holdKv !== undefined && request.sequences.length === 1,
        lora: request.lora,
        notBeforeMs: captured ? capturedDueTimes(seq, this.speedupRatio).map((t) => request.arrivalMs + t) : undefined,
      });
    });
    if (ids.length === 0) {
      queue.end();
      return queue;
    }
    this.pending.set(queue, ids.length);
    this.observer?.onRequest?.(this.rank, request.sequences.length);
    signal.addEventListener(
      'abort',
      () => {
        for (const id of ids) {
          const member = this.members.get(id);
          if (!member) continue;
          this.members.delete(id);
          this.core.abort(id);
          this.publishKv();
          if (!member.completed) this.finished({ ...member, finishReason: 'abort' }, this.clock());
        }
        this.refreshStats();
        this.pending.delete(queue);
        queue.end();
      },
      { once: true },
    );
    this.kick(request.arrivalMs);
    return queue;
  }

  private kick(arrivalMs: number): void {
    // Idle (or about to be): the request's simulated time starts at its arrival, so the mocker's own
    // request handling does not add to the simulated TTFT.
    if (!this.looping || this.wake) this.idleArrivalMs = Math.min(this.idleArrivalMs ?? Infinity, arrivalMs);
    const wake = this.wake;
    this.wake = null;
    wake?.();
    if (!this.looping) {
      this.looping = true;
      void this.loop().finally(() => (this.looping = false));
    }
  }

  private async loop(): Promise<void> {
    while (!this.core.isIdle) {
      const now = this.clock();
      const start = this.idleArrivalMs === null ? now : Math.min(now, Math.max(this.idleArrivalMs, this.lastPassEndMs));
      this.idleArrivalMs = null;
      let pass = this.runPass(start);
      if (pass.endMs > start) {
        await this.sleepUntil(pass.endMs, false);
        this.deliver([pass]);
        continue;
      }
      // Passes that take no simulated time (timing none, captured tokens already due) run back to back
      // for a short slice and their tokens go out together: one write per stream, not one per token. A pass
      // that held a captured token back ends the slice: what it emitted is due now, and the next is not.
      const passes = [pass];
      while (progressed(pass) && pass.wakeAtMs === null && !this.core.isIdle && this.clock() - start < ZERO_TIME_SLICE_MS) {
        const now = this.clock();
        pass = this.runPass(now);
        passes.push(pass);
        if (pass.endMs > now) break;
      }
      if (pass.endMs > pass.startMs) await this.sleepUntil(pass.endMs, false);
      this.deliver(passes);
      if (!progressed(pass)) await this.sleepUntil(pass.wakeAtMs ?? Infinity, true);
      else await nextTurn();
    }
  }

  private runPass(now: number): PassResult {
    const pass = this.core.executePass(now);
    if (this.core.kvEventVisibility === 'pass-start') this.publishKv();
    this.lastPassEndMs = pass.endMs;
    for (const a of pass.admitted) {
      const member = this.members.get(a.id);
      if (!member) continue;
      member.admittedMs ??= now;
      if (!member.queue.admitted) {
        member.queue.admitted = true;
        member.queue.cachedPromptTokens = a.cachedTokens;
      }
    }
    if (this.observer) this.observe(pass.tokens, pass.endMs);
    return pass;
  }

  /** After an abort or a released hold, between passes: the gauges follow the cache at once. */
  private refreshStats(): void {
    if (this.observer) this.observe([], this.clock());
  }

  /** Hands the pass to the observer as vLLM's loggers see a step; tokens count at the pass end. */
  private observe(tokens: readonly TokenOut[], endMs: number): void {
    const stats = this.core.engineStats();
    // The observer may keep them: its calls can come after the next pass (see SimulatedEngine).
    const timesToFirstTokenS: number[] = [];
    const interTokenLatenciesS: number[] = [];
    // vLLM's IterationStats: a request's whole prompt counts once, with its first token (cached tokens included).
    let promptTokens = 0;
    for (const t of tokens) {
      const member = this.members.get(t.id);
      if (!member) continue;
      if (member.firstTokenMs === null) {
        member.firstTokenMs = endMs;
        timesToFirstTokenS.push(seconds(endMs - member.arrivalMs));
        promptTokens += member.promptTokens;
      } else interTokenLatenciesS.push(seconds(endMs - (member.lastTokenMs ?? endMs)));
      member.lastTokenMs = endMs;
      member.generated = t.generated;
      if (t.completed) {
        member.completed = true;
        this.finished(member, endMs);
      }
    }
    this.observer!.onPass?.(this.rank, {
      running: stats.running,
      waiting: stats.waiting,
      activeBlocks: stats.activeBlocks,
      totalBlocks: stats.totalBlocks,
      prefixCacheQueries: stats.prefixCacheQueries - this.lastStats.prefixCacheQueries,
      prefixCacheHits: stats.prefixCacheHits - this.lastStats.prefixCacheHits,
      preemptions: stats.preemptions - this.lastStats.preemptions,
      promptTokens,
      generationTokens: tokens.length,
      timesToFirstTokenS,
      interTokenLatenciesS,
      runningLoraAdapters: stats.runningLoraAdapters,
      waitingLoraAdapters: stats.waitingLoraAdapters,
    });
    this.lastStats = stats;
  }

  private finished(member: Member, endMs: number): void {
    const admitted = member.admittedMs ?? endMs;
    const first = member.firstTokenMs ?? endMs;
    const last = member.lastTokenMs ?? endMs;
    this.observer?.onFinished?.(this.rank, {
      finishReason: member.finishReason,
      e2eS: seconds(endMs - member.arrivalMs),
      queueS: seconds(admitted - member.arrivalMs),
      prefillS: seconds(first - admitted),
      inferenceS: seconds(last - admitted),
      decodeS: seconds(last - first),
      promptTokens: member.promptTokens,
      generationTokens: member.generated,
      meanTimePerOutputTokenS: member.generated > 1 ? seconds(last - first) / (member.generated - 1) : 0,
      maxTokensParam: member.maxTokensParam,
    });
  }

  private deliver(passes: readonly PassResult[]): void {
    // SGLang publishes a step's KV events after it ran, before its tokens go out.
    if (this.core.kvEventVisibility === 'pass-end') this.publishKv();
    const batches = new Map<TokenQueue, Map<number, number>>();
    for (const pass of passes) {
      for (const t of pass.tokens) {
        const member = this.members.get(t.id);
        if (!member) continue;
        const batch = batches.get(member.queue) ?? new Map<number, number>();
        batch.set(member.sequence, t.generated);
        batches.set(member.queue, batch);
        if (!t.completed) continue;
        this.members.delete(t.id);
        const blocks = this.core.heldBlocks(t.id);
        if (blocks > 0 && member.holdId !== undefined) {
          const holdId = member.holdId;
          this.holds.set(holdId, t.id);
          member.queue.kvHold = { holdId, blocks };
          setTimeout(() => this.releaseKvHold(holdId), this.kvHoldTimeoutMs).unref();
        }
        const left = (this.pending.get(member.queue) ?? 1) - 1;
        if (left > 0) this.pending.set(member.queue, left);
        else this.pending.delete(member.queue);
      }
    }
    for (const [queue, batch] of batches) {
      queue.push([...batch].map(([sequence, emitted]) => ({ sequence, emitted })));
      if (!this.pending.has(queue)) queue.end();
    }
  }

  /** Sleeps until `deadline` (a timer for the bulk, event-loop turns for the last ms); `interruptible`: also until a request arrives. */
  private async sleepUntil(deadline: number, interruptible: boolean): Promise<void> {
    let woken = false;
    if (interruptible) this.wake = () => (woken = true);
    const remaining = deadline - this.clock();
    if (remaining > SPIN_MS) {
      await new Promise<void>((resolve) => {
        const timer = remaining === Infinity ? undefined : setTimeout(resolve, remaining - SPIN_MS);
        if (interruptible)
          this.wake = () => {
            woken = true;
            clearTimeout(timer);
            resolve();
          };
      });
    }
    // The last stretch: short blocking waits (no garbage, sub-ms precise) between event-loop turns for I/O.
    while (!woken && this.clock() < deadline) {
      Atomics.wait(PAUSE, 0, 0, Math.min(MAX_PAUSE_MS, deadline - this.clock()));
      await nextTurn();
    }
    if (interruptible) this.wake = null;
  }
}
