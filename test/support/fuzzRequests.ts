/**
 * Fuzzed HTTP requests for vLLM's generation endpoints, and the check of what came back: either a
 * well-formed vLLM error (vllm-wire-reference.md §1.6) or a valid completion honouring the request.
 * Shared by test/fuzz/fuzz.test.ts (in-process), test/fuzz/fuzz-processes.test.ts and bench/fuzz.ts (spawned CLI).
 * Checks throw plain Errors (no vitest) so the benchmark can count them.
 */
import http from 'node:http';
import type { prng } from './prng.js';
import { MODEL } from './vllmUpstream.js';

export type Json = Record<string, unknown>;
export type Rng = ReturnType<typeof prng>;

/** How a client leaves before the answer is over. */
export type Disconnect = 'mid-upload' | 'after-head' | 'after-delay';

export interface FuzzCase {
  /** Which generator made it (for counts and failure messages). */
  kind: string;
  method: string;
  path: string;
  headers: Record<string, string>;
  body: Buffer;
  /** The parsed request, when it is a JSON object, for checking a 200 answer against it. */
  request: Json | null;
  disconnect?: Disconnect;
}

const JSON_HEADERS = { 'content-type': 'application/json' };

const WEIRD: unknown[] = [
  null,
  true,
  false,
  0,
  -1,
  1,
  2,
  7,
  1.5,
  -0.5,
  1e9,
  -1e9,
  1e308,
  2 ** 53 + 1,
  '',
  'x',
  '12',
  '\u0000',
  '日本語🚀',
  'a'.repeat(5000),
  [],
  {},
  [1, 2, 3],
  ['a', 'b'],
  [[1, 2]],
  [null],
  [{}],
  { a: 1 },
  { type: 'text' },
  [[[[[[[[1]]]]]]]],
];
const FIELDS = [
  'model',
  'prompt',
  'messages',
  'max_tokens',
  'max_completion_tokens',
  'n',
  'stream',
  'stream_options',
  'stop',
  'stop_token_ids',
  'temperature',
  'top_p',
  'top_k',
  'seed',
  'min_tokens',
  'ignore_eos',
  'logprobs',
  'echo',
  'suffix',
  'return_token_ids',
  'add_special_tokens',
  'skip_special_tokens',
  'include_stop_str_in_output',
  'chat_template',
  'chat_template_kwargs',
  'tools',
  'add_generation_prompt',
  'continue_final_message',
  'request_id',
  'user',
];
const PATHS: [string, string][] = [
  ['GET', '/v1/completions'],
  ['DELETE', '/health'],
  ['PUT', '/v1/models'],
  ['POST', '/v1/embeddings'],
  ['GET', '/nope'],
  ['POST', '/v1/chat/completions/extra'],
  ['GET', '/%E2%98%83'],
  ['POST', '/v1/completions?x=%ZZ'],
  ['PATCH', '/version'],
  ['GET', '/health?probe=1'],
];

export function validBody(kind: 'chat' | 'completion', r: Rng): Json {
  const base: Json = { model: MODEL, max_tokens: 1 + Math.floor(r.next() * 12) };
  if (kind === 'chat') base.messages = [{ role: 'user', content: r.pick(['Hi', 'Tell me a story', '日本語で', 'Emoji 🚀 please']) }];
  else base.prompt = r.pick(['Once upon a time', 'The capital of France is', [9707, 11, 1879], '🚀🚀']);
  if (r.next() < 0.4) base.stream = true;
  return base;
}

const endpointOf = (kind: 'chat' | 'completion') => (kind === 'chat' ? '/v1/chat/completions' : '/v1/completions');

/** The parsed body when it is a JSON object (the last of duplicated keys wins, as in Python's json). */
function parsedObject(body: Buffer): Json | null {
  try {
    const value: unknown = JSON.parse(body.toString('utf8'));
    return value !== null && typeof value === 'object' && !Array.isArray(value) ? (value as Json) : null;
  } catch {
    return null;
  }
}

