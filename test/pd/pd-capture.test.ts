/**
 * PD-split capture → replay (issue #4 item 6): two vLLM-like upstreams, a prefill one and a decode one speaking
 * vllm-wire-reference.md §7, behind `mocker pd-proxy`, each hop through its own `mocker capture` into one capture
 * file; then a mocker prefill + decode pair (and an aggregated mocker) replays them. The replay servers and the
 * measuring client run as their own processes, as in test/capture/timing.test.ts.
 */
import { mkdtempSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CaptureStore } from '../../src/store/captureStore.js';
import { captureInProcess, pdProxyInProcess, type RunningProxy } from '../support/inProcess.js';
import { mockerProcesses } from '../support/mockerProcess.js';
import { gapsOf, measureInProcess, measurePdHopsInProcess, variedGapMs } from '../support/sseTiming.js';
import { encode, MODEL, startUpstream, type Upstream } from '../support/vllmUpstream.js';
import { testTmpdir } from '../support/tempRoot.js';

const PREFILL_MS = 150;
const DECODE_TTFT_MS = 60;
const BODY = { model: MODEL, prompt: 'Tell me a long story about disaggregated serving', max_tokens: 24, stream: true };
const UPSTREAM_PREFILL_PARAMS = {
  do_remote_prefill: true,
  do_remote_decode: false,
  remote_block_ids: [7, 8],
  remote_engine_id: 'upstream-prefill-engine',
  remote_request_id: 'upstream-request',
  remote_host: '10.0.0.1',
  remote_port: 5600,
  tp_size: 1,
};

async function streamedText(baseUrl: string): Promise<string> {
  const client = new OpenAI({ baseURL: `${baseUrl}/v1`, apiKey: 'unused', maxRetries: 0 });
  let text = '';
  for await (const chunk of await client.completions.create({ ...BODY, stream: true })) text += chunk.choices[0]?.text ?? '';
  return text;
}

