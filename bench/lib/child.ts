/**
 * Runs one server of a benchmark in its own process, as in production (its own event loop):
 *   node --import tsx bench/lib/child.ts <role> <options-json>
 * It prints `READY <port>` once listening and exits when its stdin closes. Commands on its stdin, one per
 * line, each answered by a `REPLY <json>` line, in order:
 *   STATS               CPU time, event-loop utilization and event-loop delay since the previous STATS
 *   PROFILE_START       starts the V8 CPU profiler (node:inspector)
 *   PROFILE_STOP <file> stops it and writes the .cpuprofile
 * `spawnServer` is the parent's side.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { Session } from 'node:inspector';
import net, { type AddressInfo } from 'node:net';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import type { CaptureOptions } from '../../src/app/capture.js';
import type { ServeOptions } from '../../src/app/serve.js';
import type { PdProxyOptions } from '../../src/pd/proxy.js';
import type { FastUpstreamOptions } from './fastUpstream.js';
import { childrenOf, cpuMs } from './procStat.js';

export type Role = 'upstream' | 'capture' | 'pipe' | 'relay' | 'serve' | 'bare' | 'pd-proxy';

/** A bare node:http SSE server: answers every POST with these headers and events, one write per event. */
export interface BareOptions {
  /** JSON file: { headers: Record<string, string>, events: string[] }. */
  eventsFile: string;
  /**
   * Write each event in its own event-loop turn (setImmediate), as a server streaming tokens as they come
   * does. Otherwise all writes happen in one turn, and Node's http layer corks them into a few syscalls.
   */
  perTurn?: boolean;
}

/** The smallest useful node:http reverse proxy (no parsing, no recording): what Node itself costs per hop. */
export interface PipeOptions {
  upstream: string;
}

interface Running {
  port: number;
  close(): Promise<unknown>;
}

async function listen(server: http.Server): Promise<Running> {
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

function startBare(opts: BareOptions): Promise<Running> {
  const { headers, events } = JSON.parse(readFileSync(opts.eventsFile, 'utf8')) as { headers: Record<string, string>; events: string[] };
  return listen(
    http.createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(200, headers);
        if (!opts.perTurn) {
          for (let i = 0; i < events.length - 1; i++) res.write(events[i]);
          return void res.end(events[events.length - 1]);
        }
        let i = 0;
        const next = () => {
          if (i === events.length - 1) return void res.end(events[i]);
          res.write(events[i++]);
          setImmediate(next);
        };
        next();
      });
    }),
  );
}

function startPipe(opts: PipeOptions): Promise<Running> {
  const upstream = new URL(opts.upstream);
  const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity });
  return listen(
    http.createServer((req, res) => {
      const up = http.request({ host: upstream.hostname, port: upstream.port, method: req.method, path: req.url, headers: req.headers, agent }, (upRes) => {
        res.writeHead(upRes.statusCode ?? 502, upRes.headers);
        upRes.on('data', (chunk: Buffer) => res.write(chunk));
        upRes.on('end', () => res.end());
      });
      up.on('error', () => res.destroy());
      req.pipe(up);
    }),
  );
}

/**
 * A raw TCP relay to the upstream (net sockets piped both ways, no HTTP at all): the least any userspace hop
 * written in Node can do per token, one read and one write system call.
 */
function startRelay(opts: PipeOptions): Promise<Running> {
  const upstream = new URL(opts.upstream);
  const open = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const up = net.connect(Number(upstream.port), upstream.hostname);
    open.add(client).add(up);
    client.setNoDelay(true);
    up.setNoDelay(true);
    client.pipe(up).pipe(client);
    const close = () => {
      client.destroy();
      up.destroy();
      open.delete(client);
      open.delete(up);
    };
    client.on('error', close).on('close', close);
    up.on('error', close).on('close', close);
  });
  return new Promise((resolve) =>
    server.listen(0, '127.0.0.1', () =>
      resolve({
        port: (server.address() as AddressInfo).port,
        close: () =>
          new Promise<void>((done) => {
            for (const socket of open) socket.destroy();
            server.close(() => done());
          }),
      }),
    ),
  );
}

/** CPU time (ms) of each process this one started (`capture --threads`' forwarding processes), by pid. */
function childrenCpuMs(): Map<number, number> {
  const cpu = new Map<number, number>();
  for (const pid of childrenOf(process.pid)) {
    try {
      cpu.set(pid, cpuMs(pid));
    } catch {
      // gone meanwhile
    }
  }
  return cpu;
}

/** The CPU the processes of `now` spent since `before` (those started since: all of theirs). */
const sumChanges = (before: Map<number, number>, now: Map<number, number>) => [...now].reduce((sum, [pid, ms]) => sum + ms - (before.get(pid) ?? 0), 0);

/** What a server process did between two `stats()` calls. */
export interface ProcessStats {
  /** CPU time of the process and of the processes it started. */
  cpuMs: number;
  /** CPU time of its main thread alone (the event loop's JS, and the syscalls it makes). */
  mainThreadCpuMs: number;
  /** Event-loop utilization, 0..1. */
  elu: number;
  /** Event-loop delay percentiles (ms, 1 ms sampling resolution). */
  delayP50Ms: number;
  delayP99Ms: number;
  delayMaxMs: number;
}

export interface ServerProcess {
  port: number;
  url: string;
  child: ChildProcess;
  stats(): Promise<ProcessStats>;
  profileStart(): Promise<void>;
  profileStop(file: string): Promise<void>;
  stop(): Promise<void>;
}

/**
 * Starts `role` in a child process; its stdout logs are dropped unless `verbose`. `MOCKER_BENCH_NODE_FLAGS`
 * (space-separated) are given to every child's node, e.g. `--trace-gc` with `--verbose` to see each process's
 * collections (node refuses most V8 flags in NODE_OPTIONS).
 */
