/**
 * `mocker trace --trace-format`: Dynamo's trace formats (ai-dynamo/dynamo docs/dynosim/trace-formats.md) through the
 * built CLI, on the worked examples of the formats' spec (mooncake, mooncake-delta, agentic_mooncake,
 * applied_compute_agentic). The engine's timing is the default model's, so completions are read from the run's own
 * per-request records; what the formats decide is computed by hand from the rows: which requests make a session, each
 * one's prompt length, its arrival (a timestamp, or a delay after the completions it waits for) and the prompt
 * blocks it finds in the cache. Trace and engine blocks are 4 tokens.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { runMockerToExit } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';

const dir = mkdtempSync(join(testTmpdir(), 'trace-formats-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

interface RequestRecord {
  session_id: string;
  turn_index: number;
  arrival_time_ms: number;
  last_token_ms: number;
  input_length: number;
  output_length: number;
  first_admission_reused_input_tokens: number;
}

const ENGINE = ['--extra-engine-args', '{"block_size":4}'];

let runs = 0;
/** Runs the trace rows in `format`; returns the exit, the report and the per-request records by "session/turn". */
async function traceRows(rows: object[], args: string[]) {
  const name = `run-${runs++}`;
  const file = join(dir, `${name}.jsonl`);
  writeFileSync(file, rows.map((r) => JSON.stringify(r)).join('\n'));
  const json = join(dir, `${name}.json`);
  const requests = join(dir, `${name}.requests.jsonl`);
  const html = join(dir, `${name}.html`);
  const result = await runMockerToExit(
    // A disaggregated fleet's pools take their own engine args.
    [
      'trace',
      file,
      '--trace-block-size',
      '4',
      ...(args.includes('--prefill-engine-args') ? [] : ENGINE),
      ...args,
      '--report-json',
      json,
      '--report-requests',
      requests,
      '--report-html',
      html,
      '--no-progress',
    ],
    { cwd: dir },
  );
  if (result.code !== 0) return { ...result, report: {}, records: new Map<string, RequestRecord>(), html: '' };
  const lines = readFileSync(requests, 'utf8').trim().split('\n');
  const records = new Map(lines.map((line) => JSON.parse(line) as RequestRecord).map((r) => [`${r.session_id}/${r.turn_index}`, r]));
  return { ...result, report: JSON.parse(readFileSync(json, 'utf8')) as Record<string, number>, records, html: readFileSync(html, 'utf8') };
}

/** Dynamo's arrival is the scheduled ready time; sums of the same doubles, so exact up to rounding. */
const expectAt = (actual: number, expected: number) => expect(actual).toBeCloseTo(expected, 9);

