/**
 * The container image's main process, run as the image runs it but without a container tool (none can run
 * containers on this machine: docs/deploy.md, "Container image"): the Dockerfile's ENTRYPOINT script with its CMD and
 * its ENV. SIGTERM while a stream is in flight drains it and exits 0, so `docker stop` / a pod's termination
 * reaches mocker's drain and not a shell.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { freePorts } from '../support/kvEventsClient.js';
import { mockerProcesses } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';

const ROOT = join(import.meta.dirname, '..', '..');
const dockerfile = readFileSync(join(ROOT, 'Dockerfile'), 'utf8').replace(/\\\n\s*/g, ' ');
/** The last stage's instruction (the run stage's), its argument text. */
const instruction = (name: string) => [...dockerfile.matchAll(new RegExp(`^${name} (.*)$`, 'gm'))].map((m) => m[1]).pop()!;
/** The image lays the repository out under /app (WORKDIR). */
const onHost = (path: string) => path.replace(/^\/app\//, `${ROOT}/`);

const imageEnv = Object.fromEntries([...instruction('ENV').matchAll(/(\w+)=(\S+)/g)].map((m) => [m[1], m[2]]));
const dir = mkdtempSync(join(testTmpdir(), 'mocker-image-'));

const mockers = mockerProcesses();
afterAll(async () => {
  await mockers.killAll();
  rmSync(dir, { recursive: true, force: true });
});

describe('the image entrypoint', () => {
  it('ENTRYPOINT + CMD with the image ENV: serves; SIGTERM drains a stream in flight and exits 0', async () => {
    const entrypoint = (JSON.parse(instruction('ENTRYPOINT')) as string[]).map(onHost);
    const cmd = JSON.parse(instruction('CMD')) as string[];
    expect(cmd).toEqual(['serve']);
    expect(imageEnv.MOCKER_CAPTURES).toBe('/captures/mocker.db');
    // The flags a deployment would set by environment: 20 tokens, 100 ms apart.
    const env = { ...process.env, ...imageEnv, MOCKER_MODE: 'random', MOCKER_TIMING: 'fixed', MOCKER_FORWARD_TIME_MS: '100' };
    const serve = await mockers.start(cmd, { launcher: entrypoint, env });
    // exec: the process spawned is node itself, not a shell waiting for it.
    expect(readFileSync(`/proc/${serve.child.pid}/comm`, 'utf8').trim()).toBe('node');
    expect((await fetch(`http://127.0.0.1:${serve.port}/health`)).status).toBe(200);

    const res = await fetch(`http://127.0.0.1:${serve.port}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'Qwen/Qwen3-0.6B', messages: [{ role: 'user', content: 'hi' }], stream: true, max_tokens: 20, ignore_eos: true }),
    });
    const reader = res.body!.getReader();
    const first = await reader.read();
    expect(first.done).toBe(false);
    serve.child.kill('SIGTERM');
    let text = Buffer.from(first.value!).toString('utf8');
    for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) text += Buffer.from(chunk.value).toString('utf8');
    expect(text.trimEnd().endsWith('data: [DONE]')).toBe(true);
    expect(text).toContain('"finish_reason":"length"');
    expect(await serve.exited).toEqual({ code: 0, signal: null });
    expect(serve.stdout()).toContain('1 request(s) in flight finished, 0 cut off');
  });

  it('a first argument that is a flag means serve', async () => {
    const entrypoint = (JSON.parse(instruction('ENTRYPOINT')) as string[]).map(onHost);
    const serve = await mockers.start(['--mode', 'random'], { launcher: entrypoint });
    expect(serve.stdout()).toContain('mocker serve: random mode');
    await serve.stop();
    expect(await serve.exited).toEqual({ code: 0, signal: null });
  });
});

describe('the image HEALTHCHECK, run as Docker runs it (its CMD in the container, with the image ENV)', () => {
  const entrypoint = (JSON.parse(instruction('ENTRYPOINT')) as string[]).map(onHost);
  const check = instruction('HEALTHCHECK');
  const command = JSON.parse(check.slice(check.indexOf('CMD ') + 'CMD '.length)) as string[];
  /** Whether the check passes against a container whose MOCKER_PORT is `port` (Docker: exit 0 healthy, 1 unhealthy). */
  const healthy = (port: number) => {
    const run = spawnSync(command[0], command.slice(1), { env: { ...process.env, ...imageEnv, MOCKER_PORT: String(port) }, encoding: 'utf8', timeout: 10_000 });
    expect([0, 1], run.stderr).toContain(run.status);
    return run.status === 0;
  };
  /** A command as the image runs it: the entrypoint, the image ENV, the port from MOCKER_PORT (no --port flag). */
  const start = async (args: string[], env: NodeJS.ProcessEnv = {}) => {
    const [port] = await freePorts(1);
    return mockers.start(args, {
      port,
      launcher: entrypoint,
      env: { ...process.env, ...imageEnv, ...env, MOCKER_PORT: String(port) },
      portFlag: false,
      cwd: dir,
    });
  };

  it('every command listens on the port the image exposes and checks', () => {
    expect(imageEnv.MOCKER_PORT).toBe(instruction('EXPOSE'));
    expect(command.join(' ')).toContain('process.env.MOCKER_PORT');
  });

  it('serve, serve --pd, pd-proxy and capture are healthy while they serve; a capture whose upstream is down is too; a server starting up or gone is not', async () => {
    const serve = await start(['serve'], { MOCKER_MODE: 'random' });
    const engine = `http://127.0.0.1:${serve.port}`;
    const pd = await start(['serve', '--pd', '1P1D'], { MOCKER_MODE: 'random' });
    const proxy = await start(['pd-proxy', '--prefill', engine, '--decode', engine]);
    const capture = await start(['capture', '--upstream', engine, '--captures', join(dir, 'capture.db')]);
    const [closed] = await freePorts(1);
    const orphan = await start(['capture', '--upstream', `http://127.0.0.1:${closed}`, '--captures', join(dir, 'orphan.db')]);
    for (const [what, p] of [
      ['serve', serve],
      ['serve --pd', pd],
      ['pd-proxy', proxy],
      ['capture', capture],
      ['capture, upstream down', orphan],
    ] as const) {
      expect(healthy(p.port), what).toBe(true);
    }
    // The PD proxy answers /health as an engine does (routers in front of vLLM do too): 200, no body.
    const health = await fetch(`http://127.0.0.1:${proxy.port}/health`);
    expect([health.status, await health.text()]).toEqual([200, '']);
    // A capture's /health is its upstream's, forwarded: here, no upstream. Its container still serves.
    expect((await fetch(`http://127.0.0.1:${orphan.port}/health`)).status).not.toBe(200);

    // A simulated engine still loading (--startup-time) takes no requests: unhealthy, as its /health says.
    const loading = await start(['serve', '--startup-time', '600'], { MOCKER_MODE: 'random' });
    expect((await fetch(`http://127.0.0.1:${loading.port}/health`)).status).toBe(503);
    expect(healthy(loading.port)).toBe(false);
    await capture.stop();
    expect(healthy(capture.port)).toBe(false);
  });
});
