/**
 * Runs one server of a benchmark in its own process, as it runs in production (its own event loop):
 *   node --import tsx bench/lib/child.ts <role> <options-json>
 * prints `READY <port>` once listening and shuts down (flushing --cpu-prof) when its stdin closes.
 * `spawnServer` is the parent's side.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import type { CaptureOptions } from '../../src/cli/capture.js';
import type { ServeOptions } from '../../src/cli/serve.js';
import type { FastUpstreamOptions } from './fastUpstream.js';

export type Role = 'upstream' | 'capture' | 'serve' | 'bare';

/** A bare node:http SSE server: answers every POST with these headers and events, one write per event. */
export interface BareOptions {
  /** JSON file: { headers: Record<string, string>, events: string[] }. */
  eventsFile: string;
}

async function startBare(opts: BareOptions): Promise<{ port: number; close(): Promise<void> }> {
  const { headers, events } = JSON.parse(readFileSync(opts.eventsFile, 'utf8')) as { headers: Record<string, string>; events: string[] };
  const server = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, headers);
      for (let i = 0; i < events.length - 1; i++) res.write(events[i]);
      res.end(events[events.length - 1]);
    });
  });
  server.keepAliveTimeout = 65_000;
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

export interface ServerProcess {
  port: number;
  url: string;
  child: ChildProcess;
  stop(): Promise<void>;
}

/**
 * Starts `role` in a child process. `nodeArgs` go to node (e.g. `--cpu-prof`); the child's stdout logs are
 * dropped unless `verbose`.
 */
export function spawnServer(role: 'upstream', options: FastUpstreamOptions, nodeArgs?: string[], verbose?: boolean): Promise<ServerProcess>;
export function spawnServer(role: 'capture', options: CaptureOptions, nodeArgs?: string[], verbose?: boolean): Promise<ServerProcess>;
export function spawnServer(role: 'serve', options: ServeOptions, nodeArgs?: string[], verbose?: boolean): Promise<ServerProcess>;
export function spawnServer(role: 'bare', options: BareOptions, nodeArgs?: string[], verbose?: boolean): Promise<ServerProcess>;
export function spawnServer(role: Role, options: object, nodeArgs: string[] = [], verbose = false): Promise<ServerProcess> {
  const child = spawn(process.execPath, [...nodeArgs, '--import', 'tsx', fileURLToPath(import.meta.url), role, JSON.stringify(options)], {
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  const exited = new Promise<void>((resolve) => child.on('exit', () => resolve()));
  return new Promise((resolve, reject) => {
    let buffer = '';
    child.on('exit', (code) => reject(new Error(`${role} child exited with code ${code} before it was ready`)));
    child.stdout?.on('data', (chunk: Buffer) => {
      buffer += chunk.toString('utf8');
      let at: number;
      while ((at = buffer.indexOf('\n')) >= 0) {
        const line = buffer.slice(0, at);
        buffer = buffer.slice(at + 1);
        const ready = /^READY (\d+)$/.exec(line);
        if (ready) {
          const port = Number(ready[1]);
          resolve({
            port,
            url: `http://127.0.0.1:${port}`,
            child,
            stop: async () => {
              child.stdin?.end();
              await exited;
            },
          });
        } else if (verbose) console.error(`[${role}] ${line}`);
      }
    });
  });
}

async function main(role: Role, options: string): Promise<void> {
  const opts = JSON.parse(options) as unknown;
  // Imported here so each process loads only the code of its own role.
  const running =
    role === 'upstream'
      ? await (await import('./fastUpstream.js')).startFastUpstream(opts as FastUpstreamOptions)
      : role === 'capture'
        ? await (await import('../../src/cli/capture.js')).startCapture(opts as CaptureOptions)
        : role === 'serve'
          ? await (await import('../../src/cli/serve.js')).startServe(opts as ServeOptions)
          : await startBare(opts as BareOptions);
  console.log(`READY ${running.port}`);
  process.stdin.resume();
  process.stdin.on('end', () => {
    void running.close().then(() => process.exit(0));
  });
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const [role, options] = process.argv.slice(2);
  main(role as Role, options).catch((err: unknown) => {
    console.error(err);
    process.exit(1);
  });
}
