/**
 * Benchmark: workers over threads (issue #16). A fleet of --engines engines in one `mocker serve` process,
 * `--num-workers 16 --threads 1` (every engine on the main thread's event loop) against `--threads 2` (the
 * engines round-robin over two worker threads), both `--mode random --timing none`: engine passes back to back,
 * so the fleet's throughput is bounded by CPU, and a second thread should nearly double it on two free cores.
 *
 * Both servers are the built CLI (`node dist/cli/main.js serve …`, as users launch it), started once and idle
 * while the other is measured. This process is the load generator, a process of its own: --streams-per-engine
 * closed-loop clients per port (plain node:http, keep-alive) stream /v1/completions of the bundled
 * Qwen/Qwen3-0.6B (a 32-token-id prompt, max_tokens --max-tokens, ignore_eos) for --duration-ms; every
 * response is checked for max_tokens + 1 events ([DONE] included). On a 2-core machine the client competes
 * with the server's threads for the same cores, so the measured ratio is below what two free cores would give;
 * the client's and the server's CPU use are printed per run to show it, and so are the cores two busy threads
 * get before and after the runs, and the machine's other busy time during each run (/proc/stat): on a shared
 * machine, what the other tenants take.
 * The configurations alternate after an unmeasured warm-up round, their order rotating each round (A B, B A, …);
 * tokens/s = completed responses × max_tokens / elapsed (lanes stop sending at --duration-ms, elapsed ends with
 * the last response). The ratio threads 2 / threads 1 is taken per round: its median and min–max are reported.
 *
 *   npm run build && npm run bench:workers [-- --engines 16] [--threads 2] [--streams-per-engine 16]
 *                                            [--max-tokens 128] [--duration-ms 5000] [--rounds 5]
 */
import { readFileSync } from 'node:fs';
import http from 'node:http';
import { cpus } from 'node:os';
import { Worker } from 'node:worker_threads';
import { startMockerProcess, type MockerProcess } from '../test/support/mockerProcess.js';
import { cpuMs, TICKS_PER_S } from './lib/procStat.js';
import { MODEL } from '../test/support/vllmUpstream.js';
import { postStream } from './lib/sseClient.js';
import { median, nowMs, numberArg, printTable, round } from './lib/stats.js';

const ENGINES = numberArg('engines', 16);
const THREADS = numberArg('threads', 2);
const STREAMS_PER_ENGINE = numberArg('streams-per-engine', 16);
const MAX_TOKENS = numberArg('max-tokens', 128);
const DURATION_MS = numberArg('duration-ms', 5000);
const ROUNDS = numberArg('rounds', 5);

const PROMPT_TOKENS = 32;

/**
 * The cores two busy threads get right now (CPU time over wall time of two 1 s spins): on a shared machine,
 * what the other tenants leave, the most --threads 2 can use.
 */
async function coresAvailable(): Promise<number> {
  const spin = 'const end = Date.now() + 1000; while (Date.now() < end);';
  const t0 = nowMs();
  const cpu0 = process.cpuUsage();
  await Promise.all([0, 1].map(() => new Promise((resolve) => new Worker(spin, { eval: true }).once('exit', resolve))));
  const cpu = process.cpuUsage(cpu0);
  return (cpu.user + cpu.system) / 1000 / (nowMs() - t0);
}

/** CPU time (ms) the whole machine has been busy, all cores and tenants: /proc/stat's first line, but idle and iowait. */
function machineBusyMs(): number {
  const [, ...ticks] = readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).map(Number);
  const [user, nice, system, , , irq, softirq, steal] = ticks;
  return ((user + nice + system + irq + softirq + steal) * 1000) / TICKS_PER_S;
}

interface Fleet {
  threads: number;
  process: MockerProcess;
  ports: number[];
}

async function startFleet(threads: number): Promise<Fleet> {
  const process = await startMockerProcess(['serve', '--mode', 'random', '--timing', 'none', '--num-workers', String(ENGINES), '--threads', String(threads)]);
  const ports = [...(/serving .* on (.*)/.exec(process.stdout())?.[1] ?? '').matchAll(/127\.0\.0\.1:(\d+)/g)].map((m) => Number(m[1]));
  if (ports.length !== ENGINES) throw new Error(`--threads ${threads}: ${ports.length} ports in the startup line, want ${ENGINES}`);
  return { threads, process, ports };
}

interface RunStats {
  threads: number;
  round: number;
  responses: number;
  elapsedMs: number;
  tokensPerS: number;
  /** The server process's CPU time over elapsed (2 = two cores busy). */
  serverCores: number;
  /** This process's (the clients') CPU time over elapsed. */
  clientCores: number;
  /** The rest of the machine's busy time over elapsed: other tenants of a shared machine. */
  otherCores: number;
}

