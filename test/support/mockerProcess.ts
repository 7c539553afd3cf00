import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';

const MAIN = join(import.meta.dirname, '..', '..', 'dist', 'cli', 'main.js');

export interface MockerProcess {
  child: ChildProcess;
  port: number;
  /** SIGTERM and wait for the exit. */
  stop(): Promise<void>;
}

/**
 * Runs the built CLI (`node dist/cli/main.js …`) as its own process and resolves once it prints the address
 * it listens on (`--port 0` picks a free one; a given port is waited for by number, for commands that print
 * other addresses first).
 */
export function startMockerProcess(args: string[], port = 0): Promise<MockerProcess> {
  const child = spawn(process.execPath, [MAIN, ...args, '--host', '127.0.0.1', '--port', String(port)], { stdio: ['ignore', 'pipe', 'pipe'] });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  return new Promise((resolve, reject) => {
    let out = '';
    child.stdout!.on('data', (d: Buffer) => {
      out += d.toString();
      const m = new RegExp(`http://127\\.0\\.0\\.1:(${port === 0 ? '\\d+' : port})\\b`).exec(out);
      if (m) resolve({ child, port: Number(m[1]), stop: async () => void (child.kill('SIGTERM'), await exited) });
    });
    child.stderr!.on('data', (d: Buffer) => process.stderr.write(d));
    child.on('exit', (code) => reject(new Error(`mocker ${args[0]} exited with ${code} before listening: ${out}`)));
  });
}
