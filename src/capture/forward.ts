import type { IncomingHttpHeaders, IncomingMessage, OutgoingHttpHeaders, ServerResponse } from 'node:http';
import { errorJson } from '../wire/errors.js';
import { poolingEndpoint } from '../generation/poolingKey.js';
import type { UpstreamFailure } from '../metrics/mockerMetrics.js';
import type { AgentApi, HeaderMap, RecordedEndpoint } from '../store/captureStore.js';
import type { TokenizeDialect, UpstreamEngine } from './upstreamEngine.js';
import type { UpstreamPool, UpstreamRequest } from './upstreamHttp.js';

/** Headers never forwarded hop to hop (RFC 9110 §7.6.1) or recomputed by the proxy. */
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'transfer-encoding',
  'te',
  'trailer',
  'upgrade',
  'proxy-authorization',
  'proxy-authenticate',
  'host',
  'content-length',
]);

export const DEFAULT_REDACTED_HEADERS = ['authorization', 'proxy-authorization', 'api-key', 'x-api-key', 'cookie', 'set-cookie'];

const GENERATION_PATHS: Record<string, 'chat' | 'completion'> = {
  '/v1/chat/completions': 'chat',
  '/v1/completions': 'completion',
};

/** The agents' APIs (issue #39), recorded as sent: no token ids are asked for (they have no such field). */
const AGENT_API_PATHS: Record<string, AgentApi> = {
  '/inference/v1/generate': 'generate',
  '/v1/responses': 'responses',
  '/v1/messages': 'messages',
};

const postPath = (method: string, url: string): string | null => (method === 'POST' ? url.split('?')[0].replace(/\/+$/, '') : null);

export function generationEndpoint(method: string, url: string): 'chat' | 'completion' | null {
  const path = postPath(method, url);
  return path === null ? null : (GENERATION_PATHS[path] ?? null);
}

export function agentApiEndpoint(method: string, url: string): AgentApi | null {
  const path = postPath(method, url);
  return path === null ? null : (AGENT_API_PATHS[path] ?? null);
}

export interface ForwardConfig {
  /** The engine, and what the proxy has learnt of its dialect. */
  upstream: UpstreamEngine;
  /**
   * Connections to it. Its timeout: no response headers, or no bytes for that long, and the exchange fails
   * (504 if nothing was sent yet).
   */
  connections: UpstreamPool;
}

/** Everything observed about one proxied exchange; the recorder turns it into a stored exchange. */
export interface RawExchange {
  startedAt: number;
  method: string;
  path: string;
  /** What the recorder stores it as; null: not recorded (health checks, /v1/models…). */
  endpoint: RecordedEndpoint | null;
  /** How the recorder asks the upstream for token ids it did not send. */
  tokenize: TokenizeDialect;
  requestHeaders: IncomingHttpHeaders;
  /** The body the client sent (not the one with injected fields). */
  requestBody: Buffer;
  /** The parsed request, for recorded endpoints with a JSON object body. */
  request: Record<string, unknown> | null;
  injected: string[];
  status: number | null;
  responseHeaders: IncomingHttpHeaders;
  /**
   * The upstream's bytes. The only view of its own ArrayBuffer (never a slice of Node's shared pool), and
   * not read by the proxy once handed to the sink: a sink may transfer it to another thread.
   */
  responseBody: Buffer;
  stream: boolean;
  eventEnds: number[];
  eventTimes: number[];
  totalMs: number;
  outcome: 'complete' | 'failed' | 'aborted';
  error: string | null;
}

/**
 * Whatever stores a finished exchange; the client's response ends only after it returns. It may take
 * `responseBody` (see there); everything else in the exchange stays the caller's.
 */
export type ExchangeSink = (raw: RawExchange) => Promise<void>;

/** How the upstream failed this exchange, or null (it answered, or the client went away first). */
export function upstreamFailure(raw: RawExchange): UpstreamFailure | null {
  if (raw.outcome !== 'failed') return null;
  if (raw.status === null) return raw.error?.includes('timed out') ? 'timeout' : 'unreachable';
  return raw.status >= 400 ? 'error_status' : 'broken_stream';
}

