import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';

const MAIN = join(import.meta.dirname, '..', '..', 'dist', 'cli', 'main.js');

/** A spawned CLI that listens. */
export interface MockerProcess extends SpawnedMocker {
  port: number;
  /** Where it listens, as printed: `http(s)://127.0.0.1:<port>`. */
  url: string;
  /** SIGTERM and wait for the exit. */
  stop(): Promise<void>;
}

export interface SpawnOptions {
  /** Working directory (default paths such as `captures/mocker.db` are relative to it). */
  cwd?: string;
  env?: NodeJS.ProcessEnv;
  /** false: no `--port` flag, the command's default port is the one waited for (`port` must name it). */
  portFlag?: boolean;
  /** File permissions bind the process even when the tests run as root (see `permissionsBinding`). */
  bound?: boolean;
  /** What runs instead of `node dist/cli/main.js` (e.g. `['bash', 'scripts/x.sh']`), given the same arguments. */
  launcher?: string[];
}

/**
 * `command` run so that file permissions bind it: as root, without the capabilities that override them
 * (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH; util-linux's setpriv execs the command in its place), so a 0444 file
 * or a 0555 directory is read-only to it as to anyone; any other user as itself.
 */
export function permissionsBinding(command: string[]): [string, string[]] {
  const full = process.getuid?.() === 0 ? ['setpriv', '--bounding-set', '-dac_override,-dac_read_search', '--', ...command] : command;
  return [full[0], full.slice(1)];
}

function spawnCli(args: string[], options: Omit<SpawnOptions, 'portFlag'>) {
  const command = [...(options.launcher ?? [process.execPath, MAIN]), ...args];
  const [file, rest] = options.bound ? permissionsBinding(command) : [command[0], command.slice(1)];
  const child = spawn(file, rest, { stdio: ['ignore', 'pipe', 'pipe'], cwd: options.cwd, env: options.env });
  // Decoded as a stream: a character split across two reads stays whole.
  child.stdout.setEncoding('utf8');
  child.stderr.setEncoding('utf8');
  return child;
}

/** The built CLI running as its own process: what it printed so far, and its exit. */
export interface SpawnedMocker {
  child: ChildProcess;
  /** Everything the process printed on stdout so far. */
  stdout(): string;
  /** Everything the process printed on stderr so far (also echoed to the test's own stderr). */
  stderr(): string;
  /** Settles when the process has exited: its exit code, or the signal that ended it. */
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

/** Runs the built CLI (`node dist/cli/main.js …`) as its own process, waiting for nothing. */
export function spawnMockerProcess(args: string[], options: Omit<SpawnOptions, 'portFlag'> = {}): SpawnedMocker {
  const child = spawnCli(args, options);
  let out = '';
  let err = '';
  child.stdout.on('data', (d: string) => (out += d));
  child.stderr.on('data', (d: string) => {
    err += d;
    process.stderr.write(d);
  });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once('exit', (code, signal) => resolve({ code, signal })),
  );
  return { child, stdout: () => out, stderr: () => err, exited };
}

/**
 * Runs the built CLI (`node dist/cli/main.js …`) as its own process and resolves once it prints the address
 * it listens on ("on http://…" or "proxying http://…", https with TLS: the addresses of upstreams it names are not; `--port 0`
 * picks a free one; a given port is waited for by number, for `serve --pd`, whose engines print theirs first).
 */
export function startMockerProcess(args: string[], port = 0, options: SpawnOptions = {}): Promise<MockerProcess> {
  const listen = ['--host', '127.0.0.1', ...(options.portFlag === false ? [] : ['--port', String(port)])];
  const spawned = spawnMockerProcess([...args, ...listen], options);
  const address = new RegExp(`(?:on|proxying) (https?)://127\\.0\\.0\\.1:(${port === 0 ? '\\d+' : port})\\b`);
  return new Promise((resolve, reject) => {
    // Registered after spawnMockerProcess's own listener: the chunk is already in stdout().
    spawned.child.stdout!.on('data', () => {
      const m = address.exec(spawned.stdout());
      if (m)
        resolve({
          ...spawned,
          port: Number(m[2]),
          url: `${m[1]}://127.0.0.1:${m[2]}`,
          stop: async () => void (spawned.child.kill('SIGTERM'), await spawned.exited),
        });
    });
    spawned.child.on('exit', (code) => reject(new Error(`mocker ${args[0]} exited with ${code} before listening: ${spawned.stdout()}`)));
  });
}

/** Processes a test file (or block) started with `start`, stopped together by `stopAll` (its afterEach or afterAll). */
export interface MockerProcesses {
  /** `startMockerProcess(args, port, options)`, remembered until `stopAll`. */
  start(args: string[], options?: SpawnOptions & { port?: number }): Promise<MockerProcess>;
  /** SIGTERM to each process started since the last call (or since `killAll`), and wait for their exits. */
  stopAll(): Promise<void>;
  /** SIGKILL to those still running (after tests that stopped them their own way), and wait for their exits. */
  killAll(): Promise<void>;
}

/** The spawned-CLI harness: `const mockers = mockerProcesses(); afterAll(mockers.stopAll);` then `(await mockers.start([...])).url`. */
export function mockerProcesses(): MockerProcesses {
  const started: MockerProcess[] = [];
  return {
    async start(args, { port = 0, ...options } = {}) {
      const p = await startMockerProcess(args, port, options);
      started.push(p);
      return p;
    },
    stopAll: async () => void (await Promise.all(started.splice(0).map((p) => p.stop()))),
    killAll: async () => void (await Promise.all(started.splice(0).map((p) => (p.child.kill('SIGKILL'), p.exited)))),
  };
}

/** Runs the built CLI to its exit (for arguments it must refuse): exit code and what it printed. */
export function runMockerToExit(
  args: string[],
  options: Omit<SpawnOptions, 'portFlag'> = {},
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawnCli(args, options);
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: string) => (stdout += d));
  child.stderr.on('data', (d: string) => (stderr += d));
  // A process that accepted the arguments would serve forever: ended after a while, its code is then null.
  const guard = setTimeout(() => child.kill('SIGKILL'), 30_000);
  return new Promise((resolve) =>
    child.once('close', (code) => {
      clearTimeout(guard);
      resolve({ code, stdout, stderr });
    }),
  );
}
