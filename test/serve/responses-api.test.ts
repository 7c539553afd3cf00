/**
 * Issue #39 item 1: OpenAI's Responses API (`POST /v1/responses`, `GET /v1/responses/{id}`, cancel) on the built
 * CLI, read by the official `openai` client (its `responses` resource) and by raw fetch for the exact bytes of the
 * stream framing and of vLLM's error bodies (docs: /work/notes/api39-spec.md §1). Prompt lengths are checked
 * against the server's own `/tokenize` of the chat messages vLLM builds from the request (§1.4), an independent
 * path through the chat template.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import type {
  Response as OpenAIResponse,
  ResponseCreateParamsNonStreaming,
  ResponseFunctionToolCall,
  ResponseInputItem,
  ResponseReasoningItem,
  ResponseStreamEvent,
} from 'openai/resources/responses/responses';
import { afterAll, describe, expect, it } from 'vitest';
import { mockerProcesses, startMockerProcess } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';
import { MODEL, startUpstream } from '../support/vllmUpstream.js';

type Json = Record<string, unknown>;

const mockers = mockerProcesses();
afterAll(mockers.stopAll);

const RANDOM = ['serve', '--mode', 'random', '--timing', 'none'];
const clientOf = (url: string) => new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0 });

/** The prompt length the server's `/tokenize` gives the chat messages (the chat template's own rendering). */
async function chatPromptLength(url: string, messages: Json[], extra: Json = {}): Promise<number> {
  const res = await fetch(`${url}/tokenize`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, messages, ...extra }),
  });
  expect(res.status).toBe(200);
  return ((await res.json()) as { count: number }).count;
}

const post = (url: string, path: string, body: unknown) =>
  fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: typeof body === 'string' ? body : JSON.stringify(body) });

const HEX32 = /^[0-9a-f]{32}$/;

function checkUsage(r: OpenAIResponse, maxOutput: number): void {
  const usage = r.usage!;
  expect(usage.input_tokens + usage.output_tokens).toBe(usage.total_tokens);
  expect(usage.output_tokens).toBeGreaterThan(0);
  expect(usage.output_tokens).toBeLessThanOrEqual(maxOutput);
  expect(r.status).toBe(usage.output_tokens === maxOutput ? 'incomplete' : 'completed');
  if (r.status === 'incomplete') expect(r.incomplete_details).toEqual({ reason: 'max_output_tokens' });
}

describe.each([
  ['random', RANDOM],
  ['simulate', ['serve', '--mode', 'simulate', '--timing', 'none']],
])('a text answer in %s mode', (_mode, args) => {
  it('non-streamed and streamed, parsed by the openai client; usage adds up and counts the chat prompt', async () => {
    const { url } = await mockers.start(args);
    const client = clientOf(url);
    const request = { model: MODEL, instructions: 'Be brief.', input: 'What is the capital of France?', max_output_tokens: 12 };
    const r = await client.responses.create(request);
    expect(r.id).toMatch(/^resp_[0-9a-f]{32}$/);
    expect(r.object).toBe('response');
    expect(r.model).toBe(MODEL);
    expect(r.instructions).toBe('Be brief.');
    expect(r.output).toHaveLength(1);
    expect(r.output[0]).toMatchObject({ type: 'message', role: 'assistant', status: 'completed' });
    expect(r.output[0].id).toMatch(/^msg_[0-9a-f]{32}$/);
    expect(r.output_text.length).toBeGreaterThan(0);
    checkUsage(r, 12);
    const chatMessages = [
      { role: 'system', content: 'Be brief.' },
      { role: 'user', content: 'What is the capital of France?' },
    ];
    expect(r.usage!.input_tokens).toBe(await chatPromptLength(url, chatMessages));

    const events: ResponseStreamEvent[] = [];
    for await (const event of await client.responses.create({ ...request, stream: true })) events.push(event);
    expect(events.map((e) => e.sequence_number)).toEqual(events.map((_, i) => i));
    expect(events.slice(0, 4).map((e) => e.type)).toEqual([
      'response.created',
      'response.in_progress',
      'response.output_item.added',
      'response.content_part.added',
    ]);
    const last = events.at(-1)!;
    if (last.type !== 'response.completed') throw new Error(`the stream ended with ${last.type}`);
    const deltas = events.flatMap((e) => (e.type === 'response.output_text.delta' ? [e.delta] : []));
    const [message] = last.response.output;
    if (message.type !== 'message' || message.content[0].type !== 'output_text') throw new Error('no text message');
    expect(deltas.join('')).toBe(message.content[0].text);
    expect(deltas.length).toBe(last.response.usage!.output_tokens);
    checkUsage(last.response, 12);
  });
});

