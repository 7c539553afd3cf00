/**
 * The agents' APIs through `mocker capture`: OpenAI Responses in front of a double built from `transformers serve`'s
 * recorded bytes (no `event:` lines, a stream even when none was asked for), recorded as endpoint `responses` with
 * every event's bytes and arrival time and the text its deltas make; and the reading of vLLM's Responses and
 * Messages event streams (with `event:` lines, reasoning and tool calls; api39-spec §1.3, §2.5) into the chat-shaped
 * fields chat captures are stored with. The mockers are the built CLI in their own processes.
 */
import { mkdtempSync, readFileSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseAgentResponse } from '../../src/capture/agentEvents.js';
import { foldChatDeltas } from '../../src/api/renderCommon.js';
import { recordedExchanges, startEngineDouble, type EngineDouble } from '../support/engineDoubles.js';
import { listenOnLoopback, type LoopbackServer } from '../support/loopback.js';
import { mockerProcesses, runMockerToExit } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';

type Json = Record<string, unknown>;

const dir = mkdtempSync(join(testTmpdir(), 'agent-capture-'));
const db = join(dir, 'captures.db');
const mockers = mockerProcesses();
let engine: EngineDouble;

/** The fixture's Responses exchanges, in the order they were recorded. */
const RECORDED = recordedExchanges('transformers').filter((e) => e.request.path === '/v1/responses');

/** The `data:` payloads of an SSE body, as the fixture's bytes hold them. */
const payloads = (body: string) =>
  body
    .split('\n\n')
    .filter((e) => e.startsWith('data: '))
    .map((e) => JSON.parse(e.slice('data: '.length)) as Json);

