/**
 * What the access tests share (test/access/access-control.test.ts, test/access/route-classes.test.ts): servers started for one
 * test and stopped after it, and a request as a client sends it, with or without the key.
 */
import { startMockerProcess, type MockerProcess, type SpawnedMocker } from './mockerProcess.js';
import { serveInProcess, type Running, type ServeOptions } from './inProcess.js';

export const KEY = 'sk-access-test';
/** The environment without the variables that turn routes on or set a key. */
export const ENV = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^(VLLM_|MOCKER_)/.test(k)));
export const SERVE = ['serve', '--mode', 'random', '--fast', '--served-model-name', 'm'];

/** The servers of one test: spawned CLIs and in-process upstreams; `close` after each test. */
export class AccessRig {
  private readonly processes: (MockerProcess | SpawnedMocker)[] = [];
  private readonly inProcess: Running[] = [];

  /** A process the test spawned itself, stopped with the others. */
  track(process: SpawnedMocker): void {
    this.processes.push(process);
  }

  async mocker(args: string[], env: NodeJS.ProcessEnv = ENV): Promise<{ url: string; process: MockerProcess }> {
    const p = await startMockerProcess(args, 0, { env });
    this.processes.push(p);
    return { url: `http://127.0.0.1:${p.port}`, process: p };
  }

  /** A `serve` in this process (random mode, no capture file). */
  async running(options: Partial<ServeOptions>): Promise<Running> {
    const running = await serveInProcess({ mode: 'random', captures: ':memory:', timing: 'none', ...options });
    this.inProcess.push(running);
    return running;
  }

  /** An upstream in this process: its URL. */
  async serveInProcess(options: Partial<ServeOptions>): Promise<string> {
    return `http://127.0.0.1:${(await this.running(options)).port}`;
  }

  async close(): Promise<void> {
    await Promise.all(this.processes.splice(0).map(async (p) => void (p.child.kill('SIGTERM'), await p.exited)));
    await Promise.all(this.inProcess.splice(0).map((r) => r.close()));
  }
}

/** One request as a client sends it: a JSON object body on anything but GET. */
export async function call(url: string, method: string, path: string, key?: string): Promise<{ status: number; body: string }> {
  const headers: Record<string, string> = {
    ...(key ? { authorization: `Bearer ${key}` } : {}),
    ...(method === 'GET' ? {} : { 'content-type': 'application/json' }),
  };
  const res = await fetch(`${url}${path}`, { method, headers, body: method === 'GET' ? undefined : '{}' });
  return { status: res.status, body: await res.text() };
}
