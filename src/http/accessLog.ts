import { randomUUID } from 'node:crypto';
import { STATUS_CODES } from 'node:http';
import type { MiddlewareHandler } from 'hono';
import { log } from '../util/log.js';
import { terminalText } from '../util/terminalText.js';
import type { Env } from './serveConfig.js';

/**
 * `--access-logs`: one line per request once its answer has ended (a stream included), in uvicorn's access format
 * as vLLM prints it — `INFO:     127.0.0.1:54321 - "POST /v1/chat/completions HTTP/1.1" 200 OK` — followed by the
 * duration and the request id (the client's X-Request-Id, else one made here and sent back in that header).
 */
export function accessLog(): MiddlewareHandler<Env> {
  return async (c, next) => {
    const started = performance.now();
    const { incoming, outgoing } = c.env;
    const requestId = c.req.header('x-request-id') ?? randomUUID().replaceAll('-', '');
    if (!outgoing.hasHeader('x-request-id')) outgoing.setHeader('x-request-id', requestId);
    // The request line is the client's text: escaped as every line a client writes into the terminal.
    const path = terminalText(incoming.url ?? c.req.path);
    const method = terminalText(c.req.method);
    outgoing.once('close', () => {
      const durationMs = Math.round((performance.now() - started) * 10) / 10;
      const client = `${incoming.socket.remoteAddress ?? '-'}:${incoming.socket.remotePort ?? '-'}`;
      const status = outgoing.statusCode;
      const line = `${client} - "${method} ${path} HTTP/${incoming.httpVersion}" ${status} ${STATUS_CODES[status] ?? ''}`.trimEnd();
      log('info', `INFO:     ${line} ${durationMs} ms request_id=${requestId}`, {
        client,
        method,
        path,
        status,
        duration_ms: durationMs,
        request_id: requestId,
      });
    });
    await next();
  };
}