const TOKEN_ID_FIELDS = /"(prompt_token_ids|token_ids)":\[[0-9,\s]*\]/g;

/**
 * What vLLM sends when `return_token_ids` is off: the same JSON with those fields null. Safe on raw JSON
 * text: inside a string value a quote is always escaped, so the pattern only matches real keys.
 */
export function hideTokenIds(text: string): string {
  return text.replace(TOKEN_ID_FIELDS, '"$1":null');
}

const IDS_KEY_TAIL = Buffer.from('token_ids":[');
const PROMPT_KEY_HEAD = Buffer.from('"prompt_');
const NULL_BYTES = Buffer.from('null');

/** Bytes allowed inside a token-id array: digits, commas and (JSON) whitespace. */
function isIdListByte(b: number): boolean {
  return (b >= 0x30 && b <= 0x39) || b === 0x2c || b === 0x20 || (b >= 0x09 && b <= 0x0d);
}

/**
 * `hideTokenIds` on the bytes [from, to) of `buf`, without decoding them: the same bytes (a view, no copy)
 * when no token-id field is there, else a new buffer with each such array replaced by `null` (vLLM's answer when
 * not asked), or, `absent`, each such member removed with its comma (SGLang's). The proxy's per-event path: the
 * event's bytes are never turned into a string and back.
 */
export function hideTokenIdsInBytes(buf: Buffer, from: number, to: number, unasked: 'null' | 'absent' = 'null'): Buffer {
  const bytes = buf.subarray(from, to);
  let hit = bytes.indexOf(IDS_KEY_TAIL);
  if (hit < 0) return bytes;
  const parts: Buffer[] = [];
  let copied = 0;
  for (; hit >= 0; hit = bytes.indexOf(IDS_KEY_TAIL, hit + IDS_KEY_TAIL.length)) {
    // The key is exactly "token_ids" or "prompt_token_ids" (as the regex's leading quote requires).
    const plainKey = hit >= 1 && bytes[hit - 1] === 0x22;
    const isKey = plainKey || (hit >= PROMPT_KEY_HEAD.length && bytes.subarray(hit - PROMPT_KEY_HEAD.length, hit).equals(PROMPT_KEY_HEAD));
    if (!isKey) continue;
    const open = hit + IDS_KEY_TAIL.length - 1;
    let close = open + 1;
    while (close < bytes.length && isIdListByte(bytes[close])) close++;
    if (close >= bytes.length || bytes[close] !== 0x5d) continue;
    if (unasked === 'null') {
      parts.push(bytes.subarray(copied, open), NULL_BYTES);
      copied = close + 1;
      continue;
    }
    const member = plainKey ? hit - 1 : hit - PROMPT_KEY_HEAD.length;
    const commaBefore = member - 1 >= copied && bytes[member - 1] === 0x2c;
    const commaAfter = !commaBefore && bytes[close + 1] === 0x2c;
    parts.push(bytes.subarray(copied, commaBefore ? member - 1 : member));
    copied = close + (commaAfter ? 2 : 1);
  }
  if (parts.length === 0) return bytes;
  parts.push(bytes.subarray(copied));
  return Buffer.concat(parts);
}

export function redactHeaders(headers: IncomingHttpHeaders, redacted: ReadonlySet<string>): HeaderMap {
  const out: HeaderMap = {};
  for (const [k, v] of Object.entries(headers)) {
    if (v === undefined || redacted.has(k.toLowerCase())) continue;
    out[k] = v;
  }
  return out;
}

function upstreamHeaders(headers: IncomingHttpHeaders, bodyLength: number, endpoint: string | null): OutgoingHttpHeaders {
  const out: OutgoingHttpHeaders = {};
  for (const [k, v] of Object.entries(headers)) {
    if (v === undefined || HOP_BY_HOP.has(k)) continue;
    // Recorded endpoints are fetched uncompressed so the proxy can read the events it records.
    if (endpoint && k === 'accept-encoding') continue;
    out[k] = v;
  }
  out['content-length'] = bodyLength;
  return out;
}