/**
 * Structural cases: wrong paths and methods, bytes that are not a JSON object, bodies over `maxBody`, valid
 * requests with zero to three fields replaced by values of the wrong type or removed, a wrong content type.
 */
export function makeCase(r: Rng, maxBody: number): FuzzCase {
  const roll = r.next();
  if (roll < 0.08) {
    const [method, path] = r.pick(PATHS);
    return { kind: 'path', method, path, headers: JSON_HEADERS, body: Buffer.alloc(0), request: null };
  }
  const kind = r.next() < 0.5 ? 'chat' : 'completion';
  const path = endpointOf(kind);
  if (roll < 0.2) {
    // Bytes that are not a JSON object: truncated JSON, other JSON values, garbage, nothing.
    const text = JSON.stringify(validBody(kind, r));
    const body = r.pick([
      text.slice(0, Math.floor(r.next() * text.length)),
      'null',
      '[]',
      '"text"',
      '42',
      '{"a":',
      '{,}',
      '\u00ff\u00fe',
      '',
      Buffer.from(Array.from({ length: 64 }, () => Math.floor(r.next() * 256))).toString('latin1'),
    ]);
    return { kind: 'not-an-object', method: 'POST', path, headers: JSON_HEADERS, body: Buffer.from(body, 'latin1'), request: null };
  }
  if (roll < 0.23) {
    const body = Buffer.from(JSON.stringify({ ...validBody(kind, r), padding: 'x'.repeat(maxBody) }));
    return { kind: 'oversized', method: 'POST', path, headers: JSON_HEADERS, body, request: null };
  }
  const request = validBody(kind, r);
  const edits = Math.floor(r.next() * 4);
  for (let i = 0; i < edits; i++) {
    const field = r.pick(FIELDS);
    if (r.next() < 0.15) delete request[field];
    else request[field] = r.pick(WEIRD);
  }
  if (kind === 'chat' && r.next() < 0.15) request.messages = [{ role: r.pick(['user', 'system', 'assistant', 'tool', 7, null]), content: r.pick(WEIRD) }];
  const headers = r.next() < 0.05 ? { 'content-type': 'text/plain' } : JSON_HEADERS;
  return { kind: 'wrong-types', method: 'POST', path, headers, body: Buffer.from(JSON.stringify(request)), request };
}

/** Number literals at and past the limits of doubles and of 32/64-bit integers, and ones JSON does not allow. */
const HOSTILE_NUMBERS = [
  '1e999',
  '-1e999',
  '1e308',
  '-1e308',
  '5e-324',
  '1e-400',
  '-0',
  '0.0000001',
  '2147483648',
  '-2147483649',
  '4294967296',
  '9007199254740993',
  '18446744073709551616',
  '-9223372036854775809',
  '123456789012345678901234567890',
  '-1',
  '-100000',
  'NaN',
  '-NaN',
  'Infinity',
  '-Infinity',
  '+1',
  '0x10',
  '01',
  '.5',
  '1.',
  '1e',
  '--1',
];
/** JSON string contents: lone surrogates, NUL, BOM, noncharacters, bidi overrides, combining marks, special tokens. */
const HOSTILE_STRINGS = [
  '\\ud800',
  '\\udfff',
  'a\\udc00b',
  '\\ud83d\\ude80',
  '\\u0000',
  '\\ufeff',
  '\\uffff',
  '\\ufffe',
  '\u202e\u202d',
  '\u200d\u200b',
  'e\u0301\u0301\u0301',
  '🚀'.repeat(64),
  '<|im_end|>',
  '<|endoftext|><|im_start|>system',
  '<think></think>',
  '\\r\\n\\t',
  '\u2028\u2029',
  '𝔘𝔫𝔦𝔠𝔬𝔡𝔢',
  '\\"\\\\',
  '%s%n{0}',
  '',
];
/** Raw bytes that are not valid UTF-8 (overlong, surrogate, past U+10FFFF, truncated, stray). */
const INVALID_UTF8 = [[0xc0, 0xaf], [0xed, 0xa0, 0x80], [0xf4, 0x90, 0x80, 0x80], [0xff], [0xe2, 0x82], [0x80], [0xf8, 0x88, 0x80, 0x80, 0x80]];

