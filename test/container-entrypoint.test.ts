/**
 * The container image's main process, run as the image runs it but without a container tool (none can run
 * containers on this machine: README, "Container image"): the Dockerfile's ENTRYPOINT script with its CMD and
 * its ENV. SIGTERM while a stream is in flight drains it and exits 0, so `docker stop` / a pod's termination
 * reaches mocker's drain and not a shell.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { startMockerProcess, type MockerProcess } from './support/mockerProcess.js';

const ROOT = join(import.meta.dirname, '..');
const dockerfile = readFileSync(join(ROOT, 'Dockerfile'), 'utf8').replace(/\\\n\s*/g, ' ');
/** The last stage's instruction (the run stage's), its argument text. */
const instruction = (name: string) => [...dockerfile.matchAll(new RegExp(`^${name} (.*)$`, 'gm'))].map((m) => m[1]).pop()!;
/** The image lays the repository out under /app (WORKDIR). */
const onHost = (path: string) => path.replace(/^\/app\//, `${ROOT}/`);

const processes: MockerProcess[] = [];
afterAll(() => {
  for (const p of processes) if (p.child.exitCode === null && p.child.signalCode === null) p.child.kill('SIGKILL');
});

describe('the image entrypoint', () => {
  it('ENTRYPOINT + CMD with the image ENV: serves; SIGTERM drains a stream in flight and exits 0', async () => {
    const entrypoint = (JSON.parse(instruction('ENTRYPOINT')) as string[]).map(onHost);
    const cmd = JSON.parse(instruction('CMD')) as string[];
    expect(cmd).toEqual(['serve']);
    const imageEnv = Object.fromEntries([...instruction('ENV').matchAll(/(\w+)=(\S+)/g)].map((m) => [m[1], m[2]]));
    expect(imageEnv.MOCKER_CAPTURES).toBe('/captures/mocker.db');
    // The flags a deployment would set by environment: 20 tokens, 100 ms apart.
    const env = { ...process.env, ...imageEnv, MOCKER_MODE: 'random', MOCKER_TIMING: 'fixed', MOCKER_FORWARD_TIME_MS: '100' };
    const serve = await startMockerProcess(cmd, 0, { launcher: entrypoint, env });
    processes.push(serve);
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
    const serve = await startMockerProcess(['--mode', 'random'], 0, { launcher: entrypoint });
    processes.push(serve);
    expect(serve.stdout()).toContain('mocker serve: random mode');
    await serve.stop();
    expect(await serve.exited).toEqual({ code: 0, signal: null });
  });
});
