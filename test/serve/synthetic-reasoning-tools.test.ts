/**
 * Random answers shaped as a reasoning model's with tools, as users run it: the built CLI with `--reasoning`
 * (Dynamo's thinking span), the request's `reasoning_effort` (AIPerf's budgets) and `--tool-call-rate`, read by the
 * official `openai` client. The thinking-span lengths are computed by hand from Dynamo's rule; the think token ids
 * come from the Python tokenizer's fixture; tool arguments are validated by zod's own JSON-schema reader.
 */
import OpenAI from 'openai';
import type { ChatCompletion, ChatCompletionCreateParamsNonStreaming, ChatCompletionTool } from 'openai/resources/chat/completions';
import { afterAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { mockerProcesses, runMockerToExit } from '../support/mockerProcess.js';
import { oracleIds } from '../support/qwen3Oracle.js';

const mockers = mockerProcesses();
afterAll(mockers.stopAll);

// vLLM 0.11's shape (`reasoning_content`, `tool_calls: []` kept): test/wire/ covers the others.
const SERVE = ['serve', '--mode', 'random', '--timing', 'none', '--wire', 'vllm-0.11'];
const openai = (url: string) => new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0 });

// Qwen3's <think> and </think>, as Python's tokenizer encodes them.
const thinkIds = oracleIds('<think>\nreasoning\n</think>');
const THINK = thinkIds[0];
const END_THINK = thinkIds[thinkIds.length - 1];

/** The fields mocker adds to OpenAI's types (vLLM's). */
type VllmMessage = ChatCompletion.Choice['message'] & { reasoning_content?: string | null };
type VllmChoice = ChatCompletion.Choice & { token_ids?: number[] | null };

async function chat(client: OpenAI, body: Record<string, unknown>): Promise<{ message: VllmMessage; choice: VllmChoice; completion: ChatCompletion }> {
  const completion = await client.chat.completions.create({
    model: 'Qwen/Qwen3-0.6B',
    messages: [{ role: 'user', content: 'Think first.' }],
    ...body,
  } as ChatCompletionCreateParamsNonStreaming);
  const choice = completion.choices[0] as VllmChoice;
  return { message: choice.message as VllmMessage, choice, completion };
}

/** Where the thinking span ends (its length), from the output ids: 0 when there is none. */
function spanLength(ids: number[]): number {
  if (ids[0] !== THINK) return 0;
  return ids.indexOf(END_THINK) + 1;
}

