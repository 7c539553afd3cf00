/**
 * Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) on the built CLI, as an agent speaks it:
 * the official `@anthropic-ai/sdk` client reads the answers (it throws on a shape it cannot parse), raw fetch reads
 * the exact bytes and the error shapes. Oracles: vLLM's converter as its source reads (api39-spec.md §2), the test
 * double's own chat template and tokenizer for prompt lengths, the openai-shaped `/tokenize`, and a chat capture
 * recorded through `mocker capture` for replay.
 */
import { mkdtempSync } from 'node:fs';
import { join } from 'node:path';
import Anthropic from '@anthropic-ai/sdk';
import { afterAll, describe, expect, it } from 'vitest';
import { mockerProcesses, startMockerProcess } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';
import { MODEL, promptIds, startUpstream } from '../support/vllmUpstream.js';

type Json = Record<string, unknown>;

const mockers = mockerProcesses();
afterAll(mockers.stopAll);

const RANDOM = ['serve', '--mode', 'random', '--timing', 'none'];
const client = (url: string) => new Anthropic({ baseURL: url, apiKey: 'unused', maxRetries: 0 });

const SYSTEM = 'You answer briefly.';
const QUESTION = 'What is the capital of France?';
/** The chat messages vLLM makes of SYSTEM and QUESTION (the system prompt first, the user's text as a string). */
const CHAT_MESSAGES = [
  { role: 'system', content: SYSTEM },
  { role: 'user', content: QUESTION },
];

async function post(url: string, path: string, body: Json): Promise<{ status: number; headers: Headers; text: string }> {
  const res = await fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: res.status, headers: res.headers, text: await res.text() };
}

/** A stream's events as (name, data) pairs, checking each is an `event:` line then a `data:` line. */
function sseEvents(text: string): { name: string; data: Json }[] {
  return text
    .split('\n\n')
    .filter((e) => e.length > 0)
    .map((e) => {
      const lines = e.split('\n');
      expect(lines).toHaveLength(2);
      expect(lines[0]).toMatch(/^event: /);
      expect(lines[1]).toMatch(/^data: /);
      return { name: lines[0].slice('event: '.length), data: JSON.parse(lines[1].slice('data: '.length)) as Json };
    });
}

describe('a text answer, read by the Anthropic SDK', () => {
  for (const [mode, args] of [
    ['random', RANDOM],
    ['simulate', ['serve', '--mode', 'simulate', '--timing', 'none']],
  ] as const) {
    it(`${mode} mode: messages.create and messages.stream agree; usage is the prompt's tokens (count_tokens, /tokenize, the template) and the output's`, async () => {
      const cwd = mkdtempSync(join(testTmpdir(), 'mocker-anthropic-'));
      const { url } = await mockers.start([...args], { cwd });
      const anthropic = client(url);
      const request = { model: MODEL, max_tokens: 12, system: SYSTEM, messages: [{ role: 'user' as const, content: QUESTION }] };
      const message = await anthropic.messages.create(request);
      expect(message.id).toMatch(/^chatcmpl-[0-9a-f]{32}$/);
      expect(message.type).toBe('message');
      expect(message.role).toBe('assistant');
      expect(message.model).toBe(MODEL);
      expect(message.content).toHaveLength(1);
      expect(message.content[0].type).toBe('text');
      expect(message.stop_reason).toBe('max_tokens');
      expect(message.usage.output_tokens).toBe(12);
      const expectedPrompt = (await promptIds({ messages: CHAT_MESSAGES }, true)).length;
      expect(message.usage.input_tokens).toBe(expectedPrompt);
      const counted = await anthropic.messages.countTokens({ model: MODEL, system: SYSTEM, messages: request.messages });
      expect(counted.input_tokens).toBe(expectedPrompt);
      const tokenized = JSON.parse((await post(url, '/tokenize', { model: MODEL, messages: CHAT_MESSAGES })).text) as { count: number };
      expect(tokenized.count).toBe(expectedPrompt);

      const streamed = await anthropic.messages.stream(request).finalMessage();
      expect(streamed.content).toEqual(message.content);
      expect(streamed.stop_reason).toBe('max_tokens');
      expect(streamed.usage).toMatchObject({ input_tokens: expectedPrompt, output_tokens: 12 });
    });
  }

  it('stop_sequences end the text before the sequence: stop_reason stop_sequence and the sequence named, streamed or not', async () => {
    const { url } = await mockers.start(RANDOM);
    const anthropic = client(url);
    const request = { model: MODEL, max_tokens: 30, messages: [{ role: 'user' as const, content: QUESTION }] };
    const whole = await anthropic.messages.create(request);
    const text = (whole.content[0] as Anthropic.TextBlock).text;
    // A whole text_delta from the middle of the answer this prompt gets (random mode answers a prompt the same way each time).
    const pieces = sseEvents((await post(url, '/v1/messages', { ...request, stream: true })).text)
      .map((e) => e.data.delta as { type?: string; text?: string } | undefined)
      .filter((d) => d?.type === 'text_delta')
      .map((d) => d!.text!);
    expect(pieces.join('')).toBe(text);
    const at = (k: number) => pieces.slice(0, k).join('').length;
    const k = pieces.findIndex((piece, i) => i >= pieces.length / 2 && piece.trim().length > 0 && text.indexOf(piece) === at(i));
    expect(k).toBeGreaterThan(0);
    const stop = pieces[k];
    const cut = await anthropic.messages.create({ ...request, stop_sequences: [stop] });
    expect(cut.stop_reason).toBe('stop_sequence');
    expect(cut.stop_sequence).toBe(stop);
    expect(cut.content).toEqual([{ type: 'text', text: text.slice(0, at(k)) }]);
    const streamed = await anthropic.messages.stream({ ...request, stop_sequences: [stop] }).finalMessage();
    expect(streamed.stop_reason).toBe('stop_sequence');
    expect(streamed.stop_sequence).toBe(stop);
    expect(streamed.content).toEqual(cut.content);
  });
});

