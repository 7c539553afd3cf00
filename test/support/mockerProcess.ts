import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';

const MAIN = join(import.meta.dirname, '..', '..', 'dist', 'cli', 'main.js');

export interface MockerProcess {
  child: ChildProcess;
  port: number;
  /** Everything the process printed on stdout so far. */
  stdout(): string;
  /** Everything the process printed on stderr so far (also echoed to the test's own stderr). */
  stderr(): string;
  /** SIGTERM and wait for the exit. */
  stop(): Promise<void>;
  /** Settles when the process has exited: its exit code, or the signal that ended it. */
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

export interface SpawnOptions {
  /** Working directory (default paths such as `captures/mocker.db` are relative to it). */
  cwd?: string;
  env?: NodeJS.ProcessEnv;
  /** false: no `--port` flag, the command's default port is the one waited for (`port` must name it). */
  portFlag?: boolean;
  /** Run as this user and group (a test running as root checks what an unprivileged user can do). */
  uid?: number;
  gid?: number;
}

/**
 * Runs the built CLI (`node dist/cli/main.js …`) as its own process and resolves once it prints the address
 * it listens on ("on http://…" or "proxying http://…": the addresses of upstreams it names are not; `--port 0`
 * picks a free one; a given port is waited for by number, for `serve --pd`, whose engines print theirs first).
 */
export function startMockerProcess(args: string[], port = 0, options: SpawnOptions = {}): Promise<MockerProcess> {
  const listen = ['--host', '127.0.0.1', ...(options.portFlag === false ? [] : ['--port', String(port)])];
  const child = spawn(process.execPath, [MAIN, ...args, ...listen], { stdio: ['ignore', 'pipe', 'pipe'], cwd: options.cwd, env: options.env, uid: options.uid, gid: options.gid });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
  return new Promise((resolve, reject) => {
    let out = '';
    let err = '';
    child.stdout!.on('data', (d: Buffer) => {
      out += d.toString();
      const m = new RegExp(`(?:on|proxying) http://127\\.0\\.0\\.1:(${port === 0 ? '\\d+' : port})\\b`).exec(out);
      if (m) resolve({ child, port: Number(m[1]), stdout: () => out, stderr: () => err, stop: async () => void (child.kill('SIGTERM'), await exited), exited });
    });
    child.stderr!.on('data', (d: Buffer) => {
      err += d.toString();
      process.stderr.write(d);
    });
    child.on('exit', (code) => reject(new Error(`mocker ${args[0]} exited with ${code} before listening: ${out}`)));
  });
}

/** Runs the built CLI to its exit (for arguments it must refuse): exit code and what it printed. */
export function runMockerToExit(args: string[], options: { cwd?: string; uid?: number; gid?: number } = {}): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, [MAIN, ...args], { stdio: ['ignore', 'pipe', 'pipe'], cwd: options.cwd, uid: options.uid, gid: options.gid });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  // A process that accepted the arguments would serve forever: ended after a while, its code is then null.
  const guard = setTimeout(() => child.kill('SIGKILL'), 30_000);
  return new Promise((resolve) =>
    child.once('close', (code) => {
      clearTimeout(guard);
      resolve({ code, stdout, stderr });
    }),
  );
}