function clientHeaders(headers: IncomingHttpHeaders, dropLength: boolean): OutgoingHttpHeaders {
  const out: OutgoingHttpHeaders = {};
  for (const [k, v] of Object.entries(headers)) {
    if (v === undefined) continue;
    if (k === 'transfer-encoding' || k === 'connection' || k === 'keep-alive') continue;
    if (dropLength && k === 'content-length') continue;
    out[k] = v;
  }
  return out;
}

const BLANK_LINE = Buffer.from('\n\n');

/** Splits a byte stream into SSE events (terminated by a blank line), remembering where each ends. */
class EventSplitter {
  private scanFrom = 0;
  readonly ends: number[] = [];
  readonly times: number[] = [];
  private lastEnd = 0;

  /** Returns the completed events' byte range [from, to) within `buffer`, if any completed. */
  push(buffer: Buffer, length: number, at: number): [number, number] | null {
    const from = this.lastEnd;
    const bytes = buffer.subarray(0, length);
    // An event ends after the second newline of each "\n\n" (found natively; the pair may straddle chunks).
    for (let i = bytes.indexOf(BLANK_LINE, Math.max(this.scanFrom - 1, 0)); i >= 0; i = bytes.indexOf(BLANK_LINE, i + 1)) {
      this.ends.push(i + 2);
      this.times.push(at);
      this.lastEnd = i + 2;
    }
    this.scanFrom = length;
    return this.lastEnd > from ? [from, this.lastEnd] : null;
  }

  /** Bytes after the last complete event (a stream cut short). */
  finish(length: number, at: number): void {
    if (length > this.lastEnd) {
      this.ends.push(length);
      this.times.push(at);
      this.lastEnd = length;
    }
  }
}

/**
 * Response buffers kept for the next exchanges. A buffer that lives as long as a stream outlives two scavenges:
 * allocated afresh for each exchange, the buffers of a few hundred streams a second pile up as old external
 * memory, which counts towards V8's limit for a full mark-compact. Measured (bench/proxy-overhead.ts, 64
 * streams, two rounds, --trace-gc): 28 mark-compacts, one every 0.3–0.6 s under load, each a pause of 2–5 ms
 * that every stream's next token waits out; with spare buffers, 4 and 10 in two runs.
 */
const spareBuffers: Buffer[] = [];
let spareBytes = 0;
/** What the spare buffers may hold in all: a few hundred streams' worth, a bound on idle memory. */
const SPARE_BYTES_MAX = 32 << 20;
const SPARE_BUFFER_MAX_BYTES = 1 << 20;

function takeSpareBuffer(): Buffer {
  const spare = spareBuffers.pop();
  if (!spare) return Buffer.allocUnsafeSlow(64 * 1024);
  spareBytes -= spare.length;
  return spare;
}

/** A growable byte buffer (the recorded response), from the spare buffers. */
class ByteSink {
  buffer = takeSpareBuffer();
  length = 0;
  /** Buffers outgrown: queued socket writes may still point into them, so they are spared only at release. */
  private outgrown: Buffer[] = [];
  append(chunk: Buffer): void {
    if (this.length + chunk.length > this.buffer.length) {
      const next = Buffer.allocUnsafeSlow(Math.max(this.buffer.length * 2, this.length + chunk.length));
      this.buffer.copy(next, 0, 0, this.length);
      this.outgrown.push(this.buffer);
      this.buffer = next;
    }
    chunk.copy(this.buffer, this.length);
    this.length += chunk.length;
  }
  /** A copy that owns its whole ArrayBuffer (never pooled), so it can be transferred to another thread. */
  bytes(): Buffer {
    const out = Buffer.allocUnsafeSlow(this.length);
    this.buffer.copy(out, 0, 0, this.length);
    return out;
  }
  /** Gives the buffers back for the next exchanges; nothing may read them after (no socket write still queued). */
  release(): void {
    for (const b of [...this.outgrown, this.buffer]) {
      if (b.length > SPARE_BUFFER_MAX_BYTES || spareBytes + b.length > SPARE_BYTES_MAX) continue;
      spareBuffers.push(b);
      spareBytes += b.length;
    }
    this.outgrown = [];
  }
}

