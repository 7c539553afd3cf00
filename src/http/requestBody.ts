import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Context } from 'hono';
import { forwardExchange, upstreamFailure } from '../capture/forward.js';
import { ApiError } from '../wire/errors.js';
import type { Env, Json, ServeAppConfig } from './serveConfig.js';

/** A request's bytes and their JSON; a body that is not JSON is a 400. */
export async function readJson(c: Context<Env>): Promise<{ bytes: Buffer; body: Json }> {
  const bytes = Buffer.from(await c.req.arrayBuffer());
  try {
    return { bytes, body: JSON.parse(bytes.toString('utf8')) as Json };
  } catch (err) {
    throw new ApiError(400, `Invalid JSON body: ${(err as Error).message}`, 'Bad Request');
  }
}

/** vLLM's `validate_json_request` on its API routes: any other media type is a 400 before the body is read. */
export function readApiJson(c: Context<Env>): ReturnType<typeof readJson> {
  const mediaType = (c.req.header('content-type') ?? '').toLowerCase().split(';')[0];
  if (mediaType !== 'application/json')
    throw new ApiError(400, "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed", 'Bad Request');
  return readJson(c);
}

/** The request's id: its `X-Request-Id`, else its body's `request_id`, else a fresh one. */
export function requestIdFor(c: Context<Env>, body: Json): string {
  const header = c.req.header('x-request-id');
  if (header) return header;
  if (typeof body.request_id === 'string' && body.request_id) return body.request_id;
  return randomUUID().replaceAll('-', '');
}

/** A miss `--on-miss passthrough|record` sends to the upstream (and records). */
export async function forwardMiss(config: ServeAppConfig, reqNode: IncomingMessage, bodyBytes: Buffer, res: ServerResponse): Promise<void> {
  if (!config.forward) throw new ApiError(500, 'on-miss forwarding needs --upstream', 'InternalServerError');
  const record = config.forward.sink;
  await forwardExchange(config.forward.config, reqNode, bodyBytes, res, async (raw) => {
    config.mockerMetrics?.forwarded(upstreamFailure(raw));
    if (!record) return;
    await record(raw);
    config.mockerMetrics?.captureWritten();
  });
}
