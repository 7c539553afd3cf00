/**
 * What one hostile request costs a spawned `mocker serve` (issue #11 item 3), as an outside client sees it:
 *   npx tsx bench/bounded-resources.ts [--main dist/cli/main.js] [--timeout 150]
 * Each case runs against a fresh `serve --mode random --timing none` process: the time to its answer, the
 * process's peak RSS (VmHWM) and its RSS 5 s after the answer (what it kept), and the slowest /health round trip
 * while the request was in flight (a blocked event loop shows here). `--main` runs another build of the CLI
 * (e.g. an older commit's, to compare); the request template case adds --trust-request-chat-template when
 * that build knows the flag. Linux only (/proc).
 */
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';

const { values } = parseArgs({
  options: { main: { type: 'string', default: join(import.meta.dirname, '..', 'dist', 'cli', 'main.js') }, timeout: { type: 'string', default: '150' } },
});
const MAIN = values.main!;
const TIMEOUT_MS = Number(values.timeout) * 1000;

interface Case {
  name: string;
  path: string;
  body: () => string;
  trust?: boolean;
}

const CASES: Case[] = [
  { name: 'n=16384, max_tokens=1000', path: '/v1/completions', body: () => JSON.stringify({ prompt: 'Hello world', n: 16384, max_tokens: 1000 }) },
  {
    name: '25 MB prompt (max_model_len 40960)',
    path: '/v1/completions',
    body: () => JSON.stringify({ prompt: 'the quick brown fox jumps over the lazy dog '.repeat(Math.ceil(25_000_000 / 44)), max_tokens: 5 }),
  },
  {
    name: 'request template, range(2000000)',
    path: '/v1/chat/completions',
    body: () => JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 5, chat_template: '{% for i in range(2000000) %}x{% endfor %}' }),
    trust: true,
  },
];

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

function memoryMb(pid: number): { peak: number; now: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (field: string) => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status)![1]);
  return { peak: kb('VmHWM') / 1024, now: kb('VmRSS') / 1024 };
}

async function startServer(extra: string[]): Promise<{ pid: number; port: number; stop: () => void }> {
  const child = spawn(process.execPath, [MAIN, 'serve', '--mode', 'random', '--timing', 'none', '--host', '127.0.0.1', '--port', '0', ...extra], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  return new Promise((resolve, reject) => {
    let out = '';
    child.stdout.on('data', (d: Buffer) => {
      out += d.toString();
      const m = /on http:\/\/127\.0\.0\.1:(\d+)/.exec(out);
      if (m) resolve({ pid: child.pid!, port: Number(m[1]), stop: () => child.kill('SIGKILL') });
    });
    child.once('exit', (code) => reject(new Error(`serve exited with ${code}: ${out}`)));
  });
}

async function knowsTrustFlag(): Promise<boolean> {
  const help = spawn(process.execPath, [MAIN, 'serve', '--help'], { stdio: ['ignore', 'pipe', 'ignore'] });
  let text = '';
  help.stdout.on('data', (d: Buffer) => (text += d.toString()));
  await new Promise((resolve) => help.once('close', resolve));
  return text.includes('--trust-request-chat-template');
}

async function run(c: Case, trustFlag: boolean): Promise<void> {
  const server = await startServer(c.trust && trustFlag ? ['--trust-request-chat-template'] : []);
  const base = `http://127.0.0.1:${server.port}`;
  try {
    const body = c.body();
    const before = memoryMb(server.pid);
    const started = performance.now();
    let answer: string | null = null;
    const request = fetch(`${base}${c.path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body,
      signal: AbortSignal.timeout(TIMEOUT_MS),
    })
      .then(async (res) => (answer = `${res.status} ${(await res.text()).slice(0, 110).replaceAll('\n', ' ')}`))
      .catch((err: Error) => (answer = `no answer (${err.name})`));
    let slowestHealthMs = 0;
    while (answer === null) {
      const t0 = performance.now();
      await fetch(`${base}/health`, { signal: AbortSignal.timeout(TIMEOUT_MS) }).catch(() => undefined);
      slowestHealthMs = Math.max(slowestHealthMs, performance.now() - t0);
      await sleep(10);
    }
    await request;
    const seconds = (performance.now() - started) / 1000;
    const peak = memoryMb(server.pid).peak;
    await sleep(5000);
    const kept = memoryMb(server.pid).now;
    console.log(
      `${c.name.padEnd(36)} ${seconds.toFixed(2).padStart(7)} s  peak RSS ${peak.toFixed(0).padStart(5)} MB (idle ${before.now.toFixed(0)} MB)  ` +
        `RSS 5 s later ${kept.toFixed(0).padStart(5)} MB  slowest /health ${slowestHealthMs.toFixed(0).padStart(5)} ms  -> ${answer}`,
    );
  } finally {
    server.stop();
  }
}

const trustFlag = await knowsTrustFlag();
console.log(`${MAIN}${trustFlag ? '' : ' (no --trust-request-chat-template: templates are always rendered)'}`);
for (const c of CASES) await run(c, trustFlag);
