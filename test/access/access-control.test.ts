/**
 * Issue 33, finding 4 (runtime control without authentication), through the built CLI. Oracles: vLLM's
 * AuthenticationMiddleware (vllm-wire-reference.md §1.2: a 401 `{"error":"Unauthorized"}` on paths starting with
 * `/v1` without `Authorization: Bearer <key>`), vLLM's dev-mode routes (absent unless enabled, §3) and the
 * rules for control routes (docs/capture.md, "Access and TLS"). Every route of every server is walked in route-classes.test.ts.
 */
import { mkdtempSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { AccessRig, call, ENV, KEY, SERVE } from '../support/accessRig.js';
import { freePorts } from '../support/kvEventsClient.js';
import { spawnMockerProcess } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';

type Json = Record<string, unknown>;

const rig = new AccessRig();
afterEach(() => rig.close());

describe('issue 33 finding 4: runtime control needs enabling, then the key', () => {
  it('serve: /mocker/config and /reset_prefix_cache are absent (404) without --enable-control-routes; with it they need the key; /mocker/config refuses __proto__, constructor, prototype', async () => {
    const plain = await rig.mocker([...SERVE, '--api-key', KEY]);
    for (const key of [undefined, KEY]) {
      expect((await call(plain.url, 'POST', '/mocker/config', key)).status).toBe(404);
      expect((await call(plain.url, 'GET', '/mocker/config', key)).status).toBe(404);
      expect((await call(plain.url, 'POST', '/reset_prefix_cache', key)).status).toBe(404);
      // An aggregated engine has no KV holds to hand over.
      expect((await call(plain.url, 'POST', '/mocker/kv_transfer/pull', key)).status).toBe(404);
    }

    const { url } = await rig.mocker([...SERVE, '--api-key', KEY, '--enable-control-routes']);
    const post = (body: string, key?: string) =>
      fetch(`${url}/mocker/config`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...(key ? { authorization: `Bearer ${key}` } : {}) },
        body,
      });
    const denied = await post('{"error_rate":100}');
    expect(denied.status).toBe(401);
    expect(await denied.json()).toEqual({ error: 'Unauthorized' });
    expect((await post('{"error_rate":100}', 'wrong')).status).toBe(401);
    expect((await call(url, 'POST', '/reset_prefix_cache')).status).toBe(401);
    // Nothing changed: a completion still succeeds.
    const completion = () =>
      fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
        body: JSON.stringify({ model: 'm', prompt: 'Hi', max_tokens: 1 }),
      });
    expect((await completion()).status).toBe(200);
    for (const name of ['__proto__', 'constructor', 'prototype']) {
      const res = await post(`{"${name}":{"error_rate":100},"error_rate":0}`, KEY);
      expect(res.status, name).toBe(400);
      expect(((await res.json()) as { error: Json }).error).toMatchObject({ type: 'BadRequestError', param: name, code: 400 });
    }
    const shown = (await (await fetch(`${url}/mocker/config`, { headers: { authorization: `Bearer ${KEY}` } })).json()) as Json;
    expect(shown.error_rate).toBe(0);
    expect((await completion()).status).toBe(200);
    // With the key, it works as before.
    expect((await post('{"error_rate":100}', KEY)).status).toBe(200);
    expect((await completion()).status).toBe(500);
    expect((await call(url, 'POST', '/reset_prefix_cache', KEY)).status).toBe(200);
  });

  it('capture never forwards /mocker/* to its upstream (a 404 of its own), and guards the API with --api-key', async () => {
    const upstream = await rig.serveInProcess({ enableControlRoutes: true, servedModelName: ['m'] });
    const captures = join(mkdtempSync(join(testTmpdir(), 'mocker-access-')), 'c.db');
    const { url } = await rig.mocker(['capture', '--upstream', upstream, '--captures', captures, '--api-key', KEY]);
    for (const key of [undefined, KEY]) {
      const res = await fetch(`${url}/mocker/config`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...(key ? { authorization: `Bearer ${key}` } : {}) },
        body: '{"error_rate":100}',
      });
      expect(res.status).toBe(404);
      // Percent-encoding does not smuggle it through.
      expect(
        (await fetch(`${url}/%6Docker/config`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"error_rate":100}' })).status,
      ).toBe(404);
    }
    expect(((await (await fetch(`${upstream}/mocker/config`)).json()) as Json).error_rate).toBe(0);
    expect((await call(url, 'GET', '/v1/models')).status).toBe(401);
    expect((await call(url, 'GET', '/%761/models')).status).toBe(401);
    expect((await call(url, 'GET', '/v1/models', KEY)).status).toBe(200);
    expect((await call(url, 'GET', '/health')).status).toBe(200);
  });

  it('pd-proxy guards its API with --api-key', async () => {
    const prefill = await rig.serveInProcess({ role: 'prefill', servedModelName: ['m'] });
    const decode = await rig.serveInProcess({ role: 'decode', servedModelName: ['m'] });
    const { url } = await rig.mocker(['pd-proxy', '--prefill', prefill, '--decode', decode, '--api-key', KEY]);
    const complete = (key?: string) =>
      fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...(key ? { authorization: `Bearer ${key}` } : {}) },
        body: JSON.stringify({ model: 'm', prompt: 'Hi', max_tokens: 2 }),
      });
    const denied = await complete();
    expect(denied.status).toBe(401);
    expect(await denied.json()).toEqual({ error: 'Unauthorized' });
    expect((await complete(KEY)).status).toBe(200);
    expect((await call(url, 'GET', '/healthcheck')).status).toBe(200);
  });

  it('control routes on a non-loopback address without a key: one warning line at startup; none with a key or on loopback', async () => {
    /** The WARNING lines of a serve that started listening, read once it has stopped (its pipes drained). */
    const start = async (args: string[]) => {
      const [port] = await freePorts(1);
      const spawned = spawnMockerProcess([...SERVE, '--port', String(port), ...args], { env: ENV });
      rig.track(spawned);
      const closed = new Promise<void>((resolve) => spawned.child.once('close', () => resolve()));
      await new Promise<void>((resolve, reject) => {
        spawned.child.stdout!.on('data', () => spawned.stdout().includes(`:${port}`) && resolve());
        spawned.child.once('exit', (code) => reject(new Error(`exited with ${code}: ${spawned.stderr()}`)));
      });
      spawned.child.kill('SIGTERM');
      await closed;
      return spawned
        .stderr()
        .split('\n')
        .filter((line) => line.includes('WARNING'));
    };
    const exposed = await start(['--host', '0.0.0.0', '--enable-control-routes']);
    expect(exposed).toHaveLength(1);
    expect(exposed[0]).toMatch(/\/mocker\/config.*0\.0\.0\.0.*--api-key/);
    expect(await start(['--host', '0.0.0.0', '--enable-control-routes', '--api-key', KEY])).toEqual([]);
    expect(await start(['--host', '127.0.0.1', '--enable-control-routes'])).toEqual([]);
    expect(await start(['--host', '0.0.0.0'])).toEqual([]);
  });
});
