/**
 * Probes servers' health endpoints every 50 ms from a process of its own, so what is measured is the servers'
 * latency, not the benchmark's event loop (busy with its clients). Shared by bench/fuzz.ts and bench/hostile.ts.
 */
import { spawn } from 'node:child_process';

export interface HealthProbes {
  /** Latency of each probe (ms), by process. */
  ms: Record<string, number[]>;
  /** "process: status" of each probe not answered 200. */
  unhealthy: string[];
}

/**
 * Probes every process's health endpoint every 50 ms from a process of its own, so what is measured is the
 * servers' latency, not this one's event loop (busy with 32 clients). Stopping returns every probe.
 */
export function startHealthProber(targets: { name: string; port: number; path: string }[]): { stop(): Promise<HealthProbes> } {
  const script = `
    const http = require('node:http');
    const targets = JSON.parse(process.argv[1]);
    const out = { ms: Object.fromEntries(targets.map((t) => [t.name, []])), unhealthy: [] };
    let on = true;
    process.stdin.on('end', () => (on = false)).resume();
    const probe = (t) => new Promise((resolve) => {
      const t0 = performance.now();
      const done = (status) => { out.ms[t.name].push(performance.now() - t0); if (status !== 200) out.unhealthy.push(t.name + ': ' + status); resolve(); };
      http.get({ host: '127.0.0.1', port: t.port, path: t.path, agent: false }, (res) => res.resume().on('end', () => done(res.statusCode))).on('error', () => done(0));
    });
    (async () => {
      while (on) {
        await Promise.all(targets.map(probe));
        await new Promise((r) => setTimeout(r, 50));
      }
      process.stdout.write(JSON.stringify(out));
    })();`;
  const child = spawn(process.execPath, ['-e', script, JSON.stringify(targets)], { stdio: ['pipe', 'pipe', 'inherit'] });
  let text = '';
  child.stdout.on('data', (d: Buffer) => (text += d.toString()));
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  let result: Promise<HealthProbes> | null = null;
  return {
    stop: () =>
      (result ??= (async () => {
        child.stdin.end();
        await exited;
        return JSON.parse(text) as HealthProbes;
      })()),
  };
}
