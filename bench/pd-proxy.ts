/**
 * Benchmark: the latency `mocker pd-proxy` adds per request. A mocker decode engine answers directly (the
 * baseline), and through the proxy in front of a mocker prefill engine and the same decode engine (the toy
 * proxy's two hops: the prefill request, then the decode request with the returned kv_transfer_params and the
 * pull to the prefill engine). Both engines run with `--timing none` and no transfer delay, so what is
 * measured is the serving path itself. Each engine and the proxy run in their own process; the two paths
 * alternate request by request, with --concurrency closed-loop clients (plain node:http, keep-alive), so both
 * see the same machine. Latency = request sent → last byte of a non-streamed completion.
 *
 *   npx tsx bench/pd-proxy.ts [--requests 1000] [--concurrency 1] [--prompt-tokens 256] [--max-tokens 16]
 */
import http from 'node:http';
import { spawnServer } from './lib/child.js';
import { nowMs, numberArg, printTable, quantile, round } from './lib/stats.js';

const REQUESTS = numberArg('requests', 1000);
const CONCURRENCY = numberArg('concurrency', 1);
const PROMPT_TOKENS = numberArg('prompt-tokens', 256);
const MAX_TOKENS = numberArg('max-tokens', 16);
const MODEL = 'Qwen/Qwen3-0.6B';

const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity });

function post(url: string, body: string): Promise<number> {
  const target = new URL('/v1/completions', url);
  const start = nowMs();
  return new Promise((resolve, reject) => {
    const req = http.request(
      target,
      { method: 'POST', agent, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          if (res.statusCode !== 200) return reject(new Error(`${url}: ${res.statusCode} ${Buffer.concat(chunks).toString().slice(0, 200)}`));
          resolve(nowMs() - start);
        });
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

async function main(): Promise<void> {
  const engine = { mode: 'simulate' as const, captures: ':memory:', timing: 'none' as const, kvTransferBandwidthGBps: 0, engine: { blockSize: 16 } };
  const prefill = await spawnServer('serve', { ...engine, role: 'prefill' });
  const decode = await spawnServer('serve', { ...engine, role: 'decode', kvTransferAllowedHosts: [new URL(prefill.url).host] });
  const proxy = await spawnServer('pd-proxy', {
    prefill: [new URL(prefill.url)],
    decode: [new URL(decode.url)],
    host: '127.0.0.1',
    port: 0,
    maxBodyBytes: 1 << 24,
  });
  const paths = { direct: decode.url, 'pd-proxy': proxy.url };
  const latencies: Record<keyof typeof paths, number[]> = { direct: [], 'pd-proxy': [] };
  try {
    let next = 0;
    const bodyFor = (i: number) =>
      JSON.stringify({
        model: MODEL,
        prompt: Array.from({ length: PROMPT_TOKENS }, (_, k) => 1000 + ((i * 7919 + k) % 100_000)),
        max_tokens: MAX_TOKENS,
        ignore_eos: true,
      });
    // Warm-up: both paths, JIT and connections.
    for (let i = 0; i < 50; i++) for (const url of Object.values(paths)) await post(url, bodyFor(REQUESTS + i));
    let lastReport = nowMs();
    const client = async () => {
      for (let i = next++; i < REQUESTS; i = next++) {
        const order = i % 2 === 0 ? (['direct', 'pd-proxy'] as const) : (['pd-proxy', 'direct'] as const);
        for (const path of order) latencies[path].push(await post(paths[path], bodyFor(i)));
        if (nowMs() - lastReport > 2000) {
          lastReport = nowMs();
          console.log(`… ${latencies.direct.length}/${REQUESTS} requests per path`);
        }
      }
    };
    await Promise.all(Array.from({ length: CONCURRENCY }, client));
  } finally {
    await proxy.stop();
    await prefill.stop();
    await decode.stop();
  }
  const row = (name: keyof typeof paths) => [name, latencies[name].length, round(quantile(latencies[name], 0.5)), round(quantile(latencies[name], 0.99))];
  printTable(['path', 'requests', 'p50 ms', 'p99 ms'], [row('direct'), row('pd-proxy')]);
  const added = {
    p50: quantile(latencies['pd-proxy'], 0.5) - quantile(latencies.direct, 0.5),
    p99: quantile(latencies['pd-proxy'], 0.99) - quantile(latencies.direct, 0.99),
  };
  console.log(`added by pd-proxy (prefill hop + decode hop + pull): p50 ${round(added.p50)} ms, p99 ${round(added.p99)} ms`);
  console.log(
    JSON.stringify({
      benchmark: 'pd-proxy',
      requests: REQUESTS,
      concurrency: CONCURRENCY,
      promptTokens: PROMPT_TOKENS,
      maxTokens: MAX_TOKENS,
      addedP50Ms: round(added.p50),
      addedP99Ms: round(added.p99),
      directP50Ms: round(quantile(latencies.direct, 0.5)),
      directP99Ms: round(quantile(latencies.direct, 0.99)),
    }),
  );
}

await main();
