/**
 * `serve --wire <shape>`: random answers in each engine release's response shape, read as raw bytes from the
 * spawned CLI and compared field by field (names, order, nulls) with the shapes the references record:
 * - vLLM 0.10.2–0.11: shared/spec/vllm-wire-reference.md §1.3 (the completion and chat bodies) and §1.4 (the
 *   chunks), §9 (`reasoning_content`);
 * - vLLM main (2026): the same, plus what §1.3/§1.4/§9 and Appendix A say main adds and drops, in the order of
 *   main's `completion/protocol.py` (`routed_experts` last in a choice; `kv_transfer_params`, `ec_transfer_params`,
 *   `metrics` last in a body; `usage`, `system_fingerprint`, `metrics` in a completion chunk);
 * - vLLM 0.12: §9 and Appendix A (PR #27752: `reasoning` beside `reasoning_content`);
 * - SGLang: test/fixtures/engines/sglang-shapes.md §2, §4 and §5.
 * A skeleton keeps each key in order with `null` for null, `[]` for an empty list and the type name otherwise.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mockerProcesses } from '../support/mockerProcess.js';
import { jsonEvents } from '../support/sseEvents.js';

type Json = Record<string, unknown>;

const mockers = mockerProcesses();
afterAll(mockers.stopAll);

const MODEL = 'Qwen/Qwen3-0.6B';
const MESSAGES = [{ role: 'user', content: 'Think, then answer.' }];

/** The value's structure: keys in order, nulls, empty lists, the type name of anything else (a list: its first item's). */
function skeleton(value: unknown): unknown {
  if (value === null) return null;
  if (Array.isArray(value)) return value.length === 0 ? [] : [skeleton(value[0])];
  if (typeof value === 'object') return Object.fromEntries(Object.entries(value as Json).map(([k, v]) => [k, skeleton(v)]));
  return typeof value;
}

/** Compared as text: key order counts. */
const same = (actual: unknown, expected: unknown) => expect(JSON.stringify(skeleton(actual))).toBe(JSON.stringify(expected));

const STAMP = { id: 'string', object: 'string', created: 'number', model: 'string' };
const COUNTS = { prompt_tokens: 'number', total_tokens: 'number', completion_tokens: 'number' };

interface Expected {
  completion: unknown;
  chat: unknown;
  completionChunk: unknown;
  completionUsageChunk: unknown;
  roleChunk: unknown;
  /** The key lists of a reasoning delta and of a content delta. */
  reasoningDelta: string[];
  contentDelta: string[];
  lastChatChunk: unknown;
  chatUsageChunk: unknown;
  /** Whether `stream_options: {}` asks for the usage chunk. */
  emptyOptionsUsage: boolean;
  id: { chat: RegExp; completion: RegExp };
}

const VLLM_011_COMPLETION_CHOICE = {
  index: 'number',
  text: 'string',
  logprobs: null,
  finish_reason: 'string',
  stop_reason: null,
  token_ids: null,
  prompt_logprobs: null,
  prompt_token_ids: null,
};
const VLLM_USAGE = { ...COUNTS, prompt_tokens_details: null };
const VLLM_MESSAGE_HEAD = { role: 'string', content: 'string', refusal: null, annotations: null, audio: null, function_call: null };
const VLLM_CHAT_CHOICE = (message: unknown) => ({ index: 'number', message, logprobs: null, finish_reason: 'string', stop_reason: null, token_ids: null });
const VLLM_COMPLETION_CHUNK_CHOICE = {
  index: 'number',
  text: 'string',
  logprobs: null,
  finish_reason: null,
  stop_reason: null,
  prompt_token_ids: null,
  token_ids: null,
};
const VLLM_STREAM = {
  completionUsageChunk: { ...STAMP, choices: [], usage: COUNTS },
  roleChunk: {
    ...STAMP,
    choices: [{ index: 'number', delta: { role: 'string', content: 'string' }, logprobs: null, finish_reason: null }],
    prompt_token_ids: null,
  },
  contentDelta: ['content'],
  lastChatChunk: {
    ...STAMP,
    choices: [{ index: 'number', delta: { content: 'string' }, logprobs: null, finish_reason: 'string', stop_reason: null, token_ids: null }],
  },
  chatUsageChunk: { ...STAMP, choices: [], usage: COUNTS },
  id: { chat: /^chatcmpl-[0-9a-f]{32}$/, completion: /^cmpl-[0-9a-f]{32}$/ },
};

