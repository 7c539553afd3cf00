/**
 * Capture → replay of the agents' APIs (issue 39 item 2): `mocker capture` in front of an engine answering
 * `/v1/responses` and `/v1/messages` in vLLM's shapes (a `mocker serve --mode random` upstream, whose renderings are
 * built from vLLM's entrypoints), then `mocker serve --mode replay` on the capture file. The capture works out each
 * exchange's prompt ids as vLLM's chat of the request (the upstream's /tokenize of the translated messages), so
 * the replay finds it by the same request and answers with the bytes the client got through the capture — ids,
 * text, tool calls, every event — streamed or not.
 */
import { mkdtempSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CaptureStore } from '../../src/store/captureStore.js';
import { recordedExchanges, startEngineDouble } from '../support/engineDoubles.js';
import { mockerProcesses, runMockerToExit } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';
import { MODEL } from '../support/vllmUpstream.js';

const TOOLS = [
  { type: 'function', name: 'get_weather', description: 'The weather in a city', parameters: { type: 'object', properties: { city: { type: 'string' } } } },
];

/** The requests of an agent's session: plain, streamed, with a tool call, with reasoning; each its own prompt. */
const REQUESTS: { path: string; body: Record<string, unknown> }[] = [
  { path: '/v1/responses', body: { model: MODEL, input: 'Plain answer, please.', max_output_tokens: 12 } },
  { path: '/v1/responses', body: { model: MODEL, input: 'Stream it.', max_output_tokens: 12, stream: true } },
  {
    path: '/v1/responses',
    body: { model: MODEL, instructions: 'Use tools.', input: 'Weather in Oslo?', tools: TOOLS, tool_choice: 'required', max_output_tokens: 40, stream: true },
  },
  { path: '/v1/messages', body: { model: MODEL, max_tokens: 12, messages: [{ role: 'user', content: 'Plain answer, please.' }] } },
  { path: '/v1/messages', body: { model: MODEL, max_tokens: 12, system: 'Be brief.', messages: [{ role: 'user', content: 'Stream it.' }], stream: true } },
  {
    path: '/v1/messages',
    body: {
      model: MODEL,
      max_tokens: 40,
      messages: [{ role: 'user', content: 'Weather in Oslo?' }],
      tools: [{ name: 'get_weather', description: 'The weather in a city', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }],
      tool_choice: { type: 'any' },
    },
  },
];

async function send(url: string, { path, body }: (typeof REQUESTS)[number]): Promise<{ status: number; type: string | null; text: string }> {
  const res = await fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: res.status, type: res.headers.get('content-type'), text: await res.text() };
}