describe('--reasoning: a thinking span opens every random answer', () => {
  it('a chat gets the span as reasoning_content (vLLM 0.11) and the rest as content; usage counts all tokens', async () => {
    const client = openai((await mockers.start([...SERVE, '--reasoning', '{"thinking_ratio":0.25}'])).url);
    const { message, choice, completion } = await chat(client, { max_tokens: 40, return_token_ids: true });
    const ids = choice.token_ids!;
    // floor(40 × 0.25) = 10 tokens: <think>, 8 thinking tokens, </think>.
    expect(ids.length).toBe(40);
    expect([ids[0], ids[9]]).toEqual([THINK, END_THINK]);
    expect(ids.slice(1, 9)).not.toContain(END_THINK);
    expect(typeof message.reasoning_content).toBe('string');
    expect(message.reasoning_content!.length).toBeGreaterThan(0);
    expect(message.reasoning_content).not.toContain('<think>');
    expect(typeof message.content).toBe('string');
    expect(message.content).not.toContain('</think>');
    expect(message.tool_calls).toEqual([]);
    expect(choice.finish_reason).toBe('length');
    expect(completion.usage!.completion_tokens).toBe(40);
  });

  it('streamed, the reasoning_content deltas come first and accumulate to the non-streamed texts', async () => {
    const client = openai((await mockers.start([...SERVE, '--reasoning', '{"thinking_ratio":0.5}', '--seed', '3'])).url);
    const { message } = await chat(client, { max_tokens: 30 });
    const stream = await client.chat.completions.create({
      model: 'Qwen/Qwen3-0.6B',
      messages: [{ role: 'user', content: 'Think first.' }],
      max_tokens: 30,
      stream: true,
      stream_options: { include_usage: true },
    });
    let reasoning = '';
    let content = '';
    let contentStarted = false;
    let usage = 0;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage.completion_tokens;
      const delta = chunk.choices[0]?.delta as ({ reasoning_content?: string } & { content?: string | null }) | undefined;
      if (!delta) continue;
      if (delta.content) contentStarted = true;
      if (delta.reasoning_content !== undefined) {
        expect(contentStarted).toBe(false);
        reasoning += delta.reasoning_content;
      }
      content += delta.content ?? '';
    }
    expect(reasoning).toBe(message.reasoning_content);
    expect(content).toBe(message.content);
    expect(usage).toBe(30);
  });

  it("follows Dynamo's rule: floor(max_tokens × ratio), clamped to [2, max_tokens], none below 2 tokens or when it floors to 0", async () => {
    // The ids given explicitly, through the engine args (Dynamo's key).
    const client = openai(
      (
        await mockers.start([
          ...SERVE,
          '--extra-engine-args',
          JSON.stringify({ reasoning: { start_thinking_token_id: THINK, end_thinking_token_id: END_THINK, thinking_ratio: 0.1 } }),
        ])
      ).url,
    );
    const cases: [maxTokens: number, span: number][] = [
      [100, 10], // floor(10) = 10
      [15, 2], // floor(1.5) = 1 → at least 2
      [9, 0], // floor(0.9) = 0 → none
      [1, 0], // below 2 tokens → none
    ];
    for (const [maxTokens, span] of cases) {
      const { choice } = await chat(client, { max_tokens: maxTokens, return_token_ids: true });
      expect([maxTokens, spanLength(choice.token_ids!)]).toEqual([maxTokens, span]);
    }
    const whole = openai((await mockers.start([...SERVE, '--reasoning', '{"thinking_ratio":1}'])).url);
    const { message, choice } = await chat(whole, { max_tokens: 12, return_token_ids: true });
    // The span is the whole answer: </think> is its last token, nothing follows.
    expect(spanLength(choice.token_ids!)).toBe(12);
    expect(message.content).toBeNull();
    expect(typeof message.reasoning_content).toBe('string');
  });

  it("a request's reasoning_effort sets the span instead (AIPerf: low 100, medium 250, high 500), within max_tokens", async () => {
    const client = openai((await mockers.start([...SERVE, '--reasoning', '{"thinking_ratio":0.1}'])).url);
    const cases: [effort: string, maxTokens: number, span: number][] = [
      ['low', 400, 100],
      ['medium', 400, 250],
      ['high', 300, 300],
    ];
    for (const [effort, maxTokens, span] of cases) {
      const { choice } = await chat(client, { max_tokens: maxTokens, reasoning_effort: effort, return_token_ids: true });
      expect([effort, spanLength(choice.token_ids!)]).toEqual([effort, span]);
    }
    await expect(chat(client, { max_tokens: 10, reasoning_effort: 'extreme' })).rejects.toMatchObject({ status: 400 });
  });

  it('without --reasoning, reasoning_effort changes nothing and no span is made', async () => {
    const client = openai((await mockers.start([...SERVE])).url);
    const { message, choice } = await chat(client, { max_tokens: 20, reasoning_effort: 'low', return_token_ids: true });
    expect(spanLength(choice.token_ids!)).toBe(0);
    expect(message.reasoning_content).toBeNull();
  });

  it('a completion carries the span as raw text, as vLLM (its reasoning parser reads chats only)', async () => {
    const client = openai((await mockers.start([...SERVE, '--reasoning', '{"thinking_ratio":0.5}'])).url);
    const completion = await client.completions.create({ model: 'Qwen/Qwen3-0.6B', prompt: 'Think first.', max_tokens: 10 });
    expect(completion.choices[0].text.startsWith('<think>')).toBe(true);
    expect(completion.choices[0].text).toContain('</think>');
  });
});

