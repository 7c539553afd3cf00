import type { Context, Handler, Hono } from 'hono';
import { BACKEND_METRICS_PATHS } from '../metrics/backendMetrics.js';
import { KV_PULL_PATH } from '../pd/kvTransfer.js';
import type { ClassifiedRoute, RouteClass } from '../wire/access.js';
import { OWN_HEALTH_PATH } from '../wire/drain.js';
import type { Env } from './serveConfig.js';

/**
 * Every route `serve` may register, with its methods and its access class (access.ts): registering one that is
 * not here fails `createServeApp`. Which exist depends on the configuration (control routes when enabled, the KV
 * pull on a PD engine); the others answer 404, and a known path asked with another method FastAPI's 405.
 */
export const SERVE_ROUTES: Record<string, { methods: string[]; class: RouteClass }> = {
  '/health': { methods: ['GET'], class: 'public' },
  // An engine takes requests when vLLM's /health says so: the same answer (503 while starting up or draining).
  [OWN_HEALTH_PATH]: { methods: ['GET'], class: 'public' },
  '/ping': { methods: ['GET', 'POST'], class: 'public' },
  '/version': { methods: ['GET'], class: 'public' },
  '/metrics': { methods: ['GET'], class: 'public' },
  ...Object.fromEntries(BACKEND_METRICS_PATHS.map((path) => [path, { methods: ['GET'], class: 'public' as const }])),
  '/v1/completions': { methods: ['POST'], class: 'key' },
  '/v1/chat/completions': { methods: ['POST'], class: 'key' },
  '/v1/models': { methods: ['GET'], class: 'key' },
  '/v1/embeddings': { methods: ['POST'], class: 'key' },
  '/v1/ranking': { methods: ['POST'], class: 'key' },
  '/v1/rerank': { methods: ['POST'], class: 'key' },
  '/v1/custom-multimodal': { methods: ['POST'], class: 'key' },
  '/v1/messages': { methods: ['POST'], class: 'key' },
  '/v1/messages/count_tokens': { methods: ['POST'], class: 'key' },
  '/v1/responses': { methods: ['POST'], class: 'key' },
  '/v1/responses/:response_id': { methods: ['GET'], class: 'key' },
  '/v1/responses/:response_id/cancel': { methods: ['POST'], class: 'key' },
  '/rerank': { methods: ['POST'], class: 'key' },
  '/v2/rerank': { methods: ['POST'], class: 'key' },
  '/generate': { methods: ['POST'], class: 'key' },
  '/generate_stream': { methods: ['POST'], class: 'key' },
  '/inference/v1/generate': { methods: ['POST'], class: 'key' },
  '/tokenize': { methods: ['POST'], class: 'key' },
  '/detokenize': { methods: ['POST'], class: 'key' },
  '/load': { methods: ['GET'], class: 'key' },
  '/': { methods: ['GET'], class: 'key' },
  '/mocker/engine': { methods: ['GET'], class: 'key' },
  '/mocker/kv-blocks': { methods: ['GET'], class: 'key' },
  // The decode engines of a PD deployment call it, so it cannot be off by default; it frees only the hold its
  // random id names, which only the client that got the prefill answer (and whom it gives it to) knows.
  [KV_PULL_PATH]: { methods: ['POST'], class: 'key' },
  '/mocker/config': { methods: ['GET', 'POST'], class: 'control' },
  '/reset_prefix_cache': { methods: ['POST'], class: 'control' },
  // Only with VLLM_ALLOW_RUNTIME_LORA_UPDATING, as vLLM.
  '/v1/load_lora_adapter': { methods: ['POST'], class: 'control' },
  '/v1/unload_lora_adapter': { methods: ['POST'], class: 'control' },
};

/** The routes `app` registered (its middleware left out), each with its class; throws on one `SERVE_ROUTES` does not classify. */
export function serveRoutes(app: { routes: readonly { method: string; path: string }[] }): ClassifiedRoute[] {
  return app.routes
    .filter((r) => !(r.method === 'ALL' && r.path === '/*'))
    .map((r) => {
      const entry = SERVE_ROUTES[r.path];
      if (!entry?.methods.includes(r.method))
        throw new Error(`serve registers ${r.method} ${r.path}, which SERVE_ROUTES does not classify (public, key or control)`);
      return { method: r.method, path: r.path, class: entry.class };
    });
}

export const NOT_FOUND_BODY = '{"detail":"Not Found"}';

/**
 * Registers `handler` for `path` under the methods `SERVE_ROUTES` gives it: the table is where a route's methods
 * are written, the registrations (hono's `app.routes`) are what the 404/405 answers and the access check read.
 */
export function on(app: Hono<Env>, path: string, handler: Handler<Env>): void {
  const entry = SERVE_ROUTES[path];
  if (!entry) throw new Error(`serve registers ${path}, which SERVE_ROUTES does not classify (public, key or control)`);
  app.on(entry.methods, path, handler);
}

/** FastAPI's answer to a request no route took: 405 with `Allow` for a registered path asked with another method, else 404. */
export function unmatched(app: Hono<Env>) {
  return (c: Context<Env>) => {
    const allowed = app.routes.filter((r) => r.path === c.req.path && r.method !== 'ALL').map((r) => r.method);
    if (allowed.length > 0) return c.body('{"detail":"Method Not Allowed"}', 405, { 'content-type': 'application/json', allow: allowed.join(', ') });
    return c.body(NOT_FOUND_BODY, 404, { 'content-type': 'application/json' });
  };
}
