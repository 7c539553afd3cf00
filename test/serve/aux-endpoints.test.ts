/**
 * AIPerf's mock server's (AIPerf's mock server's) endpoints on `mocker serve`: embeddings (checked with the `openai`
 * client), NIM / TEI / Cohere reranking, TGI generation through the engine, the custom multimodal endpoint,
 * `GET /`, and their errors. Every server is the built CLI in its own process.
 */
import parsePrometheusTextFormat from 'parse-prometheus-text-format';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mockerProcesses } from '../support/mockerProcess.js';
import { oracleIdsWithSpecial } from '../support/qwen3Oracle.js';
import { MODEL } from '../support/vllmUpstream.js';

const mockers = mockerProcesses();
let main: string;
let twin: string;
let small: string;

const start = async (...flags: string[]) => (await mockers.start(['serve', '--mode', 'random', '--timing', 'none', ...flags])).url;

beforeAll(async () => {
  [main, twin, small] = await Promise.all([start(), start(), start('--embedding-dimensions', '64')]);
}, 60_000);
afterAll(mockers.stopAll);

const post = (url: string, path: string, body: unknown) =>
  fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
const postJson = async (url: string, path: string, body: unknown): Promise<unknown> => {
  const res = await post(url, path, body);
  expect(res.status, `${path}: ${res.status}`).toBe(200);
  return res.json();
};
const client = (url: string) => new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0 });
const norm = (v: number[]) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));

/** Texts from the tokenizer oracle (Python HF tokenizers' ids for the bundled Qwen3 tokenizer). */
const TEXTS = ['Hello world', 'Привет, мир!', 'def f(x):\n    return x ** 2\n'];

describe('/v1/embeddings', () => {
  it('answers the openai client in float and in its default base64, the same unit vectors, usage counted by the tokenizer', async () => {
    const floats = await client(main).embeddings.create({ model: MODEL, input: TEXTS, encoding_format: 'float' });
    // The openai client asks for base64 when no format is given, and decodes the float32s itself.
    const decoded = await client(main).embeddings.create({ model: MODEL, input: TEXTS });
    expect(floats.object).toBe('list');
    expect(floats.model).toBe(MODEL);
    expect(floats.data.map((d) => [d.object, d.index])).toEqual(TEXTS.map((_, i) => ['embedding', i]));
    for (const d of floats.data) {
      expect(d.embedding).toHaveLength(768);
      expect(norm(d.embedding)).toBeCloseTo(1, 5);
    }
    expect(decoded.data.map((d) => d.embedding)).toEqual(floats.data.map((d) => d.embedding));
    // Different inputs, different vectors.
    expect(floats.data[0].embedding).not.toEqual(floats.data[1].embedding);
    const tokens = TEXTS.reduce((n, t) => n + oracleIdsWithSpecial(t).length, 0);
    expect(floats.usage).toEqual({ prompt_tokens: tokens, total_tokens: tokens, completion_tokens: 0, prompt_tokens_details: null });
  });

  it('is deterministic across processes; a text and its token ids embed alike; one string is one input', async () => {
    const here = await client(main).embeddings.create({ model: MODEL, input: TEXTS, encoding_format: 'float' });
    const there = await client(twin).embeddings.create({ model: MODEL, input: TEXTS, encoding_format: 'float' });
    expect(there.data.map((d) => d.embedding)).toEqual(here.data.map((d) => d.embedding));
    const ids = await client(twin).embeddings.create({ model: MODEL, input: TEXTS.map(oracleIdsWithSpecial), encoding_format: 'float' });
    expect(ids.data.map((d) => d.embedding)).toEqual(here.data.map((d) => d.embedding));
    const one = await client(twin).embeddings.create({ model: MODEL, input: oracleIdsWithSpecial(TEXTS[1]), encoding_format: 'float' });
    expect(one.data.map((d) => d.embedding)).toEqual([here.data[1].embedding]);
    const single = await client(twin).embeddings.create({ model: MODEL, input: TEXTS[2] });
    expect(single.data.map((d) => d.embedding)).toEqual([here.data[2].embedding]);
    expect(single.usage.prompt_tokens).toBe(oracleIdsWithSpecial(TEXTS[2]).length);
  });

  it("--embedding-dimensions sets the size; a request's dimensions shortens it (the same vector as a server of that size)", async () => {
    const sized = await client(small).embeddings.create({ model: MODEL, input: TEXTS[0] });
    expect(sized.data[0].embedding).toHaveLength(64);
    expect(norm(sized.data[0].embedding)).toBeCloseTo(1, 5);
    const asked = await client(main).embeddings.create({ model: MODEL, input: TEXTS[0], dimensions: 64 });
    expect(asked.data[0].embedding).toEqual(sized.data[0].embedding);
  });
});