describe('capture → replay of /v1/responses and /v1/messages', () => {
  const dir = mkdtempSync(join(testTmpdir(), 'mocker-agent-replay-'));
  const db = join(dir, 'agents.db');
  const mockers = mockerProcesses();
  const captured: Awaited<ReturnType<typeof send>>[] = [];
  afterAll(mockers.stopAll);

  beforeAll(async () => {
    const engine = await mockers.start(['serve', '--mode', 'random', '--reasoning', '{"thinking_ratio":0.25}']);
    const capture = await mockers.start(['capture', '--upstream', engine.url, '--captures', db]);
    for (const request of REQUESTS) captured.push(await send(capture.url, request));
    await mockers.stopAll();
  }, 60_000);

  it('records each with its prompt ids (the translated chat, tokenized by the engine) and its output ids', () => {
    expect(captured.map((c) => c.status)).toEqual(REQUESTS.map(() => 200));
    const store = CaptureStore.open(db, { readonly: true });
    try {
      const exchanges = store.exchangeIds().map((id) => store.getExchange(id)!);
      expect(exchanges.map((ex) => ex.endpoint)).toEqual(REQUESTS.map((r) => r.path.slice('/v1/'.length)));
      for (const ex of exchanges) {
        expect(ex.promptIds?.length, ex.path).toBeGreaterThan(0);
        expect(ex.tokenSource).toBe('tokenize-endpoint');
        expect(ex.generations[0].outputIds.length).toBeGreaterThan(0);
      }
    } finally {
      store.close();
    }
  });

  it('trace --from-captures runs them as turns of their prompts: input tokens as the engine counted them', async () => {
    const out = join(dir, 'trace.json');
    const run = await runMockerToExit(['trace', '--from-captures', db, '--report-json', out, '--no-progress']);
    expect(run.code, run.stderr).toBe(0);
    const report = JSON.parse(readFileSync(out, 'utf8')) as Record<string, number>;
    expect(report.completed_requests).toBe(REQUESTS.length);
    // The engine's usage in each captured answer (its last input_tokens: a stream's final usage).
    const counted = captured.map((c) => Number([...c.text.matchAll(/"input_tokens":(\d+)/g)].at(-1)![1]));
    expect(report.total_input_tokens).toBe(counted.reduce((a, b) => a + b, 0));
  });

  it('serve --mode replay answers every request with the bytes the client got through the capture', async () => {
    const replay = await mockers.start(['serve', '--mode', 'replay', '--captures', db]);
    // A whole answer gets a new id, as every vLLM answer does (resp_… or chatcmpl-…); a stream's events are as captured.
    const ID = /^\{"id":"(resp_|chatcmpl-)[0-9a-f]{32}"/;
    const withoutId = (text: string) => text.replace(ID, '{"id":"…"');
    for (const [i, request] of REQUESTS.entries()) {
      const answer = await send(replay.url, request);
      expect(answer.status, request.path).toBe(200);
      expect(answer.type).toBe(captured[i].type);
      if (request.body.stream) expect(answer.text, request.path).toBe(captured[i].text);
      else {
        expect(answer.text).toMatch(ID);
        expect(answer.text.slice(0, 60)).not.toBe(captured[i].text.slice(0, 60));
        expect(withoutId(answer.text), request.path).toBe(withoutId(captured[i].text));
      }
    }
    // rerun of the capture against its own replay: every exchange the same.
    const rerun = await runMockerToExit(['rerun', db, '--target', replay.url, '-o', join(dir, 'rerun.db'), '--json']);
    expect(rerun.code, rerun.stdout + rerun.stderr).toBe(0);
    const report = JSON.parse(rerun.stdout) as { exchanges: { endpoint: string; verdict: string }[] };
    expect(report.exchanges.map((e) => e.endpoint)).toEqual(REQUESTS.map((r) => r.path.slice('/v1/'.length)));
    expect(report.exchanges.map((e) => e.verdict)).toEqual(REQUESTS.map(() => 'same'));
    // Against another build (random tokens of another seed) every output differs: sampled requests (no seed, not
    // greedy), so reported as such without failing the run, as rerun does for chat.
    const other = await mockers.start(['serve', '--mode', 'random', '--seed', '7', '--reasoning', '{"thinking_ratio":0.25}']);
    const changed = await runMockerToExit(['rerun', db, '--target', other.url, '-o', join(dir, 'rerun-other.db'), '--json']);
    expect(changed.code, changed.stderr).toBe(0);
    const verdicts = (JSON.parse(changed.stdout) as { exchanges: { verdict: string }[] }).exchanges.map((e) => e.verdict);
    expect(verdicts).toEqual(REQUESTS.map(() => 'sampled'));
    // A request never captured is vLLM's 404 in replay mode, not an answer from elsewhere.
    const miss = await send(replay.url, { path: '/v1/responses', body: { model: MODEL, input: 'Never asked.' } });
    expect(miss.status).toBe(404);
  });
});

describe('capture → replay of /v1/responses in front of `transformers serve` (its recorded bytes: no event: lines, a stream even when none is asked)', () => {
  const dir = mkdtempSync(join(testTmpdir(), 'mocker-agent-replay-transformers-'));
  const db = join(dir, 'transformers.db');
  const mockers = mockerProcesses();
  afterAll(mockers.stopAll);
  /** The recorded requests transformers answered (not those it refused, in its status or in its stream: replay checks a request as vLLM does first). */
  const requests = recordedExchanges('transformers')
    .filter((e) => e.request.path === '/v1/responses' && e.response.status === 200 && !JSON.stringify(e.response.body).includes('response.failed'))
    .map((e) => ({ path: '/v1/responses', body: e.request.body as Record<string, unknown> }));

  it('serve --mode replay answers each with the bytes the client got through the capture', async () => {
    expect(requests.length).toBeGreaterThanOrEqual(5);
    const engine = await startEngineDouble('transformers');
    const captured: Awaited<ReturnType<typeof send>>[] = [];
    try {
      const capture = await mockers.start(['capture', '--upstream', engine.url, '--captures', db]);
      for (const request of requests) captured.push(await send(capture.url, request));
      await mockers.stopAll();
    } finally {
      await engine.close();
    }
    const replay = await mockers.start(['serve', '--mode', 'replay', '--captures', db]);
    for (const [i, request] of requests.entries()) {
      const answer = await send(replay.url, request);
      expect(answer.status, JSON.stringify(request.body)).toBe(200);
      expect(answer.text, JSON.stringify(request.body)).toBe(captured[i].text);
    }
  });
});
