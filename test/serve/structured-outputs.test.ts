/**
 * Structured outputs (#35): the built CLI in random mode and in its default simulate mode answers every form vLLM
 * 0.11 accepts (`response_format` json_schema / json_object, `structured_outputs`, the deprecated `guided_*`) with
 * output the constraint accepts, read by the official `openai` client. The oracle is Ajv (a maintained JSON-schema
 * validator, with ajv-formats for `format`), JSON.parse, and the request's own choices and regexes.
 */
import { mkdtempSync } from 'node:fs';
import { join } from 'node:path';
import { Ajv2020 } from 'ajv/dist/2020.js';
import addFormatsModule from 'ajv-formats';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mockerProcesses } from '../support/mockerProcess.js';
import { prng } from '../support/prng.js';
import { testTmpdir } from '../support/tempRoot.js';

// ajv-formats is CommonJS: its module.exports is the plugin its types name `default`.
const addFormats = addFormatsModule as unknown as typeof addFormatsModule.default;
const ajv = new Ajv2020({ strict: false });
addFormats(ajv);

const MODEL = 'Qwen/Qwen3-0.6B';
const mockers = mockerProcesses();
afterAll(mockers.stopAll);

const openai = (url: string) => new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0 });

const PERSON = {
  type: 'object',
  properties: {
    name: { type: 'string', minLength: 2, maxLength: 12 },
    age: { type: 'integer', minimum: 0, maximum: 120 },
    email: { type: 'string', format: 'email' },
    tags: { type: 'array', items: { enum: ['a', 'b', 'c'] }, minItems: 1, maxItems: 3 },
    address: { $ref: '#/$defs/address' },
  },
  required: ['name', 'age', 'email', 'tags', 'address'],
  additionalProperties: false,
  $defs: {
    address: {
      type: 'object',
      properties: { city: { type: 'string' }, zip: { type: 'string', pattern: '^[0-9]{5}$' } },
      required: ['city', 'zip'],
      additionalProperties: false,
    },
  },
};

const messages = [{ role: 'user' as const, content: 'Describe a person as JSON.' }];

/** A streamed chat's content, finish reason and completion tokens. */
async function streamed(client: OpenAI, body: Record<string, unknown>): Promise<{ content: string; finish: string | null; tokens: number }> {
  const stream = await client.chat.completions.create({
    model: MODEL,
    messages,
    ...body,
    stream: true,
    stream_options: { include_usage: true },
  } as OpenAI.ChatCompletionCreateParamsStreaming);
  let content = '';
  let finish: string | null = null;
  let tokens = 0;
  for await (const chunk of stream) {
    if (chunk.usage) tokens = chunk.usage.completion_tokens;
    const choice = chunk.choices[0];
    if (!choice) continue;
    content += choice.delta.content ?? '';
    finish = choice.finish_reason ?? finish;
  }
  return { content, finish, tokens };
}

function expectValid(schema: object, text: string): void {
  const validate = ajv.compile(schema);
  const value: unknown = JSON.parse(text);
  expect(validate(value), `${text}\n${JSON.stringify(validate.errors)}`).toBe(true);
}

