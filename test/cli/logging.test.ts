/**
 * `serve`'s logs as a user reads them from the spawned CLI: `--log-level` (debug shows every scheduler step and, as
 * AIPerf's mock server, the access log; warning shows only the start line and warnings), `--access-logs` (one line
 * per request in uvicorn's access format, as vLLM prints it, with duration and request id), `--log-format json`,
 * the `MOCKER_*` variable of a new flag, and Dynamo's `--stagger-delay` (worker w answers w delays after the first).
 */
import { mkdtempSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import { afterEach, describe, expect, it } from 'vitest';
import { mockerProcesses, type MockerProcess } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';

/** uvicorn's access line (its `levelprefix`, client, request line, status and phrase), then duration and request id. */
const ACCESS = /^INFO: {5}127\.0\.0\.1:\d+ - "(\w+) (\S+) HTTP\/1\.1" (\d{3}) ([A-Za-z ]+) ([\d.]+) ms request_id=(\S+)$/;

const accessLines = (stdout: string) =>
  stdout
    .split('\n')
    .map((line) => ACCESS.exec(line))
    .filter((m): m is RegExpExecArray => m !== null);

/** Lines printed so far settle once the answer has ended: the access line is written when the response closes. */
const settle = () => new Promise((resolve) => setTimeout(resolve, 300));

describe('serve logs', () => {
  const mockers = mockerProcesses();
  const cwd = mkdtempSync(join(testTmpdir(), 'logs-'));
  afterEach(mockers.stopAll);

  async function chat(mocker: MockerProcess, requestId?: string) {
    const client = new OpenAI({ baseURL: `${mocker.url}/v1`, apiKey: 'none', maxRetries: 0 });
    const { data, response } = await client.chat.completions
      .create(
        { model: 'Qwen/Qwen3-0.6B', messages: [{ role: 'user', content: 'Hello!' }], max_tokens: 3 },
        { headers: requestId ? { 'x-request-id': requestId } : {} },
      )
      .withResponse();
    return { answer: data, requestId: response.headers.get('x-request-id') };
  }

  it('--access-logs: one line per request, in uvicorn format, with its status, duration and request id', async () => {
    const mocker = await mockers.start(['serve', '--fast', '--access-logs'], { cwd });
    const mine = await chat(mocker, 'my-request-7');
    const theirs = await chat(mocker);
    await fetch(`${mocker.url}/v1/models`);
    await fetch(`${mocker.url}/no/such/path`);
    await settle();
    const lines = accessLines(mocker.stdout());
    expect(lines.map((m) => [m[1], m[2], m[3], m[4]])).toEqual([
      ['POST', '/v1/chat/completions', '200', 'OK'],
      ['POST', '/v1/chat/completions', '200', 'OK'],
      ['GET', '/v1/models', '200', 'OK'],
      ['GET', '/no/such/path', '404', 'Not Found'],
    ]);
    // The client's id is kept; without one, the id logged is the one the answer carries.
    expect(lines[0][6]).toBe('my-request-7');
    expect(lines[1][6]).toBe(theirs.requestId);
    expect(mine.requestId).toBe('my-request-7');
    for (const m of lines) expect(Number(m[5])).toBeGreaterThanOrEqual(0);
    // info is the default level: no scheduler steps.
    expect(mocker.stdout()).not.toContain('scheduler step');
  });

  it('--log-level debug shows each scheduler step and the access log; MOCKER_LOG_LEVEL sets it too', async () => {
    for (const setting of [
      { args: ['--log-level', 'debug'], env: {} },
      { args: [], env: { MOCKER_LOG_LEVEL: 'DEBUG' } },
    ]) {
      const mocker = await mockers.start(['serve', '--fast', ...setting.args], { cwd, env: { ...process.env, ...setting.env } });
      const { answer } = await chat(mocker);
      await settle();
      const steps = mocker
        .stdout()
        .split('\n')
        .filter((line) => / scheduler step: \d+ running, \d+ waiting/.test(line));
      // A 3-token answer takes at least three steps (prefill with the first token, then two decodes).
      expect(steps.length).toBeGreaterThanOrEqual(answer.usage!.completion_tokens);
      expect(accessLines(mocker.stdout())).toHaveLength(1);
      await mocker.stop();
    }
  });

  it('--log-level warning prints only the start line on stdout, and warnings on stderr', async () => {
    // A decode engine without KV peers is warned about; "no capture file" is an info line.
    const mocker = await mockers.start(['serve', '--fast', '--log-level', 'warning', '--disaggregation-mode', 'decode'], { cwd });
    await chat(mocker);
    await mocker.stop();
    const stdout = mocker.stdout().trim().split('\n');
    expect(stdout).toHaveLength(1);
    expect(stdout[0]).toMatch(/^mocker serve: .* on http:\/\/127\.0\.0\.1:\d+$/);
    expect(mocker.stderr()).toContain('a decode engine without --kv-transfer-allowed-hosts pulls no KV');
    expect(mocker.stderr()).not.toContain('no capture file');
  });

  it('--log-format json: every line a JSON object with time, level and message; access lines with their fields', async () => {
    const mocker = await mockers.start(['serve', '--fast', '--access-logs', '--log-format', 'json'], { cwd });
    const { requestId } = await chat(mocker);
    await settle();
    const records = mocker
      .stdout()
      .trim()
      .split('\n')
      .map((line) => JSON.parse(line) as Record<string, unknown>);
    for (const r of records) {
      expect(Number.isNaN(Date.parse(r.time as string))).toBe(false);
      expect(['debug', 'info', 'start']).toContain(r.level);
      expect(r.msg).toEqual(expect.any(String));
    }
    expect(records.find((r) => r.level === 'start')!.msg).toMatch(/ on http:\/\/127\.0\.0\.1:\d+$/);
    const access = records.filter((r) => r.method !== undefined);
    expect(access).toEqual([
      expect.objectContaining({
        level: 'info',
        method: 'POST',
        path: '/v1/chat/completions',
        status: 200,
        request_id: requestId,
        duration_ms: expect.any(Number),
      }),
    ]);
  });

  it("--stagger-delay: each worker answers its delay after the one before (Dynamo's launch stagger)", async () => {
    const mocker = await mockers.start(['serve', '--fast', '--num-workers', '3', '--stagger-delay', '2'], { cwd });
    const ports = [...mocker.stdout().matchAll(/http:\/\/127\.0\.0\.1:(\d+)/g)].map((m) => Number(m[1]));
    expect(ports).toHaveLength(3);
    expect((await fetch(`http://127.0.0.1:${ports[0]}/health`)).status).toBe(200);
    // Worker 2 starts 4 s after the first: right after start-up it is still starting, and says until when.
    const early = await fetch(`http://127.0.0.1:${ports[2]}/health`);
    expect(early.status).toBe(503);
    expect(Number(early.headers.get('retry-after'))).toBeGreaterThanOrEqual(2);
    expect((await early.json()) as { error: { message: string } }).toMatchObject({ error: { message: expect.stringContaining('--stagger-delay') } });
    let status = 503;
    for (let tries = 0; status === 503 && tries < 100; tries++) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      status = (await fetch(`http://127.0.0.1:${ports[2]}/health`)).status;
    }
    expect(status).toBe(200);
  });
});