/** JSON text (or nearly) of one hostile value; `budget` bounds giant strings and nesting in bytes. */
function hostileValue(r: Rng, budget: number, depth = 0): string {
  const roll = r.next();
  if (roll < 0.25) return r.pick(HOSTILE_NUMBERS);
  if (roll < 0.45) return `"${r.pick(HOSTILE_STRINGS)}${r.pick(HOSTILE_STRINGS)}"`;
  if (roll < 0.6) return JSON.stringify(r.pick(WEIRD));
  if (roll < 0.66) {
    // A giant string: of one character, of emoji, of words that tokenize one by one.
    const size = r.int(1, Math.max(1, Math.floor(budget / 4)));
    return `"${r.pick(['x', '🚀', ' token', '日本'])}`.padEnd(size, r.pick(['x', 'y z'])) + '"';
  }
  if (roll < 0.74) {
    // Deep nesting, up to what fits the budget.
    const levels = Math.min(r.pick([16, 256, 5000, 100_000]), Math.floor(budget / 6));
    return r.next() < 0.5 ? '['.repeat(levels) + ']'.repeat(levels) : '{"a":'.repeat(levels) + '1' + '}'.repeat(levels);
  }
  if (depth < 2 && roll < 0.87) return `[${Array.from({ length: r.int(0, 4) }, () => hostileValue(r, budget / 4, depth + 1)).join(',')}]`;
  if (depth < 2) return `{${Array.from({ length: r.int(0, 3) }, () => `"${r.pick(FIELDS)}":${hostileValue(r, budget / 4, depth + 1)}`).join(',')}}`;
  return r.pick(['null', 'true', '0', '""']);
}

/** A chat message made of hostile parts: roles, content parts, extra fields. */
function hostileMessage(r: Rng, budget: number): string {
  const role = r.next() < 0.7 ? JSON.stringify(r.pick(['user', 'system', 'assistant', 'tool', 'developer'])) : hostileValue(r, budget);
  const content =
    r.next() < 0.5 ? hostileValue(r, budget) : `[{"type":${r.next() < 0.7 ? '"text"' : hostileValue(r, budget)},"text":${hostileValue(r, budget)}}]`;
  const extra = r.next() < 0.3 ? `,"${r.pick(['name', 'tool_calls', 'tool_call_id', 'reasoning_content', 'role'])}":${hostileValue(r, budget)}` : '';
  return `{"role":${role},"content":${content}${extra}}`;
}

/**
 * Grammar-based cases: a valid request's shape with one to four fields given hostile values (limits of
 * numbers, wrong types, unicode edge cases, deep nesting, giant strings), duplicated keys, hostile messages,
 * and sometimes raw bytes that are not UTF-8 inside a string.
 */
export function makeHostileCase(r: Rng, maxBody: number): FuzzCase {
  const kind = r.next() < 0.5 ? 'chat' : 'completion';
  const entries: [string, string][] = Object.entries(validBody(kind, r)).map(([k, v]) => [k, JSON.stringify(v)]);
  const budget = r.next() < 0.1 ? maxBody * 1.2 : 2048;
  const edits = r.int(1, 4);
  for (let i = 0; i < edits; i++) {
    const roll = r.next();
    const value =
      kind === 'chat' && roll < 0.2 ? `[${Array.from({ length: r.int(1, 3) }, () => hostileMessage(r, budget)).join(',')}]` : hostileValue(r, budget);
    const field = kind === 'chat' && roll < 0.2 ? 'messages' : r.pick(FIELDS);
    // A duplicated key keeps the first value in the text: which one wins is the parser's choice.
    if (roll > 0.8) entries.push([field, value]);
    else {
      const at = entries.findIndex(([k]) => k === field);
      if (at >= 0) entries[at] = [field, value];
      else entries.push([field, value]);
    }
  }
  const text = `{${entries.map(([k, v]) => `"${k}":${v}`).join(r.pick([',', ' , ', ',\n']))}}`;
  let body = Buffer.from(text, 'utf8');
  if (r.next() < 0.1) {
    // Invalid UTF-8 inside the first string value.
    const at = body.indexOf('"', body.indexOf(':')) + 1;
    if (at > 0) body = Buffer.concat([body.subarray(0, at), Buffer.from(r.pick(INVALID_UTF8)), body.subarray(at)]);
  }
  if (r.next() < 0.05) body = Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), body]);
  return { kind: 'grammar', method: 'POST', path: endpointOf(kind), headers: JSON_HEADERS, body, request: parsedObject(body) };
}

