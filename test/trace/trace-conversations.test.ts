/**
 * Agent conversations from a capture (issue 40 items 2 and 3): two five-turn tool loops, interleaved, sent by the
 * openai client through the spawned `mocker capture` in front of `mocker serve` — each turn resends the history with
 * the assistant's tool call and the tool's result, after a known tool time. The oracle is the capture itself, read
 * here: which conversation and turn each exchange is (its request's messages) and its timing (start, duration), so
 * each turn's tool wait is the gap between the previous answer's end and its start. `mocker trace --from-captures`
 * must replay each conversation in order with those waits, and `mocker trace convert` must write them as
 * Mooncake (sessions with delays) and agentic_mooncake (requests waiting for the previous turn) rows.
 */
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import type { ChatCompletionMessageParam, ChatCompletionTool } from 'openai/resources/chat/completions';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CaptureStore } from '../../src/store/captureStore.js';
import { capturedWorkload } from '../../src/trace/capturedWorkload.js';
import { parseMooncake } from '../../src/trace/mooncake.js';
import { mooncakeFileWorkload, normalizeArrivals, type Workload } from '../../src/trace/workload.js';
import { mockerProcesses, runMockerToExit } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';
import { MODEL } from '../support/vllmUpstream.js';

/** The tool time the client takes before each next turn, per conversation (ms). */
const TOOL_WAITS = [
  [150, 50, 300, 100],
  [80, 220, 40, 120],
];
const QUESTIONS = ['What is the weather in Paris, Rome and Oslo?', 'Plan a trip: check the weather in Lima and Quito first.'];
const BLOCK = 16;

const TOOLS: ChatCompletionTool[] = [
  {
    type: 'function',
    function: { name: 'get_weather', description: 'The weather in a city', parameters: { type: 'object', properties: { city: { type: 'string' } } } },
  },
];

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** A captured exchange as the test reads it from the file. */
interface Captured {
  id: number;
  conversation: number;
  /** 0 to 4: how many tool rounds its messages hold. */
  turn: number;
  startMs: number;
  endMs: number;
  prompt: number[];
  output: number[];
}

const commonPrefix = (a: readonly number[], b: readonly number[]) => {
  let n = 0;
  while (n < a.length && n < b.length && a[n] === b[n]) n++;
  return n;
};

