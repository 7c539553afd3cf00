/**
 * A seeded 2,000-request slice of bench/fuzz.ts: fuzzed requests (structural, grammar-based, byte-mutated;
 * some clients leaving early) through the spawned CLI — `serve`, `capture` in front of it, `pd-proxy` in front
 * of a prefill and a decode `serve` — sequentially and 32 at a time.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeProcessFuzzCase } from '../support/fuzzRequests.js';
import {
  deadProcesses,
  FUZZ_MAX_BODY,
  fuzzBatch,
  health,
  RSS_BOUND_MB,
  rssMb,
  settledEngines,
  startFuzzRig,
  verifyCaptureFile,
  type FuzzOutcome,
  type FuzzRig,
} from '../support/fuzzRig.js';
import { prng } from '../support/prng.js';
import { testTmpdir } from '../support/tempRoot.js';

const SEED = 20261123;
const REQUESTS = 2000;
const BATCH = 250;

describe(`fuzzing the spawned serve, capture and pd-proxy: ${REQUESTS} requests`, () => {
  let dir: string;
  let rig: FuzzRig;
  const outcomes: FuzzOutcome[] = [];
  const betweenBatches: { dead: string[]; health: string[]; rss: Record<string, number> }[] = [];

  beforeAll(async () => {
    dir = mkdtempSync(join(testTmpdir(), 'mocker-fuzz-'));
    rig = await startFuzzRig(dir);
    // Cases come from their own generator, so a case number reproduces whatever the clients' timing.
    const r = prng(SEED);
    const net = prng(SEED + 1);
    for (let first = 0; first < REQUESTS; first += BATCH) {
      const cases = Array.from({ length: Math.min(BATCH, REQUESTS - first) }, () => makeProcessFuzzCase(r, FUZZ_MAX_BODY));
      // Batches alternate: one client at a time, then 32 at once.
      const concurrency = (first / BATCH) % 2 === 0 ? 1 : 32;
      outcomes.push(...(await fuzzBatch(rig, cases, { concurrency, firstIndex: first, seed: SEED, r: net })));
      betweenBatches.push({
        dead: deadProcesses(rig),
        health: (await health(rig)).filter((h) => h.status !== 200).map((h) => `${h.name}: ${h.status}`),
        rss: rssMb(rig),
      });
    }
  }, 240_000);

  afterAll(async () => {
    await rig?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('answers every request with a valid completion or a well-formed vLLM error, whatever door it takes', () => {
    expect(outcomes).toHaveLength(REQUESTS);
    expect(outcomes.map((o) => o.violation).filter((v) => v !== null)).toEqual([]);
    // The slice reached every door, every generator, and both answers and refusals.
    for (const door of ['serve', 'capture', 'pd-proxy']) expect(outcomes.filter((o) => o.door === door).length, door).toBeGreaterThan(REQUESTS / 5);
    for (const kind of ['path', 'not-an-object', 'oversized', 'wrong-types', 'grammar', 'mutation']) {
      expect(
        outcomes.some((o) => o.case.kind === kind),
        kind,
      ).toBe(true);
    }
    for (const kind of [
      '200 completion',
      '400 Bad Request',
      '400 BadRequestError',
      '404 NotFoundError',
      '404 detail',
      '405 detail',
      '413 Request Entity Too Large',
      'disconnected',
    ]) {
      expect(
        outcomes.some((o) => o.kind === kind),
        kind,
      ).toBe(true);
    }
  });

  it('keeps every process alive, healthy between batches and under the memory bound', () => {
    expect(betweenBatches).toHaveLength(REQUESTS / BATCH);
    for (const b of betweenBatches) {
      expect(b.dead).toEqual([]);
      expect(b.health).toEqual([]);
      for (const [name, mb] of Object.entries(b.rss)) expect(mb, name).toBeLessThan(RSS_BOUND_MB);
    }
  });

  it('leaves no request running and no KV block active on any engine', async () => {
    expect(await settledEngines(rig)).toEqual([]);
  });

  it('leaves a capture file that passes PRAGMA integrity_check and replays every exchange completed through capture', async () => {
    const verified = await verifyCaptureFile(rig, outcomes, dir, SEED);
    expect(verified.integrity).toBe('ok');
    expect(verified.replayed).toBeGreaterThan(20);
    expect(verified.problems).toEqual([]);
  });
});
