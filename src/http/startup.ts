import type { MiddlewareHandler } from 'hono';
import { OWN_HEALTH_PATH } from '../wire/drain.js';
import { errorJson } from '../wire/errors.js';

/** Paths that answer while starting up: Prometheus scrapes (every backend's and DCGM's) and the mocker's own admin routes (not its health check). */
const OPEN_WHILE_STARTING = (path: string) => path.endsWith('/metrics') || (path.startsWith('/mocker/') && path !== OWN_HEALTH_PATH);

/**
 * Dynamo's `--startup-time`: until `readyAtMs` (performance.now() ms), `/health` and the API answer 503 in vLLM's
 * error format with a `Retry-After`, as a readiness probe sees an engine still loading.
 */
export function startupGate(readyAtMs: number, clock: () => number = () => performance.now()): MiddlewareHandler {
  return async (c, next) => {
    const leftMs = readyAtMs - clock();
    if (leftMs <= 0 || OPEN_WHILE_STARTING(c.req.path)) return next();
    const body = errorJson(503, `The server is starting up: ready in ${(leftMs / 1000).toFixed(1)} s (--startup-time).`);
    return c.body(body, 503, { 'content-type': 'application/json', 'retry-after': String(Math.ceil(leftMs / 1000)) });
  };
}