beforeAll(async () => {
  engine = await startEngineDouble('transformers');
  const capture = await mockers.start(['capture', '--upstream', engine.url, '--captures', db]);
  for (const recorded of RECORDED) {
    const body = typeof recorded.request.body === 'string' ? recorded.request.body : JSON.stringify(recorded.request.body);
    const res = await fetch(`${capture.url}/v1/responses`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
    // Forwarded as the engine answered it.
    expect(res.status).toBe(recorded.response.status);
    expect(await res.text()).toBe(recorded.response.body);
  }
  await capture.stop();
}, 60_000);

afterAll(async () => {
  await mockers.stopAll();
  await engine?.close();
});

interface Row {
  id: number;
  endpoint: string;
  outcome: string;
  stream: number;
  status: number;
  error: string | null;
}

describe('capture of /v1/responses in front of transformers serve', () => {
  it("records every exchange as endpoint 'responses', streamed even when not asked, its failures as failed", () => {
    const file = new Database(db, { readonly: true });
    try {
      const rows = file.prepare('select id, endpoint, outcome, stream, status, error from exchanges order by id').all() as Row[];
      expect(rows).toHaveLength(RECORDED.length);
      for (const [i, row] of rows.entries()) {
        const recorded = RECORDED[i].response;
        expect(row.endpoint, `exchange ${row.id}`).toBe('responses');
        expect(row.status).toBe(recorded.status);
        const failedInStream = recorded.status === 200 && payloads(recorded.body).some((p) => p.type === 'error');
        expect(row.outcome, `exchange ${row.id}`).toBe(recorded.status === 200 && !failedInStream ? 'complete' : 'failed');
        if (recorded.status === 200) expect(row.stream).toBe(1);
      }
      // The in-stream error is named by its own message.
      expect(rows.map((r) => r.error)).toContain('`max_new_tokens` must be greater than 0, but is -1.');
    } finally {
      file.close();
    }
  });

  it('captures show: every event with its arrival time, the text the output_text deltas make, model and usage', async () => {
    for (const [i, recorded] of RECORDED.entries()) {
      if (recorded.response.status !== 200) continue;
      const shown = await runMockerToExit(['captures', 'show', db, String(i + 1), '--json']);
      expect(shown.code, shown.stderr).toBe(0);
      const json = JSON.parse(shown.stdout) as { endpoint: string; responseBody: string; model: string; usage: unknown; choices: { text: string }[] };
      expect(json.endpoint).toBe('responses');
      expect(json.responseBody).toBe(recorded.response.body);
      const events = payloads(recorded.response.body);
      const text = events
        .filter((e) => e.type === 'response.output_text.delta')
        .map((e) => e.delta)
        .join('');
      expect(json.choices[0].text).toBe(text);
      const completed = events.find((e) => e.type === 'response.completed')?.response as Json | undefined;
      if (completed) expect(json.usage).toEqual(completed.usage);
    }
    // The lossless export: where each event ended and when it arrived, one of each per event the engine sent.
    const jsonl = join(dir, 'export.jsonl');
    const exported = await runMockerToExit(['captures', 'export', db, '-o', jsonl]);
    expect(exported.code, exported.stderr).toBe(0);
    const lines = readFileSync(jsonl, 'utf8')
      .split('\n')
      .filter((l) => l !== '')
      .map((l) => JSON.parse(l) as Json)
      .filter((l) => l.type === 'exchange') as { endpoint: string; status: number; eventEnds: number[]; eventTimes: number[] }[];
    expect(lines).toHaveLength(RECORDED.length);
    for (const [i, line] of lines.entries()) {
      const recorded = RECORDED[i].response;
      expect(line.endpoint).toBe('responses');
      if (recorded.status !== 200) continue;
      const events = recorded.body.split('\n\n').length - 1;
      expect(line.eventEnds).toHaveLength(events);
      expect(line.eventEnds[events - 1]).toBe(Buffer.byteLength(recorded.body));
      expect(line.eventTimes).toHaveLength(events);
      expect(line.eventTimes.every((t, k) => t >= 0 && (k === 0 || t >= line.eventTimes[k - 1]))).toBe(true);
    }
    // And it reads back in.
    const imported = await runMockerToExit(['captures', 'import', jsonl, '-o', join(dir, 'imported.db')]);
    expect(imported.code, imported.stderr).toBe(0);
  });

  it('captures verify skips them, saying why; list counts them', async () => {
    const verified = await runMockerToExit(['captures', 'verify', db, '--json']);
    expect(verified.code, verified.stdout + verified.stderr).toBe(0);
    const report = JSON.parse(verified.stdout) as { skippedBy: Record<string, number> };
    expect(report.skippedBy['responses (not rendered by mocker yet)']).toBe(RECORDED.filter((e) => e.response.status === 200).length - 1);
    const listed = await runMockerToExit(['captures', 'list', db]);
    expect(listed.stdout).toContain(`${RECORDED.length} responses)`);
  });
});

/** vLLM's Responses stream (api39-spec §1.3): reasoning, text, then a function call. */
const RESPONSE = { id: 'resp_1', model: 'm', status: 'completed', usage: { input_tokens: 12, output_tokens: 9, total_tokens: 21 } };
const RESPONSES_EVENTS: Json[] = [
  { response: { ...RESPONSE, status: 'in_progress', usage: null }, sequence_number: 0, type: 'response.created' },
  {
    item: { id: 'a', summary: [], type: 'reasoning', content: null, status: 'in_progress' },
    output_index: 0,
    sequence_number: 1,
    type: 'response.output_item.added',
  },
  { content_index: 0, delta: 'Think', item_id: 'a', output_index: 0, sequence_number: 2, type: 'response.reasoning_text.delta' },
  { content_index: 0, delta: 'ing.', item_id: 'a', output_index: 0, sequence_number: 3, type: 'response.reasoning_text.delta' },
  { content_index: 0, delta: 'Hel', item_id: 'b', logprobs: [], output_index: 1, sequence_number: 4, type: 'response.output_text.delta' },
  { content_index: 0, delta: 'lo', item_id: 'b', logprobs: [], output_index: 1, sequence_number: 5, type: 'response.output_text.delta' },
  {
    item: { id: 'c', arguments: '', call_id: 'call_9', name: 'get_weather', type: 'function_call', status: 'in_progress' },
    output_index: 2,
    sequence_number: 6,
    type: 'response.output_item.added',
  },
  { delta: '{"city"', item_id: 'c', output_index: 2, sequence_number: 7, type: 'response.function_call_arguments.delta' },
  { delta: ':"Paris"}', item_id: 'c', output_index: 2, sequence_number: 8, type: 'response.function_call_arguments.delta' },
  { response: RESPONSE, sequence_number: 9, type: 'response.completed' },
];

/** vLLM's Messages stream (api39-spec §2.5): thinking, text, then a tool_use block. */
const MESSAGES_EVENTS: Json[] = [
  {
    type: 'message_start',
    message: {
      id: 'chatcmpl-1',
      type: 'message',
      role: 'assistant',
      content: [],
      model: 'm',
      stop_reason: null,
      usage: { input_tokens: 12, output_tokens: 0 },
    },
  },
  { type: 'content_block_start', content_block: { type: 'thinking', thinking: '' }, index: 0 },
  { type: 'content_block_delta', delta: { type: 'thinking_delta', thinking: 'Hmm.' }, index: 0 },
  { type: 'content_block_delta', delta: { type: 'signature_delta', signature: 'abc' }, index: 0 },
  { type: 'content_block_stop', index: 0 },
  { type: 'content_block_start', content_block: { type: 'text', text: '' }, index: 1 },
  { type: 'content_block_delta', delta: { type: 'text_delta', text: 'Hel' }, index: 1 },
  { type: 'content_block_delta', delta: { type: 'text_delta', text: 'lo' }, index: 1 },
  { type: 'content_block_stop', index: 1 },
  { type: 'content_block_start', content_block: { type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: {} }, index: 2 },
  { type: 'content_block_delta', delta: { type: 'input_json_delta', partial_json: '{"city":' }, index: 2 },
  { type: 'content_block_delta', delta: { type: 'input_json_delta', partial_json: '"Paris"}' }, index: 2 },
  { type: 'content_block_stop', index: 2 },
  { type: 'message_delta', delta: { stop_reason: 'tool_use' }, usage: { input_tokens: 12, output_tokens: 7 } },
  { type: 'message_stop' },
];

/** An SSE stream as vLLM writes the agents' APIs: `event: <type>` then `data: <json>`, and where each event ends. */
function vllmStream(events: Json[]): { body: Buffer; ends: number[] } {
  let text = '';
  const ends: number[] = [];
  for (const e of events) {
    text += `event: ${String(e.type)}\ndata: ${JSON.stringify(e)}\n\n`;
    ends.push(Buffer.byteLength(text));
  }
  return { body: Buffer.from(text), ends };
}

describe("reading vLLM's agent API streams into chat-shaped fields", () => {
  it('Responses: reasoning, text and a function call with its arguments, model and usage (spec §1.3)', () => {
    const { body, ends } = vllmStream(RESPONSES_EVENTS);
    const parsed = parseAgentResponse('responses', true, body, ends);
    expect(parsed.error).toBeNull();
    expect(parsed.model).toBe('m');
    expect(parsed.usage).toEqual(RESPONSE.usage);
    expect(parsed.generation.text).toBe('Hello');
    expect(parsed.generation.finishReason).toBe('completed');
    const folded = foldChatDeltas(parsed.generation.chunkDeltas);
    expect(folded.reasoning).toBe('Thinking.');
    expect(folded.toolCalls).toEqual([{ id: 'call_9', type: 'function', name: 'get_weather', arguments: '{"city":"Paris"}' }]);
  });

  it('Messages: thinking, text and a tool_use block, usage from message_start and message_delta (spec §2.5)', () => {
    const { body, ends } = vllmStream(MESSAGES_EVENTS);
    const parsed = parseAgentResponse('messages', true, body, ends);
    expect(parsed.error).toBeNull();
    expect(parsed.model).toBe('m');
    expect(parsed.usage).toEqual({ input_tokens: 12, output_tokens: 7 });
    expect(parsed.generation.text).toBe('Hello');
    expect(parsed.generation.finishReason).toBe('tool_use');
    const folded = foldChatDeltas(parsed.generation.chunkDeltas);
    expect(folded.reasoning).toBe('Hmm.');
    expect(folded.toolCalls).toEqual([{ id: 'toolu_1', type: 'function', name: 'get_weather', arguments: '{"city":"Paris"}' }]);
  });

  it('non-streamed answers of both APIs give the same fields', () => {
    const responses = parseAgentResponse(
      'responses',
      false,
      Buffer.from(
        JSON.stringify({
          id: 'resp_1',
          model: 'm',
          status: 'completed',
          output: [
            { id: 'rs_1', type: 'reasoning', summary: [], content: [{ type: 'reasoning_text', text: 'Hmm.' }] },
            { id: 'msg_1', type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'Hello', annotations: [] }] },
            { id: 'fc_1', type: 'function_call', call_id: 'call_1', name: 'f', arguments: '{}' },
          ],
          usage: { input_tokens: 3, output_tokens: 4 },
        }),
      ),
      [],
    );
    const messages = parseAgentResponse(
      'messages',
      false,
      Buffer.from(
        JSON.stringify({
          id: 'chatcmpl-1',
          type: 'message',
          role: 'assistant',
          model: 'm',
          content: [
            { type: 'thinking', thinking: 'Hmm.', signature: 's' },
            { type: 'text', text: 'Hello' },
            { type: 'tool_use', id: 'call_1', name: 'f', input: {} },
          ],
          stop_reason: 'tool_use',
          usage: { input_tokens: 3, output_tokens: 4 },
        }),
      ),
      [],
    );
    for (const parsed of [responses, messages]) {
      expect(parsed.error).toBeNull();
      expect(parsed.generation.text).toBe('Hello');
      const folded = foldChatDeltas(parsed.generation.chunkDeltas);
      expect(folded.reasoning).toBe('Hmm.');
      expect(folded.toolCalls).toEqual([{ id: 'call_1', type: 'function', name: 'f', arguments: '{}' }]);
      expect(parsed.usage).toEqual({ input_tokens: 3, output_tokens: 4 });
    }
  });
});

