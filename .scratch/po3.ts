/**
 * Benchmark 1: what `mocker capture` adds to a stream's latency. Issue #2 targets: added TTFT p50 ≤ 1 ms,
 * added per-token latency p50 ≤ 0.2 ms.
 *
 * Separate processes, as in production: a fast vLLM-like upstream (bench/lib/fastUpstream.ts: an engine step
 * every --gap-ms writes the next token of every running stream; a stream's first token goes out on arrival),
 * `mocker capture` in front of it (writing a real capture file), a bare node:http pass-through proxy as a
 * reference (what any Node hop costs), and this client (plain node:http, keep-alive agents). The client keeps
 * --concurrency streams of --tokens tokens running (closed loop, lane starts staggered so arrivals are spread
 * evenly) and measures the requests that started once every lane was running (all of them run to the end
 * with every lane busy). Modes run one after another, their order rotating each round; the added latency is
 * the per-round difference of p50s (mode − direct), and the table gives the median over rounds.
 *
 * - TTFT: request sent → first token event fully arrived.
 * - per-token latency: client arrival of token i − upstream write time of token i (both CLOCK_MONOTONIC; the
 *   upstream reports its write times on a side channel), i.e. the one-way delay each token suffers.
 * - inter-chunk gap: arrival of token i − token i−1 (i ≥ 2): the cadence the client sees.
 *
 * Default step 5 ms: 64 streams then make 12,800 tokens/s, several times what one GPU serving 64 streams
 * delivers, so the proxy is stressed; on a 2-core box shared by client, upstream and proxy, faster steps
 * (2 ms = 32,000 tokens/s) saturate the CPUs and measure contention more than the proxy.
 *
 *   npx tsx bench/proxy-overhead.ts [--concurrency 64] [--tokens 256] [--gap-ms 5] [--rounds 6]
 *                                   [--window-ms 2000] [--cpu-prof] [--verbose]
 * --cpu-prof profiles the capture process during round 1's capture run and prints a summary.
 */
import { mkdtempSync, rmSync, statSync, readdirSync, readFileSync } from 'node:fs';
function threads(pid: number): Map<string, number> {
  const m = new Map<string, number>();
  for (const t of readdirSync(`/proc/${pid}/task`)) {
    try {
      const comm = readFileSync(`/proc/${pid}/task/${t}/comm`, 'utf8').trim();
      const st = readFileSync(`/proc/${pid}/task/${t}/stat`, 'utf8');
      const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
      const key = `${comm}#${t}`;
      m.set(key, (Number(f[11]) + Number(f[12])) * 10);
    } catch {}
  }
  return m;
}

import http from 'node:http';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { CaptureStore } from '../src/store/captureStore.js';
import { spawnServer, type ProcessStats, type ServerProcess } from '../bench/lib/child.js';
import { printProfile } from '../bench/lib/cpuProfile.js';
import { MODEL } from '../bench/lib/fastUpstream.js';
import { postStream, type StreamResult } from '../bench/lib/sseClient.js';
import { flag, median, nowMs, numberArg, printTable, quantile, round } from '../bench/lib/stats.js';

const CONCURRENCY = numberArg('concurrency', 64);
const TOKENS = numberArg('tokens', 256);
const GAP_MS = numberArg('gap-ms', 5);
const ROUNDS = numberArg('rounds', 6);
const WINDOW_MS = numberArg('window-ms', 2000);
const PROFILE = flag('cpu-prof');
const VERBOSE = flag('verbose');

// ~1000 prompt tokens (the fast upstream reports one fake id per 4 characters).
const PROMPT = 'Summarize the following text in one paragraph. '.repeat(85);
const BODY = JSON.stringify({ model: MODEL, prompt: PROMPT, max_tokens: TOKENS, stream: true });

const MODES = ['direct', 'capture'] as const;
type Mode = (typeof MODES)[number];

interface RunStats {
  mode: Mode;
  round: number;
  requests: number;
  ttft: number[];
  perToken: number[];
  gaps: number[];
  /** The proxy process of this mode (null for direct), the upstream's and this client's event loops. */
  proxy: ProcessStats | null;
  upstream: ProcessStats;
  clientElu: number;
  /** Tokens streamed during the whole run (ramp-up and tail included). */
  tokens: number;
}

const pct = (x: number) => `${Math.round(x * 100)}%`;

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

