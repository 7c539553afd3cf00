/**
 * Issue #35 item 1: chat messages as vLLM's chat preprocessing (`chat_utils.py` `parse_chat_messages`) hands them
 * to the template — content null, a string or a list of parts; an assistant's tool calls with null content; `tool`
 * messages; the `developer` role; `name` fields — through the built CLI, read by the official `openai` client. The
 * prompt ids are checked against the Python tokenizer's renderings (test/fixtures/tokenizer/qwen3.jsonl).
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import type { ChatCompletionMessageParam, ChatCompletionTool } from 'openai/resources/chat/completions';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mockerProcesses } from '../support/mockerProcess.js';
import { oracleChat } from '../support/qwen3Oracle.js';
import { testTmpdir } from '../support/tempRoot.js';

type Json = Record<string, unknown>;
const MODEL = 'Qwen/Qwen3-0.6B';

interface ChatRow {
  kind: string;
  request?: { messages: Json[]; tools?: Json[] };
  ids?: number[];
}
const CHAT_ROWS = readFileSync(join(import.meta.dirname, '..', 'fixtures', 'tokenizer', 'qwen3.jsonl'), 'utf8')
  .split('\n')
  .filter((l) => l.trim() !== '')
  .map((l) => JSON.parse(l) as ChatRow)
  .filter((r) => r.kind === 'chat');
/** The fixture's tool loop: user, assistant with a call (content "", arguments an object), tool result. */
const TOOL_LOOP = CHAT_ROWS.find((r) => r.request!.messages.some((m) => m.role === 'tool'))!;

const WEATHER: ChatCompletionTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Get the weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
};

const mockers = mockerProcesses();
let started = 0;
let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(testTmpdir(), 'chat-messages-'));
});
afterAll(async () => {
  await mockers.stopAll();
  rmSync(dir, { recursive: true, force: true });
});

/** `serve --mode <mode>` with a capture file of its own: its URL and an openai client of it. */
async function serve(mode: 'simulate' | 'random', extra: string[] = []): Promise<{ client: OpenAI; url: string }> {
  const { url } = await mockers.start(['serve', '--mode', mode, '--timing', 'none', '--captures', join(dir, `${mode}-${started++}.db`), ...extra]);
  return { client: new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0 }), url };
}

async function post(url: string, path: string, body: unknown): Promise<{ status: number; json: Json }> {
  const res = await fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: res.status, json: (await res.json()) as Json };
}

describe.each(['simulate', 'random'] as const)('a two-step tool loop in %s mode', (mode) => {
  it('answers the second step: the assistant tool call with content null, then the tool result', async () => {
    const { client } = await serve(mode, ['--tool-call-rate', '1']);
    const question: ChatCompletionMessageParam = { role: 'user', content: 'Weather in Paris?' };
    const first = await client.chat.completions.create({ model: MODEL, messages: [question], tools: [WEATHER], max_tokens: 200 });
    const call = first.choices[0].message;
    // What the OpenAI SDKs and agent frameworks send back: the message as it came, content null.
    expect(call.content).toBeNull();
    expect(call.tool_calls).toHaveLength(1);
    const toolCall = call.tool_calls![0];
    const second = await client.chat.completions.create({
      model: MODEL,
      messages: [question, call, { role: 'tool', tool_call_id: toolCall.id, content: '{"temp": 21}' }],
      tools: [WEATHER],
      tool_choice: 'none',
      max_tokens: 8,
    });
    expect(second.choices).toHaveLength(1);
    expect(second.choices[0].message.role).toBe('assistant');
    expect(second.usage!.prompt_tokens).toBeGreaterThan(first.usage!.prompt_tokens);
  });
});

