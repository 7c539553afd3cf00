/**
 * The capture proxy's HTTP/1.1 client for its upstream: keep-alive connections (TCP or TLS) read and written
 * directly. Measured against node:http's client on the proxy's streaming path (bench/proxy-overhead.ts,
 * 64 streams, 2026-11-27), node:http's response stream cost ≈ 13 µs of CPU per streamed token on top of the
 * socket's read and write; here a token's bytes go from the socket's read to the caller in one callback.
 * Framing per RFC 9112 §6: chunked, content-length, or read to close; 1xx answers are skipped.
 */
import type { IncomingHttpHeaders, OutgoingHttpHeaders } from 'node:http';
import net from 'node:net';
import tls from 'node:tls';
import type { UpstreamTls } from '../wire/tls.js';

export interface ResponseHandler {
  /** The final (non-1xx) status line and headers, as node:http would give them. */
  head(status: number, statusMessage: string, headers: IncomingHttpHeaders): void;
  /** Body bytes, unframed: a view of what the connection read (never overwritten later). */
  data(chunk: Buffer): void;
  end(): void;
  /** The connection failed or was cut, or the answer broke the protocol; no call follows. */
  error(err: Error): void;
}

export interface UpstreamRequest {
  /** Gives up on the exchange: its connection is closed, no handler call follows. */
  abort(): void;
}

/** Headers node:http keeps only once when repeated (RFC 9110: single-valued); the first one wins. */
const SINGLE_VALUED = new Set([
  'age',
  'authorization',
  'content-length',
  'content-type',
  'etag',
  'expires',
  'from',
  'host',
  'if-modified-since',
  'if-unmodified-since',
  'last-modified',
  'location',
  'max-forwards',
  'proxy-authorization',
  'referer',
  'retry-after',
  'server',
  'user-agent',
]);

const MAX_HEAD_BYTES = 64 * 1024;
const CRLF = Buffer.from('\r\n');
const HEAD_END = Buffer.from('\r\n\r\n');

/** RFC 9110 §5.1 field names; §5.5 field values (and a reason phrase): no CR, LF, NUL or other controls but tab. */
const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
const FIELD_TEXT = /^[\t\x20-\x7e\x80-\xff]*$/;

/** A response head as node:http's parser would take it, refusing what it refuses (a bare LF, a control, a bad name). */
function parseHead(text: string): { status: number; message: string; version: string; headers: IncomingHttpHeaders } {
  const lines = text.split('\r\n');
  const statusLine = /^HTTP\/(1\.[01]) (\d{3})(?: (.*))?$/.exec(lines[0]);
  if (!statusLine || !FIELD_TEXT.test(statusLine[3] ?? '')) throw new Error(`malformed status line ${JSON.stringify(lines[0].slice(0, 100))}`);
  const headers: IncomingHttpHeaders = {};
  for (let i = 1; i < lines.length; i++) {
    const colon = lines[i].indexOf(':');
    const rawName = colon > 0 ? lines[i].slice(0, colon) : '';
    const value = lines[i].slice(colon + 1).replace(/^[ \t]+|[ \t]+$/g, '');
    if (!TOKEN.test(rawName) || !FIELD_TEXT.test(value)) throw new Error(`malformed header line ${JSON.stringify(lines[i].slice(0, 100))}`);
    const name = rawName.toLowerCase();
    const seen = headers[name];
    // Differing lengths leave the body's end unknown (RFC 9112 §6.3): refused, as node:http does.
    if (name === 'content-length' && seen !== undefined && seen !== value)
      throw new Error(`conflicting content-length values ${JSON.stringify(seen)} and ${JSON.stringify(value)}`);
    if (name === 'set-cookie') headers['set-cookie'] = [...((seen as string[] | undefined) ?? []), value];
    else if (seen === undefined) headers[name] = value;
    else if (!SINGLE_VALUED.has(name)) headers[name] = `${seen as string}${name === 'cookie' ? '; ' : ', '}${value}`;
  }
  return { status: Number(statusLine[2]), message: statusLine[3] ?? '', version: statusLine[1], headers };
}

