/**
 * A client that leaves in the middle of its upload is ordinary traffic: the spawned servers stay up, answer the
 * next request, and print nothing about it on stderr.
 */
import net from 'node:net';
import { join } from 'node:path';
import { mkdtempSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startMockerProcess, type MockerProcess } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';
import { MODEL, startUpstream, type Upstream } from '../support/vllmUpstream.js';

/** Sends the head and part of a body announced longer, then resets the connection. */
function leaveMidUpload(port: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, '127.0.0.1', () => {
      socket.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"prompt": "Once upon');
      setTimeout(() => {
        socket.resetAndDestroy();
        resolve();
      }, 100);
    });
    socket.on('error', reject);
  });
}

describe('a client leaving mid-upload', () => {
  let upstream: Upstream;
  const processes: MockerProcess[] = [];
  beforeAll(async () => {
    upstream = await startUpstream(() => ({ content: 'Hello there' }));
  });
  afterAll(async () => {
    await Promise.all(processes.map((p) => p.stop()));
    await upstream.close();
  });

  it.each([
    ['serve', () => ['serve', '--captures', join(mkdtempSync(join(testTmpdir(), 'mocker-abort-')), 'c.db')]],
    ['capture', () => ['capture', '--upstream', upstream.url, '--captures', join(mkdtempSync(join(testTmpdir(), 'mocker-abort-')), 'c.db')]],
    ['pd-proxy', () => ['pd-proxy', '--prefill', upstream.url, '--decode', upstream.url]],
  ])('%s prints nothing and serves the next request', async (_, args) => {
    const mocker = await startMockerProcess(args());
    processes.push(mocker);
    for (let i = 0; i < 3; i++) await leaveMidUpload(mocker.port);
    const res = await fetch(`http://127.0.0.1:${mocker.port}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, prompt: 'Once upon a time', max_tokens: 4 }),
    });
    expect(res.status).toBe(200);
    await res.text();
    expect(mocker.stderr()).toBe('');
  });
});
