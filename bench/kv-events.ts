/**
 * Benchmark: the cost of metrics and KV events per request at --concurrency (256) concurrent streams.
 * Two `mocker serve --mode simulate` servers, each in its own process (bench/lib/child.ts), identical but for
 * KV events:
 *   off     no --kv-events-config;
 *   events  --kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:P",
 *           "replay_endpoint":"tcp://*:P2"}' with a real zeromq SUB socket connected from this process for
 *           the whole benchmark, counting batches and checking that their seq numbers are consecutive
 *           (from 0: it connects before the first request). Warm-up batches are also decoded (msgpack) to
 *           count the BlockStored / BlockRemoved blocks, so the workload is seen to store and evict.
 * vLLM's metrics are always on: both servers are scraped (GET /metrics) once a second during every run; the
 * scrapes give each run's prefix-cache hit rate, preemptions, peak running requests and peak KV usage, to
 * compare the work both configurations did.
 *
 * Workload: --concurrency closed-loop clients (plain node:http, keep-alive) streaming /v1/completions of the
 * bundled Qwen/Qwen3-0.6B with `prompt` as token ids (256–1024 ids in 100..150000), each prompt one of
 * --prefixes shared prefixes (128–512 ids) then a fresh random suffix, so there are prefix-cache hits, new
 * blocks and, with --num-gpu-blocks blocks of --block-size, evictions; max_tokens --max-tokens, ignore_eos,
 * random outputs, --timing none (engine passes back to back: server throughput is bounded by CPU) or, with
 * --forward-time-ms N, --timing fixed. Lane k of round r draws the same prompts in both configurations.
 * Every response is checked for max_tokens + 1 events ([DONE] included). The configurations run one after
 * another, their order alternating each round, after an unmeasured warm-up round; requests/s = completed
 * responses / elapsed (lanes stop sending at --duration-ms, elapsed ends when the last response is done),
 * tokens/s = requests/s × max_tokens. The ratio events/off is taken per round; the table gives medians.
 *
 *   npx tsx bench/kv-events.ts [--concurrency 256] [--duration-ms 10000] [--rounds 5] [--max-tokens 64]
 *                              [--num-gpu-blocks 2048] [--block-size 16] [--max-num-seqs 256] [--prefixes 16]
 *                              [--forward-time-ms 0] [--cpu-prof] [--verbose]
 * --cpu-prof profiles the events server during round 1 and prints a summary.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import http from 'node:http';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { Subscriber } from 'zeromq';
import type { ServeOptions } from '../src/app/serve.js';
import { parseKvEventsConfig } from '../src/events/config.js';
import { decodePayload, freePorts } from '../test/support/kvEventsClient.js';
import { prng } from '../test/support/prng.js';
import { MODEL } from '../test/support/vllmUpstream.js';
import { spawnServer, type ProcessStats, type ServerProcess } from './lib/child.js';
import { printProfile } from './lib/cpuProfile.js';
import { postStream } from './lib/sseClient.js';
import { flag, median, nowMs, numberArg, printTable, quantile, round } from './lib/stats.js';

const CONCURRENCY = numberArg('concurrency', 256);
const DURATION_MS = numberArg('duration-ms', 10_000);
const ROUNDS = numberArg('rounds', 5);
const MAX_TOKENS = numberArg('max-tokens', 64);
const GPU_BLOCKS = numberArg('num-gpu-blocks', 2048);
const BLOCK_SIZE = numberArg('block-size', 16);
const MAX_NUM_SEQS = numberArg('max-num-seqs', 256);
const PREFIXES = numberArg('prefixes', 16);
const FORWARD_MS = numberArg('forward-time-ms', 0);
const PROFILE = flag('cpu-prof');
const VERBOSE = flag('verbose');

const PROMPT_MIN = 256;
const PROMPT_MAX = 1024;
const PREFIX_MIN = 128;
const PREFIX_MAX = 512;
const ID_MIN = 100;
const ID_MAX = 150_000;
const SCRAPE_EVERY_MS = 1000;

const CONFIGS = ['off', 'events'] as const;
type Config = (typeof CONFIGS)[number];

/** The shared prefixes, the same in every run. */
const prefixes = (() => {
  const rnd = prng(0x5eed);
  return Array.from({ length: PREFIXES }, () => Array.from({ length: rnd.int(PREFIX_MIN, PREFIX_MAX) }, () => rnd.int(ID_MIN, ID_MAX)));
})();