const PERSON = {
  type: 'object',
  properties: { name: { type: 'string' }, age: { type: 'integer' } },
  required: ['name', 'age'],
  additionalProperties: false,
};

describe('request translation (vLLM builds chat messages from the input items)', () => {
  it('message items with input_text parts, an assistant output message, text.format json_schema: the chat answer of the same messages and seed', async () => {
    const { url } = await mockers.start(RANDOM);
    const client = clientOf(url);
    const input: ResponseInputItem[] = [
      { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Describe a person.' }] },
      { type: 'message', role: 'assistant', id: 'msg_1', status: 'completed', content: [{ type: 'output_text', text: 'Which one?', annotations: [] }] },
      { role: 'user', content: 'Anyone.' },
    ];
    // `seed` is one of vLLM's extra fields, which the client's types do not declare.
    const r = await client.responses.create({
      model: MODEL,
      input,
      text: { format: { type: 'json_schema', name: 'person', schema: PERSON, strict: true } },
      seed: 7,
    } as ResponseCreateParamsNonStreaming);
    const answer = JSON.parse(r.output_text) as Json;
    expect(Object.keys(answer).sort()).toEqual(['age', 'name']);
    expect(Number.isInteger(answer.age)).toBe(true);
    const messages = [
      { role: 'user', content: 'Describe a person.' },
      { role: 'assistant', content: 'Which one?' },
      { role: 'user', content: 'Anyone.' },
    ];
    const chat = await client.chat.completions.create({
      model: MODEL,
      messages: messages as OpenAI.ChatCompletionMessageParam[],
      response_format: { type: 'json_schema', json_schema: { name: 'person', schema: PERSON, strict: true } },
      seed: 7,
    });
    expect(r.output_text).toBe(chat.choices[0].message.content);
    expect(r.usage!.input_tokens).toBe(chat.usage!.prompt_tokens);
    expect(r.usage!.input_tokens).toBe(await chatPromptLength(url, messages));
  });

  it('an input ending with an unfinished assistant message is continued (continue_final_message, no generation prompt)', async () => {
    const { url } = await mockers.start(RANDOM);
    const r = await clientOf(url).responses.create({
      model: MODEL,
      input: [
        { role: 'user', content: 'Count to five.' },
        { type: 'message', role: 'assistant', id: 'msg_1', status: 'incomplete', content: [{ type: 'output_text', text: 'One, two,', annotations: [] }] },
      ],
      max_output_tokens: 3,
    });
    const messages = [
      { role: 'user', content: 'Count to five.' },
      { role: 'assistant', content: 'One, two,' },
    ];
    const continued = await chatPromptLength(url, messages, { continue_final_message: true, add_generation_prompt: false });
    expect(continued).not.toBe(await chatPromptLength(url, messages));
    expect(r.usage!.input_tokens).toBe(continued);
  });

  it('reasoning.effort: the chat template gets enable_thinking (false for "none"), the thinking budget its level', async () => {
    const { url } = await mockers.start([...RANDOM, '--reasoning', '{"thinking_ratio":0.25}']);
    const client = clientOf(url);
    const off = await client.responses.create({ model: MODEL, input: 'Quick answer.', reasoning: { effort: 'none' }, max_output_tokens: 4 });
    const kwargs = { chat_template_kwargs: { enable_thinking: false, reasoning_effort: 'none' } };
    const offLength = await chatPromptLength(url, [{ role: 'user', content: 'Quick answer.' }], kwargs);
    // Qwen3's template writes an empty thinking block when thinking is off: the prompt is longer than without it.
    expect(offLength).toBeGreaterThan(await chatPromptLength(url, [{ role: 'user', content: 'Quick answer.' }]));
    expect(off.usage!.input_tokens).toBe(offLength);
    // AIPerf's budget for "low" is 100 thinking tokens (the chat test's oracle), within max_output_tokens.
    const low = await client.responses.create({ model: MODEL, input: 'Think a little.', reasoning: { effort: 'low' }, max_output_tokens: 300 });
    expect(low.usage!.output_tokens_details.reasoning_tokens).toBe(100);
    expect(low.reasoning).toEqual({ effort: 'low' });
  });

  it('include_reasoning false: the reasoning is generated and counted, not shown', async () => {
    const { url } = await mockers.start([...RANDOM, '--reasoning', '{"thinking_ratio":0.25}']);
    // vLLM's extra field.
    const response = await clientOf(url).responses.create({
      model: MODEL,
      input: 'Think first.',
      max_output_tokens: 40,
      include_reasoning: false,
    } as ResponseCreateParamsNonStreaming);
    expect(response.output.map((item) => item.type)).toEqual(['message']);
    expect(response.usage!.output_tokens_details.reasoning_tokens).toBe(10);
  });

  it("usage's cached_tokens are the engine's prefix-cache hits: what the chat path reports for the same prompt", async () => {
    const { url } = await mockers.start([...RANDOM, '--enable-prompt-tokens-details']);
    const client = clientOf(url);
    const text = 'Summarize: '.concat('the quick brown fox jumps over the lazy dog. '.repeat(20));
    const first = await client.responses.create({ model: MODEL, input: text, max_output_tokens: 2 });
    expect(first.usage!.input_tokens_details.cached_tokens).toBe(0);
    const chat = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: text }], max_tokens: 2 });
    const cached = chat.usage!.prompt_tokens_details!.cached_tokens!;
    expect(cached).toBeGreaterThan(0);
    const again = await client.responses.create({ model: MODEL, input: text, max_output_tokens: 2 });
    expect(again.usage!.input_tokens_details.cached_tokens).toBe(cached);
  });
});