const WEATHER: Anthropic.Tool = {
  name: 'get_weather',
  description: 'The weather in a city.',
  input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
};

describe('tools and thinking', () => {
  it('a tool_use answer (stop_reason tool_use), then the tool_result sent back gets text; the second prompt is the chat vLLM makes', async () => {
    const { url } = await mockers.start([...RANDOM, '--tool-call-rate', '1']);
    const anthropic = client(url);
    const first = await anthropic.messages.create({
      model: MODEL,
      max_tokens: 100,
      tools: [WEATHER],
      messages: [{ role: 'user', content: 'Weather in Paris?' }],
    });
    expect(first.stop_reason).toBe('tool_use');
    const call = first.content.find((b): b is Anthropic.ToolUseBlock => b.type === 'tool_use')!;
    expect(call.name).toBe('get_weather');
    expect(typeof (call.input as { city: unknown }).city).toBe('string');
    const streamedCall = (
      await anthropic.messages
        .stream({ model: MODEL, max_tokens: 100, tools: [WEATHER], messages: [{ role: 'user', content: 'Weather in Paris?' }] })
        .finalMessage()
    ).content.find((b) => b.type === 'tool_use');
    expect(streamedCall).toEqual(call);

    const followUp: Anthropic.MessageCreateParamsNonStreaming = {
      model: MODEL,
      max_tokens: 20,
      // tool_choice none: the answer is text (random mode would call a tool again at rate 1).
      tool_choice: { type: 'none' },
      tools: [WEATHER],
      messages: [
        { role: 'user', content: 'Weather in Paris?' },
        { role: 'assistant', content: [{ type: 'tool_use', id: call.id, name: call.name, input: { city: 'Paris' } }] },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: call.id, content: 'Sunny, 21 °C' }] },
      ],
    };
    const second = await anthropic.messages.create(followUp);
    expect(second.stop_reason).toBe('max_tokens');
    expect(second.content.map((b) => b.type)).toEqual(['text']);
    // The prompt is vLLM's chat: the call's arguments as Python's json.dumps writes them, the result as a tool message.
    const chat = {
      messages: [
        { role: 'user', content: 'Weather in Paris?' },
        // vLLM's chat parser gives a message without content the empty string.
        { role: 'assistant', content: '', tool_calls: [{ id: call.id, type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
        { role: 'tool', tool_call_id: call.id, content: 'Sunny, 21 °C' },
      ],
      tools: [{ type: 'function', function: { name: WEATHER.name, description: WEATHER.description, parameters: WEATHER.input_schema } }],
    };
    expect(second.usage.input_tokens).toBe((await promptIds(chat, true)).length);
  });

  it('reasoning comes as a thinking block with a signature before the text; streamed: thinking_delta, signature_delta, then the text block', async () => {
    const { url } = await mockers.start([...RANDOM, '--reasoning', '{"thinking_ratio":0.5}']);
    const anthropic = client(url);
    const request = { model: MODEL, max_tokens: 20, messages: [{ role: 'user' as const, content: 'Think first.' }] };
    const message = await anthropic.messages.create(request);
    expect(message.content.map((b) => b.type)).toEqual(['thinking', 'text']);
    const thinking = message.content[0] as Anthropic.ThinkingBlock;
    expect(thinking.thinking.length).toBeGreaterThan(0);
    expect(thinking.thinking).not.toContain('<think>');
    expect(thinking.signature).toMatch(/^[0-9a-f]{32}$/);

    const raw = await post(url, '/v1/messages', { ...request, stream: true });
    const events = sseEvents(raw.text);
    const blockEvents = events
      .filter((e) => e.name.startsWith('content_block'))
      .map((e) => [e.name, (e.data.delta as Json | undefined)?.type ?? (e.data.content_block as Json | undefined)?.type, e.data.index]);
    const firstText = blockEvents.findIndex(([, type]) => type === 'text');
    // The thinking block: start, its deltas, its signature, stop; then the text block.
    expect(blockEvents[0]).toEqual(['content_block_start', 'thinking', 0]);
    expect(blockEvents.slice(firstText - 2, firstText + 1)).toEqual([
      ['content_block_delta', 'signature_delta', 0],
      ['content_block_stop', undefined, 0],
      ['content_block_start', 'text', 1],
    ]);
    const thought = events
      .filter((e) => (e.data.delta as Json | undefined)?.type === 'thinking_delta')
      .map((e) => (e.data.delta as { thinking: string }).thinking)
      .join('');
    expect(thought).toBe(thinking.thinking);
  });
});

