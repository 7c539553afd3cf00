/**
 * An SGLang-like upstream for tests: SGLang's OpenAI-compatible and native HTTP shapes as
 * test/fixtures/engines/sglang-shapes.md records them from SGLang's source (each shape below names its section
 * there, §n), with the real Qwen3 tokenizer and a scripted answer. By default it is SGLang after PR #30917
 * (`return_token_ids`); `{ tokenIds: false }` is SGLang before it, to which that field is unknown and ignored.
 */
import { randomUUID } from 'node:crypto';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import { listenOnLoopback } from './loopback.js';
import { decode, encode, EOS, MODEL, promptIds } from './vllmUpstream.js';

type Json = Record<string, unknown>;

/** The text the model says to a request (it then ends on EOS unless something stops it first). */
export type SglangScript = (body: Json) => string;

export interface SglangOptions {
  /** SGLang after PR #30917 answers `return_token_ids` (default); before it the field is ignored (§6). */
  tokenIds?: boolean;
  /** Listen on this port (default: any free one). */
  port?: number;
}

export interface SglangUpstream {
  url: string;
  port: number;
  /** Requests received: path, parsed body and raw bytes. */
  received: { method: string; path: string; body: Json | null; raw: Buffer }[];
  close(): Promise<void>;
}

/** `tokenizer.model_max_length` of the bundled Qwen3 tokenizer: what `/tokenize` reports (§9). */
const TOKENIZER_MAX_LENGTH = 131072;
/** The served model's context length: `/v1/models`' `max_model_len` (§8). */
const CONTEXT_LENGTH = 40960;

/** SGLang's finish reason, `finish_reason.to_json()` of schedule_batch.py (§3). */
type FinishReason = { type: 'stop'; matched: number | string } | { type: 'length'; length: number };

/** One engine step of a generation: the token it produced, the whole text so far, and whether it ended there. */
interface Step {
  id: number;
  text: string;
  finish: FinishReason | null;
}

interface Generation {
  steps: Step[];
  outputIds: number[];
  text: string;
  finish: FinishReason;
}

/**
 * The scheduler's `Req.check_finished` after each token (§3): `max_new_tokens` first, then EOS or a
 * `stop_token_ids` hit (the token stays in output_ids, its text is not shown), then stop strings (the text is cut
 * before the string). Text so far is the incremental detokenizer's: held back while a character is incomplete.
 */
async function generate(content: string, maxNewTokens: number, stopTokenIds: number[], stopStrings: string[]): Promise<Generation> {
  const scripted = [...(await encode(content, false)), EOS];
  const steps: Step[] = [];
  const outputIds: number[] = [];
  let shown = '';
  for (const id of scripted) {
    outputIds.push(id);
    let finish: FinishReason | null = null;
    if (outputIds.length >= maxNewTokens) finish = { type: 'length', length: maxNewTokens };
    else if (id === EOS || stopTokenIds.includes(id)) finish = { type: 'stop', matched: id };
    const textIds = finish?.type === 'stop' ? outputIds.slice(0, -1) : outputIds;
    const decoded = await decode(textIds, true);
    if (!decoded.endsWith('\uFFFD')) shown = decoded;
    if (finish === null) {
      const hit = stopStrings.find((s) => shown.includes(s));
      if (hit !== undefined) {
        finish = { type: 'stop', matched: hit };
        shown = shown.slice(0, shown.indexOf(hit));
      }
    }
    steps.push({ id, text: shown, finish });
    if (finish) return { steps, outputIds, text: shown, finish };
  }
  throw new Error('unreachable: EOS always ends the script');
}

function readBody(req: IncomingMessage): Promise<Buffer> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => resolve(Buffer.concat(chunks)));
  });
}

/** Starlette's JSONResponse / ORJSONResponse under uvicorn: compact JSON, uvicorn's own headers (§1). */
function json(res: ServerResponse, status: number, value: unknown): void {
  const text = JSON.stringify(value);
  res
    .writeHead(status, { date: new Date().toUTCString(), server: 'uvicorn', 'content-length': Buffer.byteLength(text), 'content-type': 'application/json' })
    .end(text);
}

/** SGLang's ErrorResponse (§10). */
function error(res: ServerResponse, status: number, message: string, type = 'BadRequestError'): void {
  json(res, status, { object: 'error', message, type, param: null, code: status });
}

/** The RequestValidationError handler: 400, type "Bad Request" (§10). */
function validationError(res: ServerResponse, loc: string[], msg: string): void {
  const errors = `[{'type': 'value_error', 'loc': (${loc.map((l) => `'${l}'`).join(', ')},), 'msg': '${msg}'}]`;
  error(res, 400, `${errors} ${errors}`, 'Bad Request');
}

/** UsageInfo as pydantic dumps it at protocol.py@004c82e (§5); `exclude_none` drops the null details. */
function usageInfo(prompt: number, completion: number, excludeNone = false): Json {
  const usage: Json = {
    prompt_tokens: prompt,
    total_tokens: prompt + completion,
    completion_tokens: completion,
    prompt_tokens_details: null,
    reasoning_tokens: 0,
  };
  if (excludeNone) delete usage.prompt_tokens_details;
  return usage;
}

