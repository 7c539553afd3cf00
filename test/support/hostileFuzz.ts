/**
 * Hostile tool schemas and chat templates (issue #33), fuzzed through the spawned CLI: one `serve` takes chats
 * whose tools carry fuzzed JSON schemas (huge lengths and counts, deep nesting, wrong types) and chats that bring
 * a fuzzed chat template (loops, allocations, recursion, broken syntax); another serves a capture file whose own
 * chat template and tokenizer files are hostile, and takes chats that steer its template into each trap. Every
 * reply must be a valid answer or a well-formed vLLM error, and both processes must live.
 * Shared by test/fuzz/fuzz-hostile.test.ts (a seeded slice) and bench/hostile.ts (10,000 cases, /health p99, peak RSS).
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { CaptureStore } from '../../src/store/captureStore.js';
import { loadModelFiles } from '../../src/tokenizer/index.js';
import { classifyReply, sendCases, type CaseOutcome, type FuzzCase, type Json, type Reply, type Rng } from './fuzzRequests.js';
import { startMockerProcess, type MockerProcess } from './mockerProcess.js';

const JSON_HEADERS = { 'content-type': 'application/json' };
/** Largest body the fuzzed processes accept. */
const MAX_BODY = 1 << 20;
/** The plain serve's context length: a tool call's arguments may take up to 8 characters a token of it. */
const MAX_MODEL_LEN = 8192;

/** Numbers a schema's bounds may take: ordinary ones, and ones no sampler may take literally. */
const BOUNDS: unknown[] = [0, 1, 2, 3, 8, 10, 100, 1e3, 1e4, 1e5, 1e6, 1e9, 1e12, 1e308, -1, -1e9, 0.5, 2.5, '5', null, true, [], {}];
const TYPES: unknown[] = ['object', 'array', 'string', 'integer', 'number', 'boolean', 'null', 'nope', ['string', 'null'], ['array', 'object'], 7, null];

/** A JSON-schema-like value: mostly schemas, with hostile bounds, nesting and wrong types. */
export function fuzzSchema(r: Rng, depth = 0): unknown {
  const roll = r.next();
  if (depth > 9 || roll < 0.04) return r.pick<unknown>([null, true, 'string', 1, [], {}]);
  const schema: Json = {};
  if (r.next() < 0.85) schema.type = r.pick(TYPES);
  const type = typeof schema.type === 'string' ? schema.type : r.pick(['object', 'array', 'string']);
  if (type === 'object' || r.next() < 0.1) {
    schema.properties = Object.fromEntries(
      Array.from({ length: r.int(0, 4) }, (_, i) => [r.pick([`p${i}`, 'a'.repeat(r.int(1, 300)), '', '日本', '"q"']), fuzzSchema(r, depth + 1)]),
    );
    if (r.next() < 0.7) schema.required = Object.keys(schema.properties as Json).filter(() => r.next() < 0.7);
  }
  if (type === 'array' || r.next() < 0.1) {
    schema.items = fuzzSchema(r, depth + 1);
    if (r.next() < 0.7) schema.minItems = r.pick(BOUNDS);
    if (r.next() < 0.4) schema.maxItems = r.pick(BOUNDS);
  }
  if (type === 'string' || r.next() < 0.1) {
    if (r.next() < 0.7) schema.minLength = r.pick(BOUNDS);
    if (r.next() < 0.4) schema.maxLength = r.pick(BOUNDS);
  }
  if (type === 'integer' || type === 'number' || r.next() < 0.1) {
    for (const key of ['minimum', 'maximum', 'exclusiveMinimum', 'exclusiveMaximum'])
      if (r.next() < 0.3) schema[key] = r.next() < 0.5 ? r.pick(BOUNDS) : -r.next() * 1e308;
  }
  if (r.next() < 0.08)
    schema.enum =
      r.next() < 0.8 ? Array.from({ length: r.int(0, 4) }, () => r.pick<unknown>(['a', 1, null, { x: [1, 2] }, 'b'.repeat(r.int(0, 2000))])) : 'not a list';
  if (r.next() < 0.05) schema.const = r.pick<unknown>([null, 'c', 3, { deep: [[[[[[1]]]]]] }, 'c'.repeat(r.int(0, 5000))]);
  if (r.next() < 0.1) schema[r.pick(['anyOf', 'oneOf'])] = Array.from({ length: r.int(0, 3) }, () => fuzzSchema(r, depth + 1));
  return schema;
}

