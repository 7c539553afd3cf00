/**
 * Replay honours the time of every captured event, for each engine's dialect: `transformers serve`'s role-only
 * chunk that leads the first token, the finish/usage chunk and llama.cpp's `[DONE]` after the last one — not
 * only the events that carry tokens; and the events of the agents' APIs (OpenAI Responses from `transformers serve`
 * and as vLLM renders it, Anthropic Messages) and of vLLM's token-in/token-out generate.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CaptureStore } from '../../src/store/captureStore.js';
import { type EngineName, recordedExchanges, startEngineDouble } from '../support/engineDoubles.js';
import { mockerProcesses, startMockerProcess } from '../support/mockerProcess.js';
import { arrivals, measureInProcess } from '../support/sseTiming.js';
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

/** The request of a case: the engine's recorded one, or the scripted upstreams' own. */
function bodyOf({ engine, path }: Case): Record<string, unknown> {
  if (engine === 'vllm') return path === '/inference/v1/generate' ? GENERATE_BODY : VLLM_BODY;
  if (engine === 'vllm-shaped') return AGENT_BODIES[path as keyof typeof AGENT_BODIES];
  return recordedRequest(engine, path);
}

/** The upstream of a case, answering its request with its recorded (or scripted) timing. */
async function upstreamOf({ engine, leadMs }: Case): Promise<{ url: string; close(): Promise<void> }> {
  if (engine === 'vllm') {
    const upstream = await startUpstream(() => ({
      content: 'one two three four five six seven eight nine ten',
      finish: 'stop',
      ttftMs: 40,
      gapMs: (i) => 5 + ((i * 7) % 13),
    }));
    return { url: upstream.url, close: () => upstream.close() };
  }
  if (engine === 'vllm-shaped') {
    const upstream = await startMockerProcess(['serve', '--mode', 'random', '--forward-time-ms', '7']);
    return { url: upstream.url, close: () => upstream.stop() };
  }
  const double = await startEngineDouble(engine, 0, { firstEventLeadMs: leadMs });
  return { url: double.url, close: () => double.close() };
}

/** The engine's recorded streamed request on `path` (the double answers it with the recorded bytes and read timing). */
function recordedRequest(engine: EngineName, path: string): Record<string, unknown> {
  const found = recordedExchanges(engine).find(
    (e) => e.request.path === path && typeof e.request.body === 'object' && e.request.body?.stream === true && e.response.reads,
  );
  if (!found) throw new Error(`no recorded stream of ${engine} on ${path}`);
  return found.request.body as Record<string, unknown>;
}

/**
 * Captures one exchange of the case through `mocker capture` into `file`; its captured event offsets. The proxy stamps
 * arrivals, so a loaded machine moves them; the replay is held to whatever was captured.
 */
async function captureCase(testCase: Case, file: string, mockers: ReturnType<typeof mockerProcesses>): Promise<number[]> {
  const { path } = testCase;
  const upstream = await upstreamOf(testCase);
  try {
    const capture = await mockers.start(['capture', '--upstream', upstream.url, '--captures', file]);
    // One exchange is all the replay needs (its client's timing is not the capture's: the proxy stamps arrivals).
    await arrivals(capture.url, bodyOf(testCase), {}, undefined, { path, withDone: true });
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
  store.close();
  return exchange.eventTimes;
}

describe('replay of each dialect at its captured timing', () => {
  const dir = mkdtempSync(join(testTmpdir(), 'mocker-dialect-timing-'));
  const replays = mockerProcesses();
  const captured: number[][] = [];
  const fileOf = (index: number) => join(dir, `capture-${index}.db`);
  const replayUrls: string[] = [];

  // The captures are made first, those whose first event is not checked for its lead all at once, then every replay
  // server is started: only the replays' timing is measured (against what was captured, one at a time, the other
  // servers idle); the suite runs this file alone, and case after case it took 46 s here, 37 s so.
  beforeAll(async () => {
    const capturing = CASES.map(() => mockerProcesses());
    const capture = async (i: number) => {
      captured[i] = await captureCase(CASES[i], fileOf(i), capturing[i]);
    };
    try {
      for (const [i, c] of CASES.entries()) if (c.leadMs > 0) await capture(i);
      await Promise.all(CASES.flatMap((c, i) => (c.leadMs > 0 ? [] : [capture(i)])));
    } finally {
      await Promise.all(capturing.map((m) => m.stopAll()));
    }
    const started = await Promise.all(CASES.map((_, i) => replays.start(['serve', '--mode', 'replay', '--captures', fileOf(i)])));
    started.forEach((replay, i) => (replayUrls[i] = replay.url));
  }, 120_000);

  afterAll(async () => {
    await replays.stopAll();
    rmSync(dir, { recursive: true, force: true });
  });

  it.each(CASES.map((c, index) => ({ ...c, index })))(
    '$engine on $path: sends every event — role, tokens, finish, usage, [DONE] — within 2 ms of its captured offset',
    async ({ index, ...testCase }) => {
      const { path, leadMs } = testCase;
      const times = captured[index];
      // The double's schedule is the oracle of what was captured: its first event leads the rest by the lead. The proxy
      // stamps arrivals, so a late first event on a loaded machine shortens the gap; a coalesced one would leave ~0.
      if (leadMs > 0) expect(times[1] - times[0]).toBeGreaterThan(leadMs / 2);
      const { rttMs, arrivalsMs } = await measureInProcess(replayUrls[index], bodyOf(testCase), { path, withDone: true });
      expect(arrivalsMs).toHaveLength(times.length);
      // The captured offsets were taken at the proxy; this client also pays its own round trip to the server.
      arrivalsMs.forEach((at, i) => expect(Math.abs(at - (times[i] + rttMs)), `event ${i} of ${times.length}`).toBeLessThanOrEqual(2));
    },
  );
});
