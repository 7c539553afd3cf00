/**
 * The capture proxy's upstream HTTP/1.1 client (src/capture/upstreamHttp.ts) against real servers on loopback:
 * node:http servers (an independent implementation of the framing) and raw TCP servers sending the exact
 * bytes of RFC 9112's examples — chunked bodies cut at every byte, content-length, read-to-close, 1xx
 * answers, connection reuse and refusal, malformed framing, timeouts and resets.
 */
import http from 'node:http';
import net, { type AddressInfo } from 'node:net';
import type { IncomingHttpHeaders } from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
import { UpstreamPool } from '../../src/capture/upstreamHttp.js';

interface Answer {
  status: number;
  message: string;
  headers: IncomingHttpHeaders;
  body: string;
  error: string | null;
}

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function listening(server: net.Server): Promise<URL> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  cleanups.push(() => new Promise((resolve) => server.close(resolve)));
  return new URL(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
}

/** A TCP server that answers each request's head with `reply(n)` (n = requests so far on any connection). */
async function rawServer(reply: (n: number, socket: net.Socket) => void): Promise<{ url: URL; connections: () => number }> {
  let n = 0;
  let connections = 0;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((socket) => {
    connections++;
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    let seen = '';
    socket.on('data', (d) => {
      seen += d.toString('latin1');
      while (seen.includes('\r\n\r\n')) {
        const head = seen.slice(0, seen.indexOf('\r\n\r\n'));
        const length = Number(/content-length: (\d+)/i.exec(head)?.[1] ?? 0);
        if (seen.length < head.length + 4 + length) return;
        seen = seen.slice(head.length + 4 + length);
        reply(++n, socket);
      }
    });
  });
  const url = await listening(server);
  cleanups.push(() => sockets.forEach((s) => s.destroy()));
  return { url, connections: () => connections };
}

function ask(pool: UpstreamPool, method = 'POST', path = '/v1/completions', body = '{}'): Promise<Answer> {
  return new Promise((resolve) => {
    const answer: Answer = { status: 0, message: '', headers: {}, body: '', error: null };
    const chunks: Buffer[] = [];
    pool.request(method, path, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) }, Buffer.from(body), {
      head: (status, message, headers) => Object.assign(answer, { status, message, headers }),
      data: (chunk) => chunks.push(Buffer.from(chunk)),
      end: () => resolve({ ...answer, body: Buffer.concat(chunks).toString('utf8') }),
      error: (err) => resolve({ ...answer, body: Buffer.concat(chunks).toString('utf8'), error: err.message }),
    });
  });
}

function pool(url: URL, timeoutMs = 5_000): UpstreamPool {
  const p = new UpstreamPool(url, timeoutMs);
  cleanups.push(() => p.close());
  return p;
}

