import type { HttpBindings } from '@hono/node-server';
import type { Context, MiddlewareHandler } from 'hono';
import { bodyLimit } from 'hono/body-limit';

/** Requests without a body for hono's node adapter. */
const BODILESS = new Set(['GET', 'HEAD', 'TRACE']);

/**
 * hono's `bodyLimit`, deciding by the Content-Length header without touching the request's web body when it can
 * (hono decides the same way then, but reads `c.req.raw.body` first, which makes @hono/node-server build a web
 * stream over the socket for every request and lose its direct read of the body: a tenth of a replay's CPU).
 * A chunked body, or one of unknown length, goes to hono's own middleware, which counts it.
 */
export function declaredBodyLimit(options: {
  maxSize: number;
  onError: (c: Context) => Response | Promise<Response>;
}): MiddlewareHandler<{ Bindings: HttpBindings }> {
  const counting = bodyLimit(options);
  return async (c, next) => {
    if (BODILESS.has(c.req.method)) return next();
    const headers = c.env.incoming.headers;
    const length = headers['content-length'];
    if (length === undefined || headers['transfer-encoding'] !== undefined) return counting(c, next);
    return parseInt(length || '0', 10) > options.maxSize ? options.onError(c) : next();
  };
}