describe('mocker trace --trace-format: golden runs of the spec examples', () => {
  it('mooncake: sessions of turns, each a delay (given, or from its timestamps) after the previous completes; per-session figures', async () => {
    const { code, stderr, stdout, report, records, html } = await traceRows(
      [
        { session_id: 'a', timestamp: 1000, input_length: 6, output_length: 10, hash_ids: [1, 2] },
        { session_id: 'a', delay: 5, input_length: 10, output_length: 20, hash_ids: [1, 2, 3] },
        { session_id: 'b', timestamp: 1002, input_length: 8, output_length: 4, hash_ids: [1, 9] },
        { session_id: 'a', timestamp: 1100, input_length: 12, output_length: 1, hash_ids: [1, 2, 3] },
      ],
      ['--trace-format', 'mooncake'],
    );
    expect(stderr).toBe('');
    expect(code).toBe(0);
    const [a1, a2, a3, b1] = ['a/0', 'a/1', 'a/2', 'b/0'].map((key) => records.get(key)!);
    expect([a1, a2, a3, b1].map((r) => r.input_length)).toEqual([6, 10, 12, 8]);
    // Starts normalised by the first timestamp (1000): a at 0, b at 2.
    expect([a1.arrival_time_ms, b1.arrival_time_ms]).toEqual([0, 2]);
    expectAt(a2.arrival_time_ms, a1.last_token_ms + 5);
    // a3 has no delay: 1100 − 1000, the session's last timestamp (a2 has none).
    expectAt(a3.arrival_time_ms, a2.last_token_ms + 100);
    // a2's prompt [1×4, 2×4, 3×2] finds a1's first block (a1's second block is 2, 2 and two of a1's outputs);
    // a3's [1×4, 2×4, 3×4] finds a2's first two.
    expect([a2.first_admission_reused_input_tokens, a3.first_admission_reused_input_tokens]).toEqual([4, 8]);

    expect([report.num_sessions, report.mean_turns_per_session, report.max_turns_per_session]).toEqual([2, 2, 3]);
    const latencies = [a3.last_token_ms - 0, b1.last_token_ms - 2];
    expectAt(report.mean_session_latency_ms, (latencies[0] + latencies[1]) / 2);
    expectAt(report.max_session_latency_ms, Math.max(...latencies));
    const turn0 = (a1.first_admission_reused_input_tokens + b1.first_admission_reused_input_tokens) / (6 + 8);
    expectAt(report.first_admission_prefix_cache_reused_ratio_turn_0, turn0);
    expectAt(report.first_admission_prefix_cache_reused_ratio_turn_1, 4 / 10);
    expectAt(report.first_admission_prefix_cache_reused_ratio_turn_2, 8 / 12);
    expect(stdout).toContain('Sessions: 2 (turns per session: mean 2.00, max 3)');
    expect(stdout).toContain(`First Admission Prefix Cache Reused Ratio by Turn: 0: ${turn0.toFixed(2)}, 1: 0.40, 2: 0.67`);
    expect(stdout).toMatch(/┃ Session Latency \(ms\) /);
    expect(html).toContain('<h2>Sessions</h2>');
    expect(html).toContain('<td data-key="num_sessions">2</td>');
    expect(html).toContain('<td>66.7 %</td>');
  });

  it('mooncake-delta: each turn is the previous prompt, its output and the new blocks; the cache holds the output it repeats', async () => {
    const { code, stderr, records } = await traceRows(
      [
        { session_id: 's', timestamp: 0, input_length: 6, output_length: 3, hash_ids: [10, 11] },
        { session_id: 's', delay: 5, input_length: 3, output_length: 2, hash_ids: [12] },
        { session_id: 's', input_length: 4, output_length: 1, hash_ids: [13] },
      ],
      ['--trace-format', 'mooncake-delta'],
    );
    expect(stderr).toBe('');
    expect(code).toBe(0);
    const [t1, t2, t3] = [0, 1, 2].map((turn) => records.get(`s/${turn}`)!);
    // 6; 6 + 3 output + 3; 12 + 2 output + 4.
    expect([t1, t2, t3].map((r) => r.input_length)).toEqual([6, 12, 18]);
    expect([t1, t2, t3].map((r) => r.output_length)).toEqual([3, 2, 1]);
    expect(t1.arrival_time_ms).toBe(0);
    expectAt(t2.arrival_time_ms, t1.last_token_ms + 5);
    expectAt(t3.arrival_time_ms, t2.last_token_ms);
    // t1 computed the KV of its 6 prompt tokens and its first 2 outputs (the last token's is never computed): 2 full
    // blocks, [10×4] and [11, 11, o1, o1'], which t2's prompt starts with. t2 computed 12 + 1 tokens: 3 blocks for t3.
    expect([t2.first_admission_reused_input_tokens, t3.first_admission_reused_input_tokens]).toEqual([8, 12]);
  });

  it('agentic_mooncake: a request DAG, each dependent ready its delay + tool wait after the slowest of its dependencies', async () => {
    const { code, stderr, report, records } = await traceRows(
      [
        { request_id: 'r1', session_id: 'root', timestamp: 0, input_length: 8, output_length: 10, hash_ids: [1, 2] },
        { request_id: 'c1', session_id: 'kid1', timestamp: 50, input_length: 8, output_length: 30, hash_ids: [1, 5], wait_for: ['r1'], delay: 2 },
        { request_id: 'c2', session_id: 'kid2', input_length: 8, output_length: 5, hash_ids: [1, 6], wait_for: ['r1'], tool_wait_ms: 3 },
        { request_id: 'bg', timestamp: 20, input_length: 4, output_length: 2, hash_ids: [9] },
        {
          request_id: 'r2',
          session_id: 'root',
          timestamp: 999,
          input_length: 12,
          output_length: 1,
          hash_ids: [1, 2, 7],
          wait_for: ['c1', 'c2'],
          delay: 1,
          tool_wait_ms: 4,
          prefix_reset: false,
          branches: ['c1'],
          tool_events: [{ tool_call_id: 't', duration_ms: 4 }],
        },
      ],
      ['--trace-format', 'agentic_mooncake'],
    );
    expect(stderr).toBe('');
    expect(code).toBe(0);
    // A row without session_id is its own trajectory, request_<line>.
    const [r1, c1, c2, bg, r2] = ['root/0', 'kid1/0', 'kid2/0', 'request_4/0', 'root/1'].map((key) => records.get(key)!);
    expect([r1, c1, c2, bg, r2].map((r) => r.input_length)).toEqual([8, 8, 8, 4, 12]);
    expect([r1.arrival_time_ms, bg.arrival_time_ms]).toEqual([0, 20]);
    // c1's own timestamp (50) is ignored: it waits for r1.
    expectAt(c1.arrival_time_ms, r1.last_token_ms + 2);
    expectAt(c2.arrival_time_ms, r1.last_token_ms + 3);
    expectAt(r2.arrival_time_ms, Math.max(c1.last_token_ms, c2.last_token_ms) + 1 + 4);
    expect([report.num_sessions, report.mean_turns_per_session, report.max_turns_per_session]).toEqual([4, 5 / 4, 2]);
  });

  it('applied_compute_agentic: num_turns + 1 requests a row, prompts grown by answers and tool outputs, tool latencies in seconds', async () => {
    const { code, stderr, records } = await traceRows(
      [
        {
          num_turns: 2,
          input_prompt_length: 6,
          assistant_response_length: [3, 2],
          tool_call_output_length: [4, 1],
          tool_call_latency: [0.5, 0.01],
          final_assistant_response_length: 7,
        },
        {
          num_turns: 1,
          input_prompt_length: 4,
          assistant_response_length: [1],
          tool_call_output_length: [0],
          tool_call_latency: [0],
          final_assistant_response_length: 1,
        },
      ],
      ['--trace-format', 'applied_compute_agentic', '--replay-concurrency', '2'],
    );
    expect(stderr).toBe('');
    expect(code).toBe(0);
    const s1 = [0, 1, 2].map((turn) => records.get(`applied_compute_agentic_session_1/${turn}`)!);
    const s2 = [0, 1].map((turn) => records.get(`applied_compute_agentic_session_2/${turn}`)!);
    // 6; 6 + 3 + 4; 13 + 2 + 1 — and 4; 4 + 1 + 0.
    expect(s1.map((r) => r.input_length)).toEqual([6, 13, 16]);
    expect(s2.map((r) => r.input_length)).toEqual([4, 5]);
    expect([...s1, ...s2].map((r) => r.output_length)).toEqual([3, 2, 7, 1, 1]);
    // Two sessions under a cap of 2: both start at once; each later request 0.5 s, 10 ms, 0 s after the previous.
    expect([s1[0].arrival_time_ms, s2[0].arrival_time_ms]).toEqual([0, 0]);
    expectAt(s1[1].arrival_time_ms, s1[0].last_token_ms + 500);
    expectAt(s1[2].arrival_time_ms, s1[1].last_token_ms + 10);
    expectAt(s2[1].arrival_time_ms, s2[0].last_token_ms);
    // t1's prompt [1×4, 2×4, 3×4, 4] starts with t0's first block; the final one [1×4, 2×4, 3×4, 4×4] with t1's three.
    expect([s1[1].first_admission_reused_input_tokens, s1[2].first_admission_reused_input_tokens]).toEqual([4, 12]);
  });

  it('reports no session figures when every session is one request', async () => {
    const { code, report, stdout, html } = await traceRows(
      [
        { timestamp: 0, input_length: 8, output_length: 2, hash_ids: [1, 2] },
        { timestamp: 1, input_length: 8, output_length: 2, hash_ids: [1, 3] },
      ],
      [],
    );
    expect(code).toBe(0);
    expect(report.completed_requests).toBe(2);
    expect(Object.keys(report).filter((key) => key.includes('session'))).toEqual([]);
    expect(stdout).not.toContain('Sessions:');
    expect(html).not.toContain('<h2>Sessions</h2>');
  });
});