describe("capture of vLLM's Responses and Messages streams (event: lines) through the proxy", () => {
  const vllmDb = join(dir, 'vllm-agents.db');
  let upstream: LoopbackServer;
  /** What each path streams, one event a write, 5 ms apart. */
  const STREAMS: Record<string, Json[]> = { '/v1/responses': RESPONSES_EVENTS, '/v1/messages': MESSAGES_EVENTS };

  beforeAll(async () => {
    upstream = await listenOnLoopback(
      http.createServer((req, res) => {
        req.resume();
        req.on('end', async () => {
          const events = STREAMS[(req.url ?? '').split('?')[0]];
          if (req.method !== 'POST' || !events) return void res.writeHead(404, { 'content-type': 'application/json' }).end('{"detail":"Not Found"}');
          res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8' });
          for (const e of events) {
            res.write(`event: ${String(e.type)}\ndata: ${JSON.stringify(e)}\n\n`);
            await new Promise((r) => setTimeout(r, 5));
          }
          res.end();
        });
      }),
    );
    const capture = await mockers.start(['capture', '--upstream', upstream.url, '--captures', vllmDb]);
    for (const path of Object.keys(STREAMS)) {
      const res = await fetch(`${capture.url}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: '{"model":"m","stream":true}',
      });
      expect(res.status).toBe(200);
      expect(await res.text()).toBe(vllmStream(STREAMS[path]).body.toString());
    }
    await capture.stop();
  }, 60_000);

  afterAll(() => upstream?.close());

  it('records each event (its event: and data: lines) with its arrival time, and the structured output', async () => {
    for (const [id, path, endpoint] of [
      [1, '/v1/responses', 'responses'],
      [2, '/v1/messages', 'messages'],
    ] as const) {
      const shown = JSON.parse((await runMockerToExit(['captures', 'show', vllmDb, String(id), '--json'])).stdout) as {
        endpoint: string;
        outcome: string;
        model: string;
        choices: { text: string; chunks: { delta: Json }[] }[];
      };
      expect(shown).toMatchObject({ endpoint, outcome: 'complete', model: 'm' });
      expect(shown.choices[0].text).toBe('Hello');
      const folded = foldChatDeltas(shown.choices[0].chunks.map((c) => c.delta));
      expect(folded.toolCalls.map((c) => [c.name, c.arguments])).toEqual([['get_weather', '{"city":"Paris"}']]);
      expect(folded.reasoning).toBe(endpoint === 'responses' ? 'Thinking.' : 'Hmm.');
      const { body, ends } = vllmStream(STREAMS[path]);
      const jsonl = join(dir, `${endpoint}.jsonl`);
      expect((await runMockerToExit(['captures', 'export', vllmDb, '-o', jsonl])).code).toBe(0);
      const line = readFileSync(jsonl, 'utf8')
        .split('\n')
        .filter((l) => l !== '')
        .map((l) => JSON.parse(l) as Json & { eventEnds: number[]; eventTimes: number[] })
        .filter((l) => l.type === 'exchange')[id - 1];
      expect(line.eventEnds).toEqual(ends);
      expect(Buffer.from(String(line.responseBody))).toEqual(body);
      // One arrival time per event, in order (events read together share one).
      expect(line.eventTimes).toHaveLength(ends.length);
      expect(line.eventTimes.every((t, k) => t > 0 && (k === 0 || t >= line.eventTimes[k - 1]))).toBe(true);
    }
  });
});
