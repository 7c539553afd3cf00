/** vLLM's auxiliary surface (vllm-wire-reference.md §3): /ping, /version, /v1/models, --api-key, --enable-request-id-headers, /load, /reset_prefix_cache. */
import { mkdtempSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import { afterEach, describe, expect, it } from 'vitest';
import type { EngineState } from '../../src/engine/index.js';
import { captureInProcess, serveInProcess, type Running, type ServeOptions } from '../support/inProcess.js';
import { MODEL, startUpstream } from '../support/vllmUpstream.js';
import { testTmpdir } from '../support/tempRoot.js';

const servers: Running[] = [];
afterEach(async () => {
  for (const s of servers.splice(0)) await s.close();
});
const serve = async (options: Partial<ServeOptions>) => {
  const s = await serveInProcess({ mode: 'random', captures: ':memory:', forwardTimeMs: 0, ...options });
  servers.push(s);
  return s.url;
};
const complete = (url: string, headers: Record<string, string> = {}, body: Record<string, unknown> = {}) =>
  fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: MODEL, prompt: 'hello', max_tokens: 2, ...body }),
  });

describe('auxiliary endpoints and flags', () => {
  it('/ping answers GET and POST as /health does: 200 with an empty body', async () => {
    const url = await serve({});
    for (const [path, method] of [
      ['/health', 'GET'],
      ['/ping', 'GET'],
      ['/ping', 'POST'],
    ]) {
      const res = await fetch(`${url}${path}`, { method });
      expect(res.status, `${method} ${path}`).toBe(200);
      expect(await res.text(), `${method} ${path}`).toBe('');
    }
  });

  it('/v1/models: a ModelCard per served name, with root, max_model_len and a fresh permission, read by the openai client', async () => {
    const url = await serve({ servedModelName: ['my-model', 'alias'] });
    const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0 });
    const first: Record<string, unknown>[] = [];
    for await (const model of client.models.list()) first.push(model as unknown as Record<string, unknown>);
    expect(first.map((m) => m.id)).toEqual(['my-model', 'alias']);
    const now = Date.now() / 1000;
    for (const card of first) {
      // Qwen3-0.6B's config.json: max_position_embeddings 40960; root is the model, not the served name.
      expect(card).toMatchObject({ object: 'model', owned_by: 'vllm', root: MODEL, parent: null, max_model_len: 40960 });
      expect(Math.abs((card.created as number) - now)).toBeLessThan(5);
      const [permission] = card.permission as Record<string, unknown>[];
      expect(permission).toMatchObject({
        object: 'model_permission',
        allow_create_engine: false,
        allow_sampling: true,
        allow_logprobs: true,
        organization: '*',
        group: null,
        is_blocking: false,
      });
      expect(permission.id).toMatch(/^modelperm-[0-9a-f]{32}$/);
    }
    // vLLM builds the permission ids per call.
    const again = (await (await fetch(`${url}/v1/models`)).json()) as { data: { permission: { id: string }[] }[] };
    expect(again.data[0].permission[0].id).not.toBe((first[0].permission as { id: string }[])[0].id);
    const capped = await serve({ maxModelLen: 2048 });
    expect(((await (await fetch(`${capped}/v1/models`)).json()) as { data: { max_model_len: number }[] }).data[0].max_model_len).toBe(2048);
  });

  it("/version: a vLLM release number; a replay answers with the captured engine's", async () => {
    const url = await serve({});
    const own = await fetch(`${url}/version`);
    expect(own.headers.get('content-type')).toMatch(/^application\/json/);
    expect(Object.keys((await own.json()) as object)).toEqual(['version']);
    // A pre-0.10.2 engine (the test double reports 0.10.1.1), captured, then replayed without it.
    const upstream = await startUpstream(() => ({ content: 'hi' }), { legacy: true });
    const db = join(mkdtempSync(join(testTmpdir(), 'mocker-version-')), 'v.db');
    const capture = await captureInProcess({
      upstream: upstream.url,
      captures: db,
    });
    expect((await complete(`http://127.0.0.1:${capture.port}`)).status).toBe(200);
    await capture.close();
    await upstream.close();
    const replay = await serve({ mode: 'replay', captures: db });
    expect(await (await fetch(`${replay}/version`)).json()).toEqual({ version: '0.10.1.1' });
  });

  it('--api-key: /v1/* answers 401 without the bearer key, /health stays open', async () => {
    const url = await serve({ apiKey: 'sk-test' });
    const denied = await complete(url);
    expect(denied.status).toBe(401);
    expect(await denied.json()).toEqual({ error: 'Unauthorized' });
    expect((await complete(url, { authorization: 'Bearer wrong' })).status).toBe(401);
    expect((await fetch(`${url}/v1/models`)).status).toBe(401);
    expect((await complete(url, { authorization: 'Bearer sk-test' })).status).toBe(200);
    expect((await fetch(`${url}/health`)).status).toBe(200);
  });

  it('--enable-request-id-headers echoes X-Request-Id, or makes one', async () => {
    const url = await serve({ requestIdHeaders: true });
    expect((await complete(url, { 'x-request-id': 'abc-123' })).headers.get('x-request-id')).toBe('abc-123');
    expect((await complete(url)).headers.get('x-request-id')).toMatch(/^[0-9a-f]{32}$/);
    const plain = await serve({});
    expect((await complete(plain)).headers.get('x-request-id')).toBeNull();
  });

  it('/load counts requests in flight with --enable-server-load-tracking, else reads 0', async () => {
    const url = await serve({ serverLoadTracking: true, forwardTimeMs: 20 });
    const load = async (u: string) => ((await (await fetch(`${u}/load`)).json()) as { server_load: number }).server_load;
    expect(await load(url)).toBe(0);
    const pending = [complete(url, {}, { max_tokens: 20 }), complete(url, {}, { max_tokens: 20 })];
    let seen = 0;
    for (let i = 0; i < 50 && seen < 2; i++) {
      seen = await load(url);
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    expect(seen).toBe(2);
    await Promise.all(pending);
    expect(await load(url)).toBe(0);
    const untracked = await serve({ forwardTimeMs: 20 });
    const busy = complete(untracked, {}, { max_tokens: 20 });
    expect(await load(untracked)).toBe(0);
    await busy;
  });

  it('/reset_prefix_cache drops the cached blocks nobody holds', async () => {
    const url = await serve({ engine: { blockSize: 16 }, enableControlRoutes: true });
    const prompt = Array.from({ length: 64 }, (_, i) => 1000 + i);
    expect((await complete(url, {}, { prompt })).status).toBe(200);
    const state = async () => ((await (await fetch(`${url}/mocker/engine`)).json()) as EngineState).ranks[0];
    // The finished request's 4 full prompt blocks stay cached.
    expect((await state()).inactiveBlocks).toBeGreaterThanOrEqual(4);
    expect((await fetch(`${url}/reset_prefix_cache`, { method: 'POST' })).status).toBe(200);
    expect((await state()).inactiveBlocks).toBe(0);
    // So the same prompt finds nothing cached any more.
    const before = (await state()).prefixCacheHits;
    await complete(url, {}, { prompt });
    expect((await state()).prefixCacheHits).toBe(before);
  });
});