describe('mocker trace --trace-format: what it refuses, with Dynamo’s reasons', () => {
  const root = { request_id: 'r1', timestamp: 0, input_length: 8, output_length: 2, hash_ids: [1, 2] };
  const session = { session_id: 's', timestamp: 0, input_length: 8, output_length: 2, hash_ids: [1, 2] };
  const loop = {
    num_turns: 1,
    input_prompt_length: 4,
    assistant_response_length: [1],
    tool_call_output_length: [1],
    tool_call_latency: [0],
    final_assistant_response_length: 1,
  };
  it.each([
    [
      'a wait for an unknown request',
      [root, { ...root, request_id: 'c1', wait_for: ['zz'] }],
      ['--trace-format', 'agentic_mooncake'],
      /line 2: request c1 waits for unknown request_id zz/,
    ],
    [
      'a cycle of waits',
      [
        { ...root, wait_for: ['r2'] },
        { ...root, request_id: 'r2', wait_for: ['r1'] },
      ],
      ['--trace-format', 'agentic_mooncake'],
      /cycle detected at request r1/,
    ],
    ['a request waiting for itself', [{ ...root, wait_for: ['r1'] }], ['--trace-format', 'agentic_mooncake'], /line 1: request r1 cannot wait for itself/],
    ['a duplicate request_id', [root, root], ['--trace-format', 'agentic_mooncake'], /line 2 duplicates request_id r1 \(line 1\)/],
    [
      'agentic_mooncake with --replay-concurrency',
      [root],
      ['--trace-format', 'agentic-mooncake', '--replay-concurrency', '2'],
      /agentic_mooncake trace format is not supported with --replay-concurrency/,
    ],
    [
      'agentic_mooncake online',
      [root],
      ['--trace-format', 'agentic_mooncake', '--replay-mode', 'online'],
      /agentic_mooncake trace format is not supported for online replay/,
    ],
    [
      'applied_compute_agentic without --replay-concurrency',
      [loop],
      ['--trace-format', 'applied_compute_agentic'],
      /applied_compute_agentic trace format requires --replay-concurrency because source traces do not contain first-turn timestamps/,
    ],
    [
      'an applied_compute_agentic row whose lists do not match num_turns',
      [{ ...loop, tool_call_latency: [0, 1] }],
      ['--trace-format', 'applied_compute_agentic', '--replay-concurrency', '1'],
      /line 1: field tool_call_latency length 2 does not match num_turns 1/,
    ],
    [
      'mooncake-delta online',
      [session],
      ['--trace-format', 'mooncake_delta', '--replay-mode', 'online'],
      /mooncake-delta trace format is not supported for online replay/,
    ],
    [
      'mooncake-delta disaggregated',
      [session],
      ['--trace-format', 'mooncake-delta', '--prefill-engine-args', '{}', '--decode-engine-args', '{}', '--router-mode', 'kv_router'],
      /mooncake-delta trace format is not supported for disaggregated replay/,
    ],
    [
      'a mooncake-delta row with more hash ids than its input needs',
      [{ ...session, input_length: 6, hash_ids: [1, 2, 3] }],
      ['--trace-format', 'mooncake-delta'],
      /line 1: input_length 6 requires exactly 2 hash IDs at trace_block_size 4, got 3/,
    ],
    [
      'an unknown format',
      [session],
      ['--trace-format', 'weka'],
      /--trace-format must be one of mooncake, mooncake-delta, agentic_mooncake, applied_compute_agentic, got "weka"/,
    ],
  ])('refuses %s', async (_label, rows, args, message) => {
    const { code, stderr } = await traceRows(rows, args);
    expect(stderr).toMatch(message);
    expect(code).toBe(1);
  });

  it('refuses a format for a workload that is not a trace file', async () => {
    const { code, stderr } = await runMockerToExit(
      ['trace', '--trace-format', 'agentic_mooncake', '--input-tokens', '8', '--output-tokens', '2', '--request-count', '2', '--no-progress'],
      { cwd: dir },
    );
    expect(stderr).toMatch(/--trace-format agentic_mooncake is the format of a trace file: a synthetic workload has none/);
    expect(code).toBe(1);
  });
});