describe('PD-split capture, then replay', () => {
  let dbPath: string;
  let capturedText: string;
  /** The prefill hop's captured duration, and the decode hop's captured event times (at the capture proxies). */
  let prefillHop: number;
  let decodeHop: number[];
  let decodeSawParams: unknown;
  /** When the decode upstream wrote each of its events (its timers can fire late: this is what it really sent). */
  let decodeSentMs: number[];
  const mockers = mockerProcesses();
  const proxies: RunningProxy[] = [];

  beforeAll(async () => {
    dbPath = join(mkdtempSync(join(testTmpdir(), 'mocker-pd-')), 'pd.db');
    const prefill: Upstream = await startUpstream((body) => {
      const transfer = body.kv_transfer_params as Record<string, unknown> | undefined;
      return transfer?.do_remote_decode ? { content: 'word '.repeat(40), ttftMs: PREFILL_MS, kvTransferParams: UPSTREAM_PREFILL_PARAMS } : { errorStatus: 400 };
    });
    const decode: Upstream = await startUpstream(() => ({ content: 'story '.repeat(40), ttftMs: DECODE_TTFT_MS, gapMs: variedGapMs }));
    const capture = (upstream: Upstream) =>
      captureInProcess({
        upstream: upstream.url,
        captures: dbPath,
      });
    const captureP = await capture(prefill);
    const captureD = await capture(decode);
    const proxy = await pdProxyInProcess({ prefill: [captureP.url], decode: [captureD.url] });
    capturedText = await streamedText(`http://127.0.0.1:${proxy.port}`);
    const decodeRequest = decode.received.find((r) => r.path === '/v1/completions');
    decodeSawParams = decodeRequest?.body?.kv_transfer_params;
    decodeSentMs = decodeRequest?.sentMs.slice(0, BODY.max_tokens) ?? [];
    await proxy.close();
    await captureP.close();
    await captureD.close();
    await prefill.close();
    await decode.close();

    const store = CaptureStore.open(dbPath);
    // Read whole before the store closes (a lookup's exchanges read their bodies on first use).
    const hops = store.findByPrompt(MODEL, await encode(BODY.prompt, true)).map((found) => store.getExchange(found.id)!);
    store.close();
    const hopOf = (ex: (typeof hops)[number]) =>
      (JSON.parse(ex.requestBody.toString('utf8')) as { kv_transfer_params?: Record<string, unknown> }).kv_transfer_params;
    const p = hops.find((ex) => hopOf(ex)?.do_remote_decode === true)!;
    const d = hops.find((ex) => hopOf(ex)?.do_remote_prefill === true)!;
    prefillHop = p.generations[0].tokenTimes[0];
    decodeHop = d.eventTimes.slice(0, BODY.max_tokens);
    expect(p.requestId).toBe(d.requestId);
  });

  afterAll(async () => {
    for (const p of proxies) await p.close();
    await mockers.stopAll();
  });

  const mocker = async (...args: string[]) => (await mockers.start(['serve', '--mode', 'replay', '--captures', dbPath, ...args])).url;

  it('captured both hops, linked by X-Request-Id, with the timing the upstream wrote', () => {
    // 24 of the decode upstream's tokens (its answer, not the prefill's: that one token is thrown away).
    expect(capturedText.trim().split(/\s+/)).toEqual(new Array(24).fill('story'));
    // The decode upstream got the prefill upstream's kv_transfer_params through the capture proxies.
    expect(decodeSawParams).toEqual(UPSTREAM_PREFILL_PARAMS);
    expect(prefillHop).toBeGreaterThanOrEqual(PREFILL_MS);
    expect(decodeHop[0]).toBeGreaterThanOrEqual(DECODE_TTFT_MS);
    // Every gap as the upstream wrote it: its scripted gaps, give or take its timers, late by up to 3.3 ms in this
    // busy process. The proxy's stamps are within 0.5 ms of those writes but for a pause of the shared process.
    const sentGaps = gapsOf(decodeSentMs);
    expect(sentGaps).toHaveLength(BODY.max_tokens - 1);
    gapsOf(decodeHop).forEach((g, i) => expect(Math.abs(g - sentGaps[i]), `gap ${i}`).toBeLessThanOrEqual(5));
  });

  it('a mocker prefill + decode pair behind pd-proxy replays the same content; each hop within 2 ms of its capture', async () => {
    const prefill = await mocker('--disaggregation-mode', 'prefill');
    const decode = await mocker('--disaggregation-mode', 'decode', '--kv-transfer-allowed-hosts', new URL(prefill).host);
    const proxy = await pdProxyInProcess({ prefill: [prefill], decode: [decode] });
    proxies.push(proxy);
    expect(await streamedText(`http://127.0.0.1:${proxy.port}`)).toBe(capturedText);

    const m = await measurePdHopsInProcess(prefill, decode, BODY);
    // Each captured time was measured at a capture proxy; this client also pays its own round trip.
    const prefillSeen = `prefill hop ${m.prefillMs.toFixed(2)} ms: captured ${prefillHop.toFixed(2)}, round trip ${m.prefillRttMs.toFixed(2)}`;
    expect(Math.abs(m.prefillMs - (prefillHop + m.prefillRttMs)), prefillSeen).toBeLessThanOrEqual(2);
    expect(m.decodeArrivalsMs).toHaveLength(decodeHop.length);
    const decodeSeen = `decode hop's first token at ${m.decodeArrivalsMs[0].toFixed(2)} ms: captured ${decodeHop[0].toFixed(2)}, round trip ${m.decodeRttMs.toFixed(2)}`;
    expect(Math.abs(m.decodeArrivalsMs[0] - (decodeHop[0] + m.decodeRttMs)), decodeSeen).toBeLessThanOrEqual(2);
    const want = gapsOf(decodeHop);
    m.decodeGapsMs.forEach((g, i) => expect(Math.abs(g - want[i]), `gap ${i}`).toBeLessThanOrEqual(2));
  });

  it('an aggregated mocker replays the PD capture: the prefill hop, then the decode hop', async () => {
    const agg = await mocker();
    expect(await streamedText(agg)).toBe(capturedText);
    const { rttMs, arrivalsMs, gapsMs } = await measureInProcess(agg, BODY);
    expect(arrivalsMs).toHaveLength(decodeHop.length);
    expect(Math.abs(arrivalsMs[0] - (prefillHop + decodeHop[0] + rttMs))).toBeLessThanOrEqual(2);
    const want = gapsOf(decodeHop);
    gapsMs.forEach((g, i) => expect(Math.abs(g - want[i]), `gap ${i}`).toBeLessThanOrEqual(2));
  });
});