/** The size on a chunk-size line (bytes [0, end) of `line`): hex digits, then optional extensions after ';'. */
function chunkSize(line: Buffer, end: number): number {
  let size = 0;
  let i = 0;
  for (; i < end; i++) {
    const c = line[i];
    const digit = c >= 0x30 && c <= 0x39 ? c - 0x30 : c >= 0x61 && c <= 0x66 ? c - 0x57 : c >= 0x41 && c <= 0x46 ? c - 0x37 : -1;
    if (digit < 0) break;
    size = size * 16 + digit;
  }
  const valid = i > 0 && i <= 15 && (i === end || /^[ \t]*(?:;.*)?$/.test(line.subarray(i, end).toString('latin1')));
  if (!valid) throw new Error(`invalid chunk size ${JSON.stringify(line.subarray(0, Math.min(end, 40)).toString('latin1'))}`);
  return size;
}

/** How the body of one response is delimited. */
type Framing = { kind: 'none' } | { kind: 'length'; left: number } | { kind: 'chunked' } | { kind: 'close' };

function framingOf(method: string, status: number, headers: IncomingHttpHeaders): Framing {
  if (method === 'HEAD' || status === 204 || status === 304) return { kind: 'none' };
  const coding = headers['transfer-encoding'];
  if (coding !== undefined) {
    if (/(?:^|,)\s*chunked\s*$/i.test(coding)) return { kind: 'chunked' };
    return { kind: 'close' };
  }
  const length = headers['content-length'];
  if (length !== undefined) {
    if (!/^\d+$/.test(length)) throw new Error(`invalid content-length ${JSON.stringify(length)}`);
    return Number(length) === 0 ? { kind: 'none' } : { kind: 'length', left: Number(length) };
  }
  return { kind: 'close' };
}

/** One exchange on one connection: reads its response off the socket and hands it to the handler. */
class Exchange {
  /** Bytes not yet consumed (a partial head, chunk-size line or trailer section). */
  private pending: Buffer | null = null;
  private framing: Framing | null = null;
  /** In a chunked body: bytes of the current chunk still to come, or -1 between chunks. */
  private chunkLeft = -1;
  private inTrailers = false;
  private keepAlive = true;
  /** How long the upstream keeps the connection open when idle (its `Keep-Alive: timeout=N`), if it says. */
  private idleMs: number | undefined;
  private finished = false;

  constructor(
    private readonly method: string,
    private readonly handler: ResponseHandler,
    private readonly release: (reusable: boolean, idleMs?: number) => void,
  ) {}

  /** Consumes the bytes the connection delivered. */
  feed(input: Buffer): void {
    let buf = this.pending ? Buffer.concat([this.pending, input]) : input;
    this.pending = null;
    try {
      while (buf.length > 0 && !this.finished) {
        if (!this.framing) {
          const end = buf.indexOf(HEAD_END);
          if (end < 0) {
            if (buf.length > MAX_HEAD_BYTES) throw new Error(`response head larger than ${MAX_HEAD_BYTES} bytes`);
            this.pending = Buffer.from(buf);
            return;
          }
          const head = parseHead(buf.subarray(0, end).toString('latin1'));
          buf = buf.subarray(end + 4);
          // 101 would switch protocols, which the proxy never asks for.
          if (head.status >= 100 && head.status < 200 && head.status !== 101) continue;
          const connection = String(head.headers.connection ?? '').toLowerCase();
          this.keepAlive = head.version === '1.1' ? !connection.includes('close') : connection.includes('keep-alive');
          const idleSeconds = /(?:^|[,;\s])timeout\s*=\s*(\d+)/i.exec(String(head.headers['keep-alive'] ?? ''))?.[1];
          this.idleMs = idleSeconds === undefined ? undefined : Number(idleSeconds) * 1000;
          this.framing = framingOf(this.method, head.status, head.headers);
          this.handler.head(head.status, head.message, head.headers);
          if (this.finished) return;
          if (this.framing.kind === 'none') return this.complete(buf.length === 0);
          continue;
        }
        buf = this.body(buf, this.framing);
      }
    } catch (err) {
      this.fail(err as Error);
    }
  }