const INTERESTING_BYTES = [0x22, 0x5c, 0x7b, 0x7d, 0x5b, 0x5d, 0x2c, 0x3a, 0x00, 0xff, 0x30, 0x2d, 0x65, 0x0a];

/** Byte-level mutations of a valid body: flipped bits, random or structural bytes, deleted or repeated ranges. */
export function makeMutatedCase(r: Rng): FuzzCase {
  const kind = r.next() < 0.5 ? 'chat' : 'completion';
  let body = Buffer.from(JSON.stringify(validBody(kind, r)));
  const mutations = r.int(1, 6);
  for (let i = 0; i < mutations; i++) {
    const at = r.int(0, Math.max(0, body.length - 1));
    const end = Math.min(body.length, at + r.int(1, 16));
    const roll = r.next();
    if (roll < 0.25) {
      body = Buffer.from(body);
      body[at] ^= 1 << r.int(0, 7);
    } else if (roll < 0.45) {
      body = Buffer.from(body);
      body[at] = r.next() < 0.5 ? r.pick(INTERESTING_BYTES) : r.int(0, 255);
    } else if (roll < 0.6) body = Buffer.concat([body.subarray(0, at), Buffer.from([r.pick(INTERESTING_BYTES)]), body.subarray(at)]);
    else if (roll < 0.75) body = Buffer.concat([body.subarray(0, at), body.subarray(end)]);
    else if (roll < 0.9) body = Buffer.concat([body.subarray(0, end), body.subarray(at, end), body.subarray(end)]);
    else body = body.subarray(0, at);
  }
  return { kind: 'mutation', method: 'POST', path: endpointOf(kind), headers: JSON_HEADERS, body, request: parsedObject(body) };
}

/** The mix the spawned-process fuzzing uses: structural, grammar-based and byte-mutated cases; some clients leave early. */
export function makeProcessFuzzCase(r: Rng, maxBody: number): FuzzCase {
  const roll = r.next();
  const c = roll < 0.3 ? makeCase(r, maxBody) : roll < 0.7 ? makeHostileCase(r, maxBody) : makeMutatedCase(r);
  if (r.next() < 0.06) c.disconnect = r.pick<Disconnect>(['mid-upload', 'after-head', 'after-delay']);
  return c;
}

export interface Reply {
  status: number;
  headers: http.IncomingHttpHeaders;
  text: string;
  /** The client left on purpose before the end (`FuzzCase.disconnect`). */
  disconnected: boolean;
}

