/**
 * The README's recipes run as written: a block marked `<!-- recipe: NAME -->` is run with bash, in an empty
 * directory where `npx mocker` is the built CLI (as in a fresh clone after `npm ci`), offline (npx may not fetch).
 */
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { schemaErrors } from './support/junitSchema.js';
import { testTmpdir } from './support/tempRoot.js';

const ROOT = join(import.meta.dirname, '..');
const README = readFileSync(join(ROOT, 'README.md'), 'utf8');
const groups: number[] = [];

afterAll(() => {
  // Whatever a recipe left running (it failed half way, say) goes with its process group.
  for (const pid of groups) {
    try {
      process.kill(-pid, 'SIGKILL');
    } catch {
      // Already gone.
    }
  }
});

function recipe(name: string): string {
  const marker = README.indexOf(`<!-- recipe: ${name} -->`);
  expect(marker, `README: no recipe "${name}"`).toBeGreaterThan(0);
  const start = README.indexOf('```sh\n', marker) + '```sh\n'.length;
  return README.slice(start, README.indexOf('```\n', start));
}

/** An empty directory where `npx mocker` runs the built CLI, as a package's bin does. */
function workspace(): string {
  const dir = mkdtempSync(join(testTmpdir(), 'recipe-'));
  writeFileSync(join(dir, 'package.json'), '{"name": "recipe", "private": true}\n');
  mkdirSync(join(dir, 'node_modules', '.bin'), { recursive: true });
  writeFileSync(join(dir, 'node_modules', '.bin', 'mocker'), `#!/bin/sh\nexec "${process.execPath}" "${join(ROOT, 'dist', 'cli', 'main.js')}" "$@"\n`, { mode: 0o755 });
  return dir;
}

const env = () => ({ ...process.env, PATH: `${dirname(process.execPath)}:${process.env.PATH ?? ''}`, npm_config_offline: 'true', npm_config_update_notifier: 'false' });

function run(script: string, cwd: string): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn('bash', ['-e', '-c', script], { cwd, env: env(), detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  groups.push(child.pid!);
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise((resolve) => child.once('close', (code) => resolve({ code, stdout, stderr })));
}

describe("the README's recipes", () => {
  it('rerun without a GPU: capture mocker, replay the capture, rerun against it: no regression, JUnit and HTML written, nothing left running', async () => {
    const cwd = workspace();
    const result = await run(recipe('rerun without a GPU'), cwd);
    expect(result.code, result.stderr).toBe(0);
    expect(result.stdout).toMatch(/^2 exchanges compared: 2 same, 0 regression\(s\)/m);
    expect(await schemaErrors(readFileSync(join(cwd, 'rerun.xml'), 'utf8'))).toEqual([]);
    expect(readFileSync(join(cwd, 'rerun.html'), 'utf8')).toContain('No regression: 2 exchanges compared');
    // Both captures closed self-contained: every mocker the recipe started has stopped.
    for (const file of ['golden.db', 'rerun.db']) {
      expect(existsSync(join(cwd, 'captures', file)), file).toBe(true);
      expect(existsSync(join(cwd, 'captures', `${file}-wal`)), `${file}-wal`).toBe(false);
    }
  }, 120_000);

  it('a mocker started with npx stops gracefully when npx is sent SIGTERM (npm does not pass the signal on)', async () => {
    const cwd = workspace();
    const npx = spawn('npx', ['mocker', 'serve', '--host', '127.0.0.1', '--port', '0'], { cwd, env: env(), detached: true, stdio: ['ignore', 'pipe', 'inherit'] });
    groups.push(npx.pid!);
    let out = '';
    const port = await new Promise<number>((resolve, reject) => {
      npx.stdout.on('data', (d: Buffer) => {
        out += d.toString();
        const m = /on http:\/\/127\.0\.0\.1:(\d+)/.exec(out);
        if (m) resolve(Number(m[1]));
      });
      npx.once('exit', () => reject(new Error(`npx exited first: ${out}`)));
    });
    expect((await fetch(`http://127.0.0.1:${port}/health`)).status).toBe(200);
    npx.kill('SIGTERM');
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
  }, 60_000);
});
