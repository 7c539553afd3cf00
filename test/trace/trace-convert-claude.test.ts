/**
 * `mocker trace convert` of Claude Code session logs → Mooncake (issue 40 item 3), as Dynamo's
 * `claude_trace_export` reads them (lib/bench/coding): a request per group of assistant rows sharing a
 * `requestId`, its prompt the conversation so far rendered one entry per line (`[user] …`,
 * `[assistant_tool_use id=tool_0001 name=… args=…]`, `[user_tool_result id=tool_0001 error=false] …`; thinking,
 * `isMeta` and sub-agent rows left out), its output the largest `usage.output_tokens` of the group, its delay from
 * the previous request's last row to the user row that prompted it. The expected rows are worked out here from a
 * hand-written log, with the bundled tokenizer counting the rendered entries.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { loadTokenizer } from '../../src/tokenizer/index.js';
import { claudeLogRequests } from '../../src/trace/claudeLog.js';
import { runMockerToExit } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';

const BLOCK = 8;
const at = (seconds: number) => new Date(Date.UTC(2026, 10, 20, 10, 0, 0) + seconds * 1000).toISOString();

type Row = Record<string, unknown>;
const user = (session: string, seconds: number, content: unknown, extra: Row = {}): Row => ({
  type: 'user',
  sessionId: session,
  uuid: `u-${seconds}`,
  timestamp: at(seconds),
  isSidechain: false,
  message: { role: 'user', content },
  ...extra,
});
const assistant = (session: string, seconds: number, requestId: string, content: unknown[], outputTokens?: number): Row => ({
  type: 'assistant',
  sessionId: session,
  uuid: `a-${seconds}`,
  requestId,
  timestamp: at(seconds),
  isSidechain: false,
  message: {
    id: `msg-${requestId}`,
    role: 'assistant',
    content,
    ...(outputTokens === undefined ? {} : { usage: { input_tokens: 3, output_tokens: outputTokens } }),
  },
});

const FIX = 'Fix the bug in main.ts';
const SESSION_LOG = [
  user('s1', 0, FIX),
  assistant(
    's1',
    2,
    'r1',
    [
      { type: 'thinking', thinking: 'Hidden reasoning.' },
      { type: 'text', text: 'Let me look.' },
    ],
    12,
  ),
  assistant('s1', 2.5, 'r1', [{ type: 'tool_use', id: 'toolu_A', name: 'Read', input: { file_path: 'main.ts' } }], 30),
  user('s1', 3.25, [{ type: 'tool_result', tool_use_id: 'toolu_A', content: 'const x = 1;' }]),
  // Not the conversation: a meta row, a sub-agent's row, a summary without a session.
  user('s1', 3.3, 'Caveat: local commands.', { isMeta: true }),
  user('s1', 3.4, 'A sub-agent prompt.', { isSidechain: true }),
  { type: 'summary', summary: 'Bug fix', leafUuid: 'x' },
  assistant('s1', 5, 'r2', [{ type: 'text', text: 'Fixed.' }], 5),
  user('s1', 20, 'Thanks'),
  assistant('s1', 21, 'r3', [{ type: 'text', text: "You're welcome." }]),
];
const OTHER_LOG = [user('s2', 1, 'Hello'), assistant('s2', 1.8, 'r4', [{ type: 'text', text: 'Hi!' }], 7)];

const jsonl = (rows: Row[]) => `${rows.map((r) => JSON.stringify(r)).join('\n')}\n`;

describe('trace convert of Claude Code session logs', () => {
  const dir = mkdtempSync(join(testTmpdir(), 'mocker-trace-claude-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('writes one Mooncake row per request: prompts of the rendered conversation, outputs from usage, delays from the log', async () => {
    const logs = join(dir, 'project');
    const { mkdirSync } = await import('node:fs');
    mkdirSync(logs);
    writeFileSync(join(logs, 's1.jsonl'), jsonl(SESSION_LOG));
    writeFileSync(join(logs, 's2.jsonl'), jsonl(OTHER_LOG));
    // Claude Code's prompt history is not a session.
    writeFileSync(join(logs, 'history.jsonl'), '{"display":"Fix the bug","timestamp":1}\n');
    const out = join(dir, 'claude.jsonl');
    const run = await runMockerToExit(['trace', 'convert', logs, '--trace-block-size', String(BLOCK), '-o', out]);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stderr).toContain('4 request(s) in 2 session(s)');

    const tokenizer = loadTokenizer();
    const count = async (...entries: string[]) => {
      let n = 0;
      for (const entry of entries) n += (await tokenizer.encode(`${entry}\n`, false)).length;
      return n;
    };
    const first = await count(`[user] ${FIX}`);
    const second =
      first +
      (await count(
        '[assistant] Let me look.',
        '[assistant_tool_use id=tool_0001 name=Read args={"file_path":"main.ts"}]',
        '[user_tool_result id=tool_0001 error=false] const x = 1;',
      ));
    const third = second + (await count('[assistant] Fixed.', '[user] Thanks'));
    const rows = readFileSync(out, 'utf8')
      .trim()
      .split('\n')
      .map((line) => JSON.parse(line) as Row & { hash_ids: number[] });
    expect(rows.map(({ hash_ids, ...rest }) => rest)).toEqual([
      { session_id: 's1', timestamp: 0, input_length: first, output_length: 30 },
      // Its user row (the tool result) 750 ms after the previous request's last row.
      { session_id: 's1', delay: 750, input_length: second, output_length: 5 },
      // No usage: the tokens of what it said.
      { session_id: 's1', delay: 15_000, input_length: third, output_length: await count("[assistant] You're welcome.") },
      { session_id: 's2', timestamp: 1000, input_length: await count('[user] Hello'), output_length: 7 },
    ]);
    // Each turn's prompt extends the previous: its full blocks keep their hash ids.
    const [a, b, c] = rows.map((r) => r.hash_ids);
    expect(a).toHaveLength(Math.ceil(first / BLOCK));
    expect(b.slice(0, Math.floor(first / BLOCK))).toEqual(a.slice(0, Math.floor(first / BLOCK)));
    expect(c.slice(0, Math.floor(second / BLOCK))).toEqual(b.slice(0, Math.floor(second / BLOCK)));
    expect(rows[3].hash_ids[0]).not.toBe(a[0]);
  });

  it('refuses an entry beyond the token bound, naming its line, and a file that is neither a capture nor a session log', async () => {
    const huge = jsonl([user('s3', 0, 'word '.repeat(20_000)), assistant('s3', 1, 'r', [{ type: 'text', text: 'ok' }], 1)]);
    await expect(claudeLogRequests([{ name: 'huge.jsonl', text: huge }], loadTokenizer(), BLOCK, 100)).rejects.toThrow(
      'huge.jsonl:1: an entry of more than 100 tokens',
    );
    const notes = join(dir, 'notes.jsonl');
    writeFileSync(notes, '{"a":1}\n');
    const run = await runMockerToExit(['trace', 'convert', notes]);
    expect(run.code).not.toBe(0);
    expect(run.stderr).toContain('no request found: neither a capture file (SQLite) nor Claude Code session logs');
    const broken = join(dir, 'broken.jsonl');
    writeFileSync(broken, `${JSON.stringify(user('s4', 0, 'hi'))}\n{"type":\n`);
    const bad = await runMockerToExit(['trace', 'convert', broken]);
    expect(bad.stderr).toContain(`${broken}:2: not JSON`);
  });
});