/** A chat offering fuzzed tools (the sampler's paths: `required` and a named tool always call one). */
export function makeToolCase(r: Rng): FuzzCase {
  const tools = Array.from({ length: r.int(1, 3) }, (_, i) => ({
    type: 'function',
    function: { name: `tool_${i}`, description: 'fuzzed', parameters: fuzzSchema(r) },
  }));
  const request: Json = {
    messages: [{ role: 'user', content: r.pick(['Call a tool.', 'What is the weather?', '日本語で']) }],
    tools,
    tool_choice: r.pick<unknown>(['required', 'required', 'auto', 'none', { type: 'function', function: { name: 'tool_0' } }]),
  };
  if (r.next() < 0.6) request.max_tokens = r.pick([1, 5, 50, 500, 4000]);
  if (r.next() < 0.2) request.n = r.int(1, 3);
  if (r.next() < 0.3) request.stream = true;
  return { kind: 'tool schema', method: 'POST', path: '/v1/chat/completions', headers: JSON_HEADERS, body: Buffer.from(JSON.stringify(request)), request };
}

/** How many times a fuzzed loop turns: mostly few, sometimes more than a render may take. */
const TURNS = ['0', '1', '3', '10', '100', '1000', '-5', "'x'", 'messages|length', '100000', '1000000', '200000000', '1000000000000'];

/** A random chat template from a small Jinja grammar: loops, allocations, recursion, filters, broken syntax. */
export function fuzzTemplate(r: Rng, depth = 0): string {
  const pieces = Array.from({ length: r.int(1, 4) }, () => {
    const roll = r.next();
    if (depth < 3 && roll < 0.22) {
      // Mostly small loops; a product of big ones is what the 2 s limit is for, kept rare.
      const turns = r.next() < 0.9 ? r.pick(TURNS.slice(0, 9)) : r.pick(TURNS);
      return `{% for i${depth} in range(${turns}) %}${fuzzTemplate(r, depth + 1)}{% endfor %}`;
    }
    if (depth < 3 && roll < 0.32)
      return `{% if ${r.pick(['messages', 'tools', 'x', 'messages|length > 1', 'add_generation_prompt', '1 / 0'])} %}${fuzzTemplate(r, depth + 1)}{% else %}${fuzzTemplate(r, depth + 1)}{% endif %}`;
    if (roll < 0.5) {
      return `{{ ${r.pick([
        'messages[0].content',
        "messages[0]['content'] * 3",
        `'x' * ${r.pick(['1', '1000', '100000', '100000000', '-1'])}`,
        `range(${r.pick(TURNS)})|length`,
        `range(${r.pick(TURNS.slice(0, 9))})|join(',')`,
        'undefined_variable.attribute',
        'messages|tojson',
        'messages[0].content|upper|reverse',
        'bos_token ~ eos_token',
        'raise_exception("refused")',
        'messages[99].content',
        '(messages|map(attribute="content")|list)|length',
      ])} }}`;
    }
    if (roll < 0.6) return `{% set v = ${r.pick(['messages', 'range(10)|list', "'y' * 1000", 'namespace(n=0)'])} %}`;
    if (roll < 0.66) return '{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}';
    // Spins on small arrays: CPU without memory, what the time limit (not the heap's) is for. Rare: each holds a renderer 2 s.
    if (roll < 0.665) return '{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}';
    if (roll < 0.74) return r.pick(['{{', '{% for %}', '{% endfor %}', '}}', '{% if %}', '{#', '{{ }}', '{% raw %}']);
    return r.pick(['<|im_start|>user\n', 'text ', '\n', '<|im_end|>', '日本', '']);
  });
  return pieces.join('');
}

/** A chat bringing a fuzzed template (the server trusts request templates: `--trust-request-chat-template`). */
export function makeTemplateCase(r: Rng): FuzzCase {
  const request: Json = {
    messages: Array.from({ length: r.int(1, 3) }, (_, i) => ({ role: i % 2 ? 'assistant' : 'user', content: r.pick(['Hi', 'Tell me more', '日本語']) })),
    max_tokens: r.int(1, 16),
  };
  if (r.next() < 0.8) request.chat_template = fuzzTemplate(r);
  else request.chat_template_kwargs = { chat_template: fuzzTemplate(r) };
  const path = r.next() < 0.15 ? '/tokenize' : '/v1/chat/completions';
  return { kind: 'request template', method: 'POST', path, headers: JSON_HEADERS, body: Buffer.from(JSON.stringify(request)), request };
}