const WEATHER = {
  type: 'function' as const,
  name: 'get_weather',
  description: 'The weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'], additionalProperties: false },
  strict: false,
};

describe('function calls', () => {
  it('a call (after a thinking span), then its output sent back with the reasoning and call items, answered with text; the prompt is the chat of both', async () => {
    const { url } = await mockers.start([...RANDOM, '--tool-call-rate', '1', '--reasoning', '{"thinking_ratio":0.1}', '--seed', '5']);
    const client = clientOf(url);
    const question: ResponseInputItem = { role: 'user', content: 'What is the weather in Paris?' };
    const first = await client.responses.create({ model: MODEL, input: [question], tools: [WEATHER], max_output_tokens: 200 });
    expect(first.output.map((item) => item.type)).toEqual(['reasoning', 'function_call']);
    const [reasoning, call] = first.output as [ResponseReasoningItem, ResponseFunctionToolCall];
    expect(call.name).toBe('get_weather');
    expect(call.id).toMatch(/^fc_[0-9a-f]{32}$/);
    expect(typeof call.call_id).toBe('string');
    expect(JSON.parse(call.arguments)).toEqual(expect.objectContaining({ city: expect.any(String) }));
    expect(first.tool_choice).toBe('auto');
    expect(first.tools).toEqual([expect.objectContaining({ type: 'function', name: 'get_weather' })]);

    const output: ResponseInputItem = { type: 'function_call_output', call_id: call.call_id, output: '{"celsius":21}' };
    const second = await client.responses.create({
      model: MODEL,
      input: [question, ...(first.output as ResponseInputItem[]), output],
      tools: [WEATHER],
      tool_choice: 'none',
      max_output_tokens: 10,
    });
    expect(second.output.map((item) => item.type)).toContain('message');
    expect(second.output.map((item) => item.type)).not.toContain('function_call');
    // vLLM: the reasoning item becomes the assistant's reasoning, the call its tool_calls (one message), the output a tool message.
    const chatMessages = [
      { role: 'user', content: 'What is the weather in Paris?' },
      {
        role: 'assistant',
        content: null,
        reasoning: reasoning.content![0].text,
        tool_calls: [{ id: call.call_id, type: 'function', function: { name: 'get_weather', arguments: call.arguments } }],
      },
      { role: 'tool', content: '{"celsius":21}', tool_call_id: call.call_id },
    ];
    const tools = [{ type: 'function', function: { name: WEATHER.name, description: WEATHER.description, parameters: WEATHER.parameters, strict: false } }];
    expect(second.usage!.input_tokens).toBe(await chatPromptLength(url, chatMessages, { tools }));
  });

  it('streamed: the call opens its item with its name, and its argument deltas add up to the final arguments', async () => {
    const { url } = await mockers.start([...RANDOM, '--tool-call-rate', '1', '--seed', '5']);
    const events: ResponseStreamEvent[] = [];
    const stream = await clientOf(url).responses.create({ model: MODEL, input: 'Weather in Oslo?', tools: [WEATHER], max_output_tokens: 200, stream: true });
    for await (const event of stream) events.push(event);
    const added = events.find((e) => e.type === 'response.output_item.added' && e.item.type === 'function_call');
    expect(added).toBeDefined();
    const args = events.flatMap((e) => (e.type === 'response.function_call_arguments.delta' ? [e.delta] : [])).join('');
    const done = events.find((e) => e.type === 'response.function_call_arguments.done');
    expect(done).toMatchObject({ arguments: args, name: 'get_weather' });
    const last = events.at(-1)!;
    if (last.type !== 'response.completed') throw new Error(`the stream ended with ${last.type}`);
    const final = last.response.output.find((item) => item.type === 'function_call') as ResponseFunctionToolCall;
    expect(final.arguments).toBe(args);
  });

  it("refuses tool_choice 'required' without tools and a named tool not offered; 'auto' without tools becomes 'none'", async () => {
    const { url } = await mockers.start(RANDOM);
    const required = await post(url, '/v1/responses', { input: 'hi', tool_choice: 'required' });
    expect(required.status).toBe(400);
    expect(await required.json()).toEqual({
      error: { message: "Tool choice 'required' must be specified with 'tools' parameter.", type: 'BadRequestError', param: 'tool_choice', code: 400 },
    });
    const named = await post(url, '/v1/responses', { input: 'hi', tools: [WEATHER], tool_choice: { type: 'function', name: 'nope' } });
    expect(named.status).toBe(400);
    expect(((await named.json()) as { error: Json }).error).toMatchObject({
      message: "Tool choice 'function' not found in 'tools' parameter.",
      param: 'tool_choice',
    });
    const auto = await clientOf(url).responses.create({ model: MODEL, input: 'hi', tool_choice: 'auto', max_output_tokens: 2 });
    expect(auto.tool_choice).toBe('none');
  });
});

