/**
 * The offline driver's reacting arrivals (TimedRequest.reactionMs): a request its client sent a reaction time after
 * an answer's end arrives that long after the first simulated pass end at or after `arrivalMs − reactionMs`, or at
 * `arrivalMs` when the engine is idle then. Oracle: passes of a fixed 10 ms (every pass decodes), counted by hand.
 */
import { describe, expect, it } from 'vitest';
import { runOffline, type TimedRequest } from '../../src/engine/offlineDriver.js';
import { fixedTiming } from '../../src/engine/timingModels.js';
import { smallVllmCore } from '../support/schedulerDefaults.js';

const tokens = (n: number, from: number) => Array.from({ length: n }, (_, i) => from + i);
const request = (id: string, from: number, maxOutputTokens: number) => ({ id, promptTokenIds: tokens(32, from), maxOutputTokens });

const run = (requests: TimedRequest[]) => runOffline(smallVllmCore(fixedTiming(10, 1)), requests).records;

describe('runOffline: requests that react to a pass end', () => {
  // `a` keeps the engine busy with passes 0–10, 10–20, … 50–60 (six tokens).
  const busy: TimedRequest = { request: request('a', 1, 6), arrivalMs: 0 };

  it('armed inside a pass: arrives the reaction after that pass ends, not at its own send time', () => {
    const records = run([
      busy,
      // Sent at 22 ms, 3 ms after an answer: armed at 19, inside the pass 10–20, so it arrives at 23; seen at the end
      // of the pass 20–30, its first token at 40.
      { request: request('reacting', 1000, 2), arrivalMs: 22, reactionMs: 3 },
      // The same send time without a reaction: arrives at 22, also first seen at 30.
      { request: request('plain', 2000, 2), arrivalMs: 22 },
      // Sent at 44, 8 ms after an answer: armed at 36, inside the pass 30–40: arrives at 48, in the pass 40–50, and
      // has its first token at 60 (as plain at 44 would too), but its latency counts from 48, not 44.
      { request: request('late', 3000, 1), arrivalMs: 44, reactionMs: 8 },
    ]);
    expect(records.get('reacting')).toMatchObject({ arrivalMs: 23, tokenTimesMs: [40, 50] });
    expect(records.get('plain')).toMatchObject({ arrivalMs: 22, tokenTimesMs: [40, 50] });
    expect(records.get('late')).toMatchObject({ arrivalMs: 48, tokenTimesMs: [60] });
  });

  it('armed where a pass ends exactly: that end is the first at or after it', () => {
    // Armed at 30 (sent at 32, reaction 2): the pass 20–30 ends at 30, so it arrives at 32, in the pass 30–40.
    const records = run([busy, { request: request('edge', 1000, 1), arrivalMs: 32, reactionMs: 2 }]);
    expect(records.get('edge')).toMatchObject({ arrivalMs: 32, tokenTimesMs: [50] });
  });

  it('armed while the engine is idle: arrives at its own send time', () => {
    // `a` is done at 60; armed at 95 (sent at 100, reaction 5) with nothing running: arrives at 100, first token at 110.
    const records = run([busy, { request: request('idle', 1000, 2), arrivalMs: 100, reactionMs: 5 }]);
    expect(records.get('idle')).toMatchObject({ arrivalMs: 100, tokenTimesMs: [110, 120] });
  });

  it('refuses a time that is not a finite number, or a negative reaction, naming the request (it would never arrive)', () => {
    for (const bad of [
      { request: request('nan', 1000, 1), arrivalMs: 10, reactionMs: Number.NaN },
      { request: request('negative', 1000, 1), arrivalMs: 10, reactionMs: -1 },
      { request: request('never', 1000, 1), arrivalMs: Number.POSITIVE_INFINITY },
    ])
      expect(() => run([busy, bad]), bad.request.id).toThrow(new RegExp(`request ${bad.request.id}: .*finite times`));
  });
});
