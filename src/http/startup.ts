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
    const body = errorJson(503, `The server is starting up: ready in ${(leftMs / 1000).toFixed(1)} s (--startup-time, --stagger-delay).`);
    return c.body(body, 503, { 'content-type': 'application/json', 'retry-after': String(Math.ceil(leftMs / 1000)) });
  };
}

/**
 * Dynamo's `--stagger-delay` (its mocker's launch loop): worker `w` of `workers` starts `w` delays after the first,
 * with a 2 s pause after every 32 when staggered; the delay given in seconds, or -1: 0 up to 32 workers, 0.1 s up to
 * 128, 0.2 s beyond.
 */
export function staggerOffsetMs(worker: number, workers: number, delayS: number): number {
  const delay = delayS === -1 ? (workers <= 32 ? 0 : workers <= 128 ? 0.1 : 0.2) : delayS;
  if (delay <= 0) return 0;
  return 1000 * (worker * delay + 2 * Math.floor(worker / 32));
}