const SEARCH: Anthropic.Tool = {
  name: 'search',
  input_schema: { type: 'object', properties: { query: { type: 'string' } }, required: ['query'] },
};

describe('the chat vLLM makes of a conversation', () => {
  it('count_tokens and usage count it: system blocks joined (billing header dropped), thinking, tool_use as json.dumps arguments, tool_result texts before the user text', async () => {
    const { url } = await mockers.start(RANDOM);
    const anthropic = client(url);
    const conversation = {
      model: MODEL,
      system: [
        { type: 'text' as const, text: 'x-anthropic-billing-header: cc_version=1.0; cch=abc;' },
        { type: 'text' as const, text: 'You answer ' },
        { type: 'text' as const, text: 'briefly.' },
      ],
      tools: [WEATHER, SEARCH],
      tool_choice: { type: 'any' as const },
      messages: [
        { role: 'user' as const, content: [{ type: 'text' as const, text: 'Weather in Zürich?' }] },
        {
          role: 'assistant' as const,
          content: [
            { type: 'thinking' as const, thinking: 'The tool knows.', signature: 'c2ln' },
            { type: 'text' as const, text: 'Let me check.' },
            { type: 'tool_use' as const, id: 'toolu_01', name: 'get_weather', input: { city: 'Zürich' } },
          ],
        },
        {
          role: 'user' as const,
          content: [
            {
              type: 'tool_result' as const,
              tool_use_id: 'toolu_01',
              content: [
                { type: 'text' as const, text: 'Sunny' },
                { type: 'text' as const, text: '21 °C' },
              ],
            },
            { type: 'text' as const, text: 'And tomorrow?' },
          ],
        },
      ],
    };
    // vLLM's conversion, written out from its source.
    const chat = {
      messages: [
        { role: 'system', content: 'You answer briefly.' },
        { role: 'user', content: 'Weather in Zürich?' },
        {
          role: 'assistant',
          reasoning: 'The tool knows.',
          // json.dumps' '{"city": "Z\\u00fcrich"}', which vLLM's chat parser json.loads back for the template.
          tool_calls: [{ id: 'toolu_01', type: 'function', function: { name: 'get_weather', arguments: { city: 'Zürich' } } }],
          content: 'Let me check.',
        },
        { role: 'tool', tool_call_id: 'toolu_01', content: 'Sunny\n21 °C' },
        { role: 'user', content: 'And tomorrow?' },
      ],
      tools: [WEATHER, SEARCH].map((t) => ({
        type: 'function',
        function: { name: t.name, ...(t.description ? { description: t.description } : {}), parameters: t.input_schema },
      })),
    };
    const expected = (await promptIds(chat, true)).length;
    expect((await anthropic.messages.countTokens(conversation)).input_tokens).toBe(expected);
    const message = await anthropic.messages.create({ ...conversation, max_tokens: 40 });
    expect(message.usage.input_tokens).toBe(expected);
    // tool_choice any is chat's "required": a call, whatever the tool-call rate.
    expect(message.content.some((b) => b.type === 'tool_use')).toBe(true);
  });

  it('tool_choice: tool calls the named tool, none calls none; a tool choice without a name is refused', async () => {
    const { url } = await mockers.start([...RANDOM, '--tool-call-rate', '0']);
    const anthropic = client(url);
    const request = { model: MODEL, max_tokens: 60, tools: [WEATHER, SEARCH], messages: [{ role: 'user' as const, content: 'Find it.' }] };
    const named = await anthropic.messages.create({ ...request, tool_choice: { type: 'tool', name: 'search' } });
    const calls = named.content.filter((b): b is Anthropic.ToolUseBlock => b.type === 'tool_use');
    expect(calls.map((c) => c.name)).toEqual(['search']);
    expect(typeof (calls[0].input as { query: unknown }).query).toBe('string');
    const none = await anthropic.messages.create({ ...request, tool_choice: { type: 'none' } });
    expect(none.content.map((b) => b.type)).toEqual(['text']);
    const raw = await post(url, '/v1/messages', { ...request, tool_choice: { type: 'tool' } });
    expect(raw.status).toBe(400);
    expect(raw.text).toContain("tool_choice.name is required when type is 'tool'");
  });
});

