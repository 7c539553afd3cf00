/**
 * Issue #10 item 5: the vLLM test double follows vllm-wire-reference.md, and each point it now covers is
 * captured by a spawned `mocker capture` in front of it and replayed by a spawned `mocker serve --mode replay`,
 * driven by the official openai client (raw fetch where the client cannot say it). Token-id expectations come
 * from the Python HF tokenizer fixtures (test/fixtures/tokenizer/qwen3.jsonl), never from the double.
 * Issue #34: the double's knobs for a new build's regressions (tokenizer, detokenizer, tool-call parser), each
 * checked against the fixtures or against the same double without the knob.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI, { APIError } from 'openai';
import type {
  ChatCompletionCreateParamsNonStreaming,
  ChatCompletionCreateParamsStreaming,
  ChatCompletionMessageParam,
  ChatCompletionTool,
} from 'openai/resources';
import type { CompletionCreateParamsNonStreaming, CompletionCreateParamsStreaming } from 'openai/resources';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startMockerProcess, type MockerProcess } from '../support/mockerProcess.js';
import { MODEL, startUpstream, type Answer, type Script, type Upstream, type UpstreamOptions } from '../support/vllmUpstream.js';
import { testTmpdir } from '../support/tempRoot.js';

type Json = Record<string, unknown>;

const FIXTURE = readFileSync(join(import.meta.dirname, '..', 'fixtures', 'tokenizer', 'qwen3.jsonl'), 'utf8')
  .split('\n')
  .filter(Boolean)
  .map(
    (line) =>
      JSON.parse(line) as { kind: string; text?: string; ids_without_special?: number[]; request?: { messages: ChatCompletionMessageParam[] }; ids?: number[] },
  );

/** Python HF tokenizers' ids of a text (no special tokens). */
function oracleIds(text: string): number[] {
  const row = FIXTURE.find((r) => r.kind === 'encode' && r.text === text);
  if (!row?.ids_without_special) throw new Error(`no reference tokenization of ${JSON.stringify(text)}`);
  return row.ids_without_special;
}

/** A chat request of the fixtures with its reference prompt ids (Qwen3's chat template, then the tokenizer). */
function oracleChat(firstUserContent: string): { messages: ChatCompletionMessageParam[]; ids: number[] } {
  const row = FIXTURE.find((r) => r.kind === 'chat' && r.request?.messages.some((m) => m.role === 'user' && m.content === firstUserContent));
  if (!row?.request || !row.ids) throw new Error(`no reference chat prompt for ${firstUserContent}`);
  return { messages: row.request.messages, ids: row.ids };
}

/** Qwen3's <|im_start|> and <|im_end|> (the EOS ending a chat turn): the first and last ids of an encoded turn. */
const TURN = '<|im_start|>user\nhi<|im_end|>';
const IM_START = oracleIds(TURN)[0];
const IM_END = oracleIds(TURN).at(-1) as number;
const HELLO_WORLD = 'Hello world';
/** Starts with "Hello world": the same first two tokens (the pre-tokenizer splits at the space and the dot). */
const HELLO_LONG = 'Hello world. The end.';

/** What the double answers, by the request's last user message or prompt, and by choice. */
const answers = new Map<string, (choice: number) => Answer>();
function lastText(body: Json): string {
  if (typeof body.prompt === 'string') return body.prompt;
  if (Array.isArray(body.prompt)) return body.prompt.join(',');
  const messages = (body.messages ?? []) as { content?: unknown }[];
  return String(messages.at(-1)?.content ?? '');
}
const scripted: Script = (body, choice) => {
  const answer = answers.get(lastText(body));
  if (!answer) throw new Error(`no scripted answer for ${lastText(body)}`);
  return answer(choice);
};

let upstream: Upstream;
let capture: MockerProcess;
let dir: string;
let db: string;
const clientOf = (url: string) => new OpenAI({ baseURL: `${url}/v1`, apiKey: 'sk-unused', maxRetries: 0 });
let direct: OpenAI;
let captured: OpenAI;

beforeAll(async () => {
  dir = mkdtempSync(join(testTmpdir(), 'mocker-vllm-double-'));
  db = join(dir, 'golden.db');
  upstream = await startUpstream(scripted);
  capture = await startMockerProcess(['capture', '--upstream', upstream.url, '--captures', db]);
  direct = clientOf(upstream.url);
  captured = clientOf(`http://127.0.0.1:${capture.port}`);
});

