/**
 * A seeded slice of bench/hostile.ts (issue #33): fuzzed tool schemas and request chat templates through one
 * spawned `serve`, and chats into a hostile capture file's own template and tokenizer through another
 * (test/support/hostileFuzz.ts). Every reply is a valid answer or a well-formed vLLM error, and both processes
 * live and answer /health throughout. The latency and memory targets (/health p99 ≤ 100 ms, RSS ≤ 1 GB over
 * 10,000 cases) are the benchmark's: `npm run bench:hostile`.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  CAPTURE_TRAPS,
  deadHostile,
  makeHostileRigCase,
  runHostileCases,
  startHostileRig,
  type HostileDoor,
  type HostileOutcome,
  type HostileRig,
} from '../support/hostileFuzz.js';
import { prng } from '../support/prng.js';
import { testTmpdir } from '../support/tempRoot.js';

const SEED = 20261128;
const CASES: Record<HostileDoor, number> = { plain: 800, captured: 400 };
const BATCH = 200;

describe(`fuzzing hostile tool schemas and chat templates through the spawned serve: ${CASES.plain + CASES.captured} cases`, () => {
  let dir: string;
  let rig: HostileRig;
  const outcomes: HostileOutcome[] = [];
  const betweenBatches: { dead: string[]; health: number[] }[] = [];

  beforeAll(async () => {
    dir = mkdtempSync(join(testTmpdir(), 'mocker-fuzz-hostile-'));
    rig = await startHostileRig(dir);
    const r = prng(SEED);
    for (const door of ['plain', 'captured'] as HostileDoor[]) {
      for (let first = 0; first < CASES[door]; first += BATCH) {
        const cases = Array.from({ length: Math.min(BATCH, CASES[door] - first) }, () => makeHostileRigCase(r, door));
        outcomes.push(...(await runHostileCases(rig, cases, { concurrency: 16, firstIndex: outcomes.length, seed: SEED })));
        const health = await Promise.all(
          [rig.plain, rig.captured].map(async (p) => (await fetch(`http://127.0.0.1:${p.port}/health`).catch(() => null))?.status ?? 0),
        );
        betweenBatches.push({ dead: deadHostile(rig), health });
      }
    }
  }, 240_000);

  afterAll(async () => {
    await rig?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  const messages = (door: HostileDoor) =>
    outcomes.filter((o) => o.door === door && o.reply?.status === 400).map((o) => (JSON.parse(o.reply!.text) as { error: { message: string } }).error.message);

  it('answers every case with a valid answer or a well-formed vLLM error', () => {
    expect(outcomes).toHaveLength(CASES.plain + CASES.captured);
    expect(outcomes.map((o) => o.violation).filter((v) => v !== null)).toEqual([]);
    for (const kind of ['200 completion', '200 tokenize', '400 BadRequestError'])
      expect(
        outcomes.some((o) => o.kind === kind),
        kind,
      ).toBe(true);
  });

  it('keeps both processes alive and answering /health between batches', () => {
    expect(betweenBatches.length).toBeGreaterThan(0);
    for (const b of betweenBatches) {
      expect(b.dead).toEqual([]);
      expect(b.health).toEqual([200, 200]);
    }
    expect(deadHostile(rig)).toEqual([]);
  });

  it('reached the traps: tool calls made and refused by size, request templates stopped, out of heap and broken', () => {
    const calls = outcomes.filter((o) => o.case.kind === 'tool schema' && o.reply?.status === 200 && o.reply.text.includes('"tool_calls":[{'));
    const outOfTokens = outcomes.filter(
      (o) =>
        o.case.kind === 'tool schema' &&
        o.reply?.status === 200 &&
        /"tool_choice":"required"/.test(o.case.body.toString()) &&
        /"finish_reason":"length"/.test(o.reply.text),
    );
    expect(calls.length).toBeGreaterThan(0);
    expect(outOfTokens.length).toBeGreaterThan(0);
    const plain = messages('plain');
    expect(plain.some((m) => m === 'Chat template error: rendering was stopped after 2000 ms')).toBe(true);
    expect(plain.some((m) => /^Chat template error: rendering was stopped: its process ended/.test(m))).toBe(true);
    expect(plain.some((m) => /^Chat template error: (?!rendering was stopped)/.test(m))).toBe(true);
  });

  it("walked the capture template's fast traps into 400s, and its plain chats into answers", () => {
    const trapped = new Set(
      outcomes
        .filter((o) => o.door === 'captured' && o.reply?.status === 400)
        .map((o) => (o.case.request as { messages: { content: string }[] }).messages[0].content),
    );
    for (const trap of CAPTURE_TRAPS.slice(1)) expect(trapped, trap).toContain(trap);
    for (const m of messages('captured').filter((m) => m.startsWith('Chat template error'))) expect(m).toMatch(/^Chat template error: ./);
    expect(outcomes.some((o) => o.door === 'captured' && o.reply?.status === 200)).toBe(true);
  });
});