describe('the bytes', () => {
  it('a stream is event/data pairs: message_start, block start/deltas/stop, message_delta, message_stop; no ping, no [DONE]', async () => {
    const { url } = await mockers.start(RANDOM);
    const raw = await post(url, '/v1/messages', { model: MODEL, max_tokens: 5, stream: true, messages: [{ role: 'user', content: QUESTION }] });
    expect(raw.status).toBe(200);
    expect(raw.headers.get('content-type')).toBe('text/event-stream; charset=utf-8');
    expect(raw.text).not.toContain('[DONE]');
    expect(raw.text).not.toContain('ping');
    const events = sseEvents(raw.text);
    const names = events.map((e) => e.name);
    expect(names[0]).toBe('message_start');
    expect(names[1]).toBe('content_block_start');
    expect(names.slice(-3)).toEqual(['content_block_stop', 'message_delta', 'message_stop']);
    expect(new Set(names.slice(2, -3))).toEqual(new Set(['content_block_delta']));
    // Each event's type is its name; keys in vLLM's declaration order.
    for (const e of events) expect(e.data.type).toBe(e.name);
    const prompt = (await promptIds({ messages: [{ role: 'user', content: QUESTION }] }, true)).length;
    const start = raw.text.split('\n')[1];
    expect(start).toMatch(
      new RegExp(
        `^data: \\{"type":"message_start","message":\\{"id":"chatcmpl-[0-9a-f]{32}","type":"message","role":"assistant","content":\\[\\],"model":"${MODEL.replace('/', '\\/')}","stop_reason":null,"stop_sequence":null,"usage":\\{"input_tokens":${prompt},"output_tokens":0\\}\\}\\}$`,
      ),
    );
    expect(raw.text).toContain('event: content_block_start\ndata: {"type":"content_block_start","content_block":{"type":"text","text":""},"index":0}\n\n');
    expect(
      raw.text.endsWith(
        `event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"input_tokens":${prompt},"output_tokens":5}}\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n`,
      ),
    ).toBe(true);
  });

  it('a non-streamed answer drops nulls: no stop_sequence unless a stop string ended it', async () => {
    const { url } = await mockers.start(RANDOM);
    const raw = await post(url, '/v1/messages', { model: MODEL, max_tokens: 3, messages: [{ role: 'user', content: QUESTION }] });
    expect(raw.headers.get('content-type')).toBe('application/json');
    const body = JSON.parse(raw.text) as Json;
    expect(Object.keys(body)).toEqual(['id', 'type', 'role', 'content', 'model', 'stop_reason', 'usage']);
  });
});

describe('ids and cache usage', () => {
  it("the id is the chat completion's: chatcmpl- and the request's X-Request-Id", async () => {
    const { url } = await mockers.start(RANDOM);
    const res = await fetch(`${url}/v1/messages`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-request-id': 'agent-turn-7' },
      body: JSON.stringify({ model: MODEL, max_tokens: 2, messages: [{ role: 'user', content: QUESTION }] }),
    });
    expect(((await res.json()) as { id: string }).id).toBe('chatcmpl-agent-turn-7');
  });

  it('--enable-prompt-tokens-details: a repeated prompt reads the prefix cache: cache_read_input_tokens, input_tokens the rest', async () => {
    const { url } = await mockers.start([...RANDOM, '--enable-prompt-tokens-details']);
    const anthropic = client(url);
    // Long enough to fill whole KV blocks, which the prefix cache holds.
    const request = { model: MODEL, max_tokens: 4, messages: [{ role: 'user' as const, content: QUESTION.repeat(40) }] };
    const prompt = (await anthropic.messages.countTokens(request)).input_tokens;
    const first = await anthropic.messages.create(request);
    expect(first.usage).toMatchObject({ input_tokens: prompt, cache_read_input_tokens: 0 });
    const again = await anthropic.messages.stream(request).finalMessage();
    const cached = again.usage.cache_read_input_tokens!;
    expect(cached).toBeGreaterThan(0);
    expect(again.usage.input_tokens).toBe(prompt - cached);
  });
});