/** Sends a case on a fresh connection; a client that leaves (`c.disconnect`) resolves with `disconnected`. */
export function send(port: number, c: FuzzCase, r?: Rng): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const left = (status: number) => resolve({ status, headers: {}, text: '', disconnected: true });
    const req = http.request(
      { host: '127.0.0.1', port, method: c.method, path: c.path, headers: { ...c.headers, 'content-length': c.body.length }, agent: false },
      (res) => {
        if (c.disconnect === 'after-head') {
          req.destroy();
          return left(res.statusCode ?? 0);
        }
        const chunks: Buffer[] = [];
        res.on('data', (d: Buffer) => chunks.push(d));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, text: Buffer.concat(chunks).toString('utf8'), disconnected: false }));
        res.on('error', (err) => (c.disconnect ? left(res.statusCode ?? 0) : reject(err)));
      },
    );
    req.setTimeout(30_000, () => req.destroy(new Error('no answer within 30 s')));
    req.on('error', (err) => (c.disconnect ? left(0) : reject(err)));
    if (c.disconnect === 'mid-upload') {
      req.write(c.body.subarray(0, Math.floor(c.body.length / 2)));
      setTimeout(() => (req.destroy(), left(0)), r ? r.int(0, 5) : 0);
      return;
    }
    if (c.disconnect === 'after-delay') setTimeout(() => (req.destroy(), left(0)), r ? r.int(0, 30) : 5);
    req.end(c.body);
  });
}

function check(ok: boolean, message: string): void {
  if (!ok) throw new Error(message);
}

/** A completions prompt that is a list of strings or of token-id lists is a batch: n choices per prompt (vLLM's batched completions). */
export function promptCount(c: FuzzCase): number {
  const prompt = c.request?.prompt;
  const batch = !c.path.includes('chat') && Array.isArray(prompt) && prompt.length > 0 && typeof prompt[0] !== 'number';
  return batch ? (prompt as unknown[]).length : 1;
}

/** A 200 answer must be a well-formed vLLM response honouring the request's n and max_tokens. */
export function checkAnswer(c: FuzzCase, text: string): void {
  const req = c.request;
  check(req !== null, `200 for a body that is not a JSON object`);
  const events = req!.stream === true ? text.split('\n\n').filter(Boolean) : null;
  let objects: Json[];
  try {
    objects = events ? events.slice(0, -1).map((e) => JSON.parse(e.replace(/^data: /, '')) as Json) : [JSON.parse(text) as Json];
  } catch {
    throw new Error(`200 whose body is not vLLM JSON: ${text.slice(0, 300)}`);
  }
  if (events) check(events.at(-1) === 'data: [DONE]', `stream not ended by data: [DONE]: ${events.at(-1)}`);
  for (const o of objects) {
    check(o.error === undefined, `error inside a 200: ${JSON.stringify(o)}`);
    check(/^(chatcmpl|cmpl)-/.test(String(o.id)), `id ${String(o.id)}`);
  }
  const choices = objects.flatMap((o) => (o.choices as Json[]) ?? []);
  const indices = new Set(choices.map((ch) => ch.index));
  const prompts = promptCount(c);
  const expected = (typeof req!.n === 'number' ? req!.n : 1) * prompts;
  check(indices.size === expected, `${indices.size} choice indexes, expected ${expected}`);
  const finishes = choices.map((ch) => ch.finish_reason).filter((f) => f !== null && f !== undefined);
  check(finishes.length === indices.size, `${finishes.length} finish reasons for ${indices.size} choices`);
  // A chat offering tools may end in a call.
  for (const f of finishes) check(f === 'stop' || f === 'length' || (f === 'tool_calls' && Array.isArray(req!.tools)), `finish_reason ${String(f)}`);
  const usage = objects.map((o) => o.usage as Json | null | undefined).find((u) => u);
  // max_completion_tokens is a chat field; completions ignore it as vLLM ignores unknown fields.
  const limit = (c.path.includes('chat') ? (req!.max_completion_tokens ?? req!.max_tokens) : req!.max_tokens) as number | undefined;
  if (usage && typeof limit === 'number')
    check((usage.completion_tokens as number) <= limit * indices.size, `usage ${JSON.stringify(usage)} over max_tokens ${limit}`);
}

/** Statuses a fuzzed request may get: an answer, or vLLM's / FastAPI's client errors. */
export const FUZZ_STATUSES = [200, 400, 404, 405, 413];

/**
 * Checks one reply: a valid completion, or a vLLM error (§1.6: `{"error":{message,type,param,code}}` with
 * code = the status) or FastAPI's `{"detail": …}` for unknown paths and methods. Returns its kind for counts
 * (e.g. "200 completion", "400 BadRequestError"); throws on anything else.
 */
