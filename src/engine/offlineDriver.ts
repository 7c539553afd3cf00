import type { CoreRequest, PassResult } from './contract.js';
import type { SchedulerCore } from './contract.js';

export interface TimedRequest {
  request: CoreRequest;
  /** Arrival on the virtual clock (ms). */
  arrivalMs: number;
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
 * its end). Deterministic, and as fast as the core itself.
 */
export function runOffline(core: SchedulerCore, requests: readonly TimedRequest[], afterPass?: (pass: PassResult) => void): OfflineResult {
  const arrivals = [...requests].sort((a, b) => a.arrivalMs - b.arrivalMs);
  const records = new Map<string, OfflineRecord>();
  for (const { request, arrivalMs } of arrivals) records.set(request.id, { arrivalMs, admittedMs: null, cachedTokens: 0, tokenTimesMs: [] });
  let next = 0;
  let now = arrivals.length > 0 ? arrivals[0].arrivalMs : 0;
  let passes = 0;
  let durationMs = 0;
  for (;;) {
    while (next < arrivals.length && arrivals[next].arrivalMs <= now) core.add(arrivals[next++].request);
    if (core.isIdle) {
      if (next >= arrivals.length) break;
      now = arrivals[next].arrivalMs;
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
      now = pass.endMs;
      continue;
    }
    // Nothing can happen before the next captured token time or arrival; without either the engine is stuck.
    const nextArrival = next < arrivals.length ? arrivals[next].arrivalMs : Infinity;
    const wake = Math.min(pass.wakeAtMs ?? Infinity, nextArrival);
    if (wake === Infinity)
      throw new Error(`the engine made no progress at ${now} ms with ${core.engineStats().running + core.engineStats().waiting} requests in it`);
    now = Math.max(now, wake);
  }
  return { records, durationMs, passes };
}
