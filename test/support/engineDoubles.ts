/**
 * Test doubles of llama.cpp's `llama-server` and Hugging Face's `transformers serve`, built from their real
 * answers (test/fixtures/engines/*.jsonl). A request the fixture holds is answered with the recorded bytes,
 * headers and read timing verbatim; any other request is answered in the same engine's shapes (field order,
 * headers, error bodies, stream framing), its output pieces and their timing taken from the recorded streams.
 * Every request is recorded as the raw bytes received.
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import http, { type IncomingHttpHeaders, type ServerResponse } from 'node:http';
import { join } from 'node:path';
import { isDeepStrictEqual } from 'node:util';
import { Template } from '@huggingface/jinja';
import { listenOnLoopback } from './loopback.js';
import { CHAT_TEMPLATE, decode, encode } from './vllmUpstream.js';

export type EngineName = 'llama.cpp' | 'transformers';

type Json = Record<string, unknown>;

interface Recorded {
  request: { method: string; path: string; body: Json | string | null };
  response: { status: number; headers: [string, string][]; body: string; reads?: [number, string][] };
}

/** Each engine's recorded exchanges; `transformers serve`'s OpenAI Responses ones (5.18, no `event:` lines, always streamed) beside its chat. */
const FILES: Record<EngineName, string[]> = {
  'llama.cpp': ['llamacpp-server.jsonl'],
  transformers: ['transformers-serve.jsonl', 'transformers-serve-responses.jsonl'],
};

export function recordedExchanges(engine: EngineName): Recorded[] {
  return FILES[engine].flatMap((file) =>
    readFileSync(join(import.meta.dirname, '..', 'fixtures', 'engines', file), 'utf8')
      .split('\n')
      .filter((line) => line.trim() !== '')
      .map((line) => JSON.parse(line) as Recorded),
  );
}

export interface EngineDouble {
  url: string;
  /** The model name the engine serves. */
  model: string;
  received: { method: string; path: string; headers: IncomingHttpHeaders; raw: Buffer }[];
  close(): Promise<void>;
}

const template = new Template(CHAT_TEMPLATE);

function renderChat(messages: unknown, extra: Json = {}): string {
  return template.render({ messages, add_generation_prompt: true, bos_token: '', eos_token: '<|im_end|>', ...extra });
}

/** A deterministic id of `length` letters and digits, from the request's bytes (so direct and proxied answers agree). */
function idFrom(raw: Buffer, length: number): string {
  const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';
  const digest = createHash('sha256').update(raw).digest();
  return Array.from({ length }, (_, i) => alphabet[digest[i % digest.length] % alphabet.length]).join('');
}

