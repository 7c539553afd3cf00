/**
 * The workload driver (engine-reference §8.4): which turns are ready when. Trace mode releases a session's
 * first turn at its start time; concurrency mode (closed loop) has every first turn ready at 0 and keeps at
 * most `limit` requests in flight. A later turn is ready `delay` after its predecessor completes. A session that
 * waits for others (an agentic DAG) is ready its dependency delay after the slowest of them completes.
 */
import { BinaryHeap } from '../util/binaryHeap.js';
import { checkDependencies, type Session, type Turn, type Workload } from './workload.js';

export type DriverMode = { kind: 'trace' } | { kind: 'concurrency'; limit: number };

export interface Dispatch {
  uuid: string;
  /** The session's group when it has one (a DAG's trajectory), and the turn's index in it (in dispatch order). */
  sessionId: string;
  turnIndex: number;
  turn: Turn;
  /** Trace mode: the scheduled ready time; concurrency mode: the dispatch time. */
  arrivalMs: number;
}

interface SessionState {
  session: Session;
  /** Its index in the workload: ready-time ties go to the earlier session. */
  position: number;
  nextTurn: number;
  readyAtMs: number;
  inFlight: string | null;
  /** Dependencies not yet complete, and when the slowest of those complete did. */
  waitingOn: number;
  readyAfterMs: number;
  dependents: SessionState[];
}

export class WorkloadDriver {
  private readonly sessions: SessionState[];
  /** Sessions by ready time, ties to the earlier session in the workload. */
  private readonly heap: BinaryHeap<SessionState>;
  private readonly byUuid = new Map<string, SessionState>();
  /** Turns dispatched so far per group of sessions. */
  private readonly groupTurns = new Map<string, number>();
  private inFlightCount = 0;
  private nextUuid = 0;

  constructor(
    readonly workload: Workload,
    readonly mode: DriverMode,
  ) {
    if (mode.kind === 'concurrency' && !(Number.isInteger(mode.limit) && mode.limit >= 1))
      throw new Error(`--replay-concurrency must be an integer >= 1, got ${mode.limit}`);
    const dependent = workload.sessions.some((s) => (s.waitFor?.length ?? 0) > 0);
    if (dependent) {
      // Dynamo's rule: a request DAG keeps its own schedule; a cap on requests in flight would reorder it.
      if (mode.kind === 'concurrency')
        throw new Error('a workload of dependent requests runs on its own schedule: it is not supported with --replay-concurrency');
      checkDependencies(workload.sessions);
    }
    this.sessions = workload.sessions.map((session, position) => {
      const waits = (session.waitFor?.length ?? 0) > 0;
      if (mode.kind === 'trace' && !waits && !(session.startMs !== null && Number.isFinite(session.startMs) && session.startMs >= 0)) {
        throw new Error(`session ${session.id} has no arrival timestamp: give one, or run it closed-loop with --replay-concurrency`);
      }
      for (const turn of session.turns) {
        if (!(turn.inputLength > 0)) throw new Error(`session ${session.id}: a turn has an empty prompt (input_length 0)`);
      }
      const readyAtMs = mode.kind === 'trace' && !waits ? (session.startMs as number) : 0;
      return { session, position, nextTurn: 0, readyAtMs, inFlight: null, waitingOn: session.waitFor?.length ?? 0, readyAfterMs: 0, dependents: [] };
    });
    if (dependent) {
      const byId = new Map(this.sessions.map((s) => [s.session.id, s]));
      for (const s of this.sessions) for (const id of s.session.waitFor ?? []) byId.get(id)!.dependents.push(s);
    }
    this.heap = new BinaryHeap((a, b) => a.readyAtMs < b.readyAtMs || (a.readyAtMs === b.readyAtMs && a.position < b.position));
    for (const s of this.sessions) {
      if (s.session.turns.length > 0 && s.waitingOn === 0) this.heap.push(s);
      // An empty session has nothing to wait for: it is complete at once.
      else if (s.session.turns.length === 0 && s.waitingOn === 0) this.release(s, 0);
    }
  }

  /** Once a whole session completes, the sessions that wait for it: each is ready its delay after its slowest dependency. */
  private release(state: SessionState, nowMs: number): void {
    for (const dependent of state.dependents) {
      dependent.readyAfterMs = Math.max(dependent.readyAfterMs, nowMs);
      if (--dependent.waitingOn > 0) continue;
      const readyAtMs = dependent.readyAfterMs + (dependent.session.dependencyDelayMs ?? 0);
      if (dependent.session.turns.length === 0) this.release(dependent, readyAtMs);
      else {
        dependent.readyAtMs = readyAtMs;
        this.heap.push(dependent);
      }
    }
  }

  get inFlight(): number {
    return this.inFlightCount;
  }

  /** Every turn issued and completed. */
  get done(): boolean {
    return this.inFlightCount === 0 && this.heap.size === 0;
  }

  /** When the next turn becomes ready (null: none waits, though requests in flight may add one). */
  nextReadyMs(): number | null {
    if (this.mode.kind === 'concurrency' && this.inFlightCount >= this.mode.limit) return null;
    return this.heap.peek()?.readyAtMs ?? null;
  }

  /** Turns ready at `nowMs`, at most `limit` (and never beyond the concurrency cap), marked in flight. */
  popReady(nowMs: number, limit = Infinity): Dispatch[] {
    const out: Dispatch[] = [];
    const cap = this.mode.kind === 'concurrency' ? this.mode.limit : Infinity;
    while (out.length < limit && this.inFlightCount < cap) {
      const next = this.heap.peek();
      if (!next || next.readyAtMs > nowMs) break;
      this.heap.pop();
      const turnInSession = next.nextTurn++;
      const group = next.session.group;
      const turnIndex = group === undefined ? turnInSession : (this.groupTurns.get(group) ?? 0);
      if (group !== undefined) this.groupTurns.set(group, turnIndex + 1);
      const uuid = `req-${this.nextUuid++}`;
      next.inFlight = uuid;
      this.byUuid.set(uuid, next);
      this.inFlightCount++;
      out.push({
        uuid,
        sessionId: group ?? next.session.id,
        turnIndex,
        turn: next.session.turns[turnInSession],
        arrivalMs: this.mode.kind === 'trace' ? next.readyAtMs : nowMs,
      });
    }
    return out;
  }

  /** A request finished at `nowMs`: its session's next turn is ready after that turn's delay, or, if it was the last, the sessions waiting for it may be. */
  onComplete(uuid: string, nowMs: number): void {
    const state = this.byUuid.get(uuid);
    if (!state) throw new Error(`workload driver: ${uuid} is not in flight`);
    this.byUuid.delete(uuid);
    state.inFlight = null;
    this.inFlightCount--;
    if (state.nextTurn < state.session.turns.length) {
      state.readyAtMs = nowMs + state.session.turns[state.nextTurn].delayMs;
      this.heap.push(state);
    } else this.release(state, nowMs);
  }
}