  /** Consumes body bytes of `buf`, returning what is left. */
  private body(buf: Buffer, framing: Framing): Buffer {
    if (framing.kind === 'close') {
      this.handler.data(buf);
      return buf.subarray(buf.length);
    }
    if (framing.kind === 'length') {
      const take = Math.min(framing.left, buf.length);
      framing.left -= take;
      this.handler.data(buf.subarray(0, take));
      if (framing.left === 0) this.complete(take === buf.length);
      return buf.subarray(take);
    }
    if (this.chunkLeft > 0) {
      const take = Math.min(this.chunkLeft, buf.length);
      this.chunkLeft -= take;
      this.handler.data(buf.subarray(0, take));
      return buf.subarray(take);
    }
    const lineEnd = buf.indexOf(CRLF);
    if (lineEnd < 0) {
      if (buf.length > MAX_HEAD_BYTES) throw new Error('chunk-size line too long');
      this.pending = Buffer.from(buf);
      return buf.subarray(buf.length);
    }
    const rest = buf.subarray(lineEnd + 2);
    if (this.inTrailers) {
      // Trailer fields are dropped (node:http's proxy path did not forward them either); a blank line ends them.
      if (lineEnd === 0) this.complete(rest.length === 0);
      return rest;
    }
    if (this.chunkLeft === 0) {
      // The CRLF after a chunk's data.
      if (lineEnd !== 0) throw new Error('chunk data not followed by CRLF');
      this.chunkLeft = -1;
      return rest;
    }
    this.chunkLeft = chunkSize(buf, lineEnd);
    if (this.chunkLeft === 0) this.inTrailers = true;
    return rest;
  }

  /** The response is complete; its connection is reused unless told otherwise or bytes followed it. */
  private complete(clean: boolean): void {
    this.finished = true;
    this.release(this.keepAlive && clean, this.idleMs);
    this.handler.end();
  }

  /** The connection closed: a read-to-close body ends here, anything else was cut short. */
  closed(err: Error | null): void {
    if (this.finished) return;
    if (!err && this.framing?.kind === 'close') {
      this.finished = true;
      this.release(false);
      return this.handler.end();
    }
    // Once the answer has begun, whatever broke the connection is reported as the break it is to the client.
    this.fail(this.framing ? new Error('upstream reset the connection mid-response') : (err ?? new Error('socket hang up')));
  }

  fail(err: Error): void {
    if (this.finished) return;
    this.finished = true;
    this.release(false);
    this.handler.error(err);
  }

  abandon(): void {
    this.finished = true;
    this.release(false);
  }
}

function requestHead(method: string, path: string, host: string, headers: OutgoingHttpHeaders): string {
  let head = `${method} ${path} HTTP/1.1\r\nhost: ${host}\r\nconnection: keep-alive\r\n`;
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue;
    for (const v of Array.isArray(value) ? value : [value]) {
      const text = String(v);
      // Names and values come from node:http's parser, which holds them to the same rules; checked again so
      // nothing can split a request.
      if (!TOKEN.test(name) || !FIELD_TEXT.test(text)) throw new Error(`invalid header ${JSON.stringify(name)}`);
      head += `${name}: ${text}\r\n`;
    }
  }
  return `${head}\r\n`;
}

/** A whole answer, read as text (for the proxy's own small requests: probes, tokenization). */
export interface TextAnswer {
  status: number;
  headers: IncomingHttpHeaders;
  text: string;
}

/** A kept-alive connection waiting for its next exchange, watched so a close or stray bytes drop it. */
interface IdleConnection {
  socket: net.Socket;
  unwatch(): void;
}

/** Keep-alive connections to one upstream origin (http: or https:), as many as there are exchanges at once. */
export class UpstreamPool {
  private readonly idle: IdleConnection[] = [];
  private readonly host: string;
  private readonly port: number;

  constructor(
    private readonly origin: URL,
    private readonly timeoutMs: number,
    private readonly tls: UpstreamTls = {},
  ) {
    this.host = origin.hostname.replace(/^\[|\]$/g, '');
    this.port = Number(origin.port) || (origin.protocol === 'https:' ? 443 : 80);
  }

