/**
 * Benchmark 1: what `mocker capture` adds to a stream's latency (issue #2 targets: added TTFT p50 ≤ 1 ms,
 * added per-token latency p50 ≤ 0.2 ms).
 *
 * Three processes, as in production: a fast vLLM-like upstream (bench/lib/fastUpstream.ts: one engine step
 * every --gap-ms writes the next token of every running stream; first token at once), `mocker capture` in
 * front of it (writing a real capture file), and this client (plain node:http, keep-alive). The client keeps
 * --concurrency streams of --tokens tokens running (closed loop, starts staggered so arrivals are spread
 * evenly) and measures only requests that started once all lanes were running and ended before any stopped.
 * Direct and proxied runs alternate (order flips each round); per round we take proxy p50 − direct p50.
 *
 * - TTFT: request sent → first token event fully arrived.
 * - per-token delivery latency: client arrival of token i − upstream write time of token i (both
 *   CLOCK_MONOTONIC; the upstream reports its write times on a side channel), the one-way cost per token.
 * - inter-chunk gap: arrival of token i − token i−1 (i ≥ 2), the cadence the client sees.
 *
 *   npx tsx bench/proxy-overhead.ts [--concurrency 64] [--tokens 256] [--gap-ms 2] [--rounds 6]
 *                                   [--window-ms 2000] [--cpu-prof] [--verbose]
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import http from 'node:http';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { CaptureStore } from '../src/store/captureStore.js';
import { spawnServer, type ServerProcess } from './lib/child.js';
import { printProfile } from './lib/cpuProfile.js';
import { MODEL } from './lib/fastUpstream.js';
import { postStream, type StreamResult } from './lib/sseClient.js';
import { flag, median, nowMs, numberArg, printTable, quantile, round } from './lib/stats.js';

const CONCURRENCY = numberArg('concurrency', 64);
const TOKENS = numberArg('tokens', 256);
const GAP_MS = numberArg('gap-ms', 2);
const ROUNDS = numberArg('rounds', 6);
const WINDOW_MS = numberArg('window-ms', 2000);
const PROFILE = flag('cpu-prof');
const VERBOSE = flag('verbose');

// ~1000 prompt tokens (the fast upstream reports one fake id per 4 characters).
const PROMPT = 'Summarize the following text in one paragraph. '.repeat(85);
const BODY = JSON.stringify({ model: MODEL, prompt: PROMPT, max_tokens: TOKENS, stream: true });

type Mode = 'direct' | 'proxy';

interface RunStats {
  mode: Mode;
  round: number;
  requests: number;
  ttft: number[];
  delivery: number[];
  gaps: number[];
  /** CPU time the proxy process used during the run, ms (proxy runs only). */
  proxyCpuMs: number;
  tokens: number;
}

/** utime + stime of a process in ms, from /proc (Linux). */
function cpuMs(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100; // USER_HZ is 100 on Linux
}

function getJson<T>(url: string): Promise<T> {
  return new Promise((resolve, reject) => {
    http
      .get(url, (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (text += c));
        res.on('end', () => resolve(JSON.parse(text) as T));
      })
      .on('error', reject);
  });
}

