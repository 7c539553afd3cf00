import { mkdtempSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startCapture } from '../src/cli/capture.js';
import { CaptureStore } from '../src/store/captureStore.js';
import { startMockerProcess, type MockerProcess } from './support/mockerProcess.js';
import { encode, MODEL, startUpstream, type Upstream } from './support/vllmUpstream.js';

const TTFT_MS = 200;
/** Gaps between 20 and 80 ms, varied. */
const gap = (i: number) => 20 + ((i * 37) % 61);
const BODY = { model: MODEL, prompt: 'Tell me a long story', max_tokens: 24, stream: true };

// A plain keep-alive node:http client: fetch adds milliseconds of its own per request on a small machine.
const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });

function post(url: string): Promise<http.IncomingMessage> {
  return new Promise((resolve, reject) => {
    const req = http.request(`${url}/v1/completions`, { method: 'POST', agent, headers: { 'content-type': 'application/json' } }, resolve);
    req.on('error', reject);
    req.end(JSON.stringify(BODY));
  });
}

/** Client-side arrival time of each SSE event carrying text, in ms after sending the request. */
async function arrivals(url: string): Promise<number[]> {
  const t0 = performance.now();
  const res = await post(url);
  const times: number[] = [];
  let buffer = '';
  for await (const chunk of res as AsyncIterable<Buffer>) {
    const now = performance.now() - t0;
    buffer += chunk.toString('utf8');
    let at: number;
    while ((at = buffer.indexOf('\n\n')) >= 0) {
      const event = buffer.slice(0, at);
      buffer = buffer.slice(at + 2);
      if (event !== 'data: [DONE]') times.push(now);
    }
  }
  return times;
}

/** The client's own cost of one exchange with a server: the median warm round trip of `GET /health`. */
async function roundTrip(url: string): Promise<number> {
  const samples: number[] = [];
  for (let i = 0; i < 9; i++) {
    const t0 = performance.now();
    await new Promise<void>((resolve, reject) => {
      http.get(`${url}/health`, { agent }, (res) => res.resume().on('end', resolve)).on('error', reject);
    });
    samples.push(performance.now() - t0);
  }
  return samples.sort((a, b) => a - b)[4];
}

const gaps = (times: number[]) => times.slice(1).map((t, i) => t - times[i]);

describe('captured timing', () => {
  let upstream: Upstream;
  let captured: number[];
  let observed: number[];
  let dbPath: string;
  const servers: MockerProcess[] = [];

  beforeAll(async () => {
    dbPath = join(mkdtempSync(join(tmpdir(), 'mocker-timing-')), 'timing.db');
    upstream = await startUpstream(() => ({ content: 'word '.repeat(40), ttftMs: TTFT_MS, gapMs: gap }));
    const capture = await startCapture({ upstream: upstream.url, captures: dbPath, host: '127.0.0.1', port: 0, upstreamTimeoutMs: 10_000, maxBodyBytes: 1 << 20, redactHeaders: [] });
    await roundTrip(`http://127.0.0.1:${capture.port}`);
    observed = await arrivals(`http://127.0.0.1:${capture.port}`);
    await capture.close();
    // The captured values: each event's arrival at the proxy, as the capture file recorded it.
    const store = CaptureStore.open(dbPath);
    const [ex] = store.findByPrompt(MODEL, await encode(BODY.prompt, true));
    store.close();
    captured = ex.eventTimes.slice(0, 24);
    await upstream.close();
  });

  afterAll(async () => {
    agent.destroy();
    for (const s of servers) await s.stop();
  });

  // The replay server runs as its own process, as deployed: the test process's own work (and GC) stays out of it.
  const serve = async (speedupRatio: number) => {
    const s = await startMockerProcess(['serve', '--mode', 'replay', '--captures', dbPath, '--speedup-ratio', String(speedupRatio)]);
    servers.push(s);
    const url = `http://127.0.0.1:${s.port}`;
    // Measured warm, over an open keep-alive connection: one untimed replay first.
    await arrivals(url);
    return { url, rtt: await roundTrip(url) };
  };

  it('the capture saw the scripted timing', () => {
    expect(observed.length).toBe(24);
    expect(observed[0]).toBeGreaterThanOrEqual(TTFT_MS);
    expect(captured[0]).toBeGreaterThanOrEqual(TTFT_MS);
    gaps(observed).forEach((g, i) => expect(Math.abs(g - gap(i + 1))).toBeLessThanOrEqual(5));
  });

  it('replays TTFT and every gap within 2 ms at speedup 1', async () => {
    const { url, rtt } = await serve(1);
    const replayed = await arrivals(url);
    expect(replayed.length).toBe(captured.length);
    // The captured TTFT was measured at the proxy; this client also pays its own round trip to the server.
    expect(Math.abs(replayed[0] - (captured[0] + rtt))).toBeLessThanOrEqual(2);
    const want = gaps(captured);
    gaps(replayed).forEach((g, i) => expect(Math.abs(g - want[i]), `gap ${i}`).toBeLessThanOrEqual(2));
  });

  it('divides TTFT and every gap by --speedup-ratio 10', async () => {
    const { url, rtt } = await serve(10);
    const replayed = await arrivals(url);
    expect(Math.abs(replayed[0] - (captured[0] / 10 + rtt))).toBeLessThanOrEqual(2);
    const want = gaps(captured).map((g) => g / 10);
    gaps(replayed).forEach((g, i) => expect(Math.abs(g - want[i]), `gap ${i}`).toBeLessThanOrEqual(2));
  });
});
