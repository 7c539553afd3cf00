/**
 * `mocker capture` in front of SGLang (the double of test/support/sglangUpstream.ts, built from
 * test/fixtures/engines/sglang-shapes.md), then `mocker serve --mode replay` on what it stored: the spawned CLI,
 * driven by the official `openai` client. Token ids are checked against the Python HF tokenizer's
 * (test/fixtures/tokenizer/qwen3.jsonl), never against the double's own tokenizer.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CaptureStore } from '../../src/store/captureStore.js';
import { answerSummary } from '../support/answerSummary.js';
import { runEngines } from '../support/captureRuns.js';
import { startMockerProcess, type MockerProcess } from '../support/mockerProcess.js';
import { startSglangUpstream, type SglangUpstream } from '../support/sglangUpstream.js';
import { oracleChat, oracleIds } from '../support/qwen3Oracle.js';
import { testTmpdir } from '../support/tempRoot.js';

type Json = Record<string, unknown>;

/** What the model says to everything: six tokens, some of them pieces of a Cyrillic letter. */
const ANSWER = 'Привет, мир!';
const ANSWER_IDS = oracleIds(ANSWER);
/** Qwen3's <|im_end|>, the EOS SGLang stops on and names in `matched_stop`. */
const IM_END = oracleIds('<|im_start|>user\nhi<|im_end|>').at(-1)!;
/** The answer's fourth token, its comma (the oracle splits "Привет" into three, then ","). */
const COMMA = ANSWER_IDS[3];
const MODEL = 'Qwen/Qwen3-0.6B';

interface Request {
  name: string;
  chat: boolean;
  body: Json;
  /** The prompt ids the Python tokenizer gives (the chat template rendered first for chats). */
  promptIds: number[];
  /** The output ids SGLang generated (the oracle's), the text it shows, how it finished. */
  ids: number[];
  text: string;
  finish: 'stop' | 'length';
  /** vLLM's stop_reason for it, as a replay answers it. */
  stopReason: string | number | null;
}

type Outcome = Pick<Request, 'ids' | 'text' | 'finish' | 'stopReason'>;

/** A completion of one of the fixture's texts (each request its own prompt: a replay picks among same-prompt captures). */
function completion(name: string, prompt: string, extra: Json, outcome: Outcome): Request {
  return { name, chat: false, body: { model: MODEL, prompt, max_tokens: 16, ...extra }, promptIds: oracleIds(prompt), ...outcome };
}

function chat(name: string, first: string, extra: Json, outcome: Outcome): Request {
  const { messages, ids } = oracleChat(first);
  return { name, chat: true, body: { model: MODEL, messages, max_tokens: 16, ...extra }, promptIds: ids, ...outcome };
}

const streamed = { stream: true, stream_options: { include_usage: true } };
/** Ended by the EOS SGLang names in matched_stop, which vLLM does not (stop_reason null). */
const TO_EOS: Outcome = { ids: [...ANSWER_IDS, IM_END], text: ANSWER, finish: 'stop', stopReason: null };
const CUT_AT_3: Outcome = { ids: ANSWER_IDS.slice(0, 3), text: 'Привет', finish: 'length', stopReason: null };
const REQUESTS: Request[] = [
  completion('completion', 'Hello world', {}, TO_EOS),
  completion('completion stream', 'Hello  world', streamed, TO_EOS),
  completion('completion cut by max_tokens', ' leading space', { max_tokens: 3 }, CUT_AT_3),
  completion(
    'completion stream stopped by a stop token',
    'trailing space ',
    { stop_token_ids: [COMMA], ...streamed },
    { ids: ANSWER_IDS.slice(0, 4), text: 'Привет', finish: 'stop', stopReason: COMMA },
  ),
  chat('chat', 'Hi there', {}, TO_EOS),
  chat('chat stream', 'You are terse.', streamed, TO_EOS),
  chat('chat stream cut by max_tokens', 'Tell me a joke', { max_tokens: 3, ...streamed }, CUT_AT_3),
];
/** A stop string cuts the text before it: only the engine's own ids say which tokens were generated. */
const STOP_STRING = completion(
  'completion stopped by a stop string',
  'CRLF\r\nline',
  { stop: ',' },
  { ids: ANSWER_IDS.slice(0, 4), text: 'Привет', finish: 'stop', stopReason: ',' },
);

