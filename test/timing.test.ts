import { mkdtempSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startCapture } from '../src/cli/capture.js';
import { CaptureStore } from '../src/store/captureStore.js';
import { startMockerProcess, type MockerProcess } from './support/mockerProcess.js';
import { arrivals, measureInProcess, roundTrip } from './support/sseTiming.js';
import { encode, MODEL, startUpstream, type Upstream } from './support/vllmUpstream.js';
import { testTmpdir } from './support/tempRoot.js';

const TTFT_MS = 200;
/** Gaps between 20 and 80 ms, varied. */
const gap = (i: number) => 20 + ((i * 37) % 61);
const BODY = { model: MODEL, prompt: 'Tell me a long story', max_tokens: 24, stream: true };

const gaps = (times: number[]) => times.slice(1).map((t, i) => t - times[i]);

describe('captured timing', () => {
  let upstream: Upstream;
  let captured: number[];
  let observed: number[];
  /** When the upstream wrote each event (its timers can fire late: this is what it really sent). */
  let sent: number[];
  let dbPath: string;
  const servers: MockerProcess[] = [];

  beforeAll(async () => {
    dbPath = join(mkdtempSync(join(testTmpdir(), 'mocker-timing-')), 'timing.db');
    upstream = await startUpstream(() => ({ content: 'word '.repeat(40), ttftMs: TTFT_MS, gapMs: gap }));
    const capture = await startCapture({ upstream: upstream.url, captures: dbPath, host: '127.0.0.1', port: 0, upstreamTimeoutMs: 10_000, maxBodyBytes: 1 << 20, redactHeaders: [] });
    await roundTrip(`http://127.0.0.1:${capture.port}`);
    observed = await arrivals(`http://127.0.0.1:${capture.port}`, BODY);
    await capture.close();
    // The captured values: each event's arrival at the proxy, as the capture file recorded it.
    const store = CaptureStore.open(dbPath);
    // Read whole before the store closes (a lookup's exchanges read their bodies on first use).
    const [ex] = store.findByPrompt(MODEL, await encode(BODY.prompt, true)).map((found) => store.getExchange(found.id)!);
    store.close();
    captured = ex.eventTimes.slice(0, 24);
    sent = upstream.received.find((r) => r.path === '/v1/completions')?.sentMs.slice(0, 24) ?? [];
    await upstream.close();
  });

  afterAll(async () => {
    for (const s of servers) await s.stop();
  });

  // The replay server and its measuring client run as their own processes, as deployed: the test runner's own
  // work (and garbage collection) stays out of the measurement.
  const replay = async (speedupRatio: number) => {
    const s = await startMockerProcess(['serve', '--mode', 'replay', '--captures', dbPath, '--speedup-ratio', String(speedupRatio)]);
    servers.push(s);
    const { rttMs, arrivalsMs, gapsMs } = await measureInProcess(`http://127.0.0.1:${s.port}`, BODY);
    return { rtt: rttMs, replayed: arrivalsMs, replayedGaps: gapsMs };
  };

  it('the capture recorded, and passed on, the timing the upstream wrote', () => {
    expect(observed.length).toBe(24);
    expect(observed[0]).toBeGreaterThanOrEqual(TTFT_MS);
    expect(captured[0]).toBeGreaterThanOrEqual(TTFT_MS);
    // The upstream's scripted gaps, give or take its timers (late by up to 3.3 ms in this busy process): the
    // proxy's stamps and its client's arrivals are held to the gaps it really wrote.
    const sentGaps = gaps(sent);
    expect(sentGaps).toHaveLength(23);
    gaps(captured).forEach((g, i) => expect(Math.abs(g - sentGaps[i]), `captured gap ${i}`).toBeLessThanOrEqual(5));
    gaps(observed).forEach((g, i) => expect(Math.abs(g - sentGaps[i]), `forwarded gap ${i}`).toBeLessThanOrEqual(5));
  });

  // The measuring process reports medians over several requests (test/support/sseTiming.ts): on this shared
  // 2-core VM one request's gap can land past 2 ms from the client's own read jitter; never a wider tolerance.
  it('replays TTFT and every gap within 2 ms at speedup 1', async () => {
    const { rtt, replayed, replayedGaps } = await replay(1);
    expect(replayed.length).toBe(captured.length);
    // The captured TTFT was measured at the proxy; this client also pays its own round trip to the server.
    expect(Math.abs(replayed[0] - (captured[0] + rtt))).toBeLessThanOrEqual(2);
    const want = gaps(captured);
    replayedGaps.forEach((g, i) => expect(Math.abs(g - want[i]), `gap ${i}`).toBeLessThanOrEqual(2));
  });

  it('divides TTFT and every gap by --speedup-ratio 10', async () => {
    const { rtt, replayed, replayedGaps } = await replay(10);
    expect(Math.abs(replayed[0] - (captured[0] / 10 + rtt))).toBeLessThanOrEqual(2);
    const want = gaps(captured).map((g) => g / 10);
    replayedGaps.forEach((g, i) => expect(Math.abs(g - want[i]), `gap ${i}`).toBeLessThanOrEqual(2));
  });
});
