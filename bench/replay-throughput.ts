/**
 * Benchmark 2: replay throughput. `mocker serve --mode replay --timing none` answering a captured
 * --tokens-token chat stream, against a bare node:http SSE server emitting exactly the same bytes (the same
 * events, one write per event). Issue #17 goal: replay streams ≥ 0.7× the bare server's tokens/s, at 16 and at 256
 * concurrent streams (`--concurrency`).
 * A second bare server ("bare/turn") writes each event in its own event-loop turn, as a server that streams
 * tokens as they are produced must (the plain bare server's writes all happen in one turn, and Node's http
 * layer corks them into a few syscalls): the ratio against it shows what per-token streaming itself costs.
 *
 * Setup: the vLLM-like test double (test/support/vllmUpstream.ts, real Qwen3 tokenizer) answers one chat
 * request with --tokens tokens through `mocker capture`; the replay server then serves that capture from its
 * own process, and the bare server (own process too) replays the replay server's own response bytes.
 * --concurrency closed-loop clients (plain node:http, keep-alive) send the captured request for --duration-ms
 * per run; the servers' order rotates each round. tokens/s = completed responses × tokens /
 * elapsed; every response is checked for the right number of events.
 *
 *   npx tsx bench/replay-throughput.ts [--concurrency 16] [--tokens 256] [--prompt-words 700]
 *                                      [--duration-ms 5000] [--rounds 5] [--rendered] [--cpu-prof] [--verbose]
 * --rendered asks with `stream_options.include_usage` (not captured), so replay renders the stream from the
 * captured tokens instead of sending the captured bytes; --cpu-prof profiles the replay server in round 1.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { startCapture } from '../src/app/capture.js';
import { MODEL, startUpstream } from '../test/support/vllmUpstream.js';
import { spawnServer, type ProcessStats, type ServerProcess } from './lib/child.js';
import { printProfile } from './lib/cpuProfile.js';
import { postStream } from './lib/sseClient.js';
import { flag, median, nowMs, numberArg, printTable, quantile, round } from './lib/stats.js';
import { wordText } from './lib/words.js';

const CONCURRENCY = numberArg('concurrency', 16);
const TOKENS = numberArg('tokens', 256);
const PROMPT_WORDS = numberArg('prompt-words', 700);
const DURATION_MS = numberArg('duration-ms', 5000);
const ROUNDS = numberArg('rounds', 5);
const RENDERED = flag('rendered');
const PROFILE = flag('cpu-prof');
const VERBOSE = flag('verbose');
/** Issue #17's goal for replay / bare tokens/s. */
const TARGET_RATIO = 0.7;

const CAPTURED_REQUEST = { model: MODEL, messages: [{ role: 'user', content: wordText(PROMPT_WORDS, 3) }], max_tokens: TOKENS, stream: true };
const REQUEST = JSON.stringify(RENDERED ? { ...CAPTURED_REQUEST, stream_options: { include_usage: true } } : CAPTURED_REQUEST);

const SERVERS = ['bare', 'bare/turn', 'replay'] as const;
type Server = (typeof SERVERS)[number];

interface RunStats {
  server: Server;
  round: number;
  responses: number;
  tokensPerS: number;
  latencyMs: number[];
  proc: ProcessStats;
}

async function capture(dbPath: string): Promise<void> {
  const upstream = await startUpstream(() => ({ content: wordText(TOKENS + 64, 5), ttftMs: 0 }));
  const proxy = await startCapture({
    upstream: upstream.url,
    captures: dbPath,
    host: '127.0.0.1',
    port: 0,
    upstreamTimeoutMs: 10_000,
    maxBodyBytes: 1 << 20,
    redactHeaders: [],
  });
  const agent = new http.Agent({ keepAlive: false });
  const r = await postStream(agent, `http://127.0.0.1:${proxy.port}/v1/chat/completions`, JSON.stringify(CAPTURED_REQUEST), {}, false);
  if (r.status !== 200) throw new Error(`capture failed: status ${r.status}`);
  await proxy.close();
  await upstream.close();
}

