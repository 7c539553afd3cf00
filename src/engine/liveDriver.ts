import type { EngineCore, EngineStats, PassResult } from './core.js';
import { capturedDueTimes } from './timing.js';
import { EngineRejection, type EngineRequest, type EngineStream, type TokenEvent } from './types.js';

/** How close to a deadline the driver stops sleeping on a timer and yields to the event loop instead. */
const SPIN_MS = 1.5;

/** Longest run of back-to-back zero-time passes before the driver lets I/O happen. */
const ZERO_TIME_SLICE_MS = 2;

const nextTurn = () => new Promise<void>((resolve) => setImmediate(resolve));

const progressed = (pass: PassResult) => pass.tokens.length > 0 || pass.scheduledTokens > 0 || pass.preempted.length > 0 || pass.endMs > pass.startMs;

/** One request's token events, queued by the driver and read by the HTTP layer. */
class TokenQueue implements EngineStream {
  cachedPromptTokens = 0;
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
}

/**
 * Drives an engine core in wall-clock time: runs a pass, sleeps until the pass ends (durations are already
 * divided by the speedup), hands out the tokens, and idles until a request arrives or a held-back captured
 * token is due. One per data-parallel rank.
 */
export class LiveDriver {
  private readonly members = new Map<string, Member>();
  private readonly pending = new Map<TokenQueue, number>();
  private nextId = 0;
  private looping = false;
  private wake: (() => void) | null = null;
  /** Earliest arrival since the engine went idle: the first pass counts from it, not from when it runs. */
  private idleArrivalMs: number | null = null;
  private lastPassEndMs = -Infinity;

  constructor(
    readonly core: EngineCore,
    /** `--speedup-ratio`, for captured token times. */
    private readonly speedupRatio: number,
    private readonly onPass?: (pass: PassResult) => void,
    private readonly clock: () => number = () => performance.now(),
  ) {}

  /** Requests in this rank (running and waiting): the load used to pick a rank. */
  get load(): number {
    const s = this.core.engineStats();
    return s.running + s.waiting;
  }

  stats(): EngineStats {
    return this.core.engineStats();
  }

  submit(request: EngineRequest, signal: AbortSignal): EngineStream {
    const queue = new TokenQueue();
    for (const seq of request.sequences) {
      const why = seq.outputTokenIds.length > 0 ? this.core.rejection(request.promptTokenIds.length, seq.outputTokenIds.length) : null;
      if (why) throw new EngineRejection(`This request cannot be served: ${why}.`);
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
      this.members.set(id, { queue, sequence });
      this.core.add({
        id,
        promptTokenIds: request.promptTokenIds,
        maxOutputTokens: seq.outputTokenIds.length,
        outputTokenIds: seq.outputTokenIds,
        notBeforeMs: captured ? capturedDueTimes(seq, this.speedupRatio).map((t) => request.arrivalMs + t) : undefined,
      });
    });
    if (ids.length === 0) {
      queue.end();
      return queue;
    }
    this.pending.set(queue, ids.length);
    signal.addEventListener(
      'abort',
      () => {
        for (const id of ids) {
          if (this.members.delete(id)) this.core.abort(id);
        }
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
      // for a short slice and their tokens go out together: one write per stream, not one per token.
      const passes = [pass];
      while (progressed(pass) && !this.core.isIdle && this.clock() - start < ZERO_TIME_SLICE_MS) {
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
    this.lastPassEndMs = pass.endMs;
    this.onPass?.(pass);
    for (const a of pass.admitted) {
      const member = this.members.get(a.id);
      if (member && !member.queue.admitted) {
        member.queue.admitted = true;
        member.queue.cachedPromptTokens = a.cachedTokens;
      }
    }
    return pass;
  }

  private deliver(passes: readonly PassResult[]): void {
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
    while (!woken && this.clock() < deadline) await nextTurn();
    if (interruptible) this.wake = null;
  }
}