/**
 * `body`, the bytes of a JSON object, with `"field":value` added as its first member: every byte the client
 * sent reaches the engine unchanged (a re-serialisation would round big integers, turn `1e999` into `null`,
 * `-0` into `0`, re-escape strings, and overflow the stack on deep nesting).
 */
export function spliceFirstMember(body: Buffer, field: string, valueJson: string): Buffer {
  let open = 0;
  while (open < body.length && body[open] !== 0x7b) open++;
  let next = open + 1;
  while (next < body.length && (body[next] === 0x20 || body[next] === 0x09 || body[next] === 0x0a || body[next] === 0x0d)) next++;
  const empty = body[next] === 0x7d;
  const member = Buffer.from(`${JSON.stringify(field)}:${valueJson}${empty ? '' : ','}`);
  return Buffer.concat([body.subarray(0, open + 1), member, body.subarray(open + 1)]);
}

/** The fields the engine names in a 400/422 answer to a request the proxy added them to. */
function refusedFields(injected: readonly string[], status: number, body: Buffer): string[] {
  if (status !== 400 && status !== 422) return [];
  const text = body.toString('utf8');
  return injected.filter((field) => text.includes(field));
}

/**
 * Proxies one exchange to the upstream, streaming the upstream's bytes to the client as they arrive,
 * and hands everything observed to `sink`. Generation requests get `return_token_ids: true` spliced in where
 * the engine's dialect reports token ids; the client sees those fields null again unless it asked for them
 * itself. An engine that refuses the added field (400/422 naming it) is asked again without it, and never
 * gets it again: the client only ever sees what the engine answers to its own request.
 */
export async function forwardExchange(
  config: ForwardConfig,
  req: IncomingMessage,
  requestBody: Buffer,
  res: ServerResponse,
  sink: ExchangeSink,
): Promise<void> {
  await new ForwardedExchange(config, req, requestBody, res, sink).run();
}

/** The request as the proxy reads it, and the body it sends the engine (with the fields it added, `injected`). */
function prepareRequest(
  upstream: UpstreamEngine,
  generation: 'chat' | 'completion' | null,
  endpoint: RecordedEndpoint | null,
  requestBody: Buffer,
): { request: Record<string, unknown> | null; sentBody: Buffer; injected: string[] } {
  let request: Record<string, unknown> | null = null;
  if (!endpoint) return { request, sentBody: requestBody, injected: [] };
  try {
    const parsed = JSON.parse(requestBody.toString('utf8')) as unknown;
    if (parsed && typeof parsed === 'object' && !Array.isArray(parsed)) request = parsed as Record<string, unknown>;
  } catch {
    // Not JSON: forwarded untouched, the upstream answers with its own error; not recorded as a generation.
  }
  const dialect = upstream.dialect;
  const idsAllowed = dialect.streamedChatIds || !(generation === 'chat' && request?.stream === true);
  if (generation && request && dialect.injectTokenIds && idsAllowed && request.return_token_ids === undefined)
    return { request, sentBody: spliceFirstMember(requestBody, 'return_token_ids', 'true'), injected: ['return_token_ids'] };
  return { request, sentBody: requestBody, injected: [] };
}

/** One exchange in flight: the attempt sent upstream, what it has answered so far, and the client's response. */
class ForwardedExchange {
  private readonly engine: UpstreamEngine;
  private readonly target: URL;
  private readonly raw: RawExchange;
  private sentBody: Buffer;
  /** When the exchange started, on the clock its event times are read from. */
  private t0 = performance.now();
  /** The same instant on the wall clock: start + total is when the exchange ended. */
  private readonly startedAt = Date.now();
  private body = new ByteSink();
  private splitter = new EventSplitter();
  private settled = false;
  private upstreamReq: UpstreamRequest | undefined;
  private resolve: () => void = () => undefined;
  // What the upstream's head decided for the attempt being answered.
  private statusMessage = '';
  private transform = false;
  private mayResend = false;
  private deferHead = false;
  private holdBody = false;