describe('upstream HTTP/1.1 client', () => {
  it('reads what node:http sends: status, message, repeated headers as node:http joins them, a streamed chunked body', async () => {
    const received: { method?: string; url?: string; headers?: IncomingHttpHeaders; body?: string } = {};
    const server = http.createServer((req, res) => {
      let body = '';
      req.on('data', (d: Buffer) => (body += d.toString()));
      req.on('end', () => {
        Object.assign(received, { method: req.method, url: req.url, headers: req.headers, body });
        res.writeHead(201, 'Made It', [
          ['content-type', 'text/event-stream'],
          ['x-seen', 'a'],
          ['x-seen', 'b'],
          ['set-cookie', 'k=1'],
          ['set-cookie', 'j=2'],
        ]);
        res.write('data: one\n\n');
        setTimeout(() => res.end('data: [DONE]\n\n'), 5);
      });
    });
    const url = await listening(server);
    const answer = await ask(pool(url), 'POST', '/v1/chat/completions?x=1', '{"prompt":"héllo"}');
    expect(received).toMatchObject({ method: 'POST', url: '/v1/chat/completions?x=1', body: '{"prompt":"héllo"}' });
    expect(received.headers).toMatchObject({ host: url.host, 'content-type': 'application/json' });
    expect(answer).toMatchObject({ status: 201, message: 'Made It', body: 'data: one\n\ndata: [DONE]\n\n', error: null });
    expect(answer.headers).toMatchObject({
      'content-type': 'text/event-stream',
      'x-seen': 'a, b',
      'set-cookie': ['k=1', 'j=2'],
      'transfer-encoding': 'chunked',
    });
  });

  it('decodes RFC 9112 chunked framing delivered one byte at a time, extensions and trailers included', async () => {
    const bytes =
      'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;ext=1\r\nWiki\r\n5\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nExpires: never\r\n\r\n';
    const { url } = await rawServer((_, socket) => {
      let i = 0;
      const next = () => (i < bytes.length ? socket.write(bytes[i++], 'latin1', () => setImmediate(next)) : undefined);
      next();
    });
    const answer = await ask(pool(url));
    expect(answer).toMatchObject({ status: 200, body: 'Wikipedia in\r\n\r\nchunks.', error: null });
  });

  it('reads content-length bodies, bodiless answers (204, HEAD) and skips 1xx heads', async () => {
    const replies = [
      'HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello',
      'HTTP/1.1 204 No Content\r\n\r\n',
      'HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n',
    ];
    const { url, connections } = await rawServer((n, socket) => socket.write(replies[n - 1]));
    const p = pool(url);
    expect(await ask(p)).toMatchObject({ status: 200, body: 'hello', error: null });
    expect(await ask(p, 'DELETE')).toMatchObject({ status: 204, body: '', error: null });
    expect(await ask(p, 'HEAD', '/', '')).toMatchObject({ status: 200, body: '', error: null, headers: { 'content-length': '7' } });
    // Each answer was complete and kept alive: one connection served all three.
    expect(connections()).toBe(1);
  });

  it('reads a body without length to the close, and opens a new connection after `connection: close`', async () => {
    const { url, connections } = await rawServer((n, socket) => {
      if (n === 1) return void socket.end('HTTP/1.1 200 OK\r\n\r\nuntil the end');
      socket.end('HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok');
    });
    const p = pool(url);
    expect(await ask(p)).toMatchObject({ status: 200, body: 'until the end', error: null });
    expect(await ask(p)).toMatchObject({ status: 200, body: 'ok', error: null });
    expect(await ask(p)).toMatchObject({ status: 200, body: 'ok', error: null });
    expect(connections()).toBe(3);
  });

  it('drops an idle connection the upstream closed, and the next request opens a new one', async () => {
    const { url, connections } = await rawServer((_, socket) => {
      socket.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok');
      setTimeout(() => socket.end(), 10);
    });
    const p = pool(url);
    expect(await ask(p)).toMatchObject({ body: 'ok', error: null });
    await new Promise((r) => setTimeout(r, 100));
    expect(await ask(p)).toMatchObject({ body: 'ok', error: null });
    expect(connections()).toBe(2);
  });

  it('fails malformed answers instead of guessing: a bad chunk size, a bad status line, a bad content-length', async () => {
    const replies = [
      'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n',
      'HTTP/1.1 2000 Weird\r\n\r\n',
      'HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n',
      'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n0\r\n\r\n',
      // What node:http's parser refuses too: a bare LF or a control inside a value, a space in a name, two lengths.
      'HTTP/1.1 200 OK\r\nx-odd: a\nb\r\nContent-Length: 0\r\n\r\n',
      'HTTP/1.1 200 OK\r\nx-odd: a\x01b\r\nContent-Length: 0\r\n\r\n',
      'HTTP/1.1 200 OK\r\nx odd: 1\r\nContent-Length: 0\r\n\r\n',
      'HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc',
      'HTTP/1.1 200 O\x07K\r\nContent-Length: 0\r\n\r\n',
    ];
    const { url } = await rawServer((n, socket) => socket.write(replies[n - 1]));
    // A fresh pool each time: a failed exchange's connection is never reused anyway.
    expect((await ask(pool(url))).error).toContain('invalid chunk size "zz"');
    expect((await ask(pool(url))).error).toContain('malformed status line');
    expect((await ask(pool(url))).error).toContain('invalid content-length');
    const crlf = await ask(pool(url));
    expect(crlf).toMatchObject({ body: 'abc', error: 'chunk data not followed by CRLF' });
    for (let i = 0; i < 3; i++) expect((await ask(pool(url))).error).toContain('malformed header line');
    expect((await ask(pool(url))).error).toBe('conflicting content-length values "2" and "3"');
    expect((await ask(pool(url))).error).toContain('malformed status line');
  });

  it("gives up a kept-alive connection a second before the upstream's `Keep-Alive: timeout` closes it", async () => {
    const { url, connections } = await rawServer((n, socket) => {
      socket.write(`HTTP/1.1 200 OK\r\nKeep-Alive: timeout=${n <= 2 ? 1 : 2}\r\nContent-Length: 2\r\n\r\nok`);
    });
    const p = pool(url);
    // timeout=1: nothing left to keep it for.
    expect(await ask(p)).toMatchObject({ body: 'ok', error: null });
    expect(await ask(p)).toMatchObject({ body: 'ok', error: null });
    expect(connections()).toBe(2);
    // timeout=2: reused at once, given up after a second idle.
    expect(await ask(p)).toMatchObject({ body: 'ok', error: null });
    expect(await ask(p)).toMatchObject({ body: 'ok', error: null });
    expect(connections()).toBe(3);
    await new Promise((r) => setTimeout(r, 1_200));
    expect(await ask(p)).toMatchObject({ body: 'ok', error: null });
    expect(connections()).toBe(4);
  });

  it('reports a cut mid-body as a reset, nothing as a timeout, and a closed port as the connect error', async () => {
    const { url } = await rawServer((n, socket) => {
      if (n === 1) socket.write('HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf', () => socket.destroy());
      // n === 2: never answers.
    });
    expect(await ask(pool(url))).toMatchObject({ status: 200, body: 'half', error: 'upstream reset the connection mid-response' });
    expect((await ask(pool(url, 150))).error).toBe('upstream timed out after 150 ms');
    const closed = net.createServer();
    const closedUrl = await listening(closed);
    await new Promise((r) => closed.close(r));
    expect((await ask(pool(closedUrl))).error).toMatch(/ECONNREFUSED/);
  });

  it('refuses header values that would split the request, before sending anything', async () => {
    let requests = 0;
    const { url } = await rawServer(() => requests++);
    const answer = await new Promise<string>((resolve) =>
      pool(url).request('GET', '/', { 'x-evil': 'a\r\nx-injected: 1' }, Buffer.alloc(0), {
        head: () => resolve('head'),
        data: () => undefined,
        end: () => resolve('end'),
        error: (err) => resolve(err.message),
      }),
    );
    expect(answer).toBe('invalid header "x-evil"');
    expect(requests).toBe(0);
  });
});