describe('ranking', () => {
  const QUERY = 'what is a KV cache?';
  const PASSAGES = ['a cache of keys and values', 'a fruit', 'a scheduler', 'blocks of attention state'];

  it('NIM /v1/ranking, TEI /rerank and Cohere /v2/rerank rank every passage once, best first, in the same order, on every process', async () => {
    const nim = (await postJson(main, '/v1/ranking', { model: MODEL, query: { text: QUERY }, passages: PASSAGES.map((text) => ({ text })) })) as {
      rankings: { index: number; logit: number }[];
    };
    const tei = (await postJson(main, '/rerank', { query: QUERY, texts: PASSAGES })) as { index: number; score: number }[];
    const cohere = (await postJson(main, '/v2/rerank', { model: MODEL, query: QUERY, documents: PASSAGES })) as {
      id: string;
      results: { index: number; relevance_score: number }[];
      meta: { api_version: { version: string } };
    };
    const order = nim.rankings.map((r) => r.index);
    expect([...order].sort()).toEqual([0, 1, 2, 3]);
    expect(Object.keys(nim)).toEqual(['rankings']);
    for (const r of nim.rankings) expect(Object.keys(r)).toEqual(['index', 'logit']);
    const logits = nim.rankings.map((r) => r.logit);
    expect(logits).toEqual([...logits].sort((a, b) => b - a));
    expect(tei.map((r) => r.index)).toEqual(order);
    for (const r of tei) {
      expect(Object.keys(r)).toEqual(['index', 'score']);
      expect(r.score).toBeGreaterThan(0);
      expect(r.score).toBeLessThan(1);
    }
    // NIM's logits are TEI's scores before the sigmoid.
    tei.forEach((r, i) => expect(1 / (1 + Math.exp(-nim.rankings[i].logit))).toBeCloseTo(r.score, 9));
    expect(cohere.results).toEqual(tei.map((r) => ({ index: r.index, relevance_score: r.score })));
    expect(typeof cohere.id).toBe('string');
    expect(cohere.meta.api_version.version).toBe('2');
    expect(await postJson(twin, '/rerank', { query: QUERY, texts: PASSAGES })).toEqual(tei);
  });

  it('TEI return_text and raw_scores, Cohere top_n', async () => {
    const tei = (await postJson(main, '/rerank', { query: 'q', texts: PASSAGES, return_text: true, raw_scores: true })) as {
      index: number;
      text: string;
      score: number;
    }[];
    for (const r of tei) expect(r.text).toBe(PASSAGES[r.index]);
    // raw_scores: the logits NIM answers for the same query and passages.
    const nim = (await postJson(main, '/v1/ranking', { query: { text: 'q' }, passages: PASSAGES.map((text) => ({ text })) })) as {
      rankings: { index: number; logit: number }[];
    };
    expect(tei.map((r) => [r.index, r.score])).toEqual(nim.rankings.map((r) => [r.index, r.logit]));
    const top = (await postJson(main, '/v2/rerank', { query: 'q', documents: PASSAGES, top_n: 2 })) as { results: { index: number }[] };
    expect(top.results.map((r) => r.index)).toEqual(tei.slice(0, 2).map((r) => r.index));
  });
});

interface TgiEvent {
  index: number;
  token: { id: number; text: string; logprob: number; special: boolean };
  generated_text: string | null;
  details: { finish_reason: string; generated_tokens: number } | null;
}

/** `data:` lines of a server-sent event stream (TGI writes no space after the colon). */
function sseData(text: string): string[] {
  return text
    .split('\n\n')
    .filter((block) => block.trim() !== '')
    .map((block) => {
      expect(block.startsWith('data:')).toBe(true);
      return block.slice('data:'.length).trim();
    });
}

