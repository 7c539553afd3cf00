import type { CoreRequest, PassResult } from './contract.js';
import type { SchedulerCore } from './contract.js';

export interface TimedRequest {
  request: CoreRequest;
  /** Arrival on the virtual clock (ms). */
  arrivalMs: number;
  /**
   * A client's reaction to a step's end: the request was sent this long after a pass ended (its client answered an
   * answer's end, as a closed loop does). It then arrives that long after the first pass end at or after
   * `arrivalMs − reactionMs` (at `arrivalMs` when no pass is running then): where it meets the simulated passes
   * follows from them, as it did in the run replayed, instead of falling anywhere within one.
   */
  reactionMs?: number;
}

export interface OfflineRecord {
  arrivalMs: number;
  /** First admission (virtual ms) and the prompt tokens the prefix cache supplied then. */
  admittedMs: number | null;
  cachedTokens: number;
  /** When each output token came out (virtual ms). */
  tokenTimesMs: number[];
}

export interface OfflineResult {
  records: Map<string, OfflineRecord>;
  /** The last token's time. */
  durationMs: number;
  passes: number;
}

/**
 * Runs requests through the engine core on a virtual clock (engine-reference §8.5, single worker):
 * passes back to back, arrivals released when the clock reaches them (those during a pass are seen at
 * its end; a reacting request's, see TimedRequest.reactionMs, is placed after it). Deterministic, and as fast as
 * the core itself.
 */
export function runOffline(core: SchedulerCore, requests: readonly TimedRequest[], afterPass?: (pass: PassResult) => void): OfflineResult {
  const armedAt = (r: TimedRequest) => r.arrivalMs - (r.reactionMs ?? 0);
  // A time that is not a number would never be reached (and hold back every request after it).
  for (const r of requests)
    if (!Number.isFinite(r.arrivalMs) || !(r.reactionMs === undefined || (Number.isFinite(r.reactionMs) && r.reactionMs >= 0)))
      throw new Error(`request ${r.request.id}: arrival ${r.arrivalMs} ms, reaction ${r.reactionMs} ms: finite times (a reaction >= 0) only`);
  const pending = [...requests].sort((a, b) => armedAt(a) - armedAt(b));
  const records = new Map<string, OfflineRecord>();
  for (const { request, arrivalMs } of pending) records.set(request.id, { arrivalMs, admittedMs: null, cachedTokens: 0, tokenTimesMs: [] });
  /** Requests whose arrival time is settled, by arrival. */
  const due: TimedRequest[] = [];
  let next = 0;
  /** Settles the arrivals of the requests armed by `armedBy`: a reacting one's after `passEndMs` when a pass was running then. */
  const arm = (armedBy: number, passEndMs: number | null) => {
    for (; next < pending.length && armedAt(pending[next]) <= armedBy; next++) {
      const r = pending[next];
      const arrivalMs = passEndMs !== null && r.reactionMs !== undefined ? passEndMs + r.reactionMs : r.arrivalMs;
      records.get(r.request.id)!.arrivalMs = arrivalMs;
      const at = due.findLastIndex((d) => d.arrivalMs <= arrivalMs) + 1;
      due.splice(at, 0, { request: r.request, arrivalMs });
    }
  };
  const nextEventMs = () => Math.min(due.length > 0 ? due[0].arrivalMs : Infinity, next < pending.length ? armedAt(pending[next]) : Infinity);
  let now = pending.length > 0 ? armedAt(pending[0]) : 0;
  let passes = 0;
  let durationMs = 0;
  for (;;) {
    arm(now, null);
    while (due.length > 0 && due[0].arrivalMs <= now) core.add(due.shift()!.request);
    if (core.isIdle) {
      const wake = nextEventMs();
      if (wake === Infinity) break;
      now = Math.max(now, wake);
      continue;
    }
    const pass = core.executePass(now);
    passes++;
    afterPass?.(pass);
    for (const a of pass.admitted) {
      const record = records.get(a.id)!;
      if (record.admittedMs === null) {
        record.admittedMs = now;
        record.cachedTokens = a.cachedTokens;
      }
    }
    for (const t of pass.tokens) records.get(t.id)!.tokenTimesMs.push(pass.endMs);
    if (pass.tokens.length > 0) durationMs = pass.endMs;
    const progressed = pass.tokens.length > 0 || pass.scheduledTokens > 0 || pass.preempted.length > 0 || pass.endMs > now;
    if (progressed) {
      if (pass.endMs > now) arm(pass.endMs, pass.endMs);
      now = pass.endMs;
      continue;
    }
    // Nothing can happen before the next captured token time or arrival; without either the engine is stuck.
    const wake = Math.min(pass.wakeAtMs ?? Infinity, nextEventMs());
    if (wake === Infinity)
      throw new Error(`the engine made no progress at ${now} ms with ${core.engineStats().running + core.engineStats().waiting} requests in it`);
    now = Math.max(now, wake);
  }
  return { records, durationMs, passes };
}
