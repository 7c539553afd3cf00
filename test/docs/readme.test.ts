/**
 * README.md is a guide a newcomer follows from the top: every shell block runs as written, in order, in a copy of
 * the checkout (as a fresh clone after `npm ci`), and fails the test on a non-zero exit. What the test changes,
 * and only that: each port the README names (`:8000`, `--port 8100`…) becomes a free one, consistently across
 * blocks; `npm ci`, which `.ci/run` has just run on this clone, is left out; npm and npx run offline.
 *
 * A block marked `<!-- readme-test: foreground server -->` runs a server in the foreground, as a user's first
 * terminal would: the blocks after it run against it (the user's second terminal) until the marker
 * `<!-- readme-test: stop foreground server -->`, where it gets Ctrl-C (SIGINT to its process group).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, symlinkSync } from 'node:fs';
import { createServer } from 'node:net';
import { dirname, join, resolve } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { schemaErrors } from '../support/junitSchema.js';
import { testTmpdir } from '../support/tempRoot.js';

const ROOT = join(import.meta.dirname, '..', '..');
const README = readFileSync(join(ROOT, 'README.md'), 'utf8');
const FOREGROUND = '<!-- readme-test: foreground server -->';
const STOP_FOREGROUND = '<!-- readme-test: stop foreground server -->';
/** Where the README writes: made fresh in the copy, never linked to the checkout's own. */
const WRITTEN = new Set(['captures', 'reports']);
const groups: number[] = [];

afterAll(() => {
  // Whatever a block left running (it failed half way, say) goes with its process group.
  for (const pid of groups) {
    try {
      process.kill(-pid, 'SIGKILL');
    } catch {
      // Already gone.
    }
  }
});

type Step = { kind: 'block'; code: string; foreground: boolean; heading: string } | { kind: 'stop foreground' };

/** The README's shell blocks and stop markers, in reading order, each block with the section it is in. */
function steps(readme: string): Step[] {
  const found: Step[] = [];
  let heading = '';
  const lines = readme.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    if (line.startsWith('## ')) heading = line.slice(3);
    if (line.trim() === STOP_FOREGROUND) found.push({ kind: 'stop foreground' });
    if (line === '```sh' || line === '```bash') {
      const end = lines.indexOf('```', i + 1);
      found.push({ kind: 'block', code: lines.slice(i + 1, end).join('\n'), foreground: lines[i - 1]?.trim() === FOREGROUND, heading });
      i = end;
    }
  }
  return found;
}

function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolvePort(port));
    });
  });
}

/** Each port the README names, mapped to a free one (the same README port to the same free port every time). */
async function portsOf(blocks: string[]): Promise<Map<string, number>> {
  const ports = new Map<string, number>();
  for (const code of blocks) {
    for (const m of code.matchAll(/(?:127\.0\.0\.1:|--port )(\d{4,5})\b/g)) if (!ports.has(m[1])) ports.set(m[1], await freePort());
  }
  return ports;
}

const withPorts = (code: string, ports: Map<string, number>) =>
  code.replace(/(127\.0\.0\.1:|--port )(\d{4,5})\b/g, (_, before: string, port: string) => `${before}${ports.get(port)}`);

/**
 * A copy of the checkout: every top-level entry linked, but what the README writes, which starts empty, and the
 * build, copied: the first `npx mocker` in a new directory runs the package's `prepare` (tsc), which must not
 * rewrite the build other test files are running meanwhile.
 */
function checkoutCopy(): string {
  const dir = mkdtempSync(join(testTmpdir(), 'readme-'));
  for (const entry of readdirSync(ROOT)) {
    if (entry === '.git' || entry === 'dist' || WRITTEN.has(entry)) continue;
    symlinkSync(join(ROOT, entry), join(dir, entry));
  }
  cpSync(join(ROOT, 'dist'), join(dir, 'dist'), { recursive: true });
  mkdirSync(join(dir, 'captures'));
  return dir;
}

const env = (extra: Record<string, string> = {}) => ({
  ...process.env,
  PATH: `${dirname(process.execPath)}:${process.env.PATH ?? ''}`,
  npm_config_offline: 'true',
  npm_config_update_notifier: 'false',
  ...extra,
});

interface Ran {
  code: number | null;
  signal: NodeJS.Signals | null;
  output: string;
}

