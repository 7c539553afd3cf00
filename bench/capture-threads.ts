/**
 * What `mocker capture --threads 2` gives over one event loop: the tokens per second 256 streams get through the
 * capture proxy when the upstream streams as fast as the machine lets it (an engine step every --gap-ms, 1 ms:
 * more than the box can forward), and the proxy's CPU per forwarded token (its forwarding processes included).
 * Separate processes: the fast vLLM-like upstream (bench/lib/fastUpstream.ts), the capture proxy (writing a
 * real capture file), and this client (keep-alive agents, closed loops). Each round runs direct (no proxy: what
 * client and upstream alone reach on this machine), --threads 1 and --threads 2, in an order rotating per round;
 * the ratio is taken per round and the table gives the median and the spread. How busy the machine's cores were
 * in each window says whether a second loop had a core to run on (Linux /proc/stat).
 *
 *   npx tsx bench/capture-threads.ts [--concurrency 256] [--tokens 128] [--gap-ms 1] [--rounds 3] [--window-ms 3000]
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import http from 'node:http';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { spawnServer, type ServerProcess } from './lib/child.js';
import { MODEL } from './lib/fastUpstream.js';
import { postStream } from './lib/sseClient.js';
import { median, nowMs, numberArg, printTable, round } from './lib/stats.js';

const CONCURRENCY = numberArg('concurrency', 256);
const TOKENS = numberArg('tokens', 128);
const GAP_MS = numberArg('gap-ms', 1);
const ROUNDS = numberArg('rounds', 3);
const WINDOW_MS = numberArg('window-ms', 3000);

const BODY = JSON.stringify({ model: MODEL, prompt: 'Tell me about the sea. '.repeat(20), max_tokens: TOKENS, stream: true });
const MODES = ['direct', 'threads-1', 'threads-2'] as const;
type Mode = (typeof MODES)[number];

/** Busy and total jiffies of the whole machine (/proc/stat's first line: user nice system idle iowait irq softirq steal). */
function machineJiffies(): { busy: number; total: number } {
  const fields = readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1, 9).map(Number);
  const total = fields.reduce((a, b) => a + b, 0);
  return { busy: total - fields[3] - fields[4], total };
}

interface RunResult {
  mode: Mode;
  round: number;
  tokensPerS: number;
  /** How busy the machine's cores were during the window, 0..1: whether there was a core left for another loop. */
  machineBusy: number;
  /** The proxy's CPU (its forwarding processes included) per token streamed through it, µs. */
  cpuUsPerToken: number | null;
}

