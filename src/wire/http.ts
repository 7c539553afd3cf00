import type { IncomingMessage, ServerResponse } from 'node:http';
import { errorJson } from './errors.js';

/**
 * A request's body, or null once it outgrows `limit` bytes: the rest is read and dropped (the connection stays
 * readable for the 413 that `sendTooLarge` writes).
 */
export function readBody(req: IncomingMessage, limit: number): Promise<Buffer | null> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size > limit) return resolve(null);
      chunks.push(chunk);
    });
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

/** Answers `status` with a JSON body; a response already under way is cut instead (its headers are sent). */
export function sendJson(res: ServerResponse, status: number, body: string): void {
  if (res.headersSent) return void res.destroy();
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) }).end(body);
}

/** vLLM's 413 for a body beyond `limit` bytes; the connection closes after it (the body was not read to its end). */
export function sendTooLarge(res: ServerResponse, limit: number): void {
  const body = errorJson(413, `Request body is larger than ${limit} bytes.`, 'Request Entity Too Large');
  res.writeHead(413, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), connection: 'close' }).end(body);
}

/** Aborted when the client leaves before its response is finished: what it was waiting for can stop. */
export function abortOnClose(res: ServerResponse): AbortController {
  const abort = new AbortController();
  res.on('close', () => {
    if (!res.writableFinished) abort.abort();
  });
  return abort;
}

/**
 * The answer of a server that takes requests to `/mocker/health` (OWN_HEALTH_PATH) and vLLM's `/health`: a 200
 * without a body (the drain answers 503 once stopping).
 */
export function answerHealthy(res: ServerResponse): void {
  res.writeHead(200).end();
}
