/**
 * Every route of every server classified public, key or control (issue 33), checked through the built CLI.
 * Oracles: vLLM's AuthenticationMiddleware (vllm-wire-reference.md §1.2: a 401 `{"error":"Unauthorized"}` on
 * paths starting with `/v1` without `Authorization: Bearer <key>`), vLLM's dev-mode routes (absent unless
 * enabled, §3) and the documented rules (docs/capture.md) for `--api-key-scope all` and control routes.
 * The routes walked are the routers' own lists (hono's `app.routes` through `startServe`, and the tables the
 * capture proxy and the PD proxy dispatch by), not a list kept here: a new route cannot be left out.
 */
import { mkdtempSync } from 'node:fs';
import { join } from 'node:path';
import { Hono } from 'hono';
import { afterEach, describe, expect, it } from 'vitest';
import { CAPTURE_ROUTES } from '../../src/app/captureHandler.js';
import type { ClassifiedRoute } from '../../src/wire/access.js';
import { SERVE_ROUTES, serveRoutes } from '../../src/http/routes.js';
import { PD_PROXY_ROUTES } from '../../src/pd/proxy.js';
import { AccessRig, call, ENV, KEY, SERVE } from '../support/accessRig.js';
import { testTmpdir } from '../support/tempRoot.js';

const LORA_UPDATING = { ...ENV, VLLM_ALLOW_RUNTIME_LORA_UPDATING: '1' };

const rig = new AccessRig();
afterEach(() => rig.close());

/** A path the route answers: a pattern's `*` stands for one more segment. Any method (`*`) is asked with GET. */
const sample = (route: ClassifiedRoute) => ({
  method: route.method === '*' ? 'GET' : route.method,
  path: route.path.endsWith('/*') ? `${route.path.slice(0, -1)}config` : route.path,
});

/**
 * Checks every route against a server started with `--api-key KEY` and `--api-key-scope scope`: public routes
 * answer without the key; key routes answer vLLM's 401 without it (under /v1, or everywhere with scope `all`)
 * and something else with it; control routes are 404 when `controlOn` is false, else 401 without the key.
 */
async function checkRoutes(url: string, routes: readonly ClassifiedRoute[], scope: 'v1' | 'all', controlOn: boolean): Promise<void> {
  for (const route of routes) {
    const { method, path } = sample(route);
    const what = `${method} ${path} (${route.class})`;
    const without = await call(url, method, path);
    const withKey = await call(url, method, path, KEY);
    if (route.class === 'public') {
      expect(without.status, what).not.toBe(401);
    } else if (route.class === 'control' && !controlOn) {
      expect([without.status, withKey.status], what).toEqual([404, 404]);
      continue;
    } else if (route.class === 'control' || scope === 'all' || path.startsWith('/v1')) {
      expect(without.status, what).toBe(401);
      expect(JSON.parse(without.body), what).toEqual({ error: 'Unauthorized' });
    } else {
      expect(without.status, what).not.toBe(401);
    }
    expect(withKey.status, what).not.toBe(401);
    if (route.class === 'control') expect(withKey.status, what).not.toBe(404);
  }
}

describe("every route of every server is classified public, key or control (walking the routers' own route lists)", () => {
  it('serve cannot start with a route SERVE_ROUTES does not classify (the check createServeApp runs on its routes)', () => {
    const app = new Hono();
    app.get('/health', (c) => c.body(null, 200));
    expect(serveRoutes(app)).toEqual([{ method: 'GET', path: '/health', class: 'public' }]);
    app.post('/mocker/new-knob', (c) => c.body(null, 200));
    expect(() => serveRoutes(app)).toThrow('serve registers POST /mocker/new-knob, which SERVE_ROUTES does not classify');
    // A known path under a method the table does not give it is no classified route either.
    expect(() => serveRoutes(new Hono().delete('/health', (c) => c.body(null, 200)))).toThrow('DELETE /health');
  });

  it('serve: every route hono registers, with every optional route on, is in SERVE_ROUTES; a spawned serve answers each by its class (--api-key-scope all and v1; control on and off)', async () => {
    // Every optional route on: control routes, LoRA loading (vLLM's variable, read at start) and the KV pull (PD).
    const before = process.env.VLLM_ALLOW_RUNTIME_LORA_UPDATING;
    process.env.VLLM_ALLOW_RUNTIME_LORA_UPDATING = '1';
    let routes: ClassifiedRoute[];
    try {
      routes = (await rig.running({ enableControlRoutes: true, role: 'prefill' })).routes!;
    } finally {
      if (before === undefined) delete process.env.VLLM_ALLOW_RUNTIME_LORA_UPDATING;
      else process.env.VLLM_ALLOW_RUNTIME_LORA_UPDATING = before;
    }
    // The table holds no route that is never registered.
    expect(routes.map((r) => `${r.method} ${r.path}`).sort()).toEqual(
      Object.entries(SERVE_ROUTES)
        .flatMap(([path, r]) => r.methods.map((m) => `${m} ${path}`))
        .sort(),
    );
    expect(new Set(routes.map((r) => r.class))).toEqual(new Set(['public', 'key', 'control']));

    const all = await rig.mocker(
      [...SERVE, '--api-key', KEY, '--api-key-scope', 'all', '--enable-control-routes', '--disaggregation-mode', 'prefill'],
      LORA_UPDATING,
    );
    await checkRoutes(all.url, routes, 'all', true);
    const v1 = await rig.mocker([...SERVE, '--api-key', KEY]);
    await checkRoutes(v1.url, routes, 'v1', false);
  });

  it('capture: every entry of CAPTURE_ROUTES, against a spawned capture with --api-key-scope all', async () => {
    const upstream = await rig.serveInProcess({ enableControlRoutes: true, servedModelName: ['m'] });
    const captures = join(mkdtempSync(join(testTmpdir(), 'mocker-access-')), 'c.db');
    expect(new Set(CAPTURE_ROUTES.map((r) => r.class))).toEqual(new Set(['public', 'key', 'control']));
    const { url } = await rig.mocker(['capture', '--upstream', upstream, '--captures', captures, '--api-key', KEY, '--api-key-scope', 'all']);
    // The capture has no control routes to turn on: its upstream's are never reached through it.
    await checkRoutes(url, CAPTURE_ROUTES, 'all', false);
  });

  it('pd-proxy: every entry of PD_PROXY_ROUTES, against a spawned pd-proxy with --api-key', async () => {
    const prefill = await rig.serveInProcess({ role: 'prefill', servedModelName: ['m'] });
    const decode = await rig.serveInProcess({ role: 'decode', servedModelName: ['m'] });
    const { url } = await rig.mocker(['pd-proxy', '--prefill', prefill, '--decode', decode, '--api-key', KEY]);
    await checkRoutes(url, PD_PROXY_ROUTES, 'v1', false);
  });
});