const tempDirs: string[] = [];
afterAll(() => tempDirs.forEach((d) => rmSync(d, { recursive: true, force: true })));
function tempFile(name: string): string {
  const dir = mkdtempSync(join(testTmpdir(), 'mocker-sglang-'));
  tempDirs.push(dir);
  return join(dir, name);
}

const client = (base: string) => new OpenAI({ baseURL: `${base}/v1`, apiKey: 'sk-test', maxRetries: 0 });

async function rawAnswer(to: OpenAI, r: Request, extra: Json = {}): Promise<{ status: number; text: string }> {
  const body = { ...r.body, ...extra } as never;
  const res = await (r.chat ? to.chat.completions.create(body) : to.completions.create(body)).asResponse();
  return { status: res.status, text: await res.text() };
}

/** An answer with its per-request `id` and `created` blanked (SGLang draws a new uuid for each). */
function unstamped(text: string): string {
  return text.replace(/"id":"[^"]*"/g, '"id":""').replace(/"created":\d+/g, '"created":0');
}

/** The usage fields every OpenAI client reads, whichever engine's extras come along. */
function counts(usage: unknown): { prompt_tokens: number; completion_tokens: number; total_tokens: number } {
  const u = usage as Json;
  return { prompt_tokens: u.prompt_tokens as number, completion_tokens: u.completion_tokens as number, total_tokens: u.total_tokens as number };
}

interface Stored {
  path: string;
  outcome: string;
  promptIds: number[] | null;
  tokenSource: string | null;
  outputIds: number[];
  text: string;
  finishReason: string | null;
  stopReason: unknown;
}

/** The stored exchanges, one row a choice, as the capture store reads them back. */
function stored(file: string): Stored[] {
  const store = CaptureStore.open(file, { readonly: true });
  try {
    return store.exchangeIds().flatMap((id) => {
      const e = store.getExchange(id)!;
      return e.generations.map((g) => ({
        path: e.path,
        outcome: e.outcome,
        promptIds: e.promptIds,
        tokenSource: e.tokenSource,
        outputIds: g.outputIds,
        text: g.text,
        finishReason: g.finishReason,
        stopReason: g.stopReason,
      }));
    });
  } finally {
    store.close();
  }
}

const VARIANTS = [
  { name: 'SGLang with return_token_ids (PR #30917, mid-2026)', tokenIds: true, requests: [...REQUESTS, STOP_STRING] },
  { name: 'SGLang before return_token_ids', tokenIds: false, requests: REQUESTS },
];

