import http, { type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from 'node:http';
import https from 'node:https';
import { errorJson } from '../http/errors.js';
import type { HeaderMap } from '../store/captureStore.js';

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

export function generationEndpoint(method: string, url: string): 'chat' | 'completion' | null {
  if (method !== 'POST') return null;
  const path = url.split('?')[0].replace(/\/+$/, '');
  return GENERATION_PATHS[path] ?? null;
}

export interface ForwardConfig {
  upstream: URL;
  /** No response headers, or no bytes for this long: the exchange fails (504 if nothing was sent yet). */
  timeoutMs: number;
}

/** Everything observed about one proxied exchange; the recorder turns it into a stored exchange. */
export interface RawExchange {
  startedAt: number;
  method: string;
  path: string;
  endpoint: 'chat' | 'completion' | null;
  requestHeaders: IncomingHttpHeaders;
  /** The body the client sent (not the one with injected fields). */
  requestBody: Buffer;
  /** The parsed request, for generation endpoints with a JSON object body. */
  request: Record<string, unknown> | null;
  injected: string[];
  status: number | null;
  responseHeaders: IncomingHttpHeaders;
  responseBody: Buffer;
  stream: boolean;
  eventEnds: number[];
  eventTimes: number[];
  totalMs: number;
  outcome: 'complete' | 'failed' | 'aborted';
  error: string | null;
}

/** Whatever stores a finished exchange; the client's response ends only after it returns. */
export type ExchangeSink = (raw: RawExchange) => Promise<void>;

const agents = { http: new http.Agent({ keepAlive: true, maxSockets: Infinity }), https: new https.Agent({ keepAlive: true, maxSockets: Infinity }) };

const TOKEN_ID_FIELDS = /"(prompt_token_ids|token_ids)":\[[0-9,\s]*\]/g;

/**
 * What vLLM sends when `return_token_ids` is off: the same JSON with those fields null. Safe on raw JSON
 * text: inside a string value a quote is always escaped, so the pattern only matches real keys.
 */
export function hideTokenIds(text: string): string {
  return text.replace(TOKEN_ID_FIELDS, '"$1":null');
}

export function redactHeaders(headers: IncomingHttpHeaders, redacted: ReadonlySet<string>): HeaderMap {
  const out: HeaderMap = {};
  for (const [k, v] of Object.entries(headers)) {
    if (v === undefined || redacted.has(k.toLowerCase())) continue;
    out[k] = v;
  }
  return out;
}

function upstreamHeaders(headers: IncomingHttpHeaders, bodyLength: number, endpoint: string | null): http.OutgoingHttpHeaders {
  const out: http.OutgoingHttpHeaders = {};
  for (const [k, v] of Object.entries(headers)) {
    if (v === undefined || HOP_BY_HOP.has(k)) continue;
    // Recorded endpoints are fetched uncompressed so the proxy can read the events it records.
    if (endpoint && k === 'accept-encoding') continue;
    out[k] = v;
  }
  out['content-length'] = bodyLength;
  return out;
}

function clientHeaders(headers: IncomingHttpHeaders, dropLength: boolean): http.OutgoingHttpHeaders {
  const out: http.OutgoingHttpHeaders = {};
  for (const [k, v] of Object.entries(headers)) {
    if (v === undefined) continue;
    if (k === 'transfer-encoding' || k === 'connection' || k === 'keep-alive') continue;
    if (dropLength && k === 'content-length') continue;
    out[k] = v;
  }
  return out;
}

/** Splits a byte stream into SSE events (terminated by a blank line), remembering where each ends. */
class EventSplitter {
  private scanFrom = 0;
  readonly ends: number[] = [];
  readonly times: number[] = [];
  private lastEnd = 0;

  /** Returns the completed events' byte range [from, to) within `buffer`, if any completed. */
  push(buffer: Buffer, length: number, at: number): [number, number] | null {
    const from = this.lastEnd;
    let i = Math.max(this.scanFrom, 1);
    while (i < length) {
      if (buffer[i] === 0x0a && buffer[i - 1] === 0x0a) {
        this.ends.push(i + 1);
        this.times.push(at);
        this.lastEnd = i + 1;
      }
      i++;
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

/** A growable byte buffer (the recorded response). */
class ByteSink {
  buffer = Buffer.allocUnsafe(16 * 1024);
  length = 0;
  append(chunk: Buffer): void {
    if (this.length + chunk.length > this.buffer.length) {
      const next = Buffer.allocUnsafe(Math.max(this.buffer.length * 2, this.length + chunk.length));
      this.buffer.copy(next, 0, 0, this.length);
      this.buffer = next;
    }
    chunk.copy(this.buffer, this.length);
    this.length += chunk.length;
  }
  bytes(): Buffer {
    return Buffer.from(this.buffer.subarray(0, this.length));
  }
}

/**
 * Proxies one exchange to the upstream, streaming the upstream's bytes to the client as they arrive,
 * and hands everything observed to `sink`. Generation requests get `return_token_ids: true` injected;
 * the client sees those fields null again unless it asked for them itself.
 */
export async function forwardExchange(
  config: ForwardConfig,
  req: IncomingMessage,
  requestBody: Buffer,
  res: ServerResponse,
  sink: ExchangeSink,
): Promise<void> {
  const method = req.method ?? 'GET';
  const path = req.url ?? '/';
  const endpoint = generationEndpoint(method, path);
  let request: Record<string, unknown> | null = null;
  let sentBody = requestBody;
  const injected: string[] = [];
  if (endpoint) {
    try {
      const parsed = JSON.parse(requestBody.toString('utf8')) as unknown;
      if (parsed && typeof parsed === 'object' && !Array.isArray(parsed)) request = parsed as Record<string, unknown>;
    } catch {
      // Not JSON: forwarded untouched, the upstream answers with its own error.
    }
    if (request && request.return_token_ids === undefined) {
      injected.push('return_token_ids');
      sentBody = Buffer.from(JSON.stringify({ ...request, return_token_ids: true }));
    }
  }
  const hide = injected.includes('return_token_ids');
  const base = config.upstream;
  const target = new URL(base.pathname.replace(/\/$/, '') + path, base);
  const startedAt = Date.now();
  const t0 = performance.now();
  const body = new ByteSink();
  const splitter = new EventSplitter();
  const raw: RawExchange = {
    startedAt,
    method,
    path,
    endpoint,
    requestHeaders: req.headers,
    requestBody,
    request,
    injected,
    status: null,
    responseHeaders: {},
    responseBody: Buffer.alloc(0),
    stream: false,
    eventEnds: splitter.ends,
    eventTimes: splitter.times,
    totalMs: 0,
    outcome: 'complete',
    error: null,
  };

  await new Promise<void>((resolve) => {
    let settled = false;
    const done = async (outcome: RawExchange['outcome'], error: string | null, endClient: () => void) => {
      if (settled) return;
      settled = true;
      raw.totalMs = performance.now() - t0;
      splitter.finish(body.length, raw.totalMs);
      raw.responseBody = body.bytes();
      raw.outcome = outcome;
      raw.error = error;
      try {
        await sink(raw);
      } catch (err) {
        console.error(`mocker capture: could not store ${method} ${path}: ${(err as Error).message}`);
      }
      endClient();
      resolve();
    };

    const lib = target.protocol === 'https:' ? https : http;
    const upstreamReq = lib.request(target, {
      method,
      headers: upstreamHeaders(req.headers, sentBody.length, endpoint),
      agent: target.protocol === 'https:' ? agents.https : agents.http,
      timeout: config.timeoutMs,
    });

    res.on('close', () => {
      if (!res.writableFinished && !settled) {
        upstreamReq.destroy();
        void done('aborted', 'client disconnected', () => undefined);
      }
    });

    const fail = (err: Error) => {
      const message = `upstream ${base.origin}: ${err.message}`;
      if (raw.status === null) {
        const timedOut = err.message.includes('timed out');
        const status = timedOut ? 504 : 502;
        void done('failed', message, () => {
          if (res.headersSent || res.destroyed) return void res.destroy();
          const json = errorJson(status, message, timedOut ? 'GatewayTimeout' : 'BadGateway');
          res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(json) }).end(json);
        });
      } else {
        // The upstream broke mid-response: the client sees the same break.
        void done('failed', message, () => res.destroy());
      }
    };
    upstreamReq.on('error', fail);
    upstreamReq.on('timeout', () => {
      const err = new Error(`upstream timed out after ${config.timeoutMs} ms`);
      fail(err);
      upstreamReq.destroy(err);
    });

    upstreamReq.on('response', (up) => {
      raw.status = up.statusCode ?? 0;
      raw.responseHeaders = up.headers;
      const contentType = String(up.headers['content-type'] ?? '');
      raw.stream = contentType.startsWith('text/event-stream');
      const transform = hide && raw.status < 400;
      // A non-streamed body is rewritten whole, so its head waits for it (to keep a correct content-length).
      const deferHead = transform && !raw.stream;
      if (!deferHead) {
        res.writeHead(raw.status, up.statusMessage, clientHeaders(up.headers, transform));
        if (raw.stream) res.flushHeaders();
      }
      up.on('data', (chunk: Buffer) => {
        const at = performance.now() - t0;
        body.append(chunk);
        if (!raw.stream) return deferHead ? undefined : void res.write(chunk);
        const events = splitter.push(body.buffer, body.length, at);
        if (!transform) res.write(chunk);
        else if (events) res.write(hideTokenIds(body.buffer.toString('utf8', events[0], events[1])));
      });
      // Once the response has begun, a broken connection is reported on it, not on the request.
      up.on('close', () => {
        if (!up.complete) fail(new Error('upstream reset the connection mid-response'));
      });
      up.on('end', () => {
        const failed = raw.status !== null && raw.status >= 400;
        const lastEvent = splitter.ends.at(-1) ?? 0;
        const tail = transform && raw.stream && body.length > lastEvent ? hideTokenIds(body.buffer.toString('utf8', lastEvent, body.length)) : '';
        void done(failed ? 'failed' : 'complete', failed ? `upstream status ${raw.status}` : null, () => {
          if (!deferHead) return void res.end(tail);
          const out = Buffer.from(hideTokenIds(raw.responseBody.toString('utf8')));
          const headers = clientHeaders(up.headers, true);
          headers['content-length'] = out.length;
          res.writeHead(raw.status ?? 200, up.statusMessage, headers).end(out);
        });
      });
    });
    upstreamReq.end(sentBody);
  });
}