/** Lane `lane`'s requests in round `roundNo`: a shared prefix, then a random suffix, 256–1024 ids in all. */
function requests(roundNo: number, lane: number): () => string {
  const rnd = prng(roundNo * 1_000_003 + lane + 1);
  return () => {
    const prefix = rnd.pick(prefixes);
    const length = Math.max(rnd.int(PROMPT_MIN, PROMPT_MAX), prefix.length + BLOCK_SIZE);
    const prompt = prefix.concat(Array.from({ length: length - prefix.length }, () => rnd.int(ID_MIN, ID_MAX)));
    return JSON.stringify({ model: MODEL, prompt, max_tokens: MAX_TOKENS, ignore_eos: true, stream: true });
  };
}

/** A KV events consumer: counts batches as they arrive and checks that seq goes 0, 1, 2, … */
class EventCounter {
  batches = 0;
  bytes = 0;
  /** Places where seq jumped forward, and how many batches those jumps skipped. */
  gaps = 0;
  missed = 0n;
  /** Batches whose seq was not above the previous one. */
  outOfOrder = 0;
  lastSeq = -1n;
  /** While set, payloads are decoded and their events tallied (blocks per event type). */
  decode = false;
  readonly blocks = { BlockStored: 0, BlockRemoved: 0, AllBlocksCleared: 0 };
  error: string | null = null;
  private readonly socket = new Subscriber();
  private readonly done: Promise<void>;

  constructor(endpoint: string) {
    this.socket.connect(endpoint);
    this.socket.subscribe();
    this.done = this.read();
  }

  private async read(): Promise<void> {
    try {
      for await (const [, seqFrame, payload] of this.socket) {
        const seq = seqFrame.readBigUInt64BE();
        if (seq > this.lastSeq + 1n) {
          this.gaps++;
          this.missed += seq - this.lastSeq - 1n;
        } else if (seq <= this.lastSeq) this.outOfOrder++;
        this.lastSeq = seq;
        this.batches++;
        this.bytes += payload.length;
        if (this.decode) this.tally(payload);
      }
    } catch (err) {
      if (!this.socket.closed) this.error = err instanceof Error ? err.message : String(err);
    }
  }

  private tally(payload: Buffer): void {
    const [, events] = decodePayload(payload) as [number, [keyof EventCounter['blocks'], ...unknown[]][], number];
    for (const [type, hashes] of events) this.blocks[type] += Array.isArray(hashes) ? hashes.length : 1;
  }

  /** Waits until no batch has arrived for `quietMs`. */
  async settle(quietMs = 300): Promise<void> {
    let seen = -1;
    while (seen !== this.batches) {
      seen = this.batches;
      await new Promise((resolve) => setTimeout(resolve, quietMs));
    }
  }

  async close(): Promise<void> {
    this.socket.close();
    await this.done;
  }
}

/** The /metrics series this benchmark follows (summed over label sets). */
const SERIES = [
  'vllm:prefix_cache_queries_total',
  'vllm:prefix_cache_hits_total',
  'vllm:num_preemptions_total',
  'vllm:generation_tokens_total',
  'vllm:kv_cache_usage_perc',
  'vllm:num_requests_running',
] as const;
type Series = (typeof SERIES)[number];
type Scrape = Record<Series, number>;

function scrape(url: string, agent: http.Agent): Promise<{ values: Scrape; ms: number; bytes: number }> {
  const start = nowMs();
  return new Promise((resolve, reject) => {
    http
      .get(`${url}/metrics`, { agent }, (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (text += c));
        res.on('end', () => {
          if (res.statusCode !== 200) return reject(new Error(`/metrics answered ${res.statusCode}`));
          const values = Object.fromEntries(SERIES.map((s) => [s, 0])) as Scrape;
          for (const line of text.split('\n')) {
            const name = line.slice(0, line.search(/[{ ]/)) as Series;
            if (name in values) values[name] += Number(line.slice(line.lastIndexOf(' ') + 1));
          }
          resolve({ values, ms: nowMs() - start, bytes: Buffer.byteLength(text) });
        });
      })
      .on('error', reject);
  });
}