describe.each([
  ['random', ['--mode', 'random', '--timing', 'none']],
  ['simulate (the default, every prompt a miss)', []],
])('structured outputs in %s mode', (_mode, flags) => {
  let client: OpenAI;
  beforeAll(async () => {
    const dir = mkdtempSync(join(testTmpdir(), 'mocker-structured-'));
    client = openai((await mockers.start(['serve', ...flags, '--captures', join(dir, 'none.db')])).url);
  });

  it('response_format json_schema: the answer parses and validates, streamed too; EOS ends it (finish_reason stop)', async () => {
    for (let seed = 0; seed < 5; seed++) {
      const body = { response_format: { type: 'json_schema', json_schema: { name: 'person', schema: PERSON, strict: true } }, seed };
      const completion = await client.chat.completions.create({ model: MODEL, messages, ...body } as OpenAI.ChatCompletionCreateParamsNonStreaming);
      expect(completion.choices[0].finish_reason).toBe('stop');
      expectValid(PERSON, completion.choices[0].message.content!);
      const stream = await streamed(client, body);
      expect(stream.finish).toBe('stop');
      expect(stream.content).toBe(completion.choices[0].message.content);
      expect(stream.tokens).toBe(completion.usage!.completion_tokens);
    }
  });

  it('response_format json_object: some JSON object, streamed too', async () => {
    const completion = await client.chat.completions.create({ model: MODEL, messages, response_format: { type: 'json_object' } });
    expect(completion.choices[0].finish_reason).toBe('stop');
    const value: unknown = JSON.parse(completion.choices[0].message.content!);
    expect(typeof value === 'object' && value !== null && !Array.isArray(value)).toBe(true);
    const stream = await streamed(client, { response_format: { type: 'json_object' }, seed: 4 });
    expect(stream.finish).toBe('stop');
    expect(JSON.parse(stream.content)).toBeTypeOf('object');
  });

  it('an answer that does not fit max_tokens ends by length after max_tokens tokens: the start of what a larger max_tokens gets (same seed)', async () => {
    const body = { response_format: { type: 'json_schema', json_schema: { name: 'person', schema: PERSON } }, seed: 1 };
    const full = await client.chat.completions.create({ model: MODEL, messages, ...body, max_tokens: 400 } as OpenAI.ChatCompletionCreateParamsNonStreaming);
    expect(full.choices[0].finish_reason).toBe('stop');
    const cut = await client.chat.completions.create({ model: MODEL, messages, ...body, max_tokens: 6 } as OpenAI.ChatCompletionCreateParamsNonStreaming);
    expect(cut.choices[0].finish_reason).toBe('length');
    expect(cut.usage!.completion_tokens).toBe(6);
    expect(full.choices[0].message.content!.startsWith(cut.choices[0].message.content!)).toBe(true);
    expect(() => JSON.parse(cut.choices[0].message.content!)).toThrow();
  });
});

