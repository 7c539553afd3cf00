/** vLLM's auxiliary surface: --api-key, --enable-request-id-headers, /load, /reset_prefix_cache. */
import { afterEach, describe, expect, it } from 'vitest';
import { startServe, type Running } from '../src/cli/serve.js';
import type { EngineState } from '../src/engine/index.js';
import { MODEL } from './support/vllmUpstream.js';

const servers: Running[] = [];
afterEach(async () => {
  for (const s of servers.splice(0)) await s.close();
});
const serve = async (options: Partial<Parameters<typeof startServe>[0]>) => {
  const s = await startServe({ mode: 'random', captures: ':memory:', forwardTimeMs: 0, ...options });
  servers.push(s);
  return `http://127.0.0.1:${s.port}`;
};
const complete = (url: string, headers: Record<string, string> = {}, body: Record<string, unknown> = {}) =>
  fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify({ model: MODEL, prompt: 'hello', max_tokens: 2, ...body }) });

describe('auxiliary endpoints and flags', () => {
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
    const url = await serve({ engine: { blockSize: 16 } });
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