function start(script: string, cwd: string, extraEnv: Record<string, string> = {}): { child: ChildProcess; done: Promise<Ran>; output: () => string } {
  const child = spawn('bash', ['-e', '-c', script], { cwd, env: env(extraEnv), detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  groups.push(child.pid!);
  let output = '';
  child.stdout!.on('data', (d: Buffer) => (output += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (output += d.toString()));
  const done = new Promise<Ran>((resolveRun) => child.once('close', (code, signal) => resolveRun({ code, signal, output })));
  return { child, done, output: () => output };
}

async function untilHealthy(port: number, running: { output: () => string }, done: Promise<Ran>): Promise<void> {
  let exited = false;
  void done.then(() => (exited = true));
  for (let i = 0; i < 600 && !exited; i++) {
    const ok = await fetch(`http://127.0.0.1:${port}/health`).then(
      (r) => r.ok,
      () => false,
    );
    if (ok) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`the foreground server never answered /health on :${port}:\n${running.output()}`);
}

describe('README.md', () => {
  it('is a guide of at most 250 lines whose links all point inside the repository, at files that exist', () => {
    expect(README.split('\n').length).toBeLessThanOrEqual(250);
    const links = [...README.matchAll(/\]\(([^)\s]+)\)/g)].map((m) => m[1]);
    expect(links.length).toBeGreaterThan(5);
    for (const link of links) {
      expect(link, 'a link to a web page or outside the repository').not.toMatch(/^(https?:|\/|\.\.)/);
      expect(existsSync(resolve(ROOT, link.split('#')[0])), link).toBe(true);
    }
    expect(README).not.toMatch(/\.\.\/shared|seed 00\d|issue #\d/i);
  });

  it('docs/ links only inside the repository, to files that exist, and names nothing outside it', () => {
    const docs = readdirSync(join(ROOT, 'docs')).filter((f) => f.endsWith('.md'));
    expect(docs.length).toBeGreaterThan(5);
    for (const doc of docs) {
      const text = readFileSync(join(ROOT, 'docs', doc), 'utf8');
      for (const [, link] of text.matchAll(/\]\(([^)\s]+)\)/g)) {
        if (/^https?:/.test(link)) continue;
        expect(existsSync(resolve(ROOT, 'docs', link.split('#')[0] || doc)), `${doc}: ${link}`).toBe(true);
      }
      expect(text, doc).not.toMatch(/\.\.\/shared|-reference\.md|seed 00\d|issue #\d/i);
      // In a clone `mocker` is not on the PATH: examples run it as `npx mocker` (or inside the image).
      const commands = [...text.matchAll(/^```(?:sh|bash)\n([\s\S]*?)^```$/gm)].flatMap((m) => m[1].split('\n'));
      expect(
        commands.filter((line) => /(^|[;&|]\s*|\$\(|^\w+=\S+\s+)mocker\s/.test(line)),
        doc,
      ).toEqual([]);
    }
  });

  it('every shell block runs as written, in order, in a copy of the checkout: nothing fails, and each does what the text says', async () => {
    const all = steps(README);
    const blocks = all.flatMap((s) => (s.kind === 'block' ? [s] : []));
    expect(blocks.length).toBeGreaterThan(5);
    // The setup block is the README's two commands; `npm ci` is exactly what .ci/run runs first.
    expect(blocks[0].code).toMatch(/^npm ci && npm start\b/);
    expect(readFileSync(join(ROOT, '.ci', 'run'), 'utf8')).toMatch(/^npm ci\b/m);
    const ports = await portsOf(blocks.map((b) => b.code));
    const cwd = checkoutCopy();
    let foreground: { child: ChildProcess; done: Promise<Ran>; output: () => string } | undefined;
    const outputs: { heading: string; code: string; output: string }[] = [];
    for (const step of all) {
      if (step.kind === 'stop foreground') {
        expect(foreground, `${STOP_FOREGROUND} with no foreground server`).toBeDefined();
        process.kill(-foreground!.child.pid!, 'SIGINT');
        const ran = await foreground!.done;
        // Ctrl-C ends npm by the signal, as in a terminal; the server under it has drained and stopped.
        expect(ran.code === 0 || ran.signal === 'SIGINT', ran.output).toBe(true);
        expect(ran.output).toMatch(/mocker serve: SIGINT: draining/);
        expect(ran.output).toMatch(/mocker serve: stopped: /);
        foreground = undefined;
        continue;
      }
      const code = withPorts(step.code.replace(/^npm ci && /, ''), ports);
      if (step.foreground) {
        // `npm start` serves on :8000 (the block's comment says so): that port, mapped as every other.
        const port = ports.get('8000')!;
        foreground = start(code, cwd, { MOCKER_PORT: String(port) });
        await untilHealthy(port, foreground, foreground.done);
        continue;
      }
      const ran = await start(code, cwd).done;
      expect(ran.code, `README block in "${step.heading}" failed:\n${step.code}\n--- its output:\n${ran.output}`).toBe(0);
      outputs.push({ heading: step.heading, code: step.code, output: ran.output });
    }
    expect(foreground, 'the foreground server was never stopped').toBeUndefined();

    // What the text around the blocks promises.
    const of = (heading: string) => outputs.filter((o) => o.heading === heading);
    const [curl, sdk] = of('A first request');
    expect(JSON.parse(curl.output)).toMatchObject({ object: 'chat.completion', model: 'Qwen/Qwen3-0.6B', usage: { completion_tokens: 16 } });
    expect(sdk.output.trim().length, 'the SDK printed the streamed text').toBeGreaterThan(0);
    // Recorded, then replayed: the same answer (a fresh id and created, as every vLLM response has).
    const [recorded, replayed] = of('Record and replay');
    expect(recorded.output).toMatch(/captures\/golden\.db: 2 exchanges \(2 complete/);
    const chat = (output: string) => {
      const { id, created, ...answer } = JSON.parse(output.split('\n').find((line) => line.startsWith('{"id":"chatcmpl-'))!) as Record<string, unknown>;
      expect([typeof id, typeof created]).toEqual(['string', 'number']);
      return answer;
    };
    expect(chat(replayed.output)).toEqual(chat(recorded.output));
    const [rerun] = of('Check a new build against the golden run');
    expect(rerun.output).toMatch(/^2 exchanges compared: 2 same, 0 regression\(s\)/m);
    expect(await schemaErrors(readFileSync(join(cwd, 'reports', 'rerun.xml'), 'utf8'))).toEqual([]);
    expect(readFileSync(join(cwd, 'reports', 'rerun.html'), 'utf8')).toContain('No regression: 2 exchanges compared');
    expect(existsSync(join(cwd, 'reports', 'fleet.html'))).toBe(true);
    expect(readdirSync(join(cwd, 'reports')).some((f) => /^dynamo_replay_report_.*\.json$/.test(f))).toBe(true);
    expect(of('Prefill/decode disaggregation')[0].output).toMatch(/"object":"text_completion"/);
    expect(of('Deploy')[0].output).toMatch(/^kind: Deployment$/m);
    // Every background server drained and stopped, each with its summary line, before its block ended.
    for (const { code, output } of outputs.filter((o) => o.code.includes('& '))) {
      const started = (code.match(/ & \w+=\$!/g) ?? []).length;
      expect((output.match(/^mocker \S+: stopped: /gm) ?? []).length, code).toBe(started);
    }
    // Every server a block started has stopped: both capture files were closed self-contained.
    for (const file of ['golden.db', 'rerun.db']) {
      expect(existsSync(join(cwd, 'captures', file)), file).toBe(true);
      expect(existsSync(join(cwd, 'captures', `${file}-wal`)), `${file}-wal`).toBe(false);
    }
  }, 600_000);

  it.each([
    ['npx mocker serve', ['npx', 'mocker', 'serve', '--host', '127.0.0.1']],
    ['npm start', ['npm', 'start']],
  ])(
    'a server started with %s stops gracefully when npm is sent SIGTERM (npm does not pass the signal on)',
    async (_, [command, ...args]) => {
      const cwd = checkoutCopy();
      const port = await freePort();
      const npm = spawn(command, args, { cwd, env: env({ MOCKER_PORT: String(port) }), detached: true, stdio: ['ignore', 'pipe', 'inherit'] });
      groups.push(npm.pid!);
      let out = '';
      npm.stdout.on('data', (d: Buffer) => (out += d.toString()));
      await untilHealthy(port, { output: () => out }, new Promise<Ran>((r) => npm.once('exit', (code, signal) => r({ code, signal, output: out }))));
      npm.kill('SIGTERM');
      let answering = true;
      for (let i = 0; i < 100 && answering; i++) {
        await new Promise((r) => setTimeout(r, 100));
        answering = await fetch(`http://127.0.0.1:${port}/health`).then(
          () => true,
          () => false,
        );
      }
      expect(answering).toBe(false);
      // Stopped gracefully, once: its stdout (npm's, inherited) got the summary line, not a second signal's exit.
      await new Promise((r) => setTimeout(r, 500));
      expect(out).toMatch(/mocker serve: npm \(pid \d+\), which started it, has exited: draining/);
      expect(out).toMatch(/mocker serve: stopped: /);
      expect(out).not.toContain('exiting at once');
    },
    60_000,
  );
});