const VLLM_011_CHAT = {
  ...STAMP,
  choices: [VLLM_CHAT_CHOICE({ ...VLLM_MESSAGE_HEAD, tool_calls: [], reasoning_content: 'string' })],
  service_tier: null,
  system_fingerprint: null,
  usage: VLLM_USAGE,
  prompt_logprobs: null,
  prompt_token_ids: null,
  kv_transfer_params: null,
};

const VLLM_011: Expected = {
  completion: { ...STAMP, choices: [VLLM_011_COMPLETION_CHOICE], service_tier: null, system_fingerprint: null, usage: VLLM_USAGE, kv_transfer_params: null },
  chat: VLLM_011_CHAT,
  completionChunk: { ...STAMP, choices: [VLLM_COMPLETION_CHUNK_CHOICE], usage: null },
  reasoningDelta: ['reasoning_content'],
  emptyOptionsUsage: true,
  ...VLLM_STREAM,
};

const VLLM_012: Expected = {
  ...VLLM_011,
  // The same fields in the same order, the message with both reasoning names.
  chat: { ...VLLM_011_CHAT, choices: [VLLM_CHAT_CHOICE({ ...VLLM_MESSAGE_HEAD, tool_calls: [], reasoning: 'string', reasoning_content: 'string' })] },
  reasoningDelta: ['reasoning', 'reasoning_content'],
};

const VLLM_MAIN: Expected = {
  completion: {
    ...STAMP,
    choices: [{ ...VLLM_011_COMPLETION_CHOICE, routed_experts: null }],
    service_tier: null,
    system_fingerprint: null,
    usage: VLLM_USAGE,
    kv_transfer_params: null,
    ec_transfer_params: null,
    metrics: null,
  },
  chat: {
    ...STAMP,
    // No tool call: main's serializer drops the empty list.
    choices: [{ ...VLLM_CHAT_CHOICE({ ...VLLM_MESSAGE_HEAD, reasoning: 'string' }), routed_experts: null }],
    service_tier: null,
    system_fingerprint: null,
    usage: VLLM_USAGE,
    prompt_logprobs: null,
    prompt_token_ids: null,
    prompt_text: null,
    kv_transfer_params: null,
    ec_transfer_params: null,
    metrics: null,
  },
  completionChunk: { ...STAMP, choices: [VLLM_COMPLETION_CHUNK_CHOICE], usage: null, system_fingerprint: null, metrics: null },
  reasoningDelta: ['reasoning'],
  emptyOptionsUsage: false,
  ...VLLM_STREAM,
};

const SGLANG_USAGE = { ...COUNTS, prompt_tokens_details: null, reasoning_tokens: 'number' };
const SGLANG: Expected = {
  completion: {
    ...STAMP,
    choices: [{ index: 'number', text: 'string', logprobs: null, finish_reason: 'string', matched_stop: null }],
    usage: SGLANG_USAGE,
    metadata: { weight_version: 'string' },
  },
  chat: {
    ...STAMP,
    choices: [
      {
        index: 'number',
        message: { role: 'string', content: 'string', reasoning_content: 'string', tool_calls: null },
        logprobs: null,
        finish_reason: 'string',
        matched_stop: null,
      },
    ],
    usage: SGLANG_USAGE,
    metadata: { weight_version: 'string' },
  },
  completionChunk: { ...STAMP, choices: [{ index: 'number', text: 'string', logprobs: null, finish_reason: null, matched_stop: null }], usage: null },
  // Dumped without its nulls.
  completionUsageChunk: { ...STAMP, choices: [], usage: { ...COUNTS, reasoning_tokens: 'number' } },
  roleChunk: {
    ...STAMP,
    choices: [
      { index: 'number', delta: { reasoning_content: null, role: 'string', content: 'string' }, logprobs: null, finish_reason: null, matched_stop: null },
    ],
  },
  reasoningDelta: ['reasoning_content'],
  contentDelta: ['reasoning_content', 'content'],
  // The finish in a chunk of its own.
  lastChatChunk: { ...STAMP, choices: [{ index: 'number', delta: { reasoning_content: null }, logprobs: null, finish_reason: 'string', matched_stop: null }] },
  chatUsageChunk: { ...STAMP, choices: [], usage: SGLANG_USAGE },
  emptyOptionsUsage: false,
  id: { chat: /^[0-9a-f]{32}$/, completion: /^[0-9a-f]{32}$/ },
};

