import { randomUUID } from 'node:crypto';
import type { Hono } from 'hono';
import { generationEndpoint } from '../capture/forward.js';
import { admitted, UNAUTHORIZED_BODY } from '../wire/access.js';
import { errorJson } from '../wire/errors.js';
import { accessLog } from './accessLog.js';
import { declaredBodyLimit } from './bodyLimit.js';
import { NOT_FOUND_BODY, SERVE_ROUTES } from './routes.js';
import type { Env, ServeAppConfig } from './serveConfig.js';
import { startupGate } from './startup.js';

/** Generation requests in flight (vLLM's --enable-server-load-tracking), as `/load` reports them. */
export interface ServerLoad {
  inFlight: number;
}

/**
 * What every request passes before its route: the start-up gate, the access check (absent control routes are
 * 404s), `X-Request-Id`, the load count, and the body limit.
 */
export function useServeMiddleware(app: Hono<Env>, config: ServeAppConfig, load: ServerLoad): void {
  // First, so that every answer is logged: the start-up gate's 503s and the access check's 401s too.
  if (config.accessLogs) app.use('*', accessLog());
  if (config.readyAtMs !== undefined) app.use('*', startupGate(config.readyAtMs));
  /** The paths registered (read once routes are: at the first request). */
  let registered: Set<string> | undefined;
  app.use('*', async (c, next) => {
    const path = c.req.path;
    const entry = SERVE_ROUTES[path];
    registered ??= new Set(app.routes.map((r) => r.path));
    // A control route that is off is absent, key or not.
    if (entry?.class === 'control' && !registered.has(path)) return c.body(NOT_FOUND_BODY, 404, { 'content-type': 'application/json' });
    // Unknown paths are the API's: under /v1 (or with --api-key-scope all) they too need the key, as vLLM's.
    if (!admitted(config.access, entry?.class ?? 'key', c.req.method, path, c.req.header('authorization'))) {
      return c.body(UNAUTHORIZED_BODY, 401, { 'content-type': 'application/json' });
    }
    if (config.requestIdHeaders) c.env.outgoing.setHeader('x-request-id', c.req.header('x-request-id') ?? randomUUID().replaceAll('-', ''));
    const counted = config.serverLoadTracking === true && generationEndpoint(c.req.method, c.req.path) !== null;
    if (!counted) return next();
    load.inFlight++;
    try {
      await next();
    } finally {
      load.inFlight--;
    }
  });

  app.use(
    '*',
    declaredBodyLimit({
      maxSize: config.maxBodyBytes,
      onError: (c) =>
        c.body(errorJson(413, `Request body is larger than ${config.maxBodyBytes} bytes.`, 'Request Entity Too Large'), 413, {
          'content-type': 'application/json',
        }),
    }),
  );
}