describe('errors', () => {
  it("a body vLLM's pydantic refuses (no max_tokens, max_tokens 0, an unknown block type) is its OpenAI-shaped 400", async () => {
    const { url } = await mockers.start(RANDOM);
    const messages = [{ role: 'user', content: QUESTION }];
    for (const body of [
      { model: MODEL, messages },
      { model: MODEL, max_tokens: 0, messages },
      { model: MODEL, max_tokens: 5, messages: [{ role: 'user', content: [{ type: 'document', text: 'x' }] }] },
    ]) {
      const raw = await post(url, '/v1/messages', body);
      expect(raw.status).toBe(400);
      const error = (JSON.parse(raw.text) as { error: { message: string; code: number } }).error;
      expect(error.code).toBe(400);
      expect(error.message).toMatch(/validation error/);
    }
    // The SDK reports it as a 400 too.
    await expect(client(url).messages.create({ model: MODEL, max_tokens: 0, messages: [{ role: 'user', content: QUESTION }] })).rejects.toMatchObject({
      status: 400,
    });
  });

  it('an unknown model is a 404 in the Anthropic error shape, for messages and count_tokens', async () => {
    const { url } = await mockers.start(RANDOM);
    for (const [path, extra] of [
      ['/v1/messages', { max_tokens: 5 }],
      ['/v1/messages/count_tokens', {}],
    ] as const) {
      const raw = await post(url, path, { model: 'no-such-model', messages: [{ role: 'user', content: QUESTION }], ...extra });
      expect(raw.status).toBe(404);
      expect(JSON.parse(raw.text)).toEqual({ type: 'error', error: { type: 'NotFoundError', message: 'The model `no-such-model` does not exist.' } });
    }
    await expect(
      client(url).messages.create({ model: 'no-such-model', max_tokens: 5, messages: [{ role: 'user', content: QUESTION }] }),
    ).rejects.toBeInstanceOf(Anthropic.NotFoundError);
  });

  it('--api-key guards it as vLLM: only Authorization: Bearer (what this SDK sends for apiKey or authToken); x-api-key alone is a 401', async () => {
    const { url } = await mockers.start([...RANDOM, '--api-key', 'sekret']);
    const request = { model: MODEL, max_tokens: 3, messages: [{ role: 'user' as const, content: QUESTION }] };
    for (const options of [{ apiKey: 'sekret' }, { apiKey: null, authToken: 'sekret' }]) {
      const message = await new Anthropic({ baseURL: url, maxRetries: 0, ...options }).messages.create(request);
      expect(message.usage.output_tokens).toBe(3);
    }
    await expect(new Anthropic({ baseURL: url, apiKey: 'wrong', maxRetries: 0 }).messages.create(request)).rejects.toMatchObject({ status: 401 });
    const raw = await fetch(`${url}/v1/messages`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-api-key': 'sekret' },
      body: JSON.stringify(request),
    });
    expect(raw.status).toBe(401);
    expect(await raw.json()).toEqual({ error: 'Unauthorized' });
  });
});

describe('replay', () => {
  it('a chat capture whose prompt is the translated prompt answers /v1/messages with the captured text', async () => {
    const db = join(mkdtempSync(join(testTmpdir(), 'mocker-anthropic-replay-')), 'golden.db');
    const upstream = await startUpstream(() => ({ content: 'Paris is the capital.', finish: 'stop' }));
    try {
      const capture = await startMockerProcess(['capture', '--upstream', upstream.url, '--captures', db]);
      try {
        const chat = await post(capture.url, '/v1/chat/completions', { model: MODEL, max_tokens: 50, messages: CHAT_MESSAGES });
        expect(chat.status).toBe(200);
      } finally {
        await capture.stop();
      }
    } finally {
      await upstream.close();
    }
    const { url } = await mockers.start(['serve', '--mode', 'replay', '--captures', db, '--timing', 'none']);
    const anthropic = client(url);
    const request = { model: MODEL, max_tokens: 50, system: SYSTEM, messages: [{ role: 'user' as const, content: QUESTION }] };
    const message = await anthropic.messages.create(request);
    expect(message.content).toEqual([{ type: 'text', text: 'Paris is the capital.' }]);
    expect(message.stop_reason).toBe('end_turn');
    const streamed = await anthropic.messages.stream(request).finalMessage();
    expect(streamed.content).toEqual(message.content);
  });
});