const WEATHER: ChatCompletionTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    parameters: {
      type: 'object',
      properties: {
        city: { type: 'string', minLength: 2, maxLength: 20 },
        unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
        days: { type: 'integer', minimum: 1, maximum: 7 },
        hourly: { type: 'boolean' },
        where: {
          type: 'object',
          properties: { lat: { type: 'number', minimum: -90, maximum: 90 }, lon: { type: 'number', exclusiveMinimum: -180, exclusiveMaximum: 180 } },
          required: ['lat', 'lon'],
          additionalProperties: false,
        },
        fields: { type: 'array', items: { type: 'string', enum: ['temp', 'wind', 'rain'] }, minItems: 1, maxItems: 3 },
      },
      required: ['city', 'unit', 'where'],
      additionalProperties: false,
    },
  },
};
const SEARCH: ChatCompletionTool = {
  type: 'function',
  function: {
    name: 'search',
    parameters: {
      type: 'object',
      properties: { query: { type: 'string' }, limit: { type: 'integer', exclusiveMinimum: 0, maximum: 10 } },
      required: ['query', 'limit'],
      additionalProperties: false,
    },
  },
};
const TOOLS = [WEATHER, SEARCH];
const NAMES = TOOLS.map((t) => t.function.name);

/** The tool's schema read by zod (an independent JSON-schema implementation). */
function validator(name: string) {
  const tool = TOOLS.find((t) => t.function.name === name)!;
  return z.fromJSONSchema(tool.function.parameters as Parameters<typeof z.fromJSONSchema>[0]);
}

const prompts = Array.from({ length: 12 }, (_, i) => `Request number ${i}: what should I do?`);

async function toolChat(client: OpenAI, prompt: string, extra: Record<string, unknown> = {}) {
  return chat(client, { messages: [{ role: 'user', content: prompt }], tools: TOOLS, max_tokens: 200, ...extra });
}

