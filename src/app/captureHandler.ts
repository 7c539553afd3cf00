import type { IncomingMessage, ServerResponse } from 'node:http';
import { forwardExchange, type ExchangeSink } from '../capture/forward.js';
import type { UpstreamEngine } from '../capture/upstreamEngine.js';
import type { UpstreamPool } from '../capture/upstreamHttp.js';
import { SERVE_ROUTES } from '../http/routes.js';
import { admitted, classOf, decodedPath, DEFAULT_API_KEY_SCOPE, UNAUTHORIZED_BODY, type ApiKeyPolicy, type ClassifiedRoute } from '../wire/access.js';
import { OWN_HEALTH_PATH } from '../wire/drain.js';
import { errorJson } from '../wire/errors.js';
import { answerHealthy, readBody, sendJson, sendTooLarge } from '../wire/http.js';

/** What the capture proxy's handler checks before it forwards (in every process of `capture --threads`). */
export interface ProxyLimits {
  maxBodyBytes: number;
  /** --api-key and --api-key-scope (default: no key). */
  access?: ApiKeyPolicy;
}

/**
 * Every route of the capture proxy, with its access class (access.ts), by path (any method): what `serve` keeps
 * public stays public through it; mocker's own routes (`/mocker/*`: runtime control, KV pulls) are never
 * forwarded, whatever the upstream (a 404 from the proxy itself, but for its own health check, which it
 * answers); everything else is forwarded as the API's.
 */
export const CAPTURE_ROUTES: readonly ClassifiedRoute[] = [
  ...[
    ...new Set(
      Object.entries(SERVE_ROUTES)
        .filter(([path, r]) => r.class === 'public' && !path.startsWith('/mocker/'))
        .map(([path]) => path),
    ),
  ].map((path) => ({ method: '*', path, class: 'public' as const })),
  { method: 'GET', path: OWN_HEALTH_PATH, class: 'public' },
  { method: '*', path: '/mocker/*', class: 'control' },
  { method: '*', path: '/*', class: 'key' },
];

/**
 * The exchanges a process is forwarding: at a stop, those the drain cut off end (stored as aborted) as their
 * connections close, over the next turns; `settled` waits for every one to be handed to the recorder and stored.
 */
export class ExchangesInFlight {
  private readonly pending = new Set<Promise<void>>();

  add(exchange: Promise<void>): void {
    this.pending.add(exchange);
    void exchange.finally(() => this.pending.delete(exchange)).catch(() => undefined);
  }

  async settled(): Promise<void> {
    while (this.pending.size > 0) await Promise.allSettled([...this.pending]);
  }
}

/** The proxy's request handler: its own health, the access check, the body limit, then the exchange forwarded and recorded. */
export function captureHandler(opts: ProxyLimits, upstream: UpstreamEngine, connections: UpstreamPool, sink: ExchangeSink, inFlight: ExchangesInFlight) {
  const access = opts.access ?? { scope: DEFAULT_API_KEY_SCOPE };
  return (req: IncomingMessage, res: ServerResponse) => {
    const path = decodedPath(req.url ?? '/');
    if (path === null)
      return void sendJson(res, 400, errorJson(400, `Invalid request path ${JSON.stringify((req.url ?? '').slice(0, 200))}: it does not percent-decode.`));
    // The proxy's own health, not its upstream's (whose /health is forwarded): it takes requests. Never forwarded.
    if (path === OWN_HEALTH_PATH) return void (req.method === 'GET' ? answerHealthy(res) : sendJson(res, 405, '{"detail":"Method Not Allowed"}'));
    // Every path matches the catch-all.
    const routeClass = classOf(CAPTURE_ROUTES, path)!;
    // The capture has no control routes to enable: the upstream's are not this proxy's to expose.
    if (routeClass === 'control') return void sendJson(res, 404, '{"detail":"Not Found"}');
    if (!admitted(access, routeClass, req.method ?? 'GET', path, req.headers.authorization)) return void sendJson(res, 401, UNAUTHORIZED_BODY);
    readBody(req, opts.maxBodyBytes).then(
      (body) => {
        if (body === null) return sendTooLarge(res, opts.maxBodyBytes);
        if (res.destroyed) return;
        inFlight.add(
          forwardExchange({ upstream, connections }, req, body, res, sink).catch((err: unknown) => {
            console.error(`mocker capture: ${req.method} ${req.url}: ${(err as Error).message}`);
            res.destroy();
          }),
        );
      },
      () => res.destroy(),
    );
  };
}