async function run(mode: Mode, roundNo: number, target: string, agent: http.Agent, upstream: ServerProcess, proxy: ServerProcess | null): Promise<RunStats> {
  const streamMs = TOKENS * GAP_MS;
  await Promise.all([proxy?.stats(), upstream.stats()]);
  const elu0 = performance.eventLoopUtilization();
  const t0 = nowMs();
  const measureFrom = t0 + streamMs;
  const measureUntil = measureFrom + WINDOW_MS;
  const stopAt = measureUntil + streamMs;
  const measured: { id: string; r: StreamResult }[] = [];
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
  const clientElu = performance.eventLoopUtilization(elu0).utilization;
  const [proxyStats, upstreamStats] = await Promise.all([proxy?.stats(), upstream.stats()]);
  const writes = await getJson<Record<string, number[]>>(`${upstream.url}/bench/times`);
  const stats: RunStats = { mode, round: roundNo, requests: measured.length, ttft: [], perToken: [], gaps: [], proxy: proxyStats ?? null, upstream: upstreamStats, clientElu, tokens: 0 };
  for (const { id, r } of measured) {
    const w = writes[id];
    stats.ttft.push(r.arrivals[0] - r.sentAt);
    for (let i = 0; i < TOKENS; i++) {
      stats.perToken.push(r.arrivals[i] - w[i]);
      if (i >= 2) stats.gaps.push(r.arrivals[i] - r.arrivals[i - 1]);
    }
  }
  stats.tokens = Object.values(writes).reduce((n, w) => n + w.length, 0);
  return stats;
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'mocker-bench-proxy-'));
  const dbPath = join(dir, 'capture.db');
  console.log(`proxy overhead: ${CONCURRENCY} concurrent streams x ${TOKENS} tokens, engine step ${GAP_MS} ms (${Math.round((CONCURRENCY * 1000) / GAP_MS)} tokens/s), ${ROUNDS} rounds, window ${WINDOW_MS} ms`);
  console.log(`machine: ${cpus().length} cores, ${cpus()[0]?.model ?? '?'}, node ${process.version}; capture file ${dbPath}`);

  const upstream = await spawnServer('upstream', { gapMs: GAP_MS, tokens: TOKENS }, VERBOSE);
  const capture = await spawnServer(
    'capture',
    { upstream: upstream.url, captures: dbPath, host: '127.0.0.1', port: 0, upstreamTimeoutMs: 10_000, maxBodyBytes: 1 << 20, redactHeaders: [] },
    VERBOSE,
  );

  const servers: Record<Mode, { url: string; proxy: ServerProcess | null; agent: http.Agent }> = {
    direct: { url: upstream.url, proxy: null, agent: new http.Agent({ keepAlive: true, maxSockets: CONCURRENCY }) },

    capture: { url: capture.url, proxy: capture, agent: new http.Agent({ keepAlive: true, maxSockets: CONCURRENCY }) },
  };

  const all: RunStats[] = [];
  const profileFile = join(dir, 'capture.cpuprofile');
  for (let r = 0; r <= ROUNDS; r++) {
    const order = MODES.map((_, i) => MODES[(i + r) % MODES.length]);
    for (const mode of order) {
      const { url, proxy, agent } = servers[mode];
      const profiling = PROFILE && r === 1 && mode === 'capture';
      if (profiling) await capture.profileStart();
      const before = mode === 'capture' ? threads(capture.child.pid!) : null;
      const s = await run(mode, r, url, agent, upstream, proxy);
      if (before) {
        const after = threads(capture.child.pid!);
        const rows = [...after].map(([k, v]) => [k, v - (before.get(k) ?? 0)] as const).filter(([, d]) => d > 0).sort((a, b) => b[1] - a[1]);
        console.log(`  threads (ms CPU over ${s.tokens} tokens): ` + rows.map(([k, d]) => `${k}=${d} (${((d * 1000) / s.tokens).toFixed(1)} µs/tok)`).join(', '));
      }
      if (profiling) await capture.profileStop(profileFile);
      const label = r === 0 ? 'warm-up  ' : `round ${r}/${ROUNDS}`;
      console.log(
        `  ${label} ${mode.padEnd(7)}: ${s.requests} requests, TTFT p50 ${round(median(s.ttft))} ms, per-token p50 ${round(median(s.perToken))} ms, gap p50 ${round(median(s.gaps))} ms; ` +
          `loops busy: client ${pct(s.clientElu)}, upstream ${pct(s.upstream.elu)}` +
          (s.proxy ? `, ${mode} ${pct(s.proxy.elu)} (delay p99 ${round(s.proxy.delayP99Ms, 1)}, max ${round(s.proxy.delayMaxMs, 1)} ms)` : ''),
      );
      if (r > 0) all.push(s);
    }
  }
  for (const s of Object.values(servers)) s.agent.destroy();
  await capture.stop();
  await upstream.stop();

  rmSync(dir, { recursive: true, force: true });
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
