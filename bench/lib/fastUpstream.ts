/**
 * A minimal, fast vLLM-like upstream for the proxy benchmark: /v1/completions streams in vLLM 0.11's exact
 * completion chunk format (vllm-wire-reference.md §1.4) from pre-rendered chunk tails, honouring
 * `return_token_ids`; plus GET /version, GET /v1/models and POST /tokenize, which `mocker capture` calls.
 *
 * Tokens come out like an engine's decode steps: one global step clock every `gapMs`, each step writes the
 * next token of every running stream. A new stream's first token is written at once (zero prefill time), so
 * TTFT measures only the HTTP path. The actual write time of every token (CLOCK_MONOTONIC, comparable across
 * processes) is kept per `x-request-id` and handed out by GET /bench/times (a side channel: the wire format
 * stays vLLM's).
 */
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { nowMs } from './stats.js';

export const MODEL = 'Qwen/Qwen3-0.6B';
const WORDS = [' the', ' quick', ' brown', ' fox', ' jumps', ' over', ' a', ' lazy', ' dog', ',', ' and', ' then', ' runs', ' away', '.', '\n'];

export interface FastUpstreamOptions {
  /** Engine step: time between two tokens of a stream. 0 = write all tokens at once. */
  gapMs: number;
  /** Default max_tokens when the request gives none. */
  tokens: number;
}

interface Stream {
  res: ServerResponse;
  head: string;
  next: number;
  total: number;
  withIds: boolean;
  promptIds: number[];
  times: number[];
}

const readBody = (req: IncomingMessage) =>
  new Promise<Buffer>((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });

function json(res: ServerResponse, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) }).end(text);
}

/** Fake but stable prompt token ids for a string prompt (one per 4 characters); the proxy only records them. */
function fakePromptIds(prompt: string): number[] {
  const ids: number[] = [];
  for (let i = 0; i < prompt.length; i += 4) ids.push(100 + (prompt.charCodeAt(i) % 50_000));
  return ids;
}

export async function startFastUpstream(opts: FastUpstreamOptions, port = 0): Promise<{ port: number; close(): Promise<void> }> {
  const maxTokens = 4096;
  // Pre-rendered chunk tails (everything after the per-request `{"id":…,"model":…`), with and without ids.
  const tail = (i: number, last: boolean, ids: boolean) =>
    `,"choices":[{"index":0,"text":${JSON.stringify(WORDS[i % WORDS.length])},"logprobs":null,"finish_reason":${last ? '"length"' : 'null'},"stop_reason":null,"prompt_token_ids":null,"token_ids":${ids ? `[${1000 + (i % 5000)}]` : 'null'}}],"usage":null}\n\n`;
  const tails = [false, true].map((ids) => Array.from({ length: maxTokens }, (_, i) => tail(i, false, ids)));
  const lastTails = [false, true].map((ids) => Array.from({ length: maxTokens }, (_, i) => tail(i, true, ids)));
  const times = new Map<string, number[]>();
  const running = new Set<Stream>();
  let counter = 0;

  const writeNext = (s: Stream) => {
    const i = s.next++;
    const last = s.next === s.total;
    let text = s.head + (last ? lastTails : tails)[Number(s.withIds)][i];
    if (i === 0 && s.withIds) text = text.replace('"prompt_token_ids":null', `"prompt_token_ids":[${s.promptIds.join(',')}]`);
    s.res.write(last ? text + 'data: [DONE]\n\n' : text);
    s.times.push(nowMs());
    if (last) {
      s.res.end();
      running.delete(s);
    }
  };

  // The engine's step clock: absolute deadlines, so timer lateness does not accumulate.
  let tick: NodeJS.Timeout | undefined;
  let nextStep = 0;
  const step = () => {
    tick = undefined;
    // Every running stream already had its first token written on arrival.
    for (const s of running) writeNext(s);
    if (running.size === 0) return;
    nextStep += opts.gapMs;
    tick = setTimeout(step, Math.max(0, nextStep - nowMs()));
  };

  const server = http.createServer(async (req, res) => {
    const raw = await readBody(req);
    const path = (req.url ?? '/').split('?')[0];
    if (req.method === 'GET' && path === '/version') return json(res, { version: '0.11.0' });
    if (req.method === 'GET' && path === '/v1/models') {
      return json(res, {
        object: 'list',
        data: [{ id: MODEL, object: 'model', created: 1, owned_by: 'vllm', root: MODEL, parent: null, max_model_len: 40960, permission: [] }],
      });
    }
    if (req.method === 'GET' && path === '/bench/times') {
      const out = Object.fromEntries(times);
      times.clear();
      return json(res, out);
    }
    const body = raw.length > 0 ? (JSON.parse(raw.toString('utf8')) as Record<string, unknown>) : {};
    if (req.method === 'POST' && path === '/tokenize') {
      const ids = Array.isArray(body.prompt) ? (body.prompt as number[]) : fakePromptIds(String(body.prompt ?? body.content ?? ''));
      return json(res, { count: ids.length, max_model_len: 40960, tokens: ids, token_strs: null });
    }
    if (req.method !== 'POST' || path !== '/v1/completions') {
      res.writeHead(404, { 'content-type': 'application/json' }).end('{"detail":"Not Found"}');
      return;
    }
    const requestId = String(req.headers['x-request-id'] ?? `bench${counter++}`);
    const promptIds = Array.isArray(body.prompt) ? (body.prompt as number[]) : fakePromptIds(String(body.prompt ?? ''));
    const s: Stream = {
      res,
      head: `data: {"id":"cmpl-${requestId}","object":"text_completion","created":${Math.floor(Date.now() / 1000)},"model":"${MODEL}"`,
      next: 0,
      total: Math.min(maxTokens, Number(body.max_tokens ?? opts.tokens)),
      withIds: body.return_token_ids === true,
      promptIds,
      times: [],
    };
    times.set(requestId, s.times);
    res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', server: 'uvicorn' });
    running.add(s);
    writeNext(s);
    if (opts.gapMs <= 0) {
      while (running.has(s)) writeNext(s);
      return;
    }
    if (!tick && running.size > 0) {
      nextStep = nowMs() + opts.gapMs;
      tick = setTimeout(step, opts.gapMs);
    }
  });
  server.keepAliveTimeout = 65_000;
  await new Promise<void>((resolve) => server.listen(port, '127.0.0.1', resolve));
  return {
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise<void>((resolve) => {
        if (tick) clearTimeout(tick);
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