describe('choice and regex, in every spelling vLLM 0.11 accepts, chats and completions (random mode)', () => {
  let client: OpenAI;
  beforeAll(async () => {
    client = openai((await mockers.start(['serve', '--mode', 'random', '--timing', 'none'])).url);
  });
  /** The 400 a request with `body` gets: its message. */
  const refused = async (body: Record<string, unknown>) => {
    const error = await client.chat.completions.create({ model: MODEL, messages, ...body } as OpenAI.ChatCompletionCreateParamsNonStreaming).then(
      () => null,
      (err: unknown) => err,
    );
    expect(error).toBeInstanceOf(OpenAI.BadRequestError);
    return (error as InstanceType<typeof OpenAI.BadRequestError>).message;
  };
  const CHOICES = ['positive', 'negative', 'neutral'];
  const REGEX = '[A-Z]{3}-\\d{2,4}(x|yz)?';
  const whole = new RegExp(`^(?:${REGEX})$`);

  it('choice: one of the choices (structured_outputs.choice and guided_choice)', async () => {
    const seen = new Set<string>();
    for (let seed = 0; seed < 12; seed++) {
      for (const extra of [{ structured_outputs: { choice: CHOICES } }, { guided_choice: CHOICES }]) {
        const chat = await client.chat.completions.create({ model: MODEL, messages, seed, ...extra } as OpenAI.ChatCompletionCreateParamsNonStreaming);
        expect(CHOICES).toContain(chat.choices[0].message.content);
        expect(chat.choices[0].finish_reason).toBe('stop');
        seen.add(chat.choices[0].message.content!);
        const completion = await client.completions.create({ model: MODEL, prompt: 'Sentiment:', seed, ...extra } as OpenAI.CompletionCreateParamsNonStreaming);
        expect(CHOICES).toContain(completion.choices[0].text);
      }
    }
    // A draw, not always the first choice.
    expect(seen.size).toBeGreaterThan(1);
  });

  it('regex: a string the whole regex matches (structured_outputs.regex and guided_regex), streamed too', async () => {
    for (let seed = 0; seed < 12; seed++) {
      for (const extra of [{ structured_outputs: { regex: REGEX } }, { guided_regex: REGEX }]) {
        const chat = await client.chat.completions.create({ model: MODEL, messages, seed, ...extra } as OpenAI.ChatCompletionCreateParamsNonStreaming);
        expect(chat.choices[0].message.content).toMatch(whole);
        const completion = await client.completions.create({
          model: MODEL,
          prompt: 'Code:',
          seed,
          max_tokens: 64,
          ...extra,
        } as OpenAI.CompletionCreateParamsNonStreaming);
        expect(completion.choices[0].text).toMatch(whole);
        expect(completion.choices[0].finish_reason).toBe('stop');
      }
      expect((await streamed(client, { seed, guided_regex: REGEX })).content).toMatch(whole);
    }
  });

  it('completions take response_format and guided_json too', async () => {
    const schema = { type: 'object', properties: { ok: { type: 'boolean' }, n: { type: 'integer', minimum: 5, maximum: 9 } }, required: ['ok', 'n'] };
    for (const extra of [
      { response_format: { type: 'json_schema', json_schema: { name: 's', schema } } },
      { guided_json: schema },
      { guided_json: JSON.stringify(schema) },
      { structured_outputs: { json: schema } },
    ]) {
      const completion = await client.completions.create({
        model: MODEL,
        prompt: 'JSON:',
        max_tokens: 64,
        ...extra,
      } as OpenAI.CompletionCreateParamsNonStreaming);
      expect(completion.choices[0].finish_reason).toBe('stop');
      expectValid(schema, completion.choices[0].text);
    }
  });

  it('a grammar, several kinds at once, or a schema keyword mocker cannot honour: a 400 naming it', async () => {
    expect(await refused({ guided_grammar: 'root ::= "a"' })).toContain('guided_grammar');
    expect(await refused({ structured_outputs: { grammar: 'root ::= "a"' } })).toContain('structured_outputs.grammar');
    expect(await refused({ structured_outputs: { regex: 'a', choice: ['a'] } })).toContain(
      "You can only use one kind of constraints for structured outputs ('json', 'regex' or 'choice').",
    );
    expect(await refused({ guided_regex: 'a', guided_choice: ['a'] })).toContain('You can only use one kind of structured outputs constraint');
    expect(
      await refused({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', not: { required: ['a'] } } } } }),
    ).toContain('`not`');
    expect(await refused({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', format: 'iri' } } } })).toContain(
      'format',
    );
    // One randexp cannot honour; one whose shortest string outgrows even the largest budget (256 KiB).
    expect(await refused({ structured_outputs: { regex: '(?=b)a' } })).toContain('(?=b)a');
    expect(await refused({ guided_regex: 'a{300000}' })).toContain('max_tokens');
    // Longer than max_tokens × 8 characters but within the largest budget: written until max_tokens stops it, as vLLM's model.
    const cut = await client.chat.completions.create({
      model: MODEL,
      messages,
      max_tokens: 10,
      guided_regex: 'a{100}',
    } as OpenAI.ChatCompletionCreateParamsNonStreaming);
    expect(cut.choices[0].finish_reason).toBe('length');
    expect(cut.choices[0].message.content).toMatch(/^a+$/);
    // Classes beyond ASCII are drawn from (randexp alone draws within printable ASCII, so nothing).
    const cyrillic = await client.chat.completions.create({
      model: MODEL,
      messages,
      max_tokens: 32,
      guided_regex: '[а-я]{3}-[À-ÿ]',
    } as OpenAI.ChatCompletionCreateParamsNonStreaming);
    expect(cyrillic.choices[0].message.content).toMatch(/^[а-я]{3}-[À-ÿ]$/);
  });

  it('hostile constraints are refused or cut before they cost more than the budget: catastrophic regexes, back-references, exponential allOf, bad $ref', async () => {
    // A draw that ignores the lookahead or boundary, tested against the whole regex, backtracks exponentially.
    expect(await refused({ guided_regex: '(a+)+(?=b)' })).toContain('lookarounds');
    expect(await refused({ guided_regex: '(a+)+\\B' })).toContain('word boundaries');
    // A back-reference re-emits its group: 8,000 of a 60,000-character group escape any budget.
    expect(await refused({ guided_regex: `(a{60000})${'\\1'.repeat(8000)}` })).toContain('back-references');
    expect(await refused({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { $ref: '#/%' } } } })).toContain('$ref');
    // 31 levels of allOf over two $refs to the next level: 2^31 resolutions of a small schema, cut by the budget.
    const $defs: Record<string, unknown> = { a31: { type: 'string' } };
    for (let i = 0; i < 31; i++) $defs[`a${i}`] = { allOf: [{ $ref: `#/$defs/a${i + 1}` }, { $ref: `#/$defs/a${i + 1}` }] };
    const deep = await client.chat.completions.create({
      model: MODEL,
      messages,
      max_tokens: 16,
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { $ref: '#/$defs/a0', $defs } } },
    });
    expect(deep.choices[0].finish_reason).toBe('length');
  });

  it('never answers a value its schema refuses: uniqueItems ends the array before a repeat, a pattern its lengths exclude is a 400', async () => {
    const booleans = { type: 'array', items: { type: 'boolean' }, uniqueItems: true, maxItems: 3 };
    for (let seed = 0; seed < 24; seed++) {
      const answer = await client.chat.completions.create({
        model: MODEL,
        messages,
        seed,
        max_tokens: 64,
        response_format: { type: 'json_schema', json_schema: { name: 'flags', schema: booleans } },
      });
      expectValid(booleans, answer.choices[0].message.content!);
    }
    expect(
      await refused({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', pattern: '^[a-z]+$', minLength: 40 } } } }),
    ).toContain('minLength/maxLength with pattern');
  });

  it('tool_choice auto never reads the schema (as vLLM): a keyword mocker cannot honour is no 400, the call is drawn unconstrained', async () => {
    const calling = openai((await mockers.start(['serve', '--mode', 'random', '--timing', 'none', '--tool-call-rate', '1'])).url);
    const tools = [{ type: 'function' as const, function: { name: 'lookup', parameters: { type: 'object', not: { required: ['q'] } } } }];
    for (let seed = 0; seed < 4; seed++) {
      const answer = await calling.chat.completions.create({ model: MODEL, messages, tools, seed });
      expect(answer.choices[0].message.tool_calls?.[0]).toEqual(
        expect.objectContaining({ type: 'function', function: expect.objectContaining({ name: 'lookup' }) }),
      );
    }
  });

  it('tools offered with tool_choice auto (every answer a call at --tool-call-rate 1): the constraint holds the answer, no call', async () => {
    const calling = openai((await mockers.start(['serve', '--mode', 'random', '--timing', 'none', '--tool-call-rate', '1'])).url);
    const tools = [
      { type: 'function' as const, function: { name: 'lookup', parameters: { type: 'object', properties: { q: { type: 'string' } }, required: ['q'] } } },
    ];
    const free = await calling.chat.completions.create({ model: MODEL, messages, tools });
    expect(free.choices[0].message.tool_calls?.length).toBe(1);
    const constrained = await calling.chat.completions.create({
      model: MODEL,
      messages,
      tools,
      n: 3,
      response_format: { type: 'json_schema', json_schema: { name: 'person', schema: PERSON } },
    });
    for (const choice of constrained.choices) {
      expect(choice.message.tool_calls ?? []).toEqual([]);
      expectValid(PERSON, choice.message.content!);
    }
    // n choices draw n answers.
    expect(new Set(constrained.choices.map((c) => c.message.content)).size).toBe(3);
  });

  it('with --reasoning, the thinking span comes first and the content is the constrained answer', async () => {
    const thinking = openai(
      (await mockers.start(['serve', '--mode', 'random', '--timing', 'none', '--reasoning', '{"thinking_ratio":0.3}', '--wire', 'vllm-0.11'])).url,
    );
    const completion = await thinking.chat.completions.create({
      model: MODEL,
      messages,
      response_format: { type: 'json_schema', json_schema: { name: 'person', schema: PERSON } },
    } as OpenAI.ChatCompletionCreateParamsNonStreaming);
    const message = completion.choices[0].message as OpenAI.ChatCompletionMessage & { reasoning_content?: string | null };
    expect(message.reasoning_content?.length).toBeGreaterThan(0);
    expect(completion.choices[0].finish_reason).toBe('stop');
    expectValid(PERSON, message.content!);
  });
});

/** A seeded random JSON schema from the subset vLLM's structured-output docs and backends take. */
function randomSchema(seed: number): Record<string, unknown> {
  const { next, int, pick } = prng(seed);
  const defs: Record<string, unknown> = {};
  const PATTERNS = ['^[a-z]{2,6}$', '^[A-Z][0-9]{3}$', '^(foo|bar)-\\d+$', '^\\w+@\\w+\\.org$', '^#[0-9a-f]{6}$'];
  const FORMATS = ['date-time', 'date', 'time', 'email', 'uuid', 'ipv4', 'ipv6', 'hostname', 'uri', 'duration'];
  const scalar = (): Record<string, unknown> => {
    switch (int(0, 9)) {
      case 0:
        return { type: 'string', minLength: int(0, 3), maxLength: int(3, 10) };
      case 1:
        return { type: 'string', pattern: pick(PATTERNS) };
      case 2:
        return { type: 'string', format: pick(FORMATS) };
      case 3: {
        const min = int(-50, 50);
        return next() < 0.5 ? { type: 'integer', minimum: min, maximum: min + int(0, 100) } : { type: 'integer', exclusiveMinimum: min, multipleOf: int(1, 7) };
      }
      case 4:
        return { type: 'number', minimum: int(-10, 0), exclusiveMaximum: int(1, 10) };
      case 5:
        return { enum: ['red', 'green', 42, null, true].slice(0, int(1, 5)) };
      case 6:
        return { const: pick(['fixed', 7, false, null]) };
      case 7:
        return { type: 'boolean' };
      case 8:
        return { type: ['string', 'null'], maxLength: 5 };
      default:
        return { type: 'null' };
    }
  };
  const node = (depth: number): Record<string, unknown> => {
    const roll = depth >= 3 ? 0 : int(0, 9);
    if (roll <= 3) return scalar();
    if (roll === 4) return { type: 'array', items: node(depth + 1), minItems: int(0, 2), maxItems: int(2, 4) };
    if (roll === 5) return { anyOf: [node(depth + 1), node(depth + 1)] };
    if (roll === 6) {
      const name = `d${Object.keys(defs).length}`;
      // Named before its schema is drawn, so that a nested $ref takes the next name.
      defs[name] = {};
      defs[name] = node(depth + 1);
      return { $ref: `#/$defs/${name}` };
    }
    if (roll === 7) return { allOf: [object(depth + 1, 'p', false), object(depth + 1, 'q', false)] };
    return object(depth + 1, 'k', next() < 0.5);
  };
  const object = (depth: number, prefix: string, closed: boolean): Record<string, unknown> => {
    const count = int(0, 4);
    const properties: Record<string, unknown> = {};
    for (let i = 0; i < count; i++) properties[`${prefix}${i}`] = node(depth);
    const required = Object.keys(properties).filter(() => next() < 0.6);
    return { type: 'object', properties, required, ...(closed ? { additionalProperties: false } : {}) };
  };
  const root = object(0, 'k', next() < 0.5);
  return Object.keys(defs).length > 0 ? { ...root, $defs: defs } : root;
}

describe('1,000 seeded random JSON schemas answered in random mode', () => {
  it('every answer validates against its schema (Ajv) or ends by length after max_tokens tokens', async () => {
    const client = openai((await mockers.start(['serve', '--mode', 'random', '--timing', 'none'])).url);
    const outcomes = { valid: 0, length: 0 };
    const failures: string[] = [];
    let next = 0;
    const worker = async () => {
      while (next < 1000) {
        const seed = next++;
        const schema = randomSchema(seed);
        const maxTokens = [16, 48, 160, 600][seed % 4];
        const completion = await client.chat.completions.create({
          model: MODEL,
          messages,
          seed,
          max_tokens: maxTokens,
          response_format: { type: 'json_schema', json_schema: { name: `s${seed}`, schema } },
        } as OpenAI.ChatCompletionCreateParamsNonStreaming);
        const choice = completion.choices[0];
        if (choice.finish_reason === 'length') {
          if (completion.usage!.completion_tokens !== maxTokens)
            failures.push(`seed ${seed}: length after ${completion.usage!.completion_tokens} of ${maxTokens} tokens`);
          outcomes.length++;
          continue;
        }
        const validate = ajv.compile(schema);
        let value: unknown;
        try {
          value = JSON.parse(choice.message.content!);
        } catch {
          failures.push(`seed ${seed}: not JSON: ${choice.message.content}`);
          continue;
        }
        if (choice.finish_reason === 'stop' && validate(value)) outcomes.valid++;
        else failures.push(`seed ${seed} (${choice.finish_reason}): ${JSON.stringify(schema)} -> ${choice.message.content} ${JSON.stringify(validate.errors)}`);
      }
    };
    await Promise.all(Array.from({ length: 8 }, worker));
    expect(failures.slice(0, 5)).toEqual([]);
    // Both outcomes occur: the small max_tokens cut some answers.
    expect(outcomes.valid).toBeGreaterThan(500);
    expect(outcomes.length).toBeGreaterThan(0);
  }, 300_000);
});