describe('--tool-call-rate: a chat offering tools gets a call to one of them', () => {
  it('the openai client reads a call to an offered tool whose arguments are valid against its schema; finish_reason tool_calls', async () => {
    const client = openai((await mockers.start([...SERVE, '--tool-call-rate', '1'])).url);
    const names = new Set<string>();
    for (const prompt of prompts) {
      const { message, choice } = await toolChat(client, prompt);
      expect(choice.finish_reason).toBe('tool_calls');
      expect(message.content).toBeNull();
      expect(message.tool_calls).toHaveLength(1);
      const call = message.tool_calls![0] as { id: string; type: string; function: { name: string; arguments: string } };
      expect(call.type).toBe('function');
      expect(call.id).toMatch(/^chatcmpl-tool-[0-9a-f]{32}$/);
      expect(NAMES).toContain(call.function.name);
      const parsed = validator(call.function.name).safeParse(JSON.parse(call.function.arguments));
      expect(parsed.error).toBeUndefined();
      names.add(call.function.name);
    }
    // Both tools are called over a dozen requests.
    expect([...names].sort()).toEqual([...NAMES].sort());
  });

  it("streamed, the call's fragments accumulate (the openai stream helper) to the non-streamed call", async () => {
    const client = openai((await mockers.start([...SERVE, '--tool-call-rate', '1', '--reasoning', '{"thinking_ratio":0.1}'])).url);
    for (const prompt of prompts.slice(0, 4)) {
      const { message, choice } = await toolChat(client, prompt);
      const runner = client.chat.completions.stream({ model: 'Qwen/Qwen3-0.6B', messages: [{ role: 'user', content: prompt }], tools: TOOLS, max_tokens: 200 });
      // The helper folds only OpenAI's own delta fields: vLLM's reasoning_content is summed here.
      let reasoning = '';
      runner.on('chunk', (chunk) => (reasoning += (chunk.choices[0]?.delta as { reasoning_content?: string } | undefined)?.reasoning_content ?? ''));
      const streamed = await runner.finalChatCompletion();
      const streamedCall = streamed.choices[0].message.tool_calls![0] as { id: string; type: string; function: { name: string; arguments: string } };
      expect(streamedCall).toMatchObject(message.tool_calls![0]);
      expect(streamed.choices[0].finish_reason).toBe('tool_calls');
      expect(choice.finish_reason).toBe('tool_calls');
      // The thinking span comes before the call.
      expect(reasoning).toBe(message.reasoning_content);
      expect(message.reasoning_content!.length).toBeGreaterThan(0);
    }
  });

  it('a named tool_choice always calls that tool, with content "" and finish_reason stop; "none" never calls', async () => {
    const client = openai((await mockers.start([...SERVE, '--tool-call-rate', '0'])).url);
    const { message, choice } = await toolChat(client, prompts[0], { tool_choice: { type: 'function', function: { name: 'search' } } });
    expect(choice.finish_reason).toBe('stop');
    expect(message.content).toBe('');
    expect(message.tool_calls![0].type === 'function' && message.tool_calls![0].function.name).toBe('search');
    const none = await toolChat(client, prompts[0], { tool_choice: 'none' });
    expect(none.message.tool_calls).toEqual([]);
    const required = await toolChat(client, prompts[0], { tool_choice: 'required' });
    expect(required.message.tool_calls).toHaveLength(1);
  });

  it('--tool-call-rate 0 gives no calls to tool_choice auto', async () => {
    const client = openai((await mockers.start([...SERVE, '--tool-call-rate', '0'])).url);
    for (const prompt of prompts.slice(0, 6)) {
      const { message, choice } = await toolChat(client, prompt);
      expect(message.tool_calls).toEqual([]);
      expect(typeof message.content).toBe('string');
      expect(choice.finish_reason).toBe('length');
    }
  });

  it('the same --seed makes the same calls in another run', async () => {
    const first = openai((await mockers.start([...SERVE, '--tool-call-rate', '0.5', '--seed', '11'])).url);
    const second = openai((await mockers.start([...SERVE, '--tool-call-rate', '0.5', '--seed', '11'])).url);
    const calls = async (client: OpenAI) => Promise.all(prompts.map(async (p) => (await toolChat(client, p)).message.tool_calls));
    const [a, b] = [await calls(first), await calls(second)];
    expect(b).toEqual(a);
    // At rate 0.5 a dozen answers hold both calls and plain answers.
    expect(a.some((c) => c!.length === 1) && a.some((c) => c!.length === 0)).toBe(true);
  });

  it("refuses tool_choice without tools, and a named tool that is not offered, with vLLM's 400", async () => {
    const client = openai((await mockers.start([...SERVE])).url);
    await expect(chat(client, { tool_choice: 'auto', max_tokens: 5 })).rejects.toMatchObject({
      status: 400,
      message: expect.stringContaining('`tools` must be set'),
    });
    await expect(chat(client, { tools: TOOLS, tool_choice: { type: 'function', function: { name: 'nope' } }, max_tokens: 5 })).rejects.toMatchObject({
      status: 400,
      message: expect.stringContaining('does not match any of the specified `tools`'),
    });
  });
});

describe('flags', () => {
  it('refuse a ratio outside [0, 1] and a rate outside [0, 1], naming the flag', async () => {
    const ratio = await runMockerToExit(['serve', '--mode', 'random', '--reasoning', '{"thinking_ratio":1.5}', '--port', '0']);
    expect(ratio.code).not.toBe(0);
    expect(ratio.stderr).toContain('--reasoning');
    const rate = await runMockerToExit(['serve', '--mode', 'random', '--tool-call-rate', '2', '--port', '0']);
    expect(rate.code).not.toBe(0);
    expect(rate.stderr).toContain('--tool-call-rate');
  });
});