const SHAPES: [string, Expected][] = [
  ['vllm-0.11', VLLM_011],
  ['vllm-0.12', VLLM_012],
  ['vllm-main', VLLM_MAIN],
  ['sglang', SGLANG],
];

async function post(url: string, path: string, body: Json): Promise<string> {
  const res = await fetch(`${url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, ...body }),
  });
  const text = await res.text();
  expect(res.status, text).toBe(200);
  return text;
}

const events = jsonEvents;

const choiceOf = (event: Json) => (event.choices as Json[])[0];

describe.each(SHAPES)('serve --wire %s', (wire, expected) => {
  let url = '';
  beforeAll(async () => {
    // Half of each chat answer a thinking span (its reasoning), no tool offered.
    url = (await mockers.start(['serve', '--mode', 'random', '--timing', 'none', '--wire', wire, '--reasoning', '{"thinking_ratio":0.5}'])).url;
  });

  it('a completion has the fields of its body, in order', async () => {
    const body = JSON.parse(await post(url, '/v1/completions', { prompt: 'Hello', max_tokens: 6 })) as Json;
    same(body, expected.completion);
    expect(body.id).toMatch(expected.id.completion);
  });

  it('a chat has the fields of its body and message, the reasoning under its names', async () => {
    const body = JSON.parse(await post(url, '/v1/chat/completions', { messages: MESSAGES, max_tokens: 8 })) as Json;
    same(body, expected.chat);
    expect(body.id).toMatch(expected.id.chat);
  });

  it('completion chunks, then the usage chunk', async () => {
    const chunks = events(await post(url, '/v1/completions', { prompt: 'Hello', max_tokens: 6, stream: true, stream_options: { include_usage: true } }));
    same(chunks[0], expected.completionChunk);
    same(chunks.at(-1), expected.completionUsageChunk);
    expect(chunks.slice(0, -1).every((c) => c.usage === null)).toBe(true);
  });

  it('chat chunks: the role chunk, reasoning deltas then content deltas, the finish, the usage chunk', async () => {
    const chunks = events(
      await post(url, '/v1/chat/completions', { messages: MESSAGES, max_tokens: 8, stream: true, stream_options: { include_usage: true } }),
    );
    same(chunks[0], expected.roleChunk);
    same(chunks.at(-2), expected.lastChatChunk);
    same(chunks.at(-1), expected.chatUsageChunk);
    const deltas = chunks.slice(1, -2).map((c) => Object.keys(choiceOf(c).delta as Json));
    expect(deltas[0]).toEqual(expected.reasoningDelta);
    expect(deltas).toContainEqual(expected.contentDelta);
  });

  it(`\`stream_options: {}\` ${expected.emptyOptionsUsage ? 'asks for' : 'does not ask for'} the usage chunk`, async () => {
    const chunks = events(await post(url, '/v1/completions', { prompt: 'Hello', max_tokens: 3, stream: true, stream_options: {} }));
    expect(chunks.at(-1)!.choices).toEqual(expected.emptyOptionsUsage ? [] : [expect.anything()]);
  });
});