export function spawnServer(role: 'upstream', options: FastUpstreamOptions, verbose?: boolean): Promise<ServerProcess>;
export function spawnServer(role: 'capture', options: CaptureOptions, verbose?: boolean): Promise<ServerProcess>;
export function spawnServer(role: 'pipe' | 'relay', options: PipeOptions, verbose?: boolean): Promise<ServerProcess>;
export function spawnServer(role: 'serve', options: ServeOptions, verbose?: boolean): Promise<ServerProcess>;
export function spawnServer(role: 'bare', options: BareOptions, verbose?: boolean): Promise<ServerProcess>;
export function spawnServer(role: 'pd-proxy', options: PdProxyOptions, verbose?: boolean): Promise<ServerProcess>;
export function spawnServer(role: Role, options: object, verbose = false): Promise<ServerProcess> {
  const child = spawn(
    process.execPath,
    [
      ...(process.env.MOCKER_BENCH_NODE_FLAGS?.split(' ').filter(Boolean) ?? []),
      '--import',
      'tsx',
      fileURLToPath(import.meta.url),
      role,
      JSON.stringify(options),
    ],
    {
      stdio: ['pipe', 'pipe', 'inherit'],
    },
  );
  const exited = new Promise<void>((resolve) => child.on('exit', () => resolve()));
  const replies: ((json: string) => void)[] = [];
  const command = (line: string) =>
    new Promise<string>((resolve) => {
      replies.push(resolve);
      child.stdin?.write(`${line}\n`);
    });
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
            stats: async () => JSON.parse(await command('STATS')) as ProcessStats,
            profileStart: async () => void (await command('PROFILE_START')),
            profileStop: async (file) => void (await command(`PROFILE_STOP ${file}`)),
            stop: async () => {
              child.stdin?.end();
              await exited;
            },
          });
        } else if (line.startsWith('REPLY ')) replies.shift()?.(line.slice(6));
        else if (verbose) console.error(`[${role}] ${line}`);
      }
    });
  });
}

/** URLs travel as strings in the options JSON. */
function revivePdProxyOptions(opts: PdProxyOptions): PdProxyOptions {
  return { ...opts, prefill: opts.prefill.map((u) => new URL(String(u))), decode: opts.decode.map((u) => new URL(String(u))) };
}

async function main(role: Role, options: string): Promise<void> {
  const opts = JSON.parse(options) as unknown;
  // Imported here so each process loads only the code of its own role.
  const running: Running =
    role === 'upstream'
      ? await (await import('./fastUpstream.js')).startFastUpstream(opts as FastUpstreamOptions)
      : role === 'capture'
        ? await (await import('../../src/app/capture.js')).startCapture(opts as CaptureOptions)
        : role === 'serve'
          ? await (await import('../../src/app/serve.js')).startServe(opts as ServeOptions)
          : role === 'pipe'
            ? await startPipe(opts as PipeOptions)
            : role === 'relay'
              ? await startRelay(opts as PipeOptions)
              : role === 'pd-proxy'
                ? await (await import('../../src/pd/proxy.js')).startPdProxy(revivePdProxyOptions(opts as PdProxyOptions))
                : await startBare(opts as BareOptions);
  console.log(`READY ${running.port}`);

  const delay = monitorEventLoopDelay({ resolution: 1 });
  delay.enable();
  let cpu = process.cpuUsage();
  let childrenCpu = childrenCpuMs();
  const mainThreadMs = () => cpuMs(process.pid, process.pid);
  let mainThreadCpu = mainThreadMs();
  let elu = performance.eventLoopUtilization();
  const session = new Session();
  const post = (method: string) => new Promise<unknown>((resolve, reject) => session.post(method, (err, result) => (err ? reject(err) : resolve(result))));

  const handle = async (line: string): Promise<unknown> => {
    if (line === 'STATS') {
      const dCpu = process.cpuUsage(cpu);
      const children = childrenCpuMs();
      const mainThread = mainThreadMs();
      const stats: ProcessStats = {
        cpuMs: (dCpu.user + dCpu.system) / 1000 + sumChanges(childrenCpu, children),
        mainThreadCpuMs: mainThread - mainThreadCpu,
        elu: performance.eventLoopUtilization(elu).utilization,
        delayP50Ms: delay.percentile(50) / 1e6,
        delayP99Ms: delay.percentile(99) / 1e6,
        delayMaxMs: delay.max / 1e6,
      };
      cpu = process.cpuUsage();
      childrenCpu = children;
      mainThreadCpu = mainThread;
      elu = performance.eventLoopUtilization();
      delay.reset();
      return stats;
    }
    if (line === 'PROFILE_START') {
      session.connect();
      await post('Profiler.enable');
      await post('Profiler.start');
      return null;
    }
    if (line.startsWith('PROFILE_STOP ')) {
      const { profile } = (await post('Profiler.stop')) as { profile: unknown };
      writeFileSync(line.slice('PROFILE_STOP '.length), JSON.stringify(profile));
      session.disconnect();
      return null;
    }
    throw new Error(`unknown command ${line}`);
  };

  let queue = Promise.resolve();
  let pending = '';
  process.stdin.setEncoding('utf8');
  process.stdin.on('data', (text: string) => {
    pending += text;
    const lines = pending.split('\n');
    pending = lines.pop() ?? '';
    for (const line of lines) queue = queue.then(async () => console.log(`REPLY ${JSON.stringify(await handle(line))}`));
  });
  process.stdin.on('end', () => {
    void queue.then(() => running.close()).then(() => process.exit(0));
  });
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const [role, options] = process.argv.slice(2);
  main(role as Role, options).catch((err: unknown) => {
    console.error(err);
    process.exit(1);
  });
}