/** Closed loops for a warm-up, the window and a tail: tokens that arrived within the window, per second. */
async function run(mode: Mode, round: number, target: string, proxy: ServerProcess | null): Promise<RunResult> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: CONCURRENCY });
  await proxy?.stats();
  const from = nowMs() + 1000;
  const until = from + WINDOW_MS;
  let inWindow = 0;
  let streamed = 0;
  let cpuFrom = machineJiffies();
  let cpuUntil = cpuFrom;
  setTimeout(() => (cpuFrom = machineJiffies()), from - nowMs());
  setTimeout(() => (cpuUntil = machineJiffies()), until - nowMs());
  const lane = async () => {
    while (nowMs() < until) {
      const r = await postStream(agent, `${target}/v1/completions`, BODY, {});
      if (r.status !== 200 || r.events !== TOKENS + 1) throw new Error(`${mode}: status ${r.status}, ${r.events} events (want ${TOKENS + 1})`);
      streamed += TOKENS;
      for (const t of r.arrivals) if (t >= from && t < until) inWindow++;
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, lane));
  const stats = await proxy?.stats();
  agent.destroy();
  return {
    mode,
    round,
    tokensPerS: (inWindow * 1000) / WINDOW_MS,
    machineBusy: (cpuUntil.busy - cpuFrom.busy) / (cpuUntil.total - cpuFrom.total),
    cpuUsPerToken: stats ? (stats.cpuMs * 1000) / streamed : null,
  };
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'mocker-bench-capture-threads-'));
  console.log(`capture --threads: ${CONCURRENCY} streams x ${TOKENS} tokens, engine step ${GAP_MS} ms, ${ROUNDS} rounds, window ${WINDOW_MS} ms`);
  console.log(`machine: ${cpus().length} cores, ${cpus()[0]?.model ?? '?'}, node ${process.version}`);
  const upstream = await spawnServer('upstream', { gapMs: GAP_MS, tokens: TOKENS });
  const capture = (threads: number) =>
    spawnServer('capture', {
      upstream: upstream.url,
      captures: join(dir, `threads-${threads}.db`),
      host: '127.0.0.1',
      port: 0,
      upstreamTimeoutMs: 10_000,
      maxBodyBytes: 1 << 20,
      redactHeaders: [],
      threads,
    });
  const proxies: Record<Mode, ServerProcess | null> = { direct: null, 'threads-1': await capture(1), 'threads-2': await capture(2) };
  const results: RunResult[] = [];
  for (let r = 0; r <= ROUNDS; r++) {
    for (const mode of MODES.map((_, i) => MODES[(i + r) % MODES.length])) {
      const proxy = proxies[mode];
      const result = await run(mode, r, proxy?.url ?? upstream.url, proxy);
      console.log(
        `  ${r === 0 ? 'warm-up  ' : `round ${r}/${ROUNDS}`} ${mode.padEnd(9)}: ${Math.round(result.tokensPerS)} tokens/s, machine ${Math.round(result.machineBusy * 100)} % busy` +
          (result.cpuUsPerToken === null ? '' : `, ${round(result.cpuUsPerToken, 1)} µs CPU per token`),
      );
      if (r > 0) results.push(result);
    }
  }
  await Promise.all(Object.values(proxies).map((p) => p?.stop()));
  await upstream.stop();
  rmSync(dir, { recursive: true, force: true });

  const of = (mode: Mode) => results.filter((x) => x.mode === mode).sort((a, b) => a.round - b.round);
  const ratios = of('threads-2').map((x, i) => x.tokensPerS / of('threads-1')[i].tokensPerS);
  const ofDirect = of('threads-1').map((x, i) => x.tokensPerS / of('direct')[i].tokensPerS);
  const summary = (mode: Mode) => ({
    tokensPerS: Math.round(median(of(mode).map((x) => x.tokensPerS))),
    machineBusy: round(median(of(mode).map((x) => x.machineBusy)), 2),
    cpuUsPerToken: mode === 'direct' ? null : round(median(of(mode).map((x) => x.cpuUsPerToken!)), 1),
  });
  printTable(
    ['mode', 'tokens/s', 'µs CPU per token', 'machine busy'],
    MODES.map((m) => [m, summary(m).tokensPerS, summary(m).cpuUsPerToken ?? '—', `${Math.round(summary(m).machineBusy * 100)} %`]),
  );
  const ratio = { median: round(median(ratios), 2), min: round(Math.min(...ratios), 2), max: round(Math.max(...ratios), 2) };
  console.log(
    `--threads 2 / --threads 1: ${ratio.median} x (${ratio.min}–${ratio.max}); --threads 1 / direct: ${round(median(ofDirect), 2)} x; target ≥ 1.4: ${ratio.median >= 1.4 ? 'MET' : 'NOT MET'}`,
  );
  console.log(
    JSON.stringify({
      bench: 'capture-threads',
      config: { concurrency: CONCURRENCY, tokens: TOKENS, gapMs: GAP_MS, rounds: ROUNDS, windowMs: WINDOW_MS },
      modes: Object.fromEntries(MODES.map((m) => [m, summary(m)])),
      ratio,
      threads1OverDirect: round(median(ofDirect), 2),
    }),
  );
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