export function classifyReply(c: FuzzCase, res: Reply): string {
  check(FUZZ_STATUSES.includes(res.status), `status ${res.status}: ${res.text.slice(0, 300)}`);
  if (res.status === 200 && c.method === 'POST') {
    checkAnswer(c, res.text);
    return '200 completion';
  }
  if (res.status === 200) return '200 other';
  check(/^application\/json/.test(String(res.headers['content-type'])), `content-type ${String(res.headers['content-type'])}`);
  let body: { error?: { message: unknown; type: unknown; code: unknown; param?: unknown }; detail?: unknown };
  try {
    body = JSON.parse(res.text) as typeof body;
  } catch {
    throw new Error(`${res.status} whose body is not JSON: ${res.text.slice(0, 300)}`);
  }
  if (body.detail !== undefined) {
    // FastAPI's own answers for unknown paths and methods.
    check(res.status === 404 || res.status === 405, `detail with status ${res.status}`);
    check(body.detail === (res.status === 404 ? 'Not Found' : 'Method Not Allowed'), `detail ${JSON.stringify(body.detail)}`);
    return `${res.status} detail`;
  }
  const error = body.error;
  check(error !== undefined && error !== null && typeof error === 'object', `no error object: ${res.text.slice(0, 300)}`);
  check(error!.code === res.status, `error.code ${String(error!.code)} for status ${res.status}`);
  check(typeof error!.type === 'string', `error.type ${String(error!.type)}`);
  check(typeof error!.message === 'string' && error!.message.length > 0, `error.message ${String(error!.message)}`);
  check('param' in error!, `error without param: ${res.text.slice(0, 300)}`);
  return `${res.status} ${String(error!.type)}`;
}

/** Where a failing case comes from, to reproduce it. */
export function describeCase(c: FuzzCase, index: number, seed: number): string {
  return `case ${index} (seed ${seed}, ${c.kind}${c.disconnect ? `, ${c.disconnect}` : ''}): ${c.method} ${c.path} ${c.body.toString('latin1').slice(0, 300)}`;
}

/** What became of one case. */
export interface CaseOutcome<Door extends string> {
  door: Door;
  index: number;
  case: FuzzCase;
  reply: Reply | null;
  /** "200 completion", "400 BadRequestError", "disconnected"… */
  kind: string;
  /** What was wrong with the reply (null: a valid answer or a well-formed error). */
  violation: string | null;
  /** Request sent → reply over (ms). */
  ms: number;
}

/**
 * Sends each case (numbered from `firstIndex`) to its door with `concurrency` clients; `classify` names a reply's
 * kind and throws at one that is not a valid answer or a well-formed vLLM error, which is then a violation.
 */
export async function sendCases<Door extends string>(
  cases: readonly { door: { name: Door; port: number }; case: FuzzCase }[],
  classify: (c: FuzzCase, reply: Reply) => string,
  options: { concurrency: number; firstIndex: number; seed: number; r?: Rng },
): Promise<CaseOutcome<Door>[]> {
  const outcomes: CaseOutcome<Door>[] = [];
  let next = 0;
  const client = async () => {
    for (let i = next++; i < cases.length; i = next++) {
      const { door, case: c } = cases[i];
      const index = options.firstIndex + i;
      const t0 = performance.now();
      let reply: Reply | null = null;
      let kind = 'no reply';
      let violation: string | null = null;
      try {
        reply = await send(door.port, c, options.r);
        kind = classify(c, reply);
      } catch (err) {
        violation = `${door.name}: ${(err as Error).message} — ${describeCase(c, index, options.seed)}`;
      }
      outcomes.push({ door: door.name, index, case: c, reply, kind, violation, ms: performance.now() - t0 });
    }
  };
  await Promise.all(Array.from({ length: options.concurrency }, client));
  return outcomes.sort((a, b) => a.index - b.index);
}