/** One full response of `url`, split into its SSE events, with the headers a bare server should send. */
function fetchEvents(url: string): Promise<{ headers: Record<string, string>; events: string[] }> {
  return new Promise((resolve, reject) => {
    const req = http.request(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' } }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => {
        if (res.statusCode !== 200) return reject(new Error(`replay answered ${res.statusCode}: ${body.slice(0, 300)}`));
        const headers: Record<string, string> = {};
        for (const [k, v] of Object.entries(res.headers)) if (!['date', 'connection', 'keep-alive', 'transfer-encoding'].includes(k)) headers[k] = String(v);
        resolve({ headers, events: body.split(/(?<=\n\n)/) });
      });
    });
    req.on('error', reject);
    req.end(REQUEST);
  });
}

async function run(server: Server, roundNo: number, proc: ServerProcess, events: number): Promise<RunStats> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: CONCURRENCY });
  await proc.stats();
  const latencyMs: number[] = [];
  const start = nowMs();
  const end = start + DURATION_MS;
  const lane = async () => {
    while (nowMs() < end) {
      const r = await postStream(agent, `${proc.url}/v1/chat/completions`, REQUEST, {}, false);
      if (r.status !== 200 || r.events !== events) throw new Error(`${server}: status ${r.status}, ${r.events} events (want ${events})`);
      latencyMs.push(nowMs() - r.sentAt);
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, lane));
  const elapsed = nowMs() - start;
  agent.destroy();
  return { server, round: roundNo, responses: latencyMs.length, tokensPerS: (latencyMs.length * TOKENS * 1000) / elapsed, latencyMs, proc: await proc.stats() };
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'mocker-bench-replay-'));
  const dbPath = join(dir, 'golden.db');
  console.log(
    `replay throughput: ${CONCURRENCY} concurrent clients, ${TOKENS}-token chat stream (${RENDERED ? 'rendered from tokens' : 'captured bytes verbatim'}), ~${PROMPT_WORDS}-word prompt, ${ROUNDS} rounds x ${DURATION_MS} ms per server`,
  );
  console.log(`machine: ${cpus().length} cores, ${cpus()[0]?.model ?? '?'}, node ${process.version}`);
  await capture(dbPath);

  const replay = await spawnServer(
    'serve',
    {
      mode: 'replay',
      captures: dbPath,
      host: '127.0.0.1',
      port: 0,
      timing: 'none',
      seed: 0,
      maxBodyBytes: 1 << 20,
      redactHeaders: [],
      upstreamTimeoutMs: 1000,
    },
    VERBOSE,
  );
  const reference = await fetchEvents(replay.url);
  const tokenEvents = reference.events.filter((e) => e.startsWith('data: {') && !e.includes('"choices":[]') && !e.includes('"role":"assistant"')).length;
  if (tokenEvents !== TOKENS) throw new Error(`the replayed stream has ${tokenEvents} token events, want ${TOKENS}`);
  const bytes = reference.events.reduce((n, e) => n + Buffer.byteLength(e), 0);
  console.log(
    `stream: ${reference.events.length} events (${TOKENS} with tokens), ${bytes} bytes; prompt ${CAPTURED_REQUEST.messages[0].content.length} characters`,
  );
  const eventsFile = join(dir, 'events.json');
  writeFileSync(eventsFile, JSON.stringify(reference));
  const bare = await spawnServer('bare', { eventsFile }, VERBOSE);
  const bareTurn = await spawnServer('bare', { eventsFile, perTurn: true }, VERBOSE);
  const servers: Record<Server, ServerProcess> = { bare, 'bare/turn': bareTurn, replay };

  const all: RunStats[] = [];
  const profileFile = join(dir, 'replay.cpuprofile');
  for (let r = 0; r <= ROUNDS; r++) {
    const order = SERVERS.map((_, i) => SERVERS[(i + r) % SERVERS.length]);
    for (const server of order) {
      const profiling = PROFILE && r === 1 && server === 'replay';
      if (profiling) await replay.profileStart();
      const s = await run(server, r, servers[server], reference.events.length);
      if (profiling) await replay.profileStop(profileFile);
      console.log(
        `  ${r === 0 ? 'warm-up  ' : `round ${r}/${ROUNDS}`} ${server.padEnd(9)}: ${s.responses} responses, ${Math.round(s.tokensPerS)} tokens/s, ` +
          `latency p50 ${round(median(s.latencyMs), 2)} ms; server loop busy ${Math.round(s.proc.elu * 100)}%, CPU ${round(s.proc.cpuMs / s.responses, 3)} ms/response`,
      );
      if (r > 0) all.push(s);
    }
  }
  await Promise.all(Object.values(servers).map((s) => s.stop()));

  const runs = (server: Server) => all.filter((s) => s.server === server).sort((a, b) => a.round - b.round);
  const p = runs('replay');
  const ratiosTo = (server: Server) => p.map((s, i) => s.tokensPerS / runs(server)[i].tokensPerS);
  const ratios = ratiosTo('bare');
  const ratiosTurn = ratiosTo('bare/turn');
  const summary = (rs: RunStats[]) => ({
    tokensPerS: Math.round(median(rs.map((s) => s.tokensPerS))),
    responsesPerS: round(median(rs.map((s) => (s.responses * 1000) / DURATION_MS)), 1),
    latencyP50Ms: round(median(rs.map((s) => median(s.latencyMs))), 2),
    latencyP99Ms: round(median(rs.map((s) => quantile(s.latencyMs, 0.99))), 2),
    serverCpuMsPerResponse: round(median(rs.map((s) => s.proc.cpuMs / s.responses)), 3),
  });
  const result = { bare: summary(runs('bare')), bareTurn: summary(runs('bare/turn')), replay: summary(p) };
  const ratio = round(median(ratios), 3);
  const ratioTurn = round(median(ratiosTurn), 3);

  console.log(`\nmedian over ${ROUNDS} rounds`);
  printTable(
    ['server', 'tokens/s', 'responses/s', 'latency p50 ms', 'latency p99 ms', 'server CPU ms/response'],
    (
      [
        ['bare', result.bare],
        ['bare/turn', result.bareTurn],
        ['replay', result.replay],
      ] as const
    ).map(([k, v]) => [k, v.tokensPerS, v.responsesPerS, v.latencyP50Ms, v.latencyP99Ms, v.serverCpuMsPerResponse]),
  );
  console.log(
    `replay / bare tokens/s: ${ratio} (per round: ${ratios.map((x) => round(x, 2)).join(', ')}); target ≥ ${TARGET_RATIO}: ${ratio >= TARGET_RATIO ? 'MET' : 'NOT MET'}`,
  );
  console.log(`replay / bare/turn tokens/s: ${ratioTurn} (per round: ${ratiosTurn.map((x) => round(x, 2)).join(', ')})`);

  if (PROFILE) {
    printProfile(profileFile);
    console.log(`\nprofile kept: ${profileFile}`);
  } else rmSync(dir, { recursive: true, force: true });

  console.log(
    JSON.stringify({
      bench: 'replay-throughput',
      config: {
        concurrency: CONCURRENCY,
        tokens: TOKENS,
        promptWords: PROMPT_WORDS,
        durationMs: DURATION_MS,
        rounds: ROUNDS,
        rendered: RENDERED,
        streamBytes: bytes,
      },
      ...result,
      ratio,
      ratios: ratios.map((x) => round(x, 3)),
      ratioToPerTurn: ratioTurn,
      target: { ratio: TARGET_RATIO, met: ratio >= TARGET_RATIO },
    }),
  );
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