describe('TGI and the custom multimodal endpoint', () => {
  it('/generate_stream: one event per token up to max_new_tokens, the whole text and details on the last', async () => {
    const res = await post(main, '/generate_stream', { inputs: 'Hello world', parameters: { max_new_tokens: 7, details: true } });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/^text\/event-stream/);
    const events = sseData(await res.text()).map((d) => JSON.parse(d) as TgiEvent);
    expect(events).toHaveLength(7);
    expect(events.map((e) => e.index)).toEqual([1, 2, 3, 4, 5, 6, 7]);
    expect(events.slice(0, -1).every((e) => e.generated_text === null && e.details === null)).toBe(true);
    const last = events[6];
    expect(last.generated_text).toBe(events.map((e) => e.token.text).join(''));
    expect(last.details).toMatchObject({ finish_reason: 'length', generated_tokens: 7 });
    for (const e of events) expect(Object.keys(e.token)).toEqual(['id', 'text', 'logprob', 'special']);
  });

  it('/generate: {generated_text} (with details when asked), the same tokens for the same request', async () => {
    const body = { inputs: 'Hello world', parameters: { max_new_tokens: 5, details: true } };
    const answer = (await postJson(main, '/generate', body)) as {
      generated_text: string;
      details: { finish_reason: string; generated_tokens: number; tokens: { text: string }[] };
    };
    expect(answer.details.generated_tokens).toBe(5);
    expect(answer.details.tokens).toHaveLength(5);
    expect(answer.generated_text).toBe(answer.details.tokens.map((t) => t.text).join(''));
    const plain = (await postJson(main, '/generate', { inputs: 'Hello world', parameters: { max_new_tokens: 5 } })) as Record<string, unknown>;
    expect(plain).toEqual({ generated_text: answer.generated_text });
  });

  it("a TGI request runs in the engine: vLLM's request and prompt token counters grow", async () => {
    const counters = async () => {
      const families = parsePrometheusTextFormat(await (await fetch(`${twin}/metrics`)).text());
      const sum = (name: string) => families.find((f) => f.name === name)!.metrics.reduce((n, m) => n + Number(m.value), 0);
      return { success: sum('vllm:request_success_total'), prompt: sum('vllm:prompt_tokens_total') };
    };
    const before = await counters();
    await postJson(twin, '/generate', { inputs: 'Hello world', parameters: { max_new_tokens: 3 } });
    const after = await counters();
    expect(after.success - before.success).toBe(1);
    expect(after.prompt - before.prompt).toBe(oracleIdsWithSpecial('Hello world').length);
  });

  it("/v1/custom-multimodal: AIPerf's mock server's answer, tokens used counted from the joined text fragments", async () => {
    const answer = (await postJson(main, '/v1/custom-multimodal', {
      modality_bundle: { text_fragments: ['Hello', 'world'], visual_assets: { images: [], videos: [] }, audio_streams: [] },
      inference_params: { model_id: MODEL, max_tokens: 4 },
    })) as { text: string; completion: { generated_text: string; metadata: { tokens_used: { input: number; output: number; total: number } } } };
    const input = oracleIdsWithSpecial('Hello world').length;
    expect(answer.completion.metadata.tokens_used).toEqual({ input, output: 4, total: input + 4 });
    expect(answer.completion.generated_text).toBe(answer.text);
  });
});

describe('GET / and errors', () => {
  it('GET /: the server, the vLLM version it emulates (as /version) and the model', async () => {
    const info = (await (await fetch(`${main}/`)).json()) as Record<string, unknown>;
    const version = ((await (await fetch(`${main}/version`)).json()) as { version: string }).version;
    expect(info).toMatchObject({ version, model: MODEL });
    expect(typeof info.message).toBe('string');
  });

  it('bad input: vLLM-format 400s naming the field, 404 for an unknown model, 405 for a wrong method', async () => {
    const cases: [string, unknown, number, RegExp, string | null][] = [
      ['/v1/embeddings', { model: MODEL, input: [] }, 400, /input/, 'input'],
      ['/v1/embeddings', { model: MODEL, input: 5 }, 400, /input/, null],
      ['/v1/embeddings', { model: MODEL }, 400, /input/, null],
      ['/v1/embeddings', { model: 'no-such-model', input: 'x' }, 404, /no-such-model/, 'model'],
      ['/v1/embeddings', { model: MODEL, input: 'x', dimensions: 769 }, 400, /dimensions/, 'dimensions'],
      ['/v1/embeddings', { model: MODEL, input: 'x', encoding_format: 'int8' }, 400, /encoding_format/, null],
      ['/v1/embeddings', { model: MODEL, input: [[1, 10 ** 9]] }, 400, /out of vocabulary/, 'prompt'],
      ['/v1/ranking', { model: MODEL, passages: [{ text: 'a' }] }, 400, /query/, null],
      ['/v1/ranking', { model: MODEL, query: { text: 'q' }, passages: [] }, 400, /passages/, 'passages'],
      ['/rerank', { query: 'q' }, 400, /texts/, null],
      ['/rerank', { query: 'q', texts: [] }, 400, /texts/, 'texts'],
      ['/v2/rerank', { query: 'q', documents: ['a'], top_n: 0 }, 400, /top_n/, 'top_n'],
      ['/v2/rerank', { model: 'no-such-model', query: 'q', documents: ['a'] }, 404, /no-such-model/, 'model'],
      ['/generate', { parameters: { max_new_tokens: 3 } }, 400, /inputs/, null],
      ['/generate_stream', { inputs: 'x', parameters: { max_new_tokens: 'many' } }, 400, /max_new_tokens/, null],
      ['/v1/custom-multimodal', { modality_bundle: { text_fragments: ['x'] }, inference_params: { model_id: 'no-such-model' } }, 404, /no-such-model/, 'model'],
      ['/v1/custom-multimodal', { inference_params: {} }, 400, /modality_bundle/, null],
    ];
    for (const [path, body, status, message, param] of cases) {
      const res = await post(main, path, body);
      const label = `${path} ${JSON.stringify(body)}`;
      expect(res.status, label).toBe(status);
      const { error } = (await res.json()) as { error: { message: string; param: string | null; code: number } };
      expect(error.message, label).toMatch(message);
      expect(error.param, label).toBe(param);
      expect(error.code, label).toBe(status);
    }
    const wrongMethod = await fetch(`${main}/v1/embeddings`);
    expect(wrongMethod.status).toBe(405);
    expect(wrongMethod.headers.get('allow')).toBe('POST');
  });
});