afterAll(async () => {
  await capture?.stop();
  await upstream?.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

/** Runs `use` against a fresh `mocker serve --mode replay` of everything captured so far. */
async function withReplay(use: (client: OpenAI, url: string) => Promise<void>): Promise<void> {
  const replay = await startMockerProcess(['serve', '--mode', 'replay', '--captures', db, '--timing', 'none']);
  try {
    const url = `http://127.0.0.1:${replay.port}`;
    await use(clientOf(url), url);
  } finally {
    await replay.stop();
  }
}

async function collect(stream: AsyncIterable<unknown>): Promise<Json[]> {
  const out: Json[] = [];
  for await (const chunk of stream) out.push(chunk as Json);
  return out;
}

/** Without what vLLM regenerates per request: `id` and `created`. */
const unstamped = (chunks: Json[]) => chunks.map(({ id: _id, created: _created, ...rest }) => rest);
/** Tool-call ids are random per request in vLLM as in the double; a capture's replay keeps its own. */
const anyToolId = (value: unknown) => JSON.parse(JSON.stringify(value).replace(/chatcmpl-tool-[0-9a-f]{32}/g, 'chatcmpl-tool-X')) as unknown;

/** The request plus vLLM's extra fields, which the openai client sends as they are. */
function withExtra<T extends object>(params: T, extra: Json): T {
  return { ...params, ...extra };
}

type Choice = { index: number; delta?: Json; text?: string; finish_reason?: string | null; stop_reason?: unknown; token_ids?: number[] | null };
const choicesOf = (chunks: Json[]) => chunks.flatMap((c) => (c.choices as Choice[]) ?? []);

describe('the vLLM double, captured and replayed through the CLI', () => {
  it('(a) `stream_options: {}` turns usage on (include_usage defaults to true), `continuous_usage_stats` puts usage on every chunk', async () => {
    const hi = oracleChat('Hi there');
    const sum = oracleChat('What is 2+2?');
    const rendered = oracleChat('empty system');
    for (const chat of [hi, sum, rendered]) answers.set(lastText({ messages: chat.messages }), () => ({ content: HELLO_WORLD }));
    const completionIds = [...oracleIds(HELLO_WORLD), IM_END];
    const usage = (prompt: number[], completion: number) => ({
      prompt_tokens: prompt.length,
      total_tokens: prompt.length + completion,
      completion_tokens: completion,
    });

    const empty = (c: OpenAI) => c.chat.completions.create({ model: MODEL, messages: hi.messages, stream: true, stream_options: {} });
    const continuous = (c: OpenAI) =>
      c.chat.completions.create(
        withExtra<ChatCompletionCreateParamsStreaming>(
          { model: MODEL, messages: sum.messages, stream: true },
          { stream_options: { continuous_usage_stats: true } },
        ),
      );
    const fromDouble = await collect(await empty(direct));
    expect(fromDouble.at(-1)).toMatchObject({ choices: [], usage: usage(hi.ids, completionIds.length) });
    const through = await collect(await empty(captured));
    expect(unstamped(through)).toEqual(unstamped(fromDouble));

    const continuousDouble = await collect(await continuous(direct));
    // The role chunk counts 0 tokens, then each chunk its choice's tokens so far, then the final usage chunk.
    expect(continuousDouble.map((c) => (c.usage as { completion_tokens: number }).completion_tokens)).toEqual([0, 1, 2, 3, 3]);
    expect(continuousDouble.at(-1)).toMatchObject({ choices: [], usage: usage(sum.ids, completionIds.length) });
    const continuousThrough = await collect(await continuous(captured));
    expect(unstamped(continuousThrough)).toEqual(unstamped(continuousDouble));

    // Captured without streaming, asked for as a stream with `stream_options: {}`: rendered, still with usage.
    const plain = await captured.chat.completions.create({ model: MODEL, messages: rendered.messages });
    expect(plain.usage).toMatchObject(usage(rendered.ids, completionIds.length));

    await withReplay(async (replay) => {
      expect(unstamped(await collect(await empty(replay)))).toEqual(unstamped(through));
      expect(unstamped(await collect(await continuous(replay)))).toEqual(unstamped(continuousThrough));
      const asStream = await collect(await replay.chat.completions.create({ model: MODEL, messages: rendered.messages, stream: true, stream_options: {} }));
      expect(asStream.at(-1)).toEqual(expect.objectContaining({ choices: [], usage: usage(rendered.ids, completionIds.length) }));
      expect(
        choicesOf(asStream)
          .map((c) => c.delta?.content ?? '')
          .join(''),
      ).toBe(plain.choices[0].message.content);
    });
  });

  it('(b) `stream_options` without `stream`, and a body that is not application/json: 400 in vLLM error format, proxied, never replayed', async () => {
    const prompt = 'Validation: this prompt is never generated for';
    answers.set(prompt, () => ({ content: HELLO_WORLD }));
    const withoutStream = (c: OpenAI) => c.completions.create({ model: MODEL, prompt, max_tokens: 4, stream_options: { include_usage: true } });
    const refusal = async (c: OpenAI) => {
      const err = await withoutStream(c).then(
        () => null,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(APIError);
      return { status: (err as APIError).status, error: (err as APIError).error };
    };
    const fromDouble = await refusal(direct);
    expect(fromDouble.status).toBe(400);
    expect(fromDouble.error).toEqual({
      message: expect.stringContaining('Stream options can only be defined when `stream=True`.'),
      type: 'Bad Request',
      param: null,
      code: 400,
    });
    expect(await refusal(captured)).toEqual(fromDouble);

    // `{}` is falsy for vLLM's validator: accepted without `stream`.
    const emptyOptions = await direct.completions.create({ model: MODEL, prompt, max_tokens: 4, stream_options: {} });
    expect(emptyOptions.choices[0].text).toBe(HELLO_WORLD);

    // The openai client always sends JSON: a text/plain body has to be sent by hand.
    const asText = (url: string) =>
      fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'text/plain' },
        body: JSON.stringify({ model: MODEL, prompt, max_tokens: 4 }),
      }).then(async (r) => ({ status: r.status, body: await r.text() }));
    const textDouble = await asText(upstream.url);
    expect(textDouble.status).toBe(400);
    expect(JSON.parse(textDouble.body)).toEqual({
      error: { message: expect.stringContaining("Unsupported Media Type: Only 'application/json' is allowed"), type: 'Bad Request', param: null, code: 400 },
    });
    expect(await asText(`http://127.0.0.1:${capture.port}`)).toEqual(textDouble);

    await withReplay(async (replay, url) => {
      const replayed = await refusal(replay);
      expect(replayed.status).toBe(400);
      expect(replayed.error).toMatchObject({ message: expect.stringContaining('Stream options can only be defined when `stream=True`.'), code: 400 });
      const textReplay = await asText(url);
      expect(textReplay.status).toBe(400);
      expect(JSON.parse(textReplay.body)).toEqual({
        error: { message: expect.stringContaining("Unsupported Media Type: Only 'application/json' is allowed"), type: 'Bad Request', param: null, code: 400 },
      });
      // Neither refusal left a generation behind for this prompt.
      const miss = await replay.completions.create({ model: MODEL, prompt, max_tokens: 4 }).then(
        () => null,
        (e: unknown) => e,
      );
      expect((miss as APIError).status).toBe(404);
    });
  });

  it("(c) the body's `request_id` names the response (`chatcmpl-<request_id>`); an X-Request-Id header wins over it", async () => {
    const messages: ChatCompletionMessageParam[] = [{ role: 'user', content: 'Which id does this answer get?' }];
    answers.set(lastText({ messages }), () => ({ content: HELLO_LONG }));
    const byBody = (c: OpenAI) =>
      c.chat.completions.create(withExtra<ChatCompletionCreateParamsNonStreaming>({ model: MODEL, messages, max_tokens: 8 }, { request_id: 'body-req-7' }));
    const byBoth = (c: OpenAI) =>
      c.chat.completions.create(
        withExtra<ChatCompletionCreateParamsStreaming>({ model: MODEL, messages, max_tokens: 8, stream: true }, { request_id: 'body-req-8' }),
        { headers: { 'X-Request-Id': 'header-req-8' } },
      );
    const check = async (c: OpenAI) => {
      expect((await byBody(c)).id).toBe('chatcmpl-body-req-7');
      const chunks = await collect(await byBoth(c));
      expect(new Set(chunks.map((x) => x.id))).toEqual(new Set(['chatcmpl-header-req-8']));
    };
    await check(direct);
    await check(captured);
    await withReplay(check);
  });

  it('(d) a streamed tool call: the first delta names the function with `"arguments":""`, the argument text follows', async () => {
    const question = 'Tool call: weather in Paris?';
    const args = '{"city": "Paris", "unit": "celsius"}';
    answers.set(question, () => ({ toolCall: { name: 'get_weather', arguments: args } }));
    const tools: ChatCompletionTool[] = [
      { type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } },
    ];
    const run = (c: OpenAI) => c.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: question }], tools, stream: true });
    const fromDouble = await collect(await run(direct));
    const toolDeltas = choicesOf(fromDouble).flatMap((c) => (c.delta?.tool_calls as Json[] | undefined) ?? []);
    expect(toolDeltas[0]).toEqual({
      index: 0,
      id: expect.stringMatching(/^chatcmpl-tool-[0-9a-f]{32}$/),
      type: 'function',
      function: { name: 'get_weather', arguments: '' },
    });
    for (const later of toolDeltas.slice(1)) expect(Object.keys(later).sort()).toEqual(['function', 'index']);
    expect(toolDeltas.map((d) => (d.function as { arguments: string }).arguments).join('')).toBe(args);
    expect(choicesOf(fromDouble).at(-1)?.finish_reason).toBe('tool_calls');
    const through = await collect(await run(captured));
    expect(anyToolId(unstamped(through))).toEqual(anyToolId(unstamped(fromDouble)));

    await withReplay(async (replay) => {
      expect(unstamped(await collect(await run(replay)))).toEqual(unstamped(through));
      // Asked without streaming: the deltas folded into one message, the captured call id kept.
      const full = await replay.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: question }], tools });
      const call = full.choices[0].message.tool_calls?.[0];
      expect(call).toEqual({
        id: (choicesOf(through).flatMap((c) => (c.delta?.tool_calls as Json[] | undefined) ?? [])[0] as { id: string }).id,
        type: 'function',
        function: { name: 'get_weather', arguments: args },
      });
      expect(full.choices[0].finish_reason).toBe('tool_calls');
    });
  });

  it('(e) stop strings and stop_token_ids end the output with a non-null stop_reason (the string; the token id)', async () => {
    const stopString = oracleChat('no generation prompt');
    const stopToken = 'Stop token: say hello world';
    answers.set(lastText({ messages: stopString.messages }), () => ({ content: HELLO_LONG }));
    answers.set(stopToken, () => ({ content: HELLO_LONG }));
    const [hello, world] = oracleIds(HELLO_WORLD);

    const byString = (c: OpenAI) =>
      c.chat.completions.create(
        withExtra<ChatCompletionCreateParamsStreaming>(
          { model: MODEL, messages: stopString.messages, stream: true, stop: ['world'] },
          { return_token_ids: true, add_generation_prompt: false },
        ),
      );
    const fromDouble = await collect(await byString(direct));
    const choices = choicesOf(fromDouble);
    // The text ends before the stop string; the ids run through the token that completed it.
    expect(choices.map((c) => c.delta?.content ?? '').join('')).toBe('Hello ');
    expect(choices.flatMap((c) => c.token_ids ?? [])).toEqual([hello, world]);
    expect(choices.at(-1)).toMatchObject({ finish_reason: 'stop', stop_reason: 'world' });
    expect(fromDouble[0].prompt_token_ids).toEqual(stopString.ids);
    const through = await collect(await byString(captured));
    expect(unstamped(through)).toEqual(unstamped(fromDouble));

    const tokenParams = withExtra<CompletionCreateParamsNonStreaming>(
      { model: MODEL, prompt: stopToken, max_tokens: 20 },
      { return_token_ids: true, stop_token_ids: [world] },
    );
    const byToken = (c: OpenAI) => c.completions.create(tokenParams);
    const byTokenStreamed = (c: OpenAI) => c.completions.create({ ...tokenParams, stream: true } as CompletionCreateParamsStreaming);
    const tokenDouble = await byToken(direct);
    // The stop token is generated (in the ids), its text is not.
    expect(tokenDouble.choices[0]).toMatchObject({ text: 'Hello', finish_reason: 'stop', stop_reason: world, token_ids: [hello, world] });
    const tokenThrough = await byToken(captured);
    expect(unstamped([tokenThrough as unknown as Json])).toEqual(unstamped([tokenDouble as unknown as Json]));

    await withReplay(async (replay) => {
      expect(unstamped(await collect(await byString(replay)))).toEqual(unstamped(through));
      expect(unstamped([(await byToken(replay)) as unknown as Json])).toEqual(unstamped([tokenThrough as unknown as Json]));
      // The other shape of each, rendered from the captured tokens: same text, ids and stop_reason.
      const asFull = await replay.chat.completions.create(
        withExtra<ChatCompletionCreateParamsNonStreaming>(
          { model: MODEL, messages: stopString.messages, stop: ['world'] },
          { return_token_ids: true, add_generation_prompt: false },
        ),
      );
      expect(asFull.choices[0]).toMatchObject({ message: { content: 'Hello ' }, finish_reason: 'stop', stop_reason: 'world', token_ids: [hello, world] });
      const asStream = choicesOf(await collect(await byTokenStreamed(replay)));
      expect(asStream.map((c) => c.text).join('')).toBe('Hello');
      expect(asStream.flatMap((c) => c.token_ids ?? [])).toEqual([hello, world]);
      expect(asStream.at(-1)).toMatchObject({ finish_reason: 'stop', stop_reason: world });
    });
  });

  it('(f) an aborted request: chat finishes with "abort" (stop_reason null); a completion abort is vLLM\'s 400, never replayed', async () => {
    const chat = 'Abort me after two tokens';
    const completion = 'Abort this completion';
    for (const text of [chat, completion]) answers.set(text, () => ({ content: HELLO_LONG, abortAfterTokens: 2 }));
    const streamed = (c: OpenAI) =>
      c.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: chat }], stream: true, stream_options: { include_usage: true } });
    const fromDouble = await collect(await streamed(direct));
    const choices = choicesOf(fromDouble);
    expect(choices.map((c) => c.delta?.content ?? '').join('')).toBe(HELLO_WORLD);
    expect(choices.at(-1)).toMatchObject({ finish_reason: 'abort', stop_reason: null });
    expect((fromDouble.at(-1)!.usage as { completion_tokens: number }).completion_tokens).toBe(oracleIds(HELLO_WORLD).length);
    const through = await collect(await streamed(captured));
    expect(unstamped(through)).toEqual(unstamped(fromDouble));

    const whole = (c: OpenAI) =>
      c.chat.completions.create(
        withExtra<ChatCompletionCreateParamsNonStreaming>({ model: MODEL, messages: [{ role: 'user', content: chat }] }, { return_token_ids: true }),
      );
    const wholeDouble = await whole(direct);
    expect(wholeDouble.choices[0]).toMatchObject({
      message: { content: HELLO_WORLD },
      finish_reason: 'abort',
      stop_reason: null,
      token_ids: oracleIds(HELLO_WORLD),
    });
    const wholeThrough = await whole(captured);
    expect(unstamped([wholeThrough as unknown as Json])).toEqual(unstamped([wholeDouble as unknown as Json]));

    const abortedCompletion = async (c: OpenAI) => {
      const err = (await c.completions.create({ model: MODEL, prompt: completion, max_tokens: 8 }).then(
        () => null,
        (e: unknown) => e,
      )) as APIError;
      return { status: err.status, error: err.error };
    };
    const refusal = await abortedCompletion(direct);
    // serving_completion.py: `return self.create_error_response(str(output.stop_reason))` with stop_reason None.
    expect(refusal).toEqual({ status: 400, error: { message: 'None', type: 'BadRequestError', param: null, code: 400 } });
    expect(await abortedCompletion(captured)).toEqual(refusal);

    await withReplay(async (replay) => {
      expect(unstamped(await collect(await streamed(replay)))).toEqual(unstamped(through));
      expect(unstamped([(await whole(replay)) as unknown as Json])).toEqual(unstamped([wholeThrough as unknown as Json]));
      expect((await abortedCompletion(replay)).status).toBe(404);
    });
  });

  it('(g) an error inside a 200 stream: `data: {"error": …}` (json.dumps spacing) then [DONE], passed on byte for byte', async () => {
    const prompt = 'Break the stream after two tokens';
    const message = 'scripted engine failure';
    answers.set(prompt, () => ({ content: HELLO_LONG, streamError: { afterTokens: 2, message } }));
    const body = JSON.stringify({ model: MODEL, prompt, max_tokens: 8, stream: true });
    const raw = (url: string) =>
      fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body }).then(async (r) => ({
        status: r.status,
        text: await r.text(),
      }));
    const fromDouble = await raw(upstream.url);
    expect(fromDouble.status).toBe(200);
    const events = fromDouble.text.split('\n\n').filter(Boolean);
    expect(events.slice(-2)).toEqual([`data: {"error": {"message": "${message}", "type": "BadRequestError", "param": null, "code": 400}}`, 'data: [DONE]']);
    expect(
      events
        .slice(0, -2)
        .map((e) => (JSON.parse(e.slice(6)) as { choices: Choice[] }).choices[0].text)
        .join(''),
    ).toBe(HELLO_WORLD);
    const through = await raw(`http://127.0.0.1:${capture.port}`);
    expect(through.status).toBe(200);
    expect(through.text.replace(/"id":"cmpl-[0-9a-f]+","object":"text_completion","created":\d+/g, '')).toBe(
      fromDouble.text.replace(/"id":"cmpl-[0-9a-f]+","object":"text_completion","created":\d+/g, ''),
    );

    // The openai client reads the same tokens, then raises the event's error.
    const viaClient = async (c: OpenAI) => {
      const seen: string[] = [];
      const err = await (async () => {
        for await (const chunk of await c.completions.create({ model: MODEL, prompt, max_tokens: 8, stream: true })) seen.push(chunk.choices[0].text);
      })().then(
        () => null,
        (e: unknown) => e,
      );
      return { seen, message: (err as APIError).message };
    };
    expect(await viaClient(captured)).toEqual(await viaClient(direct));
    expect((await viaClient(direct)).message).toContain(message);

    // A stream that ended in an error is stored as failed: a replay does not answer from it (docs/capture.md: never replayed).
    await withReplay(async (replay) => {
      const miss = await replay.completions.create({ model: MODEL, prompt, max_tokens: 8, stream: true }).then(
        () => null,
        (e: unknown) => e,
      );
      expect((miss as APIError).status).toBe(404);
    });
  });

  it('(h) n > 1: choices 0..n-1 streamed interleaved, usage summed over the choices', async () => {
    const chat = oracleChat('Why?');
    const texts = [HELLO_WORLD, "don't can't I'm we'll they're", '\t\tindented'];
    answers.set(lastText({ messages: chat.messages }), (choice) => ({ content: texts[choice] }));
    const completionPrompt = 'Two samples of this completion';
    answers.set(completionPrompt, (choice) => ({ content: texts[choice] }));
    const perChoice = texts.map((t) => oracleIds(t).length + 1);

    const streamed = (c: OpenAI) =>
      c.chat.completions.create(
        withExtra<ChatCompletionCreateParamsStreaming>(
          { model: MODEL, messages: chat.messages, n: 3, stream: true, stream_options: { include_usage: true } },
          { return_token_ids: true },
        ),
      );
    const fromDouble = await collect(await streamed(direct));
    const choices = choicesOf(fromDouble);
    // One role chunk per choice, then one token of each unfinished choice per engine step.
    expect(choices.slice(0, 3).map((c) => c.index)).toEqual([0, 1, 2]);
    expect(choices.slice(3, 9).map((c) => c.index)).toEqual([0, 1, 2, 0, 1, 2]);
    texts.forEach((t, i) => {
      const own = choices.filter((c) => c.index === i);
      expect(own.flatMap((c) => c.token_ids ?? [])).toEqual([...oracleIds(t), IM_END]);
      expect(own.map((c) => c.delta?.content ?? '').join('')).toBe(t);
      expect(own.at(-1)?.finish_reason).toBe('stop');
    });
    const completionTokens = perChoice.reduce((a, b) => a + b, 0);
    expect(fromDouble.at(-1)).toMatchObject({
      choices: [],
      usage: { prompt_tokens: chat.ids.length, completion_tokens: completionTokens, total_tokens: chat.ids.length + completionTokens },
    });
    const through = await collect(await streamed(captured));
    expect(unstamped(through)).toEqual(unstamped(fromDouble));

    const two = (c: OpenAI) => c.completions.create({ model: MODEL, prompt: completionPrompt, n: 2, max_tokens: 32 });
    const twoDouble = await two(direct);
    expect(twoDouble.choices.map((c) => [c.index, c.text])).toEqual([
      [0, texts[0]],
      [1, texts[1]],
    ]);
    expect(twoDouble.usage?.completion_tokens).toBe(perChoice[0] + perChoice[1]);
    const twoThrough = await two(captured);
    expect(unstamped([twoThrough as unknown as Json])).toEqual(unstamped([twoDouble as unknown as Json]));

    await withReplay(async (replay) => {
      expect(unstamped(await collect(await streamed(replay)))).toEqual(unstamped(through));
      expect(unstamped([(await two(replay)) as unknown as Json])).toEqual(unstamped([twoThrough as unknown as Json]));
    });
  });
});