describe('messages rendered as vLLM renders them (/tokenize with messages)', () => {
  let url: string;
  let client: OpenAI;
  beforeAll(async () => {
    ({ url, client } = await serve('random'));
  });

  it('the tool loop with content null and arguments as a JSON string gives the prompt of content "" and arguments as an object', async () => {
    const [question, assistant, tool] = TOOL_LOOP.request!.messages;
    const call = (assistant.tool_calls as Json[])[0];
    const fn = call.function as Json;
    const asClientsSendIt = [
      question,
      {
        role: 'assistant',
        content: null,
        tool_calls: [{ id: 'chatcmpl-tool-1', type: 'function', function: { name: fn.name, arguments: JSON.stringify(fn.arguments) } }],
      },
      { ...tool, tool_call_id: 'chatcmpl-tool-1' },
    ];
    const res = await post(url, '/tokenize', { messages: asClientsSendIt, tools: TOOL_LOOP.request!.tools });
    expect(res.status, JSON.stringify(res.json)).toBe(200);
    expect(res.json.tokens).toEqual(TOOL_LOOP.ids);
  });

  it('content as a list of text parts (objects and plain strings) gives the prompt of the newline-joined string', async () => {
    // The fixture: user "  spaces around  ", assistant "\n\nnewlines\n", user "ok".
    const { messages, ids } = oracleChat('  spaces around  ');
    expect(messages[1].content).toBe('\n\nnewlines\n');
    const asParts = [
      { role: 'user', content: [{ type: 'text', text: '  spaces around  ' }] },
      // Joined by "\n": "" + "\n" + "" + "\n" + "newlines" + "\n" + "" (a Responses-style part and a bare string among them).
      { role: 'assistant', content: [{ type: 'text', text: '' }, '', { type: 'output_text', text: 'newlines' }, { type: 'text', text: '' }] },
      { role: 'user', content: [{ type: 'input_text', text: 'ok' }] },
    ];
    const res = await post(url, '/tokenize', { messages: asParts });
    expect(res.status, JSON.stringify(res.json)).toBe(200);
    expect(res.json.tokens).toEqual(ids);
  });

  it('accepts the developer role and name fields (the Qwen3 template renders no developer turn)', async () => {
    const { messages, ids } = oracleChat('Hi there');
    const res = await post(url, '/tokenize', {
      messages: [
        { role: 'developer', content: ['Answer briefly.'] },
        { ...messages[0], name: 'alice' },
      ],
    });
    expect(res.status, JSON.stringify(res.json)).toBe(200);
    expect(res.json.tokens).toEqual(ids);
    const answer = await client.chat.completions.create({
      model: MODEL,
      messages: [
        { role: 'developer', content: 'Answer briefly.', name: 'policy' },
        { role: 'user', content: 'Hi there', name: 'alice' },
      ],
      max_tokens: 4,
    });
    expect(answer.usage!.prompt_tokens).toBe(ids.length);
  });

  it("refuses an image part with a 400 in vLLM's error format naming the part type", async () => {
    const messages: ChatCompletionMessageParam[] = [
      {
        role: 'user',
        content: [
          { type: 'text', text: 'What is in this picture?' },
          { type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgo=' } },
        ],
      },
    ];
    const refused = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 4 }).then(
      () => null,
      (err: unknown) => err,
    );
    expect(refused).toBeInstanceOf(OpenAI.BadRequestError);
    const error = (refused as InstanceType<typeof OpenAI.BadRequestError>).error as Json;
    expect(error).toMatchObject({ type: 'BadRequestError', code: 400 });
    // vLLM's "<model> is not a multimodal model", with the part type named.
    expect(error.message).toContain(`${MODEL} is not a multimodal model`);
    expect(error.message).toContain("'image_url'");
    const tokenized = await post(url, '/tokenize', { messages });
    expect(tokenized.status).toBe(400);
    expect((tokenized.json.error as Json).message).toContain("'image_url'");
  });
});

describe('a chat template of the request (rendered in a renderer process) sees the same messages', () => {
  it('content null as "", tool-call arguments as an object, tool_call_id and name passed on', async () => {
    const { url } = await serve('random', ['--trust-request-chat-template']);
    const template =
      // A template that tells null from "" (vLLM hands it "" for null content).
      '{% for m in messages %}[{{ m.role }}|{{ m.name }}|{% if m.content is none %}NONE{% endif %}{{ m.content }}|{{ m.tool_call_id }}' +
      '{% for c in m.tool_calls or [] %}|{{ c.function.arguments.city }}{% endfor %}]{% endfor %}';
    const res = await post(url, '/tokenize', {
      chat_template: template,
      add_generation_prompt: false,
      messages: [
        { role: 'user', content: [{ type: 'text', text: 'Weather?' }], name: 'alice' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
        { role: 'tool', tool_call_id: 'c1', content: 'sunny' },
      ],
    });
    expect(res.status, JSON.stringify(res.json)).toBe(200);
    // Rendered by hand from vLLM's rules: a missing field prints as "" (jinja's undefined).
    const expected = await post(url, '/tokenize', { prompt: '[user|alice|Weather?|][assistant||||Paris][tool||sunny|c1]', add_special_tokens: false });
    expect(res.json.tokens).toEqual(expected.json.tokens);
  });

  it('a template that loops over content gets parts (vLLM\'s "openai" content format): strings and null become lists', async () => {
    const { url } = await serve('random', ['--trust-request-chat-template']);
    const template = "{% for m in messages %}{{ m.role }}:{% for p in m['content'] %}<{{ p.type }}={{ p.text }}>{% endfor %}|{% endfor %}";
    const res = await post(url, '/tokenize', {
      chat_template: template,
      add_generation_prompt: false,
      messages: [
        { role: 'system', content: 'Be brief.' },
        { role: 'user', content: [{ type: 'text', text: 'a' }, 'b', { type: 'input_text', text: 'c' }] },
        { role: 'assistant', content: null },
      ],
    });
    expect(res.status, JSON.stringify(res.json)).toBe(200);
    const expected = await post(url, '/tokenize', { prompt: 'system:<text=Be brief.>|user:<text=a><text=b><text=c>|assistant:|', add_special_tokens: false });
    expect(res.json.tokens).toEqual(expected.json.tokens);
  });
});