/** `should_include_usage`: the request's stream_options, else the server default (off) (§4). */
function includeUsage(body: Json): boolean {
  const options = body.stream_options;
  return options !== null && typeof options === 'object' && (options as Json).include_usage === true;
}

const GENERATION_PATHS = new Set(['/v1/completions', '/v1/chat/completions', '/generate', '/tokenize', '/v1/tokenize', '/detokenize', '/v1/detokenize']);

export async function startSglangUpstream(script: SglangScript, options: SglangOptions = {}): Promise<SglangUpstream> {
  const tokenIds = options.tokenIds ?? true;
  const received: SglangUpstream['received'] = [];
  const server = http.createServer(async (req, res) => {
    const raw = await readBody(req);
    const method = req.method ?? 'GET';
    const path = (req.url ?? '/').split('?')[0];
    let body: Json | null = null;
    let parseError: string | null = null;
    try {
      const value = raw.length ? (JSON.parse(raw.toString('utf8')) as unknown) : null;
      body = value !== null && typeof value === 'object' && !Array.isArray(value) ? (value as Json) : null;
    } catch (err) {
      parseError = (err as Error).message;
    }
    received.push({ method, path, body, raw });

    if (method === 'GET' && path === '/health')
      return void res.writeHead(200, { date: new Date().toUTCString(), server: 'uvicorn', 'content-length': 0 }).end();
    if (method === 'GET' && path === '/get_model_info') {
      return json(res, 200, { model_path: MODEL, tokenizer_path: MODEL, is_generation: true, preferred_sampling_params: null, weight_version: 'default' });
    }
    if (method === 'GET' && path === '/v1/models') {
      return json(res, 200, {
        object: 'list',
        data: [
          { id: MODEL, object: 'model', created: Math.floor(Date.now() / 1000), owned_by: 'sglang', root: MODEL, parent: null, max_model_len: CONTEXT_LENGTH },
        ],
      });
    }
    if (method !== 'POST' || !GENERATION_PATHS.has(path)) return json(res, 404, { detail: 'Not Found' });
    const mediaType = String(req.headers['content-type'] ?? '')
      .toLowerCase()
      .split(';')[0];
    if (path !== '/generate' && mediaType !== 'application/json')
      return validationError(res, ['header', 'content-type'], "Unsupported Media Type: Only 'application/json' is allowed");
    if (parseError !== null || body === null) return validationError(res, ['body'], `JSON decode error: ${parseError ?? 'not an object'}`);

    if (path === '/tokenize' || path === '/v1/tokenize') {
      // Exactly one of prompt and messages (§9).
      if ((body.prompt === undefined) === (body.messages === undefined))
        return validationError(res, ['body'], "Value error, Exactly one of 'prompt' or 'messages' must be provided.");
      const tokens = body.messages !== undefined ? await promptIds(body, true) : await encode(String(body.prompt), body.add_special_tokens !== false);
      return json(res, 200, { tokens, count: tokens.length, max_model_len: TOKENIZER_MAX_LENGTH });
    }
    if (path === '/detokenize' || path === '/v1/detokenize') {
      return json(res, 200, { text: await decode((body.tokens as number[] | undefined) ?? [], body.skip_special_tokens !== false) });
    }
    if (path === '/generate') return nativeGenerate(body, res);

    const chat = path === '/v1/chat/completions';
    if (chat && (!Array.isArray(body.messages) || body.messages.length === 0)) return error(res, 400, 'Messages cannot be empty.');
    if (!chat && (body.prompt === undefined || body.prompt === '')) return error(res, 400, 'Prompt cannot be empty');
    const stream = body.stream === true;
    const withIds = tokenIds && body.return_token_ids === true;
    if (chat && stream && withIds) {
      return error(
        res,
        400,
        'return_token_ids is not supported with streaming on /v1/chat/completions. Please set stream=false when using return_token_ids=true.',
      );
    }
    const prompt = await promptIds(body, chat);
    const maxTokens = Number(chat ? (body.max_completion_tokens ?? body.max_tokens ?? CONTEXT_LENGTH - prompt.length) : (body.max_tokens ?? 16));
    const stopField = body.stop;
    const stopStrings = typeof stopField === 'string' ? [stopField] : Array.isArray(stopField) ? (stopField as string[]) : [];
    const gen = await generate(script(body), maxTokens, Array.isArray(body.stop_token_ids) ? (body.stop_token_ids as number[]) : [], stopStrings);
    // meta_info["id"] is the request's rid, by default uuid4().hex; the OpenAI model field echoes the request (§2).
    const id = typeof body.rid === 'string' ? body.rid : randomUUID().replaceAll('-', '');
    const model = typeof body.model === 'string' ? body.model : 'default';
    const created = () => Math.floor(Date.now() / 1000);
    const matched = (f: FinishReason | null) => (f?.type === 'stop' ? f.matched : null);

    if (!stream) {
      const usage = usageInfo(prompt.length, gen.outputIds.length);
      const ids = withIds ? { prompt_token_ids: prompt, token_ids: gen.outputIds } : {};
      if (chat) {
        const message = { role: 'assistant', content: gen.text, reasoning_content: null, tool_calls: null };
        const choice = { index: 0, message, logprobs: null, finish_reason: gen.finish.type, matched_stop: matched(gen.finish), ...ids };
        return json(res, 200, { id, object: 'chat.completion', created: created(), model, choices: [choice], usage, metadata: { weight_version: 'default' } });
      }
      const choice = {
        index: 0,
        text: gen.text,
        logprobs: null,
        finish_reason: gen.finish.type,
        matched_stop: matched(gen.finish),
        ...(withIds ? { token_ids: gen.outputIds, prompt_token_ids: prompt } : {}),
      };
      return json(res, 200, { id, object: 'text_completion', created: created(), model, choices: [choice], usage, metadata: { weight_version: 'default' } });
    }

    res.writeHead(200, { date: new Date().toUTCString(), server: 'uvicorn', 'content-type': 'text/event-stream; charset=utf-8' });
    res.flushHeaders();
    const send = (value: unknown) => res.write(`data: ${JSON.stringify(value)}\n\n`);
    const tick = () => new Promise((r) => setTimeout(r, 2));
    let offset = 0;
    if (chat) {
      // serving_chat: a role chunk, then one chunk per non-empty text delta, then the finish chunk (§4).
      const chunk = (delta: Json, finish: string | null = null, matchedStop: number | string | null = null) => ({
        id,
        object: 'chat.completion.chunk',
        created: created(),
        model,
        choices: [{ index: 0, delta: { reasoning_content: null, ...delta }, logprobs: null, finish_reason: finish, matched_stop: matchedStop }],
      });
      for (const [i, step] of gen.steps.entries()) {
        await tick();
        if (i === 0) send(chunk({ role: 'assistant', content: '' }));
        const delta = step.text.slice(offset);
        offset = step.text.length;
        if (delta !== '') send(chunk({ content: delta }));
      }
      send(chunk({}, gen.finish.type, matched(gen.finish)));
      if (includeUsage(body))
        send({ id, object: 'chat.completion.chunk', created: created(), model, choices: [], usage: usageInfo(prompt.length, gen.outputIds.length) });
    } else {
      // serving_completions: one chunk per engine step, empty text included (§4).
      for (const [i, step] of gen.steps.entries()) {
        await tick();
        const delta = step.text.slice(offset);
        offset = step.text.length;
        const ids = withIds ? { token_ids: [step.id], ...(i === 0 ? { prompt_token_ids: prompt } : {}) } : {};
        send({
          id,
          object: 'text_completion',
          created: created(),
          model,
          choices: [{ index: 0, text: delta, logprobs: null, finish_reason: step.finish?.type ?? null, matched_stop: matched(step.finish), ...ids }],
          usage: null,
        });
      }
      if (includeUsage(body))
        send({ id, object: 'text_completion', created: created(), model, choices: [], usage: usageInfo(prompt.length, gen.outputIds.length, true) });
    }
    res.end('data: [DONE]\n\n');
  });

  /** The native API (§7): `text` or `input_ids`, `sampling_params`, `stream`. */
  async function nativeGenerate(body: Json, res: ServerResponse): Promise<void> {
    const input = Array.isArray(body.input_ids) ? (body.input_ids as number[]) : await encode(String(body.text ?? ''), true);
    const params = (body.sampling_params ?? {}) as Json;
    const gen = await generate(
      script(body),
      Number(params.max_new_tokens ?? 128),
      (params.stop_token_ids as number[] | undefined) ?? [],
      typeof params.stop === 'string' ? [params.stop] : ((params.stop as string[] | undefined) ?? []),
    );
    const rid = typeof body.rid === 'string' ? body.rid : randomUUID().replaceAll('-', '');
    const start = performance.now();
    const metaInfo = (upTo: number, finish: FinishReason | null): Json => ({
      id: rid,
      finish_reason: finish,
      prompt_tokens: input.length,
      weight_version: 'default',
      total_retractions: 0,
      completion_tokens: upTo,
      cached_tokens: 0,
      ...(finish ? { e2e_latency: (performance.now() - start) / 1000 } : {}),
    });
    if (body.stream !== true) return json(res, 200, { text: gen.text, output_ids: gen.outputIds, meta_info: metaInfo(gen.outputIds.length, gen.finish) });
    res.writeHead(200, { date: new Date().toUTCString(), server: 'uvicorn', 'content-type': 'text/event-stream; charset=utf-8' });
    // Cumulative text and ids in every event (incremental_streaming_output off).
    for (const [i, step] of gen.steps.entries()) {
      res.write(`data: ${JSON.stringify({ text: step.text, output_ids: gen.outputIds.slice(0, i + 1), meta_info: metaInfo(i + 1, step.finish) })}\n\n`);
    }
    res.end('data: [DONE]\n\n');
  }

  const { url, port, close } = await listenOnLoopback(server, options.port);
  return { url, port, received, close };
}