describe('reasoning', () => {
  it('a thinking span comes back as a reasoning item before the message, counted in reasoning_tokens; streamed, its events first', async () => {
    const { url } = await mockers.start([...RANDOM, '--reasoning', '{"thinking_ratio":0.25}']);
    const client = clientOf(url);
    const r = await client.responses.create({ model: MODEL, input: 'Think first.', max_output_tokens: 40 });
    expect(r.output.map((item) => item.type)).toEqual(['reasoning', 'message']);
    const reasoning = r.output[0];
    if (reasoning.type !== 'reasoning') throw new Error('no reasoning item');
    expect(reasoning.id).toMatch(/^rs_[0-9a-f]{32}$/);
    expect(reasoning.content![0].type).toBe('reasoning_text');
    expect(reasoning.content![0].text.length).toBeGreaterThan(0);
    expect(reasoning.content![0].text).not.toContain('<think>');
    // floor(40 × 0.25) = 10 tokens: <think>, 8 thinking tokens, </think> (Dynamo's rule, as the chat test computes it).
    expect(r.usage!.output_tokens_details.reasoning_tokens).toBe(10);
    expect(r.usage!.output_tokens).toBe(40);

    const types: string[] = [];
    for await (const event of await client.responses.create({ model: MODEL, input: 'Think first.', max_output_tokens: 40, stream: true }))
      types.push(event.type);
    const firstText = types.indexOf('response.output_text.delta');
    expect(types.indexOf('response.reasoning_text.delta')).toBeGreaterThan(0);
    expect(types.lastIndexOf('response.reasoning_text.delta')).toBeLessThan(firstText);
    expect(types.slice(0, firstText)).toContain('response.reasoning_part.done');
  });
});

const notFound = (id: string) => ({
  error: { message: `Response with id '${id}' not found.`, type: 'invalid_request_error', param: 'response_id', code: 404 },
});