  constructor(
    private readonly config: ForwardConfig,
    private readonly req: IncomingMessage,
    private readonly requestBody: Buffer,
    private readonly res: ServerResponse,
    private readonly sink: ExchangeSink,
  ) {
    const method = req.method ?? 'GET';
    const path = req.url ?? '/';
    const generation = generationEndpoint(method, path);
    // The agents' APIs, embeddings and rerank requests are recorded as sent: nothing is added to them.
    const endpoint = generation ?? agentApiEndpoint(method, path) ?? poolingEndpoint(method, path);
    this.engine = config.upstream;
    const { request, sentBody, injected } = prepareRequest(this.engine, generation, endpoint, requestBody);
    this.sentBody = sentBody;
    const base = this.engine.url;
    this.target = new URL(base.pathname.replace(/\/$/, '') + path, base);
    this.raw = {
      startedAt: this.startedAt,
      method,
      path,
      endpoint,
      tokenize: this.engine.dialect.tokenize,
      requestHeaders: req.headers,
      requestBody,
      request,
      injected,
      status: null,
      responseHeaders: {},
      responseBody: Buffer.alloc(0),
      stream: false,
      eventEnds: this.splitter.ends,
      eventTimes: this.splitter.times,
      totalMs: 0,
      outcome: 'complete',
      error: null,
    };
  }

  /** Settles once the exchange is stored and the client's response ended (or the client went away). */
  run(): Promise<void> {
    return new Promise<void>((resolve) => {
      this.resolve = resolve;
      this.res.on('close', () => {
        if (!this.res.writableFinished && !this.settled) {
          this.upstreamReq?.abort();
          void this.done('aborted', 'client disconnected', () => undefined);
        }
      });
      this.send();
    });
  }

  private async done(outcome: RawExchange['outcome'], error: string | null, endClient: () => void): Promise<void> {
    if (this.settled) return;
    this.settled = true;
    const { raw, res } = this;
    raw.totalMs = performance.now() - this.t0;
    this.splitter.finish(this.body.length, raw.totalMs);
    raw.responseBody = this.body.bytes();
    raw.outcome = outcome;
    raw.error = error;
    try {
      await this.sink(raw);
    } catch (err) {
      console.error(`mocker capture: could not store ${raw.method} ${raw.path}: ${(err as Error).message}`);
    }
    try {
      endClient();
    } catch (err) {
      // Whatever the upstream sent that the client's response cannot carry: that client's connection ends, not the process.
      console.error(`mocker capture: ${raw.method} ${raw.path}: could not answer the client: ${(err as Error).message}`);
      res.destroy();
    }
    // Once the response is closed, its bytes are in the kernel or dropped: none is read from `body` again.
    const spent = this.body;
    if (res.closed) spent.release();
    else res.once('close', () => spent.release());
    this.resolve();
  }

  private send(): void {
    const { req, raw, target } = this;
    this.upstreamReq = this.config.connections.request(
      raw.method,
      target.pathname + target.search,
      upstreamHeaders(req.headers, this.sentBody.length, raw.endpoint),
      this.sentBody,
      {
        head: (status, message, headers) => this.onHead(status, message, headers),
        data: (chunk) => this.onData(chunk),
        // node:http sends a response's writes on the next tick (each write corks the client's socket until then). When
        // one read of the upstream carried the stream's last events and its end, ending the exchange at once would
        // hold those events back behind handing it to the recorder (measured: 2-3 ms on the last event).
        end: () => process.nextTick(() => this.onEnd()),
        error: (err) => this.onError(err),
      },
    );
  }

