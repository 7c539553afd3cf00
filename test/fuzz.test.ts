import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServe, type Running } from '../src/cli/serve.js';
import { classifyReply, describeCase, FUZZ_STATUSES, makeCase, send } from './support/fuzzRequests.js';
import { prng } from './support/prng.js';

const REQUESTS = 600;
const MAX_BODY = 64 * 1024;
const CONCURRENCY = 8;

describe(`fuzz: ${REQUESTS} random or malformed requests`, () => {
  let server: Running;
  beforeAll(async () => {
    server = await startServe({ mode: 'random', captures: ':memory:', forwardTimeMs: 0, maxBodyBytes: MAX_BODY });
  });
  afterAll(async () => {
    await server?.close();
  });

  it('answers each with a vLLM-format error or a valid answer, and /health stays 200 throughout', async () => {
    const seed = 20261122;
    const r = prng(seed);
    const cases = Array.from({ length: REQUESTS }, () => makeCase(r, MAX_BODY));
    const health: number[] = [];
    let running = true;
    const poller = (async () => {
      while (running) {
        const res = await send(server.port, { kind: 'health', method: 'GET', path: '/health', headers: {}, body: Buffer.alloc(0), request: null }).catch(() => ({ status: 0 }));
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