describe("the double's knobs for a new build's regressions: one thing changed, the output ids as before", () => {
  const builds: Upstream[] = [];
  afterAll(async () => {
    await Promise.all(builds.map((b) => b.close()));
  });
  /** A double with this regression, and the openai client of it. */
  async function newBuild(options: UpstreamOptions): Promise<{ client: OpenAI; url: string }> {
    const build = await startUpstream(scripted, options);
    builds.push(build);
    return { client: clientOf(build.url), url: build.url };
  }
  const withIds = { return_token_ids: true };
  /** The chat answer's parts a client reads, streamed or not. */
  async function chatAnswer(
    c: OpenAI,
    messages: ChatCompletionMessageParam[],
    stream: boolean,
  ): Promise<{ content: string; reasoning: string; args: string; ids: number[] }> {
    if (!stream) {
      const [choice] = (await c.chat.completions.create(withExtra<ChatCompletionCreateParamsNonStreaming>({ model: MODEL, messages }, withIds)))
        .choices as unknown as {
        message: { content: string | null; reasoning_content: string | null; tool_calls: { function: { arguments: string } }[] };
        token_ids: number[];
      }[];
      return {
        content: choice.message.content ?? '',
        reasoning: choice.message.reasoning_content ?? '',
        args: choice.message.tool_calls.map((t) => t.function.arguments).join(''),
        ids: choice.token_ids,
      };
    }
    const choices = choicesOf(
      await collect(await c.chat.completions.create(withExtra<ChatCompletionCreateParamsStreaming>({ model: MODEL, messages, stream: true }, withIds))),
    );
    const text = (key: string) => choices.map((ch) => (typeof ch.delta?.[key] === 'string' ? ch.delta[key] : '')).join('');
    const args = choices
      .flatMap((ch) => (ch.delta?.tool_calls as { function: { arguments: string } }[] | undefined) ?? [])
      .map((t) => t.function.arguments)
      .join('');
    return { content: text('content'), reasoning: text('reasoning_content'), args, ids: choices.flatMap((ch) => ch.token_ids ?? []) };
  }

  it('tokenizerIdChanges: the new id where Qwen3 gives the original, in prompt_token_ids (chat and text prompts) and /tokenize; usage as before', async () => {
    // Beyond Qwen3's tokenizer (its last id is 151668): a special token the new build numbers differently.
    const NEW_IM_START = 151669;
    const changed = (ids: number[]) => ids.map((id) => (id === IM_START ? NEW_IM_START : id));
    const { client, url } = await newBuild({ tokenizerIdChanges: { [IM_START]: NEW_IM_START } });
    const chat = oracleChat('Hi there');
    answers.set(lastText({ messages: chat.messages }), () => ({ content: HELLO_WORLD }));
    answers.set(TURN, () => ({ content: HELLO_WORLD }));
    answers.set(oracleIds(TURN).join(','), () => ({ content: HELLO_WORLD }));
    expect(changed(chat.ids)).not.toEqual(chat.ids);

    const full = await client.chat.completions.create(withExtra<ChatCompletionCreateParamsNonStreaming>({ model: MODEL, messages: chat.messages }, withIds));
    expect((full as unknown as { prompt_token_ids: number[] }).prompt_token_ids).toEqual(changed(chat.ids));
    expect(full.usage?.prompt_tokens).toBe(chat.ids.length);
    expect(full.choices[0].message.content).toBe(HELLO_WORLD);
    const streamed = await collect(
      await client.chat.completions.create(withExtra<ChatCompletionCreateParamsStreaming>({ model: MODEL, messages: chat.messages, stream: true }, withIds)),
    );
    expect(streamed[0].prompt_token_ids).toEqual(changed(chat.ids));

    const completion = await client.completions.create(withExtra<CompletionCreateParamsNonStreaming>({ model: MODEL, prompt: TURN, max_tokens: 4 }, withIds));
    expect((completion.choices[0] as unknown as { prompt_token_ids: number[] }).prompt_token_ids).toEqual(changed(oracleIds(TURN)));
    // A token-id prompt meets no tokenizer: as sent.
    const asIds = await client.completions.create(
      withExtra<CompletionCreateParamsNonStreaming>({ model: MODEL, prompt: oracleIds(TURN), max_tokens: 4 }, withIds),
    );
    expect((asIds.choices[0] as unknown as { prompt_token_ids: number[] }).prompt_token_ids).toEqual(oracleIds(TURN));

    const tokenize = await fetch(`${url}/tokenize`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, messages: chat.messages }),
    });
    expect(((await tokenize.json()) as { tokens: number[] }).tokens).toEqual(changed(chat.ids));
  });

  it('detokenize: the same output ids, other content and completion text, streamed or not; reasoning and tool arguments untouched', async () => {
    // A detokenizer that leaves SentencePiece's word marks in place of spaces.
    const { client } = await newBuild({ detokenize: (piece) => piece.replaceAll(' ', '\u2581') });
    const messages: ChatCompletionMessageParam[] = [{ role: 'user', content: 'Detokenize: think, call, answer' }];
    const args = '{"city": "Paris"}';
    answers.set(lastText({ messages }), () => ({
      reasoning: 'Let me think about it',
      toolCall: { name: 'get_weather', arguments: args },
      content: HELLO_WORLD,
    }));
    for (const stream of [false, true]) {
      const before = await chatAnswer(direct, messages, stream);
      const after = await chatAnswer(client, messages, stream);
      expect(after).toEqual({ ...before, content: 'Hello\u2581world' });
      expect(after.ids.slice(-3)).toEqual([...oracleIds(HELLO_WORLD), IM_END]);
      expect([after.reasoning, after.args]).toEqual(['Let me think about it', args]);
    }
    const prompt = 'Detokenize this completion';
    answers.set(prompt, () => ({ content: HELLO_WORLD }));
    const completion = await client.completions.create(withExtra<CompletionCreateParamsNonStreaming>({ model: MODEL, prompt, max_tokens: 8 }, withIds));
    expect(completion.choices[0]).toMatchObject({ text: 'Hello\u2581world', token_ids: [...oracleIds(HELLO_WORLD), IM_END] });
    const streamed = choicesOf(
      await collect(
        await client.completions.create(withExtra<CompletionCreateParamsStreaming>({ model: MODEL, prompt, max_tokens: 8, stream: true }, withIds)),
      ),
    );
    expect(streamed.map((c) => c.text).join('')).toBe('Hello\u2581world');
    expect(streamed.flatMap((c) => c.token_ids ?? [])).toEqual([...oracleIds(HELLO_WORLD), IM_END]);
  });

  it('toolArguments: the same output ids, another arguments string, streamed or not', async () => {
    // A parser that re-serializes the arguments without spaces.
    const { client } = await newBuild({ toolArguments: (args) => JSON.stringify(JSON.parse(args)) });
    const messages: ChatCompletionMessageParam[] = [{ role: 'user', content: 'Tool parser: weather in Paris?' }];
    answers.set(lastText({ messages }), () => ({ toolCall: { name: 'get_weather', arguments: '{"city": "Paris", "unit": "celsius"}' } }));
    for (const stream of [false, true]) {
      const before = await chatAnswer(direct, messages, stream);
      const after = await chatAnswer(client, messages, stream);
      expect(before.args).toBe('{"city": "Paris", "unit": "celsius"}');
      expect(after).toEqual({ ...before, args: '{"city":"Paris","unit":"celsius"}' });
    }
  });
});