interface RunStats {
  config: Config;
  round: number;
  responses: number;
  elapsedMs: number;
  requestsPerS: number;
  tokensPerS: number;
  latencyMs: number[];
  proc: ProcessStats;
  /** This process (clients, scraper and, for events, the subscriber): CPU time over elapsed. */
  clientCpu: number;
  scrapes: number;
  scrapeMs: number[];
  prefixHitRate: number;
  preemptions: number;
  generationTokens: number;
  kvUsageMax: number;
  runningMax: number;
  /** events only: batches received during the run. */
  batches: number;
  eventBytes: number;
}

async function run(config: Config, roundNo: number, proc: ServerProcess, sub: EventCounter | null): Promise<RunStats> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: CONCURRENCY });
  const metricsAgent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  const first = await scrape(proc.url, metricsAgent);
  await proc.stats();
  const batches0 = sub?.batches ?? 0;
  const bytes0 = sub?.bytes ?? 0;
  const cpu0 = process.cpuUsage();
  const scrapeMs: number[] = [];
  let kvUsageMax = 0;
  let runningMax = 0;
  let scraping: Promise<void> = Promise.resolve();
  const timer = setInterval(() => {
    scraping = scraping.then(async () => {
      const s = await scrape(proc.url, metricsAgent);
      scrapeMs.push(s.ms);
      kvUsageMax = Math.max(kvUsageMax, s.values['vllm:kv_cache_usage_perc']);
      runningMax = Math.max(runningMax, s.values['vllm:num_requests_running']);
    });
  }, SCRAPE_EVERY_MS);
  const latencyMs: number[] = [];
  const start = nowMs();
  const end = start + DURATION_MS;
  const lane = async (k: number) => {
    const next = requests(roundNo, k);
    while (nowMs() < end) {
      const r = await postStream(agent, `${proc.url}/v1/completions`, next(), {}, false);
      if (r.status !== 200 || r.events !== MAX_TOKENS + 1) throw new Error(`${config}: status ${r.status}, ${r.events} events (want ${MAX_TOKENS + 1})`);
      latencyMs.push(nowMs() - r.sentAt);
    }
  };
  try {
    await Promise.all(Array.from({ length: CONCURRENCY }, (_, k) => lane(k)));
  } finally {
    clearInterval(timer);
  }
  const elapsedMs = nowMs() - start;
  const batches = (sub?.batches ?? 0) - batches0;
  const eventBytes = (sub?.bytes ?? 0) - bytes0;
  const dCpu = process.cpuUsage(cpu0);
  const procStats = await proc.stats();
  await scraping;
  const last = await scrape(proc.url, metricsAgent);
  agent.destroy();
  metricsAgent.destroy();
  const delta = (s: Series) => last.values[s] - first.values[s];
  const responses = latencyMs.length;
  return {
    config,
    round: roundNo,
    responses,
    elapsedMs,
    requestsPerS: (responses * 1000) / elapsedMs,
    tokensPerS: (responses * MAX_TOKENS * 1000) / elapsedMs,
    latencyMs,
    proc: procStats,
    clientCpu: (dCpu.user + dCpu.system) / 1000 / elapsedMs,
    scrapes: scrapeMs.length,
    scrapeMs,
    prefixHitRate: delta('vllm:prefix_cache_hits_total') / delta('vllm:prefix_cache_queries_total'),
    preemptions: delta('vllm:num_preemptions_total'),
    generationTokens: delta('vllm:generation_tokens_total'),
    kvUsageMax,
    runningMax,
    batches,
    eventBytes,
  };
}

const pct = (x: number) => `${Math.round(x * 100)}%`;