describe('store', () => {
  it('on: GET returns the stored response (same bytes), previous_response_id carries the input and the answer text into the prompt; store false keeps nothing', async () => {
    const { url } = await mockers.start([...RANDOM, '--enable-responses-api-store']);
    const client = clientOf(url);
    const created = await post(url, '/v1/responses', { model: MODEL, instructions: 'Be brief.', input: 'Name a colour.', max_output_tokens: 6 });
    const createdBytes = await created.text();
    const first = JSON.parse(createdBytes) as OpenAIResponse;
    const got = await fetch(`${url}/v1/responses/${first.id}`);
    expect(got.status).toBe(200);
    expect(await got.text()).toBe(createdBytes);
    const [message] = first.output;
    if (message.type !== 'message' || message.content[0].type !== 'output_text') throw new Error('no text message');
    const firstText = message.content[0].text;
    const retrieved = await client.responses.retrieve(first.id);
    expect(retrieved.output_text).toBe(firstText);
    expect(retrieved.usage).toEqual(first.usage);

    const second = await client.responses.create({ model: MODEL, input: 'Another one.', previous_response_id: first.id, max_output_tokens: 6 });
    expect(second.previous_response_id).toBe(first.id);
    // vLLM drops the previous turn's system message (the new request's instructions would replace it).
    const chatMessages = [
      { role: 'user', content: 'Name a colour.' },
      { role: 'assistant', content: firstText },
      { role: 'user', content: 'Another one.' },
    ];
    expect(second.usage!.input_tokens).toBe(await chatPromptLength(url, chatMessages));

    const unstored = await client.responses.create({ model: MODEL, input: 'Not this one.', store: false, max_output_tokens: 2 });
    expect((await fetch(`${url}/v1/responses/${unstored.id}`)).status).toBe(404);

    const cancel = await post(url, `/v1/responses/${first.id}/cancel`, {});
    expect(cancel.status).toBe(400);
    expect(((await cancel.json()) as { error: Json }).error).toMatchObject({
      message: 'Cannot cancel a synchronous response.',
      param: 'response_id',
      code: 400,
    });
  });

  it("vLLM's VLLM_ENABLE_RESPONSES_API_STORE=1 turns it on too", async () => {
    const { url } = await mockers.start(RANDOM, { env: { ...process.env, VLLM_ENABLE_RESPONSES_API_STORE: '1' } });
    const r = await clientOf(url).responses.create({ model: MODEL, input: 'Name a colour.', max_output_tokens: 3 });
    expect((await clientOf(url).responses.retrieve(r.id)).id).toBe(r.id);
  });

  it("off (vLLM's default): nothing is kept, GET, cancel and previous_response_id answer vLLM's 404", async () => {
    const { url } = await mockers.start(RANDOM);
    const r = await clientOf(url).responses.create({ model: MODEL, input: 'Name a colour.', max_output_tokens: 3 });
    const got = await fetch(`${url}/v1/responses/${r.id}`);
    expect(got.status).toBe(404);
    expect(await got.text()).toBe(JSON.stringify(notFound(r.id)));
    const cancel = await post(url, `/v1/responses/${r.id}/cancel`, {});
    expect(cancel.status).toBe(404);
    expect(await cancel.json()).toEqual(notFound(r.id));
    const chained = await post(url, '/v1/responses', { input: 'more', previous_response_id: 'resp_unknown' });
    expect(chained.status).toBe(404);
    expect(await chained.json()).toEqual(notFound('resp_unknown'));
  });
});