describe.each(VARIANTS)('capture in front of $name', ({ tokenIds, requests }) => {
  let engine: SglangUpstream;
  let capture: MockerProcess;
  let file: string;
  const direct: Record<string, { status: number; text: string }> = {};
  const proxied: Record<string, { status: number; text: string }> = {};

  beforeAll(async () => {
    engine = await startSglangUpstream(() => ANSWER, { tokenIds });
    file = tempFile('capture.db');
    capture = await startMockerProcess(['capture', '--upstream', engine.url, '--captures', file]);
    for (const r of requests) {
      direct[r.name] = await rawAnswer(client(engine.url), r);
      proxied[r.name] = await rawAnswer(client(`http://127.0.0.1:${capture.port}`), r);
    }
    await capture.stop();
  });
  afterAll(async () => {
    await capture?.stop();
    await engine?.close();
  });

  it('is identified as SGLang and stored as sglang', () => {
    expect(capture.stdout()).toContain('(sglang)');
    expect(runEngines(file)).toEqual(['sglang']);
  });

  it('answers as SGLang does, in the shapes of its source', () => {
    for (const r of requests) {
      expect(direct[r.name].status, r.name).toBe(200);
      const s = answerSummary(r.chat, r.body.stream === true, direct[r.name].text);
      expect(s.content, r.name).toBe(r.text);
      expect(s.finish, r.name).toBe(r.finish);
      // completion_tokens counts the EOS SGLang stopped on (it is in output_ids).
      expect(counts(s.usage), r.name).toEqual({
        prompt_tokens: r.promptIds.length,
        completion_tokens: r.ids.length,
        total_tokens: r.promptIds.length + r.ids.length,
      });
    }
    const completion = JSON.parse(direct.completion.text) as Json;
    expect(Object.keys(completion)).toEqual(['id', 'object', 'created', 'model', 'choices', 'usage', 'metadata']);
    expect(completion.id).toMatch(/^[0-9a-f]{32}$/);
    expect((completion.choices as Json[])[0]).toEqual({ index: 0, text: ANSWER, logprobs: null, finish_reason: 'stop', matched_stop: IM_END });
    const chatEnd = direct['chat stream'].text
      .split('\n')
      .filter((l) => l.startsWith('data: {'))
      .map((l) => JSON.parse(l.slice(6)) as Json)
      .at(-2)!;
    expect((chatEnd.choices as Json[])[0]).toEqual({
      index: 0,
      delta: { reasoning_content: null },
      logprobs: null,
      finish_reason: 'stop',
      matched_stop: IM_END,
    });
  });

  it('answers the openai client as SGLang answers it directly: the ids it asked for are left out again', () => {
    for (const r of requests) {
      expect(proxied[r.name].status, r.name).toBe(200);
      expect(unstamped(proxied[r.name].text), r.name).toBe(unstamped(direct[r.name].text));
    }
  });

  it('asks for the token ids everywhere but in streamed chats, which SGLang refuses with a 400', () => {
    const asked = engine.received
      .filter((r) => r.path.startsWith('/v1/') && r.method === 'POST')
      .map((r) => ({ path: r.path, stream: r.body?.stream === true, ids: r.body?.return_token_ids }));
    // Each request went direct (never asked) and then through the proxy.
    const viaProxy = asked.filter((_, i) => i % 2 === 1);
    expect(viaProxy).toEqual(
      requests.map((r) => ({
        path: r.chat ? '/v1/chat/completions' : '/v1/completions',
        stream: r.body.stream === true,
        ids: r.chat && r.body.stream === true ? undefined : true,
      })),
    );
    expect(asked.filter((_, i) => i % 2 === 0).every((a) => a.ids === undefined)).toBe(true);
  });

  it('stores the prompt and output ids the Python tokenizer gives, the text, and the stop as vLLM says it', () => {
    const rows = stored(file);
    expect(rows.map((r) => r.outcome)).toEqual(requests.map(() => 'complete'));
    rows.forEach((row, i) => {
      const r = requests[i];
      expect(row.promptIds, r.name).toEqual(r.promptIds);
      expect(row.outputIds, r.name).toEqual(r.ids);
      expect(row.text, r.name).toBe(r.text);
      expect(row.finishReason, r.name).toBe(r.finish);
      expect(row.stopReason, r.name).toEqual(r.stopReason);
      // Ids the engine sent are exact; a streamed chat's (and an older SGLang's) come from its /tokenize.
      const fromEngine = tokenIds && !(r.chat && r.body.stream === true);
      expect(row.tokenSource, r.name).toBe(fromEngine ? 'engine' : 'tokenize-endpoint');
    });
  });

  it('replays the same text, token ids, finish reasons and usage from the capture file alone', async () => {
    await engine.close();
    const replay = await startMockerProcess(['serve', '--mode', 'replay', '--captures', file, '--timing', 'none']);
    try {
      for (const r of requests) {
        const stream = r.body.stream === true;
        const answer = await rawAnswer(client(`http://127.0.0.1:${replay.port}`), r);
        expect(answer.status, `${r.name}: ${answer.text}`).toBe(200);
        const replayed = answerSummary(r.chat, stream, answer.text);
        const original = answerSummary(r.chat, stream, direct[r.name].text);
        expect({ ...replayed, usage: counts(replayed.usage) }, r.name).toEqual({ ...original, usage: counts(original.usage) });
        // Asked for them, the replay answers the ids SGLang generated.
        const withIds = await rawAnswer(client(`http://127.0.0.1:${replay.port}`), r, { return_token_ids: true });
        expect(answerSummary(r.chat, stream, withIds.text).ids, r.name).toEqual(r.ids);
      }
    } finally {
      await replay.stop();
    }
  });
});