async function main(): Promise<void> {
  const timing = FORWARD_MS > 0 ? `--timing fixed --forward-time-ms ${FORWARD_MS}` : '--timing none';
  console.log(
    `KV events cost: ${CONCURRENCY} concurrent streaming /v1/completions, prompts ${PROMPT_MIN}–${PROMPT_MAX} token ids (${PREFIXES} shared prefixes of ${PREFIX_MIN}–${PREFIX_MAX}), ` +
      `max_tokens ${MAX_TOKENS}; ${ROUNDS} rounds x ${DURATION_MS} ms per configuration, /metrics scraped every ${SCRAPE_EVERY_MS} ms`,
  );
  console.log(`machine: ${cpus().length} cores, ${cpus()[0]?.model ?? '?'}, node ${process.version}`);
  const [pubPort, replayPort] = await freePorts(2);
  const kvEventsJson = JSON.stringify({
    enable_kv_cache_events: true,
    publisher: 'zmq',
    endpoint: `tcp://*:${pubPort}`,
    replay_endpoint: `tcp://*:${replayPort}`,
  });
  const kvEvents = parseKvEventsConfig(kvEventsJson, 'array');
  if (!kvEvents) throw new Error('KV events config parsed as disabled');
  const serverFlags = `mocker serve --mode simulate ${timing} --block-size ${BLOCK_SIZE} --num-gpu-blocks-override ${GPU_BLOCKS} --max-num-seqs ${MAX_NUM_SEQS}`;
  console.log(`off:    ${serverFlags}`);
  console.log(`events: ${serverFlags} --kv-events-config '${kvEventsJson}'  + SUB tcp://127.0.0.1:${pubPort}`);

  const base: ServeOptions = {
    mode: 'simulate',
    captures: ':memory:',
    outputs: 'random',
    host: '127.0.0.1',
    port: 0,
    timing: FORWARD_MS > 0 ? 'fixed' : 'none',
    forwardTimeMs: FORWARD_MS,
    seed: 0,
    engine: { blockSize: BLOCK_SIZE, numGpuBlocks: GPU_BLOCKS, maxNumSeqs: MAX_NUM_SEQS },
  };
  const servers: Record<Config, ServerProcess> = {
    off: await spawnServer('serve', base, VERBOSE),
    events: await spawnServer('serve', { ...base, kvEvents: [kvEvents] }, VERBOSE),
  };
  const sub = new EventCounter(`tcp://127.0.0.1:${pubPort}`);
  // ZMQ's slow joiner: the subscription must reach the publisher before the first batch.
  await new Promise((resolve) => setTimeout(resolve, 500));

  const dir = mkdtempSync(join(tmpdir(), 'mocker-bench-kv-events-'));
  const profileFile = join(dir, 'events.cpuprofile');
  const all: RunStats[] = [];
  try {
    for (let r = 0; r <= ROUNDS; r++) {
      const order = CONFIGS.map((_, i) => CONFIGS[(i + r) % CONFIGS.length]);
      for (const config of order) {
        const events = config === 'events';
        const profiling = PROFILE && r === 1 && events;
        sub.decode = r === 0 && events;
        if (profiling) await servers.events.profileStart();
        const s = await run(config, r, servers[config], events ? sub : null);
        if (profiling) await servers.events.profileStop(profileFile);
        sub.decode = false;
        console.log(
          `  ${r === 0 ? 'warm-up  ' : `round ${r}/${ROUNDS}`} ${config.padEnd(6)}: ${s.responses} responses, ${round(s.requestsPerS, 1)} req/s, ${Math.round(s.tokensPerS)} tokens/s, ` +
            `latency p50 ${Math.round(median(s.latencyMs))} ms; server loop busy ${pct(s.proc.elu)}, CPU ${round(s.proc.cpuMs / s.responses, 3)} ms/request; ` +
            `client CPU ${pct(s.clientCpu)}; prefix hits ${pct(s.prefixHitRate)}, ${s.preemptions} preemptions, max ${s.runningMax} running, KV usage ${pct(s.kvUsageMax)}; ` +
            `${s.scrapes} scrapes (p50 ${round(median(s.scrapeMs), 1)} ms)` +
            (events ? `; ${s.batches} event batches (${Math.round((s.batches * 1000) / s.elapsedMs)}/s, ${round(s.eventBytes / 1e6, 1)} MB)` : ''),
        );
        if (r === 0 && events) {
          const b = sub.blocks;
          console.log(`             warm-up events decoded: ${b.BlockStored} blocks stored, ${b.BlockRemoved} removed (evicted), ${b.AllBlocksCleared} clears`);
        }
        if (r > 0) all.push(s);
      }
    }
    await sub.settle();
  } finally {
    await sub.close();
    await Promise.all(Object.values(servers).map((s) => s.stop()));
  }

  const runs = (config: Config) => all.filter((s) => s.config === config).sort((a, b) => a.round - b.round);
  const off = runs('off');
  const on = runs('events');
  const ratios = on.map((s, i) => s.requestsPerS / off[i].requestsPerS);
  const cpuRatios = on.map((s, i) => s.proc.cpuMs / s.responses / (off[i].proc.cpuMs / off[i].responses));
  const summary = (rs: RunStats[]) => ({
    requestsPerS: round(median(rs.map((s) => s.requestsPerS)), 1),
    tokensPerS: Math.round(median(rs.map((s) => s.tokensPerS))),
    latencyP50Ms: round(median(rs.map((s) => median(s.latencyMs))), 1),
    latencyP99Ms: round(median(rs.map((s) => quantile(s.latencyMs, 0.99))), 1),
    serverCpuMsPerRequest: round(median(rs.map((s) => s.proc.cpuMs / s.responses)), 3),
    serverElu: round(median(rs.map((s) => s.proc.elu)), 2),
    clientCpu: round(median(rs.map((s) => s.clientCpu)), 2),
    prefixHitRate: round(median(rs.map((s) => s.prefixHitRate)), 3),
    preemptions: median(rs.map((s) => s.preemptions)),
    scrapeP50Ms: round(median(rs.flatMap((s) => s.scrapeMs)), 1),
    batchesPerS: Math.round(median(rs.map((s) => (s.batches * 1000) / s.elapsedMs))),
    eventKBPerRequest: round(median(rs.map((s) => s.eventBytes / 1000 / s.responses)), 2),
  });
  const result = { off: summary(off), events: summary(on) };
  const ratio = round(median(ratios), 3);
  const cpuRatio = round(median(cpuRatios), 3);

  console.log(`\nmedian over ${ROUNDS} rounds`);
  printTable(
    [
      'config',
      'req/s',
      'tokens/s',
      'latency p50 ms',
      'p99 ms',
      'server CPU ms/req',
      'server busy',
      'client CPU',
      'prefix hits',
      'preemptions',
      'scrape p50 ms',
      'event batches/s',
      'event KB/req',
    ],
    CONFIGS.map((c) => {
      const v = result[c];
      const events = c === 'events';
      return [
        c,
        v.requestsPerS,
        v.tokensPerS,
        v.latencyP50Ms,
        v.latencyP99Ms,
        v.serverCpuMsPerRequest,
        pct(v.serverElu),
        pct(v.clientCpu),
        pct(v.prefixHitRate),
        v.preemptions,
        v.scrapeP50Ms,
        events ? v.batchesPerS : '-',
        events ? v.eventKBPerRequest : '-',
      ];
    }),
  );
  console.log(`events / off throughput (req/s, = tokens/s): ${ratio} (per round: ${ratios.map((x) => round(x, 3)).join(', ')})`);
  console.log(`events / off server CPU per request: ${cpuRatio} (per round: ${cpuRatios.map((x) => round(x, 3)).join(', ')})`);
  const lastSeq = sub.lastSeq;
  console.log(
    `subscriber: ${sub.batches} batches received (seq 0..${lastSeq}), ${sub.gaps} gaps (${sub.missed} batches missed), ${sub.outOfOrder} out of order` +
      (sub.error ? `; socket error: ${sub.error}` : ''),
  );

  if (PROFILE) {
    printProfile(profileFile);
    console.log(`\nprofile kept: ${profileFile}`);
  } else rmSync(dir, { recursive: true, force: true });

  console.log(
    JSON.stringify({
      bench: 'kv-events',
      config: {
        concurrency: CONCURRENCY,
        durationMs: DURATION_MS,
        rounds: ROUNDS,
        maxTokens: MAX_TOKENS,
        numGpuBlocks: GPU_BLOCKS,
        blockSize: BLOCK_SIZE,
        maxNumSeqs: MAX_NUM_SEQS,
        prefixes: PREFIXES,
        forwardTimeMs: FORWARD_MS,
      },
      ...result,
      ratio,
      ratios: ratios.map((x) => round(x, 3)),
      cpuPerRequestRatio: cpuRatio,
      subscriber: { batches: sub.batches, lastSeq: Number(lastSeq), gaps: sub.gaps, missed: Number(sub.missed), outOfOrder: sub.outOfOrder, error: sub.error },
    }),
  );
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