describe('wire bytes', () => {
  it('the stream: event: and data: lines, the same type in both, sequence numbers 0..n-1, no [DONE]; item ids bare hex while streaming', async () => {
    const { url } = await mockers.start(RANDOM);
    const res = await post(url, '/v1/responses', { input: 'Hello', max_output_tokens: 5, stream: true, request_id: 'my-request-7' });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('text/event-stream; charset=utf-8');
    const text = await res.text();
    expect(text).not.toContain('[DONE]');
    expect(text.endsWith('\n\n')).toBe(true);
    const blocks = text.slice(0, -2).split('\n\n');
    const data = blocks.map((block, i) => {
      const match = /^event: ([a-z_.]+)\ndata: (\{.*\})$/.exec(block);
      if (!match) throw new Error(`event ${i} is not framed as event: + data:: ${JSON.stringify(block)}`);
      const json = JSON.parse(match[2]) as Json;
      expect(json.type).toBe(match[1]);
      expect(json.sequence_number).toBe(i);
      return json;
    });
    expect(data.at(-1)!.type).toBe('response.completed');
    const response = data.at(-1)!.response as Json;
    // vLLM takes the request's request_id verbatim as the response id.
    expect(response.id).toBe('my-request-7');
    expect(response.temperature).toBe(1);
    expect(text).toContain('"temperature":1.0,');
    const added = data.find((d) => d.type === 'response.output_item.added')!;
    expect((added.item as Json).id).toMatch(HEX32);
    expect(((response.output as Json[])[0].id as string).startsWith('msg_')).toBe(true);
    const deltas = data.filter((d) => d.type === 'response.output_text.delta');
    expect(deltas).toHaveLength(5);
    expect(Object.keys(deltas[0])).toEqual(['content_index', 'delta', 'item_id', 'logprobs', 'output_index', 'sequence_number', 'type']);
  });

  it("errors in vLLM's shape: unknown model 404, bad JSON and bad fields 400, a prompt past max_model_len 400", async () => {
    const { url } = await mockers.start([...RANDOM, '--max-model-len', '64']);
    const model = await post(url, '/v1/responses', { model: 'nope', input: 'hi' });
    expect(model.status).toBe(404);
    expect(await model.json()).toEqual({ error: { message: 'The model `nope` does not exist.', type: 'NotFoundError', param: 'model', code: 404 } });
    const broken = await post(url, '/v1/responses', '{"input":');
    expect(broken.status).toBe(400);
    const missing = await post(url, '/v1/responses', { model: MODEL });
    expect(missing.status).toBe(400);
    const include = await post(url, '/v1/responses', { input: 'hi', include: ['nonsense'] });
    expect(include.status).toBe(400);
    const missingError = ((await missing.json()) as { error: Json }).error;
    expect(missingError).toMatchObject({ type: 'Bad Request', code: 400 });
    expect(missingError.message).toMatch(/^1 validation error:\n {2}input: /);
    // Within the characters tokenized up front (a longer prompt is refused on a prefix, in chat's words).
    const long = 'word '.repeat(60);
    const tooLong = await post(url, '/v1/responses', { input: long });
    expect(tooLong.status).toBe(400);
    const body = (await tooLong.json()) as { error: Json };
    const wide = await mockers.start(RANDOM);
    const n = await chatPromptLength(wide.url, [{ role: 'user', content: long }]);
    expect(n).toBeGreaterThan(64);
    expect(body).toEqual({
      error: {
        message: `The engine prompt length ${n} exceeds the max_model_len 64. Please reduce prompt.`,
        type: 'invalid_request_error',
        param: 'input',
        code: 400,
      },
    });
  });
});

describe('replay', () => {
  it('a chat capture whose prompt is the translated request answers /v1/responses with the captured text', async () => {
    const dir = mkdtempSync(join(testTmpdir(), 'mocker-responses-'));
    try {
      const db = join(dir, 'captures.db');
      const answer = 'The capital of France is Paris.';
      const upstream = await startUpstream(() => ({ content: answer }));
      const capture = await startMockerProcess(['capture', '--upstream', upstream.url, '--captures', db], 0);
      try {
        const captured = await clientOf(capture.url).chat.completions.create({
          model: MODEL,
          messages: [
            { role: 'system', content: 'Be brief.' },
            { role: 'user', content: 'What is the capital of France?' },
          ],
        });
        expect(captured.choices[0].message.content).toBe(answer);
      } finally {
        await capture.stop();
        await upstream.close();
      }
      const { url } = await mockers.start(['serve', '--mode', 'replay', '--captures', db, '--timing', 'none']);
      const client = clientOf(url);
      const r = await client.responses.create({ model: MODEL, instructions: 'Be brief.', input: 'What is the capital of France?' });
      expect(r.output_text).toBe(answer);
      expect(r.status).toBe('completed');
      let streamed = '';
      for await (const event of await client.responses.create({
        model: MODEL,
        instructions: 'Be brief.',
        input: 'What is the capital of France?',
        stream: true,
      }))
        if (event.type === 'response.output_text.delta') streamed += event.delta;
      expect(streamed).toBe(answer);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