async function run(fleet: Fleet, roundNo: number): Promise<RunStats> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: ENGINES * STREAMS_PER_ENGINE });
  const pid = fleet.process.child.pid!;
  const server0 = cpuMs(pid);
  const client0 = process.cpuUsage();
  const machine0 = machineBusyMs();
  let responses = 0;
  const start = nowMs();
  const end = start + DURATION_MS;
  const lane = async (port: number, k: number) => {
    const prompt = Array.from({ length: PROMPT_TOKENS }, (_, i) => 1000 + ((k * 131 + i * 7) % 20_000));
    const body = JSON.stringify({ model: MODEL, prompt, max_tokens: MAX_TOKENS, ignore_eos: true, stream: true });
    while (nowMs() < end) {
      const r = await postStream(agent, `http://127.0.0.1:${port}/v1/completions`, body, {}, false);
      if (r.status !== 200 || r.events !== MAX_TOKENS + 1)
        throw new Error(`--threads ${fleet.threads}, port ${port}: status ${r.status}, ${r.events} events (want ${MAX_TOKENS + 1})`);
      responses++;
    }
  };
  await Promise.all(fleet.ports.flatMap((port, e) => Array.from({ length: STREAMS_PER_ENGINE }, (_, s) => lane(port, e * STREAMS_PER_ENGINE + s))));
  const elapsedMs = nowMs() - start;
  const client = process.cpuUsage(client0);
  const serverMs = cpuMs(pid) - server0;
  const clientMs = (client.user + client.system) / 1000;
  const machineMs = machineBusyMs() - machine0;
  agent.destroy();
  return {
    threads: fleet.threads,
    round: roundNo,
    responses,
    elapsedMs,
    tokensPerS: (responses * MAX_TOKENS * 1000) / elapsedMs,
    serverCores: serverMs / elapsedMs,
    clientCores: clientMs / elapsedMs,
    otherCores: Math.max(0, machineMs - serverMs - clientMs) / elapsedMs,
  };
}

async function main(): Promise<void> {
  console.log(
    `workers over threads: mocker serve --mode random --timing none --num-workers ${ENGINES}, --threads 1 vs --threads ${THREADS}; ` +
      `${STREAMS_PER_ENGINE} streams per engine (${ENGINES * STREAMS_PER_ENGINE} in all), max_tokens ${MAX_TOKENS}; ${ROUNDS} rounds x ${DURATION_MS} ms per configuration`,
  );
  console.log(`machine: ${cpus().length} cores, ${cpus()[0]?.model ?? '?'}, node ${process.version}`);
  const before = await coresAvailable();
  console.log(`two busy threads got ${round(before, 2)} cores before the runs`);
  const fleets = [await startFleet(1), await startFleet(THREADS)];
  const all: RunStats[] = [];
  try {
    for (let r = 0; r <= ROUNDS; r++) {
      for (const fleet of r % 2 === 0 ? fleets : [...fleets].reverse()) {
        const s = await run(fleet, r);
        console.log(
          `  ${r === 0 ? 'warm-up  ' : `round ${r}/${ROUNDS}`} --threads ${s.threads}: ${s.responses} responses, ${Math.round(s.tokensPerS)} tokens/s; ` +
            `server CPU ${round(s.serverCores, 2)} cores, client CPU ${round(s.clientCores, 2)} cores, other tenants ${round(s.otherCores, 2)} cores`,
        );
        if (r > 0) all.push(s);
      }
    }
  } finally {
    for (const fleet of fleets) await fleet.process.stop();
  }

  const runs = (threads: number) => all.filter((s) => s.threads === threads).sort((a, b) => a.round - b.round);
  const one = runs(1);
  const many = runs(THREADS);
  const ratios = many.map((s, i) => s.tokensPerS / one[i].tokensPerS);
  const summary = (rs: RunStats[]) => ({
    tokensPerS: Math.round(median(rs.map((s) => s.tokensPerS))),
    serverCores: round(median(rs.map((s) => s.serverCores)), 2),
    clientCores: round(median(rs.map((s) => s.clientCores)), 2),
    otherCores: round(median(rs.map((s) => s.otherCores)), 2),
  });
  const result = { threads1: summary(one), threadsN: summary(many) };
  const ratio = round(median(ratios), 3);
  const after = await coresAvailable();

  console.log(`\nmedian over ${ROUNDS} rounds`);
  printTable(
    ['config', 'tokens/s', 'server CPU (cores)', 'client CPU (cores)', 'other tenants (cores)'],
    [
      ['--threads 1', result.threads1.tokensPerS, result.threads1.serverCores, result.threads1.clientCores, result.threads1.otherCores],
      [`--threads ${THREADS}`, result.threadsN.tokensPerS, result.threadsN.serverCores, result.threadsN.clientCores, result.threadsN.otherCores],
    ],
  );
  console.log(`--threads ${THREADS} / --threads 1 tokens/s: ${ratio} (per round: ${ratios.map((x) => round(x, 3)).join(', ')})`);
  console.log(`two busy threads got ${round(after, 2)} cores after the runs`);
  console.log(
    JSON.stringify({
      bench: 'workers',
      config: { engines: ENGINES, threads: THREADS, streamsPerEngine: STREAMS_PER_ENGINE, maxTokens: MAX_TOKENS, durationMs: DURATION_MS, rounds: ROUNDS },
      ...result,
      ratio,
      ratios: ratios.map((x) => round(x, 3)),
      coresAvailable: { before: round(before, 2), after: round(after, 2) },
    }),
  );
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
