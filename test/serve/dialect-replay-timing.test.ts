/**
 * Replay honours the time of every captured event, for each engine's dialect: `transformers serve`'s role-only
 * chunk that leads the first token, the finish/usage chunk and llama.cpp's `[DONE]` after the last one — not
 * only the events that carry tokens; and the events of the agents' APIs (OpenAI Responses from `transformers serve`
 * and as vLLM renders it, Anthropic Messages) and of vLLM's token-in/token-out generate.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { CaptureStore } from '../../src/store/captureStore.js';
import { type EngineName, recordedExchanges, startEngineDouble } from '../support/engineDoubles.js';
import { mockerProcesses, startMockerProcess } from '../support/mockerProcess.js';
import { arrivals, measureInProcess, type MeasuredRoute } from '../support/sseTiming.js';
import { testTmpdir } from '../support/tempRoot.js';
import { MODEL, startUpstream } from '../support/vllmUpstream.js';

/** How much later than recorded `transformers serve`'s first token comes after its role chunk (issue 38 measured ~30 ms). */
const ROLE_LEAD_MS = 30;

interface Case {
  /** `vllm-shaped`: a `mocker serve --mode random` engine answering the agents' APIs as vLLM renders them. */
  engine: EngineName | 'vllm' | 'vllm-shaped';
  path: '/v1/chat/completions' | '/v1/completions' | '/v1/responses' | '/v1/messages' | '/inference/v1/generate';
  leadMs: number;
}

const CASES: Case[] = [
  { engine: 'transformers', path: '/v1/chat/completions', leadMs: ROLE_LEAD_MS },
  { engine: 'transformers', path: '/v1/completions', leadMs: 0 },
  // OpenAI Responses: no token ids, no [DONE]; every event at its captured offset all the same.
  { engine: 'transformers', path: '/v1/responses', leadMs: 0 },
  { engine: 'llama.cpp', path: '/v1/chat/completions', leadMs: 0 },
  { engine: 'llama.cpp', path: '/v1/completions', leadMs: 0 },
  { engine: 'vllm', path: '/v1/chat/completions', leadMs: 0 },
  { engine: 'vllm', path: '/inference/v1/generate', leadMs: 0 },
  { engine: 'vllm-shaped', path: '/v1/responses', leadMs: 0 },
  { engine: 'vllm-shaped', path: '/v1/messages', leadMs: 0 },
];

/** vLLM's token-in/token-out request: ten prompt ids, sixteen out, streamed with its usage chunk. */
const GENERATE_BODY = {
  token_ids: Array.from({ length: 10 }, (_, i) => 1000 + i),
  sampling_params: { max_tokens: 16 },
  stream: true,
  stream_options: { include_usage: true },
};

/** The agents' APIs, streamed: the events of a vLLM-rendered answer (a step every 7 ms upstream). */
const AGENT_BODIES = {
  '/v1/responses': { model: MODEL, input: 'Count to ten.', max_output_tokens: 16, stream: true },
  '/v1/messages': { model: MODEL, max_tokens: 16, messages: [{ role: 'user', content: 'Count to ten.' }], stream: true },
};

/** vLLM's double: an EOS stop (its own finish chunk), then the usage chunk and [DONE], with gaps of 5-17 ms. */
const VLLM_BODY = {
  model: MODEL,
  messages: [{ role: 'user', content: 'Count to ten.' }],
  max_tokens: 32,
  stream: true,
  stream_options: { include_usage: true },
};

/** The upstream of a case and the request it answers with its recorded (or scripted) timing. */
async function upstreamOf({ engine, path, leadMs }: Case): Promise<{ url: string; body: Record<string, unknown>; close(): Promise<void> }> {
  if (engine === 'vllm') {
    const upstream = await startUpstream(() => ({
      content: 'one two three four five six seven eight nine ten',
      finish: 'stop',
      ttftMs: 40,
      gapMs: (i) => 5 + ((i * 7) % 13),
    }));
    return { url: upstream.url, body: path === '/inference/v1/generate' ? GENERATE_BODY : VLLM_BODY, close: () => upstream.close() };
  }
  if (engine === 'vllm-shaped') {
    const upstream = await startMockerProcess(['serve', '--mode', 'random', '--forward-time-ms', '7']);
    return { url: upstream.url, body: AGENT_BODIES[path as keyof typeof AGENT_BODIES], close: () => upstream.stop() };
  }
  const double = await startEngineDouble(engine, 0, { firstEventLeadMs: leadMs });
  return { url: double.url, body: recordedRequest(engine, path), close: () => double.close() };
}

/** The engine's recorded streamed request on `path` (the double answers it with the recorded bytes and read timing). */
function recordedRequest(engine: EngineName, path: string): Record<string, unknown> {
  const found = recordedExchanges(engine).find(
    (e) => e.request.path === path && typeof e.request.body === 'object' && e.request.body?.stream === true && e.response.reads,
  );
  if (!found) throw new Error(`no recorded stream of ${engine} on ${path}`);
  return found.request.body as Record<string, unknown>;
}

describe.each(CASES)('replay of $engine on $path', (testCase) => {
  const { path, leadMs } = testCase;
  const mockers = mockerProcesses();
  const dir = mkdtempSync(join(testTmpdir(), 'mocker-dialect-timing-'));
  afterAll(async () => {
    await mockers.stopAll();
    rmSync(dir, { recursive: true, force: true });
  });

  it('sends every event — role, tokens, finish, usage, [DONE] — within 2 ms of its captured offset', async () => {
    const file = join(dir, 'capture.db');
    const route: MeasuredRoute = { path, withDone: true };
    const upstream = await upstreamOf(testCase);
    const { body } = upstream;
    try {
      const capture = await mockers.start(['capture', '--upstream', upstream.url, '--captures', file]);
      // One exchange is all the replay needs (its client's timing is not the capture's: the proxy stamps arrivals).
      await arrivals(capture.url, body, {}, undefined, route);
      await mockers.stopAll();
    } finally {
      await upstream.close();
    }
    const store = CaptureStore.open(file, { readonly: true });
    // The one captured exchange of the request.
    const exchange = store
      .exchangeIds()
      .map((id) => store.getExchange(id)!)
      .find((ex) => ex.path === path)!;
    const captured = exchange.eventTimes;
    store.close();
    // The double's schedule is the oracle of what was captured: its first event leads the rest by the lead. The proxy
    // stamps arrivals, so a late first event on a loaded machine shortens the gap; a coalesced one would leave ~0.
    if (leadMs > 0) expect(captured[1] - captured[0]).toBeGreaterThan(leadMs / 2);

    const replay = await mockers.start(['serve', '--mode', 'replay', '--captures', file]);
    const { rttMs, arrivalsMs } = await measureInProcess(replay.url, body, route);
    expect(arrivalsMs).toHaveLength(captured.length);
    // The captured offsets were taken at the proxy; this client also pays its own round trip to the server.
    arrivalsMs.forEach((at, i) => expect(Math.abs(at - (captured[i] + rttMs)), `event ${i} of ${captured.length}`).toBeLessThanOrEqual(2));
  });
});
