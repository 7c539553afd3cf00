import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { serveInProcess, type Running } from '../support/inProcess.js';
import { classifyReply, describeCase, FUZZ_STATUSES, makeCase, send } from '../support/fuzzRequests.js';
import { prng } from '../support/prng.js';
import { MODEL } from '../support/vllmUpstream.js';

const REQUESTS = 600;
const MAX_BODY = 64 * 1024;
const CONCURRENCY = 8;

describe(`fuzz: ${REQUESTS} random or malformed requests`, () => {
  let server: Running;
  beforeAll(async () => {
    server = await serveInProcess({ mode: 'random', captures: ':memory:', forwardTimeMs: 0, maxBodyBytes: MAX_BODY });
  });
  afterAll(async () => {
    await server?.close();
  });

  it("answers a value nested 30,000 deep, even in a field completions ignore, with a 400 (vLLM's parser gives up near 1,000 levels)", async () => {
    const deep = `${'['.repeat(30_000)}${']'.repeat(30_000)}`;
    for (const field of ['max_completion_tokens', 'user', 'max_tokens']) {
      const body = Buffer.from(`{"model":"${MODEL}","max_tokens":4,"prompt":"Hi","${field}":${deep}}`);
      const c = { kind: 'deep', method: 'POST', path: '/v1/completions', headers: { 'content-type': 'application/json' }, body, request: null };
      const res = await send(server.port, c);
      expect(res.status, field).toBe(400);
      expect(classifyReply(c, res)).toMatch(/^400 /);
    }
  });

  it('answers each with a vLLM-format error or a valid answer, and /health stays 200 throughout', async () => {
    const seed = 20261122;
    const r = prng(seed);
    const cases = Array.from({ length: REQUESTS }, () => makeCase(r, MAX_BODY));
    const health: number[] = [];
    let running = true;
    const poller = (async () => {
      while (running) {
        const res = await send(server.port, { kind: 'health', method: 'GET', path: '/health', headers: {}, body: Buffer.alloc(0), request: null }).catch(
          () => ({ status: 0 }),
        );
        health.push(res.status);
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    })();

    const statuses = new Map<number, number>();
    let next = 0;
    const worker = async () => {
      while (next < cases.length) {
        const i = next++;
        const c = cases[i];
        const res = await send(server.port, c);
        statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1);
        expect(() => classifyReply(c, res), describeCase(c, i, seed)).not.toThrow();
      }
    };
    try {
      await Promise.all(Array.from({ length: CONCURRENCY }, worker));
    } finally {
      running = false;
      await poller;
    }

    // The generator reached every kind of answer, and the server never stopped being healthy.
    expect([...statuses.values()].reduce((a, b) => a + b, 0)).toBe(REQUESTS);
    for (const status of FUZZ_STATUSES) expect(statuses.get(status) ?? 0, `status ${status}`).toBeGreaterThan(0);
    expect(health.length).toBeGreaterThan(5);
    expect(health.every((s) => s === 200)).toBe(true);
  });
});