function uuidFrom(raw: Buffer): string {
  const h = createHash('sha256').update(raw).digest('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-4${h.slice(13, 16)}-8${h.slice(17, 20)}-${h.slice(20, 32)}`;
}

/** The recorded streamed generation on `path`: its text pieces and the arrival time of each read. */
function recordedStream(exchanges: Recorded[], path: string): { pieces: string[]; times: number[]; template: Json[] } {
  const ex = exchanges.find(
    (e) => e.request.path === path && typeof e.request.body === 'object' && e.request.body?.stream === true && e.response.status === 200,
  );
  if (!ex?.response.reads) throw new Error(`no recorded stream on ${path}`);
  const pieces: string[] = [];
  const times: number[] = [];
  const chunks: Json[] = [];
  for (const [at, text] of ex.response.reads) {
    for (const line of text.split('\n')) {
      if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
      const chunk = JSON.parse(line.slice(6)) as Json;
      chunks.push(chunk);
      const choice = (chunk.choices as Json[])[0];
      const piece = path.endsWith('/chat/completions') ? (choice.delta as Json).content : choice.text;
      if (typeof piece === 'string' && piece !== '' && choice.finish_reason == null) {
        pieces.push(piece);
        times.push(at);
      }
    }
  }
  return { pieces, times, template: chunks };
}

function recordedBody(exchanges: Recorded[], path: string): Json {
  const ex = exchanges.find(
    (e) => e.request.path === path && typeof e.request.body === 'object' && e.request.body?.stream === undefined && e.response.status === 200,
  );
  if (!ex) throw new Error(`no recorded answer on ${path}`);
  return JSON.parse(ex.response.body) as Json;
}

/** Headers as each engine sends them with a body of this type and length. */
function headersFor(engine: EngineName, contentType: string, length: number | null, requestId: string): [string, string][] {
  const sized: [string, string][] = length === null ? [['Transfer-Encoding', 'chunked']] : [['Content-Length', String(length)]];
  if (engine === 'llama.cpp')
    return [['Keep-Alive', 'timeout=5, max=100'], ['Content-Type', contentType], ['Server', 'llama.cpp'], ...sized, ['Access-Control-Allow-Origin', '']];
  return [
    ['date', new Date(0).toUTCString()],
    ['server', 'uvicorn'],
    ...(length === null ? [] : sized.map(([k, v]) => [k.toLowerCase(), v] as [string, string])),
    ['content-type', contentType],
    ['x-request-id', requestId],
    ...(length === null ? sized : []),
  ];
}

function send(res: ServerResponse, status: number, headers: [string, string][], body: string): void {
  res.writeHead(status, headers.flat()).end(body);
}

/** The fields of OpenAI's request types `transformers serve` validates against (anything else is a 422). */
const TRANSFORMERS_FIELDS = new Set([
  'model',
  'prompt',
  'messages',
  'max_tokens',
  'max_completion_tokens',
  'temperature',
  'top_p',
  'n',
  'stream',
  'stream_options',
  'stop',
  'logprobs',
  'top_logprobs',
  'seed',
  'frequency_penalty',
  'presence_penalty',
  'logit_bias',
  'user',
  'echo',
  'best_of',
  'suffix',
  'tools',
  'tool_choice',
  'response_format',
  'parallel_tool_calls',
  'chat_template_kwargs',
  'metadata',
  'store',
  'modalities',
  'audio',
  'reasoning_effort',
  'service_tier',
  'prediction',
  'web_search_options',
  'functions',
  'function_call',
  'generation_config',
  'request_id',
]);

export interface DoubleOptions {
  /**
   * A recorded stream's events after its first come this much later: its first (`transformers serve`'s role-only
   * chunk) leads the first token by tens of ms, as measured against the real server under load.
   */
  firstEventLeadMs?: number;
  /** The text of each token a request not recorded generates (default: the recorded stream's pieces). */
  outputPieces?: string[];
}

/** Starts the double on `port` (default: any free one). */
export async function startEngineDouble(engine: EngineName, port = 0, options: DoubleOptions = {}): Promise<EngineDouble> {
  const lead = options.firstEventLeadMs ?? 0;
  const exchanges = recordedExchanges(engine);
  const served = engine === 'llama.cpp' ? 'tiny-qwen3tok.gguf' : 'tiny-qwen3';
  const received: EngineDouble['received'] = [];
  type GenerationPath = '/v1/completions' | '/v1/chat/completions';
  const streams: Record<GenerationPath, ReturnType<typeof recordedStream>> = {
    '/v1/completions': recordedStream(exchanges, '/v1/completions'),
    '/v1/chat/completions': recordedStream(exchanges, '/v1/chat/completions'),
  };
  const bodies: Record<GenerationPath, Json> = {
    '/v1/completions': recordedBody(exchanges, '/v1/completions'),
    '/v1/chat/completions': recordedBody(exchanges, '/v1/chat/completions'),
  };

  const json = (res: ServerResponse, status: number, value: unknown, requestId: string) => {
    const text = JSON.stringify(value);
    send(
      res,
      status,
      headersFor(engine, engine === 'llama.cpp' ? 'application/json; charset=utf-8' : 'application/json', Buffer.byteLength(text), requestId),
      text,
    );
  };

  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const raw = Buffer.concat(chunks);
      const method = req.method ?? 'GET';
      const path = (req.url ?? '/').split('?')[0];
      received.push({ method, path, headers: req.headers, raw });
      let body: Json | null = null;
      let parseError: string | null = null;
      if (raw.length > 0) {
        try {
          const value = JSON.parse(raw.toString('utf8')) as unknown;
          body = value !== null && typeof value === 'object' && !Array.isArray(value) ? (value as Json) : null;
        } catch (err) {
          parseError = (err as Error).message;
        }
      }
      const recorded = exchanges.find(
        (e) =>
          e.request.method === method &&
          e.request.path === path &&
          (typeof e.request.body === 'string' ? e.request.body === raw.toString('utf8') : isDeepStrictEqual(e.request.body, body ?? null)),
      );
      if (recorded) return void replayRecorded(res, recorded);
      void answer(method, path, raw, body, parseError, res);
    });
  });

  function replayRecorded(res: ServerResponse, recorded: Recorded): void {
    const { status, headers, body, reads } = recorded.response;
    res.writeHead(status, headers.flat());
    if (!reads) return void res.end(body);
    const start = performance.now();
    let i = 0;
    const next = () => {
      if (res.destroyed) return;
      if (i === reads.length) return void res.end();
      const [recordedAt, text] = reads[i++];
      const at = i > 1 ? recordedAt + lead : recordedAt;
      setTimeout(
        () => {
          res.write(text);
          next();
        },
        Math.max(0, start + at - performance.now()),
      );
    };
    next();
  }

  async function answer(method: string, path: string, raw: Buffer, body: Json | null, parseError: string | null, res: ServerResponse): Promise<void> {
    const requestId = uuidFrom(raw);
    const notFound = () =>
      engine === 'llama.cpp'
        ? json(res, 404, { error: { code: 404, message: 'File Not Found', type: 'not_found_error' } }, requestId)
        : json(res, 404, { detail: 'Not Found' }, requestId);
    const generation = path === '/v1/completions' || path === '/v1/chat/completions';
    if (method !== 'POST') return notFound();
    if (engine === 'transformers' && !generation) return notFound();
    if (parseError !== null || body === null) {
      if (engine === 'llama.cpp')
        return json(
          res,
          500,
          { error: { code: 500, message: `[json.exception.parse_error.101] parse error: ${parseError ?? 'not an object'}`, type: 'server_error' } },
          requestId,
        );
      return json(
        res,
        422,
        { detail: [{ type: 'json_invalid', loc: ['body', 1], msg: 'JSON decode error', input: {}, ctx: { error: parseError ?? 'not an object' } }] },
        requestId,
      );
    }
    if (engine === 'llama.cpp') {
      if (path === '/tokenize') {
        const content = typeof body.content === 'string' ? body.content : '';
        return json(res, 200, { tokens: await encode(content, body.add_special === true) }, requestId);
      }
      if (path === '/detokenize') return json(res, 200, { content: await decode((body.tokens as number[] | undefined) ?? [], false) }, requestId);
      if (path === '/apply-template') return json(res, 200, { prompt: renderChat(body.messages, body.tools ? { tools: body.tools } : {}) }, requestId);
      if (!generation) return notFound();
      if (typeof body.n === 'number' && body.n > 1)
        return json(res, 500, { error: { code: 500, message: 'Only one completion choice is allowed', type: 'server_error' } }, requestId);
    } else {
      const unexpected = Object.keys(body).filter((k) => !TRANSFORMERS_FIELDS.has(k));
      if (unexpected.length > 0)
        return json(res, 422, { detail: `Unexpected fields in the request: {${unexpected.map((k) => `'${k}'`).join(', ')}}` }, requestId);
      if (body.model !== undefined && body.model !== served)
        return json(res, 400, { detail: `Server is pinned to '${served}'; requested '${String(body.model)}'.` }, requestId);
      if (path === '/v1/completions' && typeof body.prompt !== 'string') return json(res, 400, { detail: 'prompt must be a string.' }, requestId);
    }
    const chat = path === '/v1/chat/completions';
    const generationPath: GenerationPath = chat ? '/v1/chat/completions' : '/v1/completions';
    const promptIds = chat
      ? await encode(renderChat(body.messages, engine === 'transformers' ? ((body.chat_template_kwargs as Json | undefined) ?? {}) : {}), false)
      : Array.isArray(body.prompt)
        ? (body.prompt as number[])
        : await encode(String(body.prompt), engine === 'llama.cpp');
    const recordedStreamOf = streams[generationPath];
    const wanted = Number(body.max_tokens ?? body.max_completion_tokens ?? 8);
    // The double's model ends on its own after 8 tokens (EOS, finish "stop") unless max_tokens cuts it first.
    const count = Math.min(wanted, 8);
    const finish = wanted <= 8 ? 'length' : 'stop';
    const source = options.outputPieces ?? recordedStreamOf.pieces;
    const pieces = Array.from({ length: count }, (_, i) => source[i % source.length]);
    const usage = { completion_tokens: count, prompt_tokens: promptIds.length, total_tokens: count + promptIds.length };
    const model = engine === 'llama.cpp' ? String(body.model ?? served) : `${served}@main`;
    const id = engine === 'llama.cpp' ? `chatcmpl-${idFrom(raw, 32)}` : requestId;
    const text = pieces.join('');

    if (body.stream !== true) {
      const template = structuredClone(bodies[generationPath]);
      const choice = (template.choices as Json[])[0];
      if (chat) (choice.message as Json).content = text;
      else choice.text = text;
      choice.finish_reason = finish;
      template.usage = usage;
      template.id = id;
      template.model = model;
      const out = JSON.stringify(template);
      await new Promise((r) => setTimeout(r, recordedStreamOf.times[Math.min(count, recordedStreamOf.times.length) - 1] ?? 0));
      return send(
        res,
        200,
        headersFor(engine, engine === 'llama.cpp' ? 'application/json; charset=utf-8' : 'application/json', Buffer.byteLength(out), requestId),
        out,
      );
    }

    res.writeHead(200, headersFor(engine, engine === 'llama.cpp' ? 'text/event-stream' : 'text/event-stream; charset=utf-8', null, requestId).flat());
    const start = performance.now();
    const at = (i: number) => {
      const times = recordedStreamOf.times;
      const gap = times.length > 1 ? times[times.length - 1] - times[times.length - 2] : 1;
      return i < times.length ? times[i] : times[times.length - 1] + gap * (i - times.length + 1);
    };
    const wait = (ms: number) => new Promise((r) => setTimeout(r, Math.max(0, start + ms - performance.now())));
    const event = (chunk: Json) => res.write(`data: ${JSON.stringify(chunk)}\n\n`);
    const [first, ...rest] = recordedStreamOf.template;
    const last = rest[rest.length - 1];
    const withChoice = (base: Json, change: (choice: Json) => void, extra: Json = {}): Json => {
      const chunk = structuredClone(base);
      chunk.id = id;
      chunk.model = model;
      change((chunk.choices as Json[])[0]);
      return { ...chunk, ...extra };
    };
    const includeUsage = engine === 'llama.cpp' || (body.stream_options as Json | undefined)?.include_usage === true;
    if (chat && engine === 'transformers') event(withChoice(first, () => undefined));
    const pieceTemplate = chat && engine === 'transformers' ? rest[0] : first;
    for (let i = 0; i < pieces.length; i++) {
      await wait(at(i));
      if (res.destroyed) return;
      event(withChoice(pieceTemplate, (c) => (chat ? ((c.delta as Json).content = pieces[i]) : (c.text = pieces[i]))));
    }
    const final = withChoice(last, (c) => (c.finish_reason = finish));
    if (includeUsage) final.usage = usage;
    else delete final.usage;
    event(final);
    res.end(engine === 'llama.cpp' ? 'data: [DONE]\n\n' : undefined);
  }

  const { url, close } = await listenOnLoopback(server, port);
  return { url, model: served, received, close };
}