async function run(mode: Mode, target: string, upstream: ServerProcess, proxy: ServerProcess, agent: http.Agent, roundNo: number): Promise<RunStats> {
  const streamMs = TOKENS * GAP_MS;
  const t0 = nowMs();
  const measureFrom = t0 + streamMs;
  const measureUntil = measureFrom + WINDOW_MS;
  const stopAt = measureUntil + streamMs;
  const measured: { id: string; r: StreamResult }[] = [];
  const cpu0 = mode === 'proxy' ? cpuMs(proxy.child.pid!) : 0; // spawned children always have a pid
  const lane = async (k: number) => {
    await new Promise((r) => setTimeout(r, (k * streamMs) / CONCURRENCY));
    for (let seq = 0; nowMs() < stopAt; seq++) {
      const id = `${mode}-${roundNo}-${k}-${seq}`;
      const r = await postStream(agent, `${target}/v1/completions`, BODY, { 'x-request-id': id });
      if (r.status !== 200 || r.events !== TOKENS + 1) throw new Error(`${mode}: status ${r.status}, ${r.events} events (want ${TOKENS + 1})`);
      if (r.sentAt >= measureFrom && r.sentAt < measureUntil) measured.push({ id, r });
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, (_, k) => lane(k)));
  const proxyCpuMs = mode === 'proxy' ? cpuMs(proxy.child.pid!) - cpu0 : 0;
  const writes = await getJson<Record<string, number[]>>(`${upstream.url}/bench/times`);
  const stats: RunStats = { mode, round: roundNo, requests: measured.length, ttft: [], delivery: [], gaps: [], proxyCpuMs, tokens: 0 };
  for (const { id, r } of measured) {
    const w = writes[id];
    stats.ttft.push(r.arrivals[0] - r.sentAt);
    for (let i = 0; i < TOKENS; i++) {
      stats.delivery.push(r.arrivals[i] - w[i]);
      if (i >= 2) stats.gaps.push(r.arrivals[i] - r.arrivals[i - 1]);
    }
  }
  // Tokens streamed over the whole run (warm-up and tail included), for the proxy's CPU cost per token.
  stats.tokens = Object.values(writes).reduce((n, w) => n + w.length, 0);
  return stats;
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'mocker-bench-proxy-'));
  const dbPath = join(dir, 'capture.db');
  const profDir = join(dir, 'prof');
  console.log(`proxy overhead: ${CONCURRENCY} concurrent streams x ${TOKENS} tokens, engine step ${GAP_MS} ms, ${ROUNDS} rounds x 2 modes, window ${WINDOW_MS} ms`);
  console.log(`machine: ${cpus().length} cores, ${cpus()[0]?.model ?? '?'}, node ${process.version}; capture file ${dbPath}`);

  const upstream = await spawnServer('upstream', { gapMs: GAP_MS, tokens: TOKENS }, [], VERBOSE);
  const proxy = await spawnServer(
    'capture',
    { upstream: upstream.url, captures: dbPath, host: '127.0.0.1', port: 0, upstreamTimeoutMs: 10_000, maxBodyBytes: 1 << 20, redactHeaders: [] },
    PROFILE ? ['--cpu-prof', '--cpu-prof-dir', profDir] : [],
    VERBOSE,
  );
  const agents = { direct: new http.Agent({ keepAlive: true, maxSockets: CONCURRENCY }), proxy: new http.Agent({ keepAlive: true, maxSockets: CONCURRENCY }) };
  const targets = { direct: upstream.url, proxy: proxy.url };

  const all: RunStats[] = [];
  for (let r = 0; r <= ROUNDS; r++) {
    const order: Mode[] = r % 2 === 0 ? ['direct', 'proxy'] : ['proxy', 'direct'];
    for (const mode of order) {
      const s = await run(mode, targets[mode], upstream, proxy, agents[mode], r);
      const label = r === 0 ? 'warm-up' : `round ${r}/${ROUNDS}`;
      console.log(
        `  ${label} ${mode.padEnd(6)}: ${s.requests} requests, TTFT p50 ${round(median(s.ttft))} ms, delivery p50 ${round(median(s.delivery))} ms, gap p50 ${round(median(s.gaps))} ms` +
          (mode === 'proxy' ? `, proxy CPU ${round(s.proxyCpuMs / 1000, 2)} s` : ''),
      );
      if (r > 0) all.push(s);
    }
  }
  for (const a of Object.values(agents)) a.destroy();
  await proxy.stop();
  await upstream.stop();

  const byRound = (mode: Mode) => all.filter((s) => s.mode === mode).sort((a, b) => a.round - b.round);
  const direct = byRound('direct');
  const proxied = byRound('proxy');
  const metric = (pick: (s: RunStats) => number[], q: number) => {
    const d = direct.map((s) => quantile(pick(s), q));
    const p = proxied.map((s) => quantile(pick(s), q));
    return { direct: median(d), proxy: median(p), added: median(p.map((x, i) => x - d[i])) };
  };
  const rows = {
    ttftP50: metric((s) => s.ttft, 0.5),
    ttftP99: metric((s) => s.ttft, 0.99),
    deliveryP50: metric((s) => s.delivery, 0.5),
    deliveryP99: metric((s) => s.delivery, 0.99),
    gapP50: metric((s) => s.gaps, 0.5),
    gapP99: metric((s) => s.gaps, 0.99),
  };
  const proxyCpuUsPerToken = median(proxied.map((s) => (s.proxyCpuMs * 1000) / s.tokens));

  const store = CaptureStore.open(dbPath);
  const counts = store.counts();
  store.close();
  const fileBytes = statSync(dbPath).size;

  console.log(`\nmedian over ${ROUNDS} rounds of each round's value (added = proxy − direct, paired by round), ms`);
  printTable(
    ['metric', 'direct', 'via capture', 'added'],
    Object.entries(rows).map(([k, v]) => [k, v.direct, v.proxy, v.added]),
  );
  const requests = { direct: direct.reduce((n, s) => n + s.requests, 0), proxy: proxied.reduce((n, s) => n + s.requests, 0) };
  console.log(`measured requests: ${requests.direct} direct, ${requests.proxy} via capture; capture file: ${counts.complete} complete, ${counts.failed} failed, ${counts.aborted} aborted, ${(fileBytes / 1e6).toFixed(1)} MB`);
  console.log(`capture process CPU: ${round(proxyCpuUsPerToken, 1)} µs per streamed token (incl. recording)`);
  const met = { ttft: rows.ttftP50.added <= 1, perToken: rows.deliveryP50.added <= 0.2 };
  console.log(`targets: added TTFT p50 ${round(rows.ttftP50.added)} ms ≤ 1 ms: ${met.ttft ? 'MET' : 'NOT MET'}; added per-token p50 ${round(rows.deliveryP50.added)} ms ≤ 0.2 ms: ${met.perToken ? 'MET' : 'NOT MET'}`);

  if (PROFILE) for (const f of readdirSync(profDir)) printProfile(join(profDir, f));
  if (!PROFILE) rmSync(dir, { recursive: true, force: true });
  else console.log(`\nprofile kept in ${profDir}`);

  const result = {
    bench: 'proxy-overhead',
    config: { concurrency: CONCURRENCY, tokens: TOKENS, gapMs: GAP_MS, rounds: ROUNDS, windowMs: WINDOW_MS },
    requests,
    ms: Object.fromEntries(Object.entries(rows).map(([k, v]) => [k, { direct: round(v.direct), proxy: round(v.proxy), added: round(v.added) }])),
    proxyCpuUsPerToken: round(proxyCpuUsPerToken, 2),
    captured: counts,
    targets: { addedTtftP50Ms: 1, addedPerTokenP50Ms: 0.2, met },
  };
  console.log(JSON.stringify(result));
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