  private onHead(status: number, message: string, headers: IncomingHttpHeaders): void {
    const { raw, res } = this;
    this.engine.answered();
    raw.status = status;
    this.statusMessage = message;
    raw.responseHeaders = headers;
    raw.stream = String(headers['content-type'] ?? '').startsWith('text/event-stream');
    this.transform = raw.injected.includes('return_token_ids') && status < 400;
    // An error answer to a request the proxy added fields to waits whole: it may be a refusal to resend.
    this.mayResend = raw.injected.length > 0 && (status === 400 || status === 422);
    // A non-streamed body is rewritten whole, so its head waits for it (to keep a correct content-length).
    this.deferHead = this.mayResend || (this.transform && !raw.stream);
    // A body the client knows the length of is complete for it at its last byte, before the proxy ends the
    // response: a recorded one goes out only once stored (a non-streamed answer is one piece anyway).
    this.holdBody = this.deferHead || (raw.endpoint !== null && !this.transform && (!raw.stream || headers['content-length'] !== undefined));
    if (!this.deferHead) {
      res.writeHead(status, this.statusMessage, clientHeaders(headers, this.transform));
      if (raw.stream) res.flushHeaders();
    }
  }

  private onData(chunk: Buffer): void {
    const { body, res } = this;
    const at = performance.now() - this.t0;
    body.append(chunk);
    if (!this.raw.stream) {
      if (!this.holdBody) res.write(chunk);
      return;
    }
    const events = this.splitter.push(body.buffer, body.length, at);
    if (this.holdBody) return;
    // A view of `body`'s bytes is safe to queue: appends never rewrite them (growing copies elsewhere).
    if (!this.transform) res.write(chunk);
    else if (events) res.write(hideTokenIdsInBytes(body.buffer, events[0], events[1], this.engine.dialect.unaskedIds));
  }

  private onEnd(): void {
    const { raw, body, res } = this;
    const refused = this.mayResend ? refusedFields(raw.injected, raw.status ?? 0, body.buffer.subarray(0, body.length)) : [];
    if (refused.length > 0) return this.resendWithout(refused);
    const unasked = this.engine.dialect.unaskedIds;
    const status = raw.status ?? 0;
    const failed = status >= 400;
    const lastEvent = this.splitter.ends.at(-1) ?? 0;
    const tail = this.transform && raw.stream && body.length > lastEvent ? hideTokenIdsInBytes(body.buffer, lastEvent, body.length, unasked) : undefined;
    const headers = raw.responseHeaders;
    void this.done(failed ? 'failed' : 'complete', failed ? `upstream status ${status}` : null, () => {
      if (!this.deferHead && this.holdBody) return void res.end(body.buffer.subarray(0, body.length));
      if (!this.deferHead) return void (tail ? res.end(tail) : res.end());
      // From the proxy's own copy: the sink may have taken raw.responseBody.
      const out = this.transform ? hideTokenIdsInBytes(body.buffer, 0, body.length, unasked) : body.buffer.subarray(0, body.length);
      const outHeaders = clientHeaders(headers, true);
      outHeaders['content-length'] = out.length;
      res.writeHead(status, this.statusMessage, outHeaders).end(out);
    });
  }

  /** The engine refused the fields the proxy added: it is asked again with the client's own bytes. */
  private resendWithout(refused: string[]): void {
    const { raw } = this;
    this.engine.refused(refused);
    // The one field ever added was refused: the engine gets the client's own bytes.
    raw.injected = [];
    this.sentBody = this.requestBody;
    raw.status = null;
    // Held whole, never written to the client.
    this.body.release();
    this.body = new ByteSink();
    this.splitter = new EventSplitter();
    raw.eventEnds = this.splitter.ends;
    raw.eventTimes = this.splitter.times;
    // The engine's own timing starts with the request it answers.
    const resent = performance.now();
    raw.startedAt += Math.round(resent - this.t0);
    this.t0 = resent;
    this.send();
  }

  private onError(err: Error): void {
    const { res } = this;
    const message = `upstream ${this.engine.url.origin}: ${err.message}`;
    if (this.raw.status !== null) {
      // The upstream broke mid-response: the client sees the same break.
      void this.done('failed', message, () => res.destroy());
      return;
    }
    const timedOut = err.message.includes('timed out');
    const status = timedOut ? 504 : 502;
    void this.done('failed', message, () => {
      if (res.headersSent || res.destroyed) return void res.destroy();
      const json = errorJson(status, message, timedOut ? 'GatewayTimeout' : 'BadGateway');
      res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(json) }).end(json);
    });
  }
}