describe('a capture of two five-turn tool loops', () => {
  const dir = mkdtempSync(join(testTmpdir(), 'mocker-trace-conversations-'));
  const cap = join(dir, 'agents.db');
  const mockers = mockerProcesses();
  /** Per conversation, its turns in order. */
  let conversations: Captured[][];
  /** Per conversation, the client's own wait before each next turn (from its answer to its next request). */
  const clientWaits: number[][] = [[], []];

  beforeAll(async () => {
    const server = await mockers.start(['serve', '--tool-call-rate', '1']);
    const capture = await mockers.start(['capture', '--upstream', server.url, '--captures', cap]);
    const client = new OpenAI({ baseURL: `${capture.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    const converse = async (k: number) => {
      const messages: ChatCompletionMessageParam[] = [
        { role: 'system', content: 'You are a travel agent. Use the tools you are given.' },
        { role: 'user', content: QUESTIONS[k] },
      ];
      let answered = 0;
      for (let turn = 0; turn < 5; turn++) {
        if (turn > 0) clientWaits[k].push(performance.now() - answered);
        const last = turn === 4;
        const completion = await client.chat.completions.create({ model: MODEL, messages, tools: TOOLS, tool_choice: last ? 'none' : 'auto', max_tokens: 96 });
        answered = performance.now();
        if (last) break;
        const calls = completion.choices[0].message.tool_calls;
        // --tool-call-rate 1: every answer of a turn that may call a tool calls one.
        if (!calls?.length) throw new Error(`conversation ${k} turn ${turn}: no tool call (finish_reason ${completion.choices[0].finish_reason})`);
        messages.push({ role: 'assistant', content: null, tool_calls: calls });
        messages.push({ role: 'tool', tool_call_id: calls[0].id, content: JSON.stringify({ temperature_c: 10 + turn, sky: 'clear' }) });
        await sleep(TOOL_WAITS[k][turn]);
      }
    };
    await Promise.all([converse(0), sleep(40).then(() => converse(1))]);
    await mockers.stopAll();

    const store = CaptureStore.open(cap, { readonly: true });
    try {
      conversations = [[], []];
      for (const id of store.exchangeIds()) {
        const ex = store.getExchange(id)!;
        const messages = (JSON.parse(ex.requestBody.toString('utf8')) as { messages: { content: string | null }[] }).messages;
        const conversation = QUESTIONS.indexOf(messages[1].content!);
        conversations[conversation].push({
          id,
          conversation,
          turn: (messages.length - 2) / 2,
          startMs: ex.startedAt,
          endMs: ex.startedAt + ex.totalMs,
          prompt: ex.promptIds!,
          output: ex.generations[0].outputIds,
        });
      }
      for (const turns of conversations) turns.sort((a, b) => a.turn - b.turn);
    } finally {
      store.close();
    }
  }, 60_000);

  afterAll(async () => {
    await mockers.killAll();
    rmSync(dir, { recursive: true, force: true });
  });

  /** The capture's tool waits: from each answer's end to the next turn's start. */
  const capturedGaps = (k: number) => conversations[k].slice(1).map((t, i) => t.startMs - conversations[k][i].endMs);

  it('holds both conversations, five turns each, interleaved, each wait at least the tool time the client took', () => {
    expect(conversations.map((c) => c.map((t) => t.turn))).toEqual([
      [0, 1, 2, 3, 4],
      [0, 1, 2, 3, 4],
    ]);
    // Interleaved: the second started before the first ended.
    expect(conversations[1][0].startMs).toBeLessThan(conversations[0][4].startMs);
    for (const k of [0, 1]) {
      // The capture's clock starts in whole ms: 1 ms of slack.
      capturedGaps(k).forEach((gap, i) => expect(gap, `conversation ${k} wait ${i}`).toBeGreaterThanOrEqual(Math.min(TOOL_WAITS[k][i], clientWaits[k][i]) - 1));
      // Each turn's prompt extends the previous one (the agent resends its history).
      conversations[k].slice(1).forEach((t, i) => expect(commonPrefix(t.prompt, conversations[k][i].prompt)).toBe(conversations[k][i].prompt.length));
    }
  });

  /** `--report-requests` records (one JSON line per request) of a spawned `mocker trace` run. */
  type RequestRecord = { session_id: string; turn_index: number; arrival_time_ms: number; last_token_ms: number | null; input_length: number };
  const readRecords = (file: string) =>
    readFileSync(file, 'utf8')
      .trim()
      .split('\n')
      .map((line) => JSON.parse(line) as RequestRecord);

  /** Each conversation in turn order, each turn arriving its captured tool wait after the previous one completed. */
  function expectConversationsReplayed(records: RequestRecord[]) {
    expect(records).toHaveLength(10);
    for (const k of [0, 1]) {
      const root = `exchange-${conversations[k][0].id}`;
      const mine = records.filter((r) => r.session_id === root).sort((a, b) => a.arrival_time_ms - b.arrival_time_ms);
      expect(mine.map((r) => r.turn_index)).toEqual([0, 1, 2, 3, 4]);
      expect(mine.map((r) => r.input_length)).toEqual(conversations[k].map((t) => t.prompt.length));
      const waits = mine.slice(1).map((r, i) => r.arrival_time_ms - mine[i].last_token_ms!);
      waits.forEach((wait, i) => expect(wait, `conversation ${k} wait ${i}`).toBeCloseTo(capturedGaps(k)[i], 6));
    }
    // The conversations start as captured, relative to the first.
    const first = Math.min(conversations[0][0].startMs, conversations[1][0].startMs);
    for (const k of [0, 1])
      expect(records.find((r) => r.session_id === `exchange-${conversations[k][0].id}` && r.turn_index === 0)!.arrival_time_ms).toBe(
        conversations[k][0].startMs - first,
      );
  }

  it('mocker trace --from-captures replays each conversation in turn order, each turn its captured tool wait after the previous', async () => {
    const report = join(dir, 'report.json');
    const requests = join(dir, 'requests.jsonl');
    const run = await runMockerToExit(['trace', '--from-captures', cap, '--report-json', report, '--report-requests', requests, '--no-progress']);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stderr).toContain('mocker trace: 10 turn(s) in 2 conversation(s): 8 continue an earlier exchange after its tool or think time\n');
    const json = JSON.parse(readFileSync(report, 'utf8')) as Record<string, number>;
    expect([json.num_requests, json.completed_requests]).toEqual([10, 10]);
    expectConversationsReplayed(readRecords(requests));
  });

  it('round trip: trace convert → agentic_mooncake, replayed with --trace-format agentic_mooncake, keeps the order and the waits', async () => {
    const trace = join(dir, 'round-trip.agentic.jsonl');
    const converted = await runMockerToExit(['trace', 'convert', cap, '--to', 'agentic_mooncake', '-o', trace]);
    expect(converted.code, converted.stderr).toBe(0);
    const requests = join(dir, 'round-trip.requests.jsonl');
    const report = join(dir, 'round-trip.json');
    const run = await runMockerToExit([
      'trace',
      trace,
      '--trace-format',
      'agentic_mooncake',
      '--report-json',
      report,
      '--report-requests',
      requests,
      '--no-progress',
    ]);
    expect(run.code, run.stderr).toBe(0);
    expectConversationsReplayed(readRecords(requests));
  });

  it('trace convert → mooncake: two sessions of five turns with the captured waits, read back as the same sessions', async () => {
    const out = join(dir, 'agents.mooncake.jsonl');
    const run = await runMockerToExit(['trace', 'convert', cap, '--trace-block-size', String(BLOCK), '-o', out]);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stderr).toContain('10 request(s) in 2 session(s)');
    const text = readFileSync(out, 'utf8');
    const rows = parseMooncake(text, BLOCK);
    for (const k of [0, 1]) {
      const mine = rows.filter((r) => r.sessionId === `exchange-${conversations[k][0].id}`);
      expect(mine.map((r) => r.inputLength)).toEqual(conversations[k].map((t) => t.prompt.length));
      expect(mine.map((r) => r.outputLength)).toEqual(conversations[k].map((t) => t.output.length));
      expect(mine.map((r) => r.delayMs)).toEqual([0, ...capturedGaps(k)]);
    }
    // Read back, the same sessions as --from-captures replays (ids, turns, lengths, waits, starts).
    const shape = (w: Workload) =>
      normalizeArrivals(w, 1).sessions.map((s) => ({ id: s.id, startMs: s.startMs, turns: s.turns.map((t) => [t.inputLength, t.outputLength, t.delayMs]) }));
    expect(shape(mooncakeFileWorkload(text, BLOCK))).toEqual(shape(capturedWorkload(cap).workload));

    // Text-free: prompts sharing their first k blocks of ids share their first k hash ids, and no more.
    const all = conversations.flat().sort((a, b) => a.startMs - b.startMs || a.id - b.id);
    const hashIds = text
      .trim()
      .split('\n')
      .map((line) => (JSON.parse(line) as { hash_ids: number[] }).hash_ids);
    expect(hashIds[0]).toEqual(Array.from({ length: Math.ceil(all[0].prompt.length / BLOCK) }, (_, i) => i));
    for (let i = 0; i < all.length; i++) {
      for (let j = i + 1; j < all.length; j++) {
        const blocks = Math.floor(commonPrefix(all[i].prompt, all[j].prompt) / BLOCK);
        expect(commonPrefix(hashIds[i], hashIds[j]), `exchanges ${all[i].id} and ${all[j].id}`).toBe(blocks);
      }
    }
  });

  it('trace convert → agentic_mooncake: each turn waits for the previous one of its conversation, its delay the captured wait', async () => {
    const out = join(dir, 'agents.agentic.jsonl');
    const run = await runMockerToExit(['trace', 'convert', cap, '--to', 'agentic_mooncake', '--output', out]);
    expect(run.code, run.stderr).toBe(0);
    type Row = { request_id: string; session_id: string; wait_for?: string[]; delay?: number; timestamp?: number; input_length: number; output_length: number };
    const rows = readFileSync(out, 'utf8')
      .trim()
      .split('\n')
      .map((line) => JSON.parse(line) as Row);
    expect(rows).toHaveLength(10);
    const byId = new Map(rows.map((r) => [r.request_id, r]));
    expect(byId.size).toBe(10);
    const first = Math.min(conversations[0][0].startMs, conversations[1][0].startMs);
    for (const k of [0, 1]) {
      const turns = conversations[k];
      const root = byId.get(`exchange-${turns[0].id}`)!;
      expect(root).toMatchObject({ session_id: `exchange-${turns[0].id}`, timestamp: turns[0].startMs - first, input_length: turns[0].prompt.length });
      expect(root.wait_for).toBeUndefined();
      turns.slice(1).forEach((t, i) => {
        const row = byId.get(`exchange-${t.id}`)!;
        expect(row).toMatchObject({ session_id: `exchange-${turns[0].id}`, wait_for: [`exchange-${turns[i].id}`], input_length: t.prompt.length });
        expect(row.delay).toBeCloseTo(capturedGaps(k)[i], 9);
        expect(row.timestamp).toBeUndefined();
      });
    }
  });

  it('trace convert refuses to replace a file without --force, and never its input', async () => {
    const out = join(dir, 'taken.jsonl');
    writeFileSync(out, 'keep me\n');
    const refused = await runMockerToExit(['trace', 'convert', cap, '-o', out]);
    expect(refused.code).not.toBe(0);
    expect(refused.stderr).toContain(`${out}: already exists (--force replaces it)`);
    expect(readFileSync(out, 'utf8')).toBe('keep me\n');
    const forced = await runMockerToExit(['trace', 'convert', cap, '-o', out, '--force']);
    expect(forced.code, forced.stderr).toBe(0);
    expect(readFileSync(out, 'utf8').split('\n')).toHaveLength(11);
    const input = await runMockerToExit(['trace', 'convert', cap, '-o', cap, '--force']);
    expect(input.code).not.toBe(0);
    expect(input.stderr).toContain('an input of this command');
    expect(existsSync(cap)).toBe(true);
  });
});