/**
 * The capture file's chat template: a chat whose first message names a trap walks into it (a loop that never
 * ends in time, an allocation beyond any heap, unbounded recursion, a giant string, an undefined name); any other
 * chat renders as Qwen's template does, after a line that says it is the capture's.
 */
export const HOSTILE_CAPTURE_TEMPLATE = [
  "{%- set first = messages[0].content if messages and messages[0].content is string else '' -%}",
  "{%- if first == 'loop forever' -%}{%- for i in range(100000) -%}{%- for j in range(100000) -%}{%- endfor -%}{%- endfor -%}",
  "{%- elif first == 'allocate without bound' -%}{%- for i in range(200000000) -%}x{%- endfor -%}",
  "{%- elif first == 'recurse without end' -%}{%- macro f(n) -%}{{ f(n + 1) }}{%- endmacro -%}{{ f(0) }}",
  "{%- elif first == 'giant string' -%}{{ 'x' * 100000000 }}",
  "{%- elif first == 'undefined name' -%}{{ nothing.here }}",
  "{%- else -%}<|im_start|>system{{ '\\n' }}captured template<|im_end|>{{ '\\n' }}",
  "{%- for m in messages -%}<|im_start|>{{ m.role }}{{ '\\n' }}{{ m.content if m.content is string else '' }}<|im_end|>{{ '\\n' }}{%- endfor -%}",
  "{%- if add_generation_prompt -%}<|im_start|>assistant{{ '\\n' }}{%- endif -%}{%- endif -%}",
].join('\n');

/** The traps of the capture's template, and plain chats. */
export const CAPTURE_TRAPS = ['loop forever', 'allocate without bound', 'recurse without end', 'giant string', 'undefined name'];

/**
 * Writes a capture file (with the store's own API) whose run carries the bundled tokenizer made hostile in ways
 * it still loads with: the template above; a normalizer that makes every "a" eight (a text grows up to 8 times,
 * under the 64 a capture may have); EOS ids that are not ids ("abc", -5, 1e20) beside the real one; special
 * tokens of the wrong types; a context length of 4,096.
 */
export function writeHostileCapture(file: string): void {
  const model = loadModelFiles();
  const files = new Map(model.files);
  const tokenizerJson = JSON.parse(files.get('tokenizer.json')!.toString('utf8')) as Json;
  tokenizerJson.normalizer = { type: 'Sequence', normalizers: [tokenizerJson.normalizer, { type: 'Replace', pattern: { String: 'a' }, content: 'aaaaaaaa' }] };
  files.set('tokenizer.json', Buffer.from(JSON.stringify(tokenizerJson)));
  const tokenizerConfig = JSON.parse(files.get('tokenizer_config.json')!.toString('utf8')) as Json;
  Object.assign(tokenizerConfig, { bos_token: { nope: 1 }, pad_token: 12345, unk_token: ['x'], chat_template: [{ name: 'default', template: 7 }, 'junk'] });
  files.set('tokenizer_config.json', Buffer.from(JSON.stringify(tokenizerConfig)));
  files.set('generation_config.json', Buffer.from(JSON.stringify({ eos_token_id: ['abc', -5, 1e20, 151645] })));
  files.set('config.json', Buffer.from(JSON.stringify({ ...(JSON.parse(files.get('config.json')!.toString('utf8')) as Json), max_position_embeddings: 4096 })));
  files.set('chat_template.jinja', Buffer.from(HOSTILE_CAPTURE_TEMPLATE));
  const store = CaptureStore.open(file);
  try {
    store.startRun({ kind: 'capture', tokenizerName: 'hostile/qwen3' }, files);
  } finally {
    store.close();
  }
}

/** A chat (or /tokenize, or a tool call) steering the capture's template: into a trap now and then, else plainly. */
export function makeCapturedCase(r: Rng): FuzzCase {
  // The loop's 2 s stop is the slow trap: kept rare so the run stays short.
  const trap = r.next() < 0.12 ? r.pick(CAPTURE_TRAPS.slice(r.next() < 0.05 ? 0 : 1)) : null;
  const content = trap ?? r.pick(['Hello', 'banana bandana', 'a'.repeat(r.int(1, 3000)), '日本語', '']);
  const request: Json = {
    messages: [
      { role: 'user', content },
      ...(r.next() < 0.3
        ? [
            { role: 'assistant', content: 'ok' },
            { role: 'user', content: 'more' },
          ]
        : []),
    ],
  };
  const roll = r.next();
  if (roll < 0.15)
    return { kind: 'capture template', method: 'POST', path: '/tokenize', headers: JSON_HEADERS, body: Buffer.from(JSON.stringify(request)), request };
  if (roll < 0.4) Object.assign(request, { tools: [{ type: 'function', function: { name: 'f', parameters: fuzzSchema(r) } }], tool_choice: 'required' });
  if (r.next() < 0.6) request.max_tokens = r.pick([1, 8, 64, 1000]);
  if (r.next() < 0.3) request.stream = true;
  return { kind: 'capture template', method: 'POST', path: '/v1/chat/completions', headers: JSON_HEADERS, body: Buffer.from(JSON.stringify(request)), request };
}

