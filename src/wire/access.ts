import { createHash, timingSafeEqual } from 'node:crypto';
import { isIP } from 'node:net';

/**
 * Who may call a route, for every server (`serve`, `capture`, `pd-proxy`), each of which classifies every route
 * it has in one table beside where it registers them:
 * - `public`: anyone, always: what probes and scrapers call (health, version, metrics);
 * - `key`: the API: with `--api-key`, it needs `Authorization: Bearer <key>` on `/v1/*` (vLLM's rule) or, with
 *   `--api-key-scope all`, on every path;
 * - `control`: changes the server's state at run time: absent (404) unless enabled (as vLLM's dev-mode routes),
 *   and then needs the key whenever one is set, whatever the scope.
 */
export type RouteClass = 'public' | 'key' | 'control';

export const API_KEY_SCOPES = ['v1', 'all'] as const;
export type ApiKeyScope = (typeof API_KEY_SCOPES)[number];
/** vLLM's: the key guards `/v1/*`. */
export const DEFAULT_API_KEY_SCOPE: ApiKeyScope = 'v1';

/** `--api-key` (none: every route open) and `--api-key-scope`. */
export interface ApiKeyPolicy {
  key?: string;
  scope: ApiKeyScope;
}

/** A route as a test or a user sees it: method, path (`/*` at the end: every path below) and class. */
export interface ClassifiedRoute {
  method: string;
  path: string;
  class: RouteClass;
}

/** vLLM's answer to a request without the key (its AuthenticationMiddleware). */
export const UNAUTHORIZED_BODY = '{"error":"Unauthorized"}';

/** Whether a request for `path`, of class `routeClass`, must carry the key. */
export function needsKey(policy: ApiKeyPolicy, routeClass: RouteClass, method: string, path: string): boolean {
  if (policy.key === undefined || routeClass === 'public') return false;
  if (routeClass === 'control') return true;
  // vLLM lets CORS preflights through.
  return method !== 'OPTIONS' && (policy.scope === 'all' || path.startsWith('/v1'));
}

const digest = (text: string) => createHash('sha256').update(text).digest();

/** Whether `authorization` is `Bearer <key>`, compared in constant time (digests of equal length). */
export function presentsKey(authorization: string | undefined, key: string): boolean {
  return timingSafeEqual(digest(authorization ?? ''), digest(`Bearer ${key}`));
}

/** Whether the request may go on: false when it needs the key and lacks it. */
export function admitted(policy: ApiKeyPolicy, routeClass: RouteClass, method: string, path: string, authorization: string | undefined): boolean {
  return !needsKey(policy, routeClass, method, path) || presentsKey(authorization, policy.key!);
}

/**
 * The path a request URL names as an engine behind a proxy reads it (percent-decoded, dot segments resolved),
 * so that `/%761/models` is classified as the `/v1/models` it is; null when it cannot be decoded.
 */
export function decodedPath(url: string): string | null {
  try {
    return decodeURIComponent(new URL(url, 'http://localhost').pathname);
  } catch {
    return null;
  }
}

/**
 * The class of `path` in a table whose paths are exact, or end with `/*` (that prefix and everything below it);
 * the longest match wins. Undefined when nothing matches.
 */
export function classOf(table: readonly { path: string; class: RouteClass }[], path: string): RouteClass | undefined {
  let best: { path: string; class: RouteClass } | undefined;
  for (const route of table) {
    const prefix = route.path.endsWith('/*') ? route.path.slice(0, -1) : null;
    const matches = prefix === null ? route.path === path : path.startsWith(prefix) || path === prefix.slice(0, -1);
    if (matches && (!best || route.path.length > best.path.length)) best = route;
  }
  return best?.class;
}

/** Whether `host` (a listen address) is reachable from this machine only. */
export function isLoopback(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, '').toLowerCase();
  if (h === 'localhost') return true;
  if (isIP(h) === 4) return h.startsWith('127.');
  return h === '::1' || h.startsWith('::ffff:127.');
}

/** The startup warning for control routes listening beyond loopback with no key to guard them, or null. */
export function exposedControlWarning(command: string, host: string, policy: ApiKeyPolicy, controlRoutes: string[]): string | null {
  if (controlRoutes.length === 0 || policy.key !== undefined || isLoopback(host)) return null;
  return `mocker ${command}: WARNING: runtime control routes (${controlRoutes.join(', ')}) are enabled on ${host} without --api-key: anyone who can reach this address can change the server`;
}
