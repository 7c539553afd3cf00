/**
 * Agent conversations rebuilt from captured turns (issue 40 item 2) and the hash ids of converted traces (item 3),
 * on hand-made turns whose links and ids are worked out here from the rules: a turn continues the completed turn
 * whose prompt is a strict prefix of its own and whose prompt + output shares the most with it; hash ids name
 * the prompt up to each block's end (Dynamo's RollingHashIdMapper), numbered from 0 in first-seen order.
 */
import { describe, expect, it } from 'vitest';
import { type CapturedConversations, conversationSessions } from '../../src/trace/capturedWorkload.js';
import { type CapturedTurn, linkTurns } from '../../src/trace/conversations.js';
import { WorkloadDriver } from '../../src/trace/driver.js';
import { RollingHashIds } from '../../src/trace/rollingHash.js';

const ids = (from: number, count: number) => Array.from({ length: count }, (_, i) => from + i);

const turn = (startMs: number, endMs: number, prompt: number[], output: number[]): CapturedTurn => ({
  startMs,
  endMs,
  prompt: Uint32Array.from(prompt),
  output: Uint32Array.from(output),
});

describe('linkTurns', () => {
  it('chains the turns of a tool loop and keeps an unrelated conversation apart', () => {
    const system = ids(1, 30);
    const t1 = [...system, 100, 101];
    const a1 = [200, 201, 202];
    // The answer re-rendered (its ids), a tool result, the next generation prompt.
    const t2 = [...t1, ...a1, 300, 301];
    const a2 = [210, 211];
    const t3 = [...t2, ...a2, 310];
    const other = [...system, 900];
    const turns = [turn(0, 10, t1, a1), turn(5, 12, other, [7]), turn(25, 40, t2, a2), turn(30, 31, [...other, 7, 8], [9]), turn(90, 95, t3, [1])];
    expect(Array.from(linkTurns(turns))).toEqual([-1, -1, 0, 1, 2]);
  });

  it('needs the earlier turn complete before the later starts, and a strict prefix', () => {
    const p = ids(1, 20);
    // The second starts before the first completed (a parallel request): not its next turn; equal prompts neither.
    expect(Array.from(linkTurns([turn(0, 50, p, [5]), turn(10, 20, [...p, 5, 6], [1])]))).toEqual([-1, -1]);
    expect(Array.from(linkTurns([turn(0, 5, p, [5]), turn(10, 20, p, [1])]))).toEqual([-1, -1]);
    expect(Array.from(linkTurns([turn(0, 10, p, [5]), turn(10, 20, [...p, 5, 6], [1])]))).toEqual([-1, 0]);
  });

  it('picks, among prompts it extends, the one whose prompt and output it shares the most; branches share a parent', () => {
    const p = ids(1, 16);
    // Two identical requests answered differently, then a turn that carries the second answer, and one the first.
    const turns = [
      turn(0, 10, p, [500, 501, 502]),
      turn(1, 11, p, [600, 601, 602]),
      turn(20, 30, [...p, 600, 601, 602, 7], [1]),
      turn(21, 31, [...p, 500, 501, 9], [1]),
      // A turn that extends the third turn's prompt and, at a shorter length, the first prompts: the longer wins.
      turn(40, 50, [...p, 600, 601, 602, 7, 1, 8], [1]),
      // Answers re-tokenized differently (no output shared): the longest prompt it extends still wins.
      turn(41, 51, [...p, 600, 601, 602, 7, 3], [1]),
    ];
    expect(Array.from(linkTurns(turns))).toEqual([-1, -1, 1, 0, 2, 2]);
  });
});

describe('conversationSessions', () => {
  it('keeps a chain of turns one session and makes each branch a session that waits for the turn it continues', () => {
    const p = ids(1, 8);
    const turns = [turn(0, 10, p, [50]), turn(20, 30, [...p, 50, 1], [60]), turn(25, 35, [...p, 50, 2], [70]), turn(40, 45, [...p, 50, 1, 60, 3], [80])];
    const parent = linkTurns(turns);
    expect(Array.from(parent)).toEqual([-1, 0, 0, 1]);
    const conversations: CapturedConversations = {
      turns: turns.map((t, i) => ({ ...t, exchangeId: 11 + i })),
      parent,
      root: Int32Array.from([0, 0, 0, 0]),
      models: [],
      skipped: { failed: 0, aborted: 0, batched: 0, withoutPromptIds: 0 },
      notes: [],
    };
    const sessions = conversationSessions(conversations);
    expect(
      sessions.map((s) => ({
        id: s.id,
        group: s.group,
        startMs: s.startMs,
        waitFor: s.waitFor,
        delay: s.dependencyDelayMs,
        turns: s.turns.map((t) => [t.inputLength, t.delayMs]),
      })),
    ).toEqual([
      { id: 'exchange-11', group: 'exchange-11', startMs: 0, waitFor: undefined, delay: undefined, turns: [[8, 0]] },
      // The branch continued by the fourth turn: one session, its next turn 40 - 30 ms after it completes.
      {
        id: 'exchange-12',
        group: 'exchange-11',
        startMs: 20,
        waitFor: ['exchange-11'],
        delay: 10,
        turns: [
          [10, 0],
          [12, 10],
        ],
      },
      { id: 'exchange-13', group: 'exchange-11', startMs: 25, waitFor: ['exchange-11'], delay: 15, turns: [[10, 0]] },
    ]);
    // A request DAG: runs on its schedule, not under a concurrency cap (Dynamo's rule).
    const workload = { sessions, requests: 4 };
    expect(() => new WorkloadDriver(workload, { kind: 'trace' })).not.toThrow();
    expect(() => new WorkloadDriver(workload, { kind: 'concurrency', limit: 2 })).toThrow(/not supported with --replay-concurrency/);
  });
});

describe('RollingHashIds', () => {
  it('gives each block the id of the prompt up to its end, the partial tail included, numbered from 0 over the file', () => {
    const mapper = new RollingHashIds(4);
    // 10 tokens: blocks 1-4, 5-8 and the tail 9-10.
    expect(mapper.of(ids(1, 10))).toEqual([0, 1, 2]);
    // Same first two blocks, another tail.
    expect(mapper.of([...ids(1, 8), 99])).toEqual([0, 1, 3]);
    // 9-12 as a full block is not the tail 9-10.
    expect(mapper.of(ids(1, 12))).toEqual([0, 1, 4]);
    // A block equal to an earlier one after a different start is another prefix: a new id (the chain).
    expect(mapper.of([...ids(50, 4), ...ids(5, 4)])).toEqual([5, 6]);
    expect(mapper.of(ids(1, 10))).toEqual([0, 1, 2]);
    expect(mapper.of([])).toEqual([]);
  });

  it('refuses a block size below 1', () => {
    expect(() => new RollingHashIds(0)).toThrow('the trace block size must be an integer >= 1, got 0');
  });
});