  /**
   * Sends one request with its whole body; the handler gets the answer. No bytes for `timeoutMs` (before the
   * head or between body bytes): `error` with a message saying it timed out.
   */
  request(method: string, path: string, headers: OutgoingHttpHeaders, body: Buffer, handler: ResponseHandler): UpstreamRequest {
    let head: Buffer;
    try {
      head = Buffer.from(requestHead(method, path, this.origin.host, headers), 'latin1');
    } catch (err) {
      queueMicrotask(() => handler.error(err as Error));
      return { abort: () => undefined };
    }
    const socket = this.take();
    const onData = (chunk: Buffer) => exchange.feed(chunk);
    const onError = (err: Error) => exchange.closed(err);
    const onClose = () => exchange.closed(null);
    const onTimeout = () => exchange.fail(new Error(`upstream timed out after ${this.timeoutMs} ms`));
    const exchange = new Exchange(method, handler, (reusable, idleMs) => {
      socket.off('data', onData).off('error', onError).off('close', onClose).off('end', onClose).off('timeout', onTimeout);
      socket.setTimeout(0);
      this.release(socket, reusable, idleMs);
    });
    socket.on('data', onData).on('error', onError).on('close', onClose).on('end', onClose).on('timeout', onTimeout);
    socket.setTimeout(this.timeoutMs);
    socket.write(Buffer.concat([head, body]));
    return { abort: () => exchange.abandon() };
  }

  /** One request's whole answer as text; rejects when the upstream cannot be reached or the answer breaks off. */
  text(method: string, path: string, headers: OutgoingHttpHeaders = {}, body = Buffer.alloc(0)): Promise<TextAnswer> {
    return new Promise((resolve, reject) => {
      let status = 0;
      let answerHeaders: IncomingHttpHeaders = {};
      const chunks: Buffer[] = [];
      const sent = body.length > 0 ? { ...headers, 'content-length': body.length } : headers;
      this.request(method, path, sent, body, {
        head: (code, _message, h) => {
          status = code;
          answerHeaders = h;
        },
        data: (chunk) => chunks.push(Buffer.from(chunk)),
        end: () => resolve({ status, headers: answerHeaders, text: Buffer.concat(chunks).toString('utf8') }),
        error: reject,
      });
    });
  }

  /** Closes every idle connection. */
  close(): void {
    for (const { socket, unwatch } of this.idle.splice(0)) {
      unwatch();
      socket.destroy();
    }
  }

  private take(): net.Socket {
    const kept = this.idle.pop();
    if (kept) {
      kept.unwatch();
      return kept.socket.ref();
    }
    const socket =
      this.origin.protocol === 'https:'
        ? tls.connect({
            host: this.host,
            port: this.port,
            servername: net.isIP(this.host) ? undefined : this.host,
            ALPNProtocols: ['http/1.1'],
            ca: this.tls.ca,
          })
        : net.connect({ host: this.host, port: this.port });
    socket.setNoDelay(true);
    return socket;
  }

  /**
   * Keeps a connection for the next exchange, unless it cannot be reused; one the upstream said it closes after
   * `idleMs` idle is given up a second before (as node:http's agent does), so no request races that close.
   */
  private release(socket: net.Socket, reusable: boolean, idleMs?: number): void {
    const keepMs = idleMs === undefined ? undefined : idleMs - 1000;
    if (!reusable || socket.destroyed || (keepMs !== undefined && keepMs <= 0)) return void socket.destroy();
    const drop = () => {
      entry.unwatch();
      socket.destroy();
      this.idle.splice(this.idle.indexOf(entry), 1);
    };
    const entry: IdleConnection = {
      socket,
      unwatch: () => {
        socket.off('close', drop).off('error', drop).off('end', drop).off('data', drop).off('timeout', drop);
        socket.setTimeout(0);
      },
    };
    socket.on('close', drop).on('error', drop).on('end', drop).on('data', drop);
    if (keepMs !== undefined) socket.on('timeout', drop).setTimeout(keepMs);
    // As node:http's agent: an idle connection keeps no process (or worker thread) alive.
    socket.unref();
    this.idle.push(entry);
  }
}