export interface HostileRig {
  /** `serve --mode random --trust-request-chat-template`: fuzzed tools and request templates. */
  plain: MockerProcess;
  /** `serve` of the hostile capture file (`--on-miss random`): chats into its template's traps. */
  captured: MockerProcess;
  stop(): Promise<void>;
}

export async function startHostileRig(dir: string): Promise<HostileRig> {
  const captureFile = join(dir, 'hostile.db');
  writeHostileCapture(captureFile);
  const common = ['--timing', 'none', '--trust-request-chat-template', '--max-body-bytes', String(MAX_BODY)];
  const [plain, captured] = await Promise.all([
    startMockerProcess(['serve', '--mode', 'random', '--max-model-len', String(MAX_MODEL_LEN), ...common], 0, { cwd: dir }),
    startMockerProcess(['serve', '--captures', captureFile, '--on-miss', 'random', ...common], 0, { cwd: dir }),
  ]);
  return { plain, captured, stop: async () => void (await Promise.all([plain.stop(), captured.stop()])) };
}

export type HostileDoor = 'plain' | 'captured';

/** A case for `door`: fuzzed tool schemas or request templates (half each) for the plain serve, the capture's traps for the other. */
export function makeHostileRigCase(r: Rng, door: HostileDoor): { door: HostileDoor; case: FuzzCase } {
  if (door === 'captured') return { door, case: makeCapturedCase(r) };
  return { door, case: r.next() < 0.5 ? makeToolCase(r) : makeTemplateCase(r) };
}

export type HostileOutcome = CaseOutcome<HostileDoor>;

/** A reply of /tokenize: `{count, max_model_len, tokens, token_strs}` with as many tokens as counted. */
function classifyTokenize(res: Reply): string {
  const body = JSON.parse(res.text) as { count?: unknown; max_model_len?: unknown; tokens?: unknown };
  if (!Array.isArray(body.tokens) || body.count !== body.tokens.length || typeof body.max_model_len !== 'number')
    throw new Error(`/tokenize 200 not vLLM's TokenizeResponse: ${res.text.slice(0, 300)}`);
  return '200 tokenize';
}

/** Sends cases with `concurrency` clients; each reply is classified, anything else is a violation. */
export function runHostileCases(
  rig: HostileRig,
  cases: { door: HostileDoor; case: FuzzCase }[],
  options: { concurrency: number; firstIndex: number; seed: number },
): Promise<HostileOutcome[]> {
  const routed = cases.map(({ door, case: c }) => ({ door: { name: door, port: rig[door].port }, case: c }));
  return sendCases(routed, (c, reply) => (reply.status === 200 && c.path === '/tokenize' ? classifyTokenize(reply) : classifyReply(c, reply)), options);
}

/** The processes of the rig that exited (a crash: nothing stops them during fuzzing). */
export function deadHostile(rig: HostileRig): string[] {
  return (['plain', 'captured'] as const)
    .filter((name) => rig[name].child.exitCode !== null || rig[name].child.signalCode !== null)
    .map((name) => `${name} (exit ${rig[name].child.exitCode ?? rig[name].child.signalCode})`);
}

/** Resident memory (VmRSS, MB) of each serve and, apart, of its template renderers (its child processes). */
export function hostileRssMb(rig: HostileRig): Record<string, number> {
  const rss = (pid: number) => Number(/^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? NaN) / 1024;
  const children = (pid: number) => {
    try {
      return readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean).map(Number);
    } catch {
      return [];
    }
  };
  const out: Record<string, number> = {};
  for (const name of ['plain', 'captured'] as const) {
    const pid = rig[name].child.pid!;
    out[name] = rss(pid);
    out[`${name} renderers`] = children(pid).reduce((sum, child) => {
      try {
        return sum + rss(child);
      } catch {
        return sum; // a renderer that ended meanwhile
      }
    }, 0);
    // Sampled together: what the serve and its renderers hold at one moment.
    out[`${name} with renderers`] = out[name] + out[`${name} renderers`];
  }
  return out;
}
