import { createHash, randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { z } from 'zod';
import { LoopSlice } from '../util/loopSlice.js';
import { seededUniform } from '../util/mulberry32.js';
import { badRequest } from '../wire/errors.js';
import { parseBody } from '../api/schemas.js';

/**
 * Embeddings and reranking as AIPerf's mock server answers them (AIPerf's mock server): no engine, a latency of its own
 * (base + per item × items), vectors and scores drawn from hashes of the inputs so every run and every process
 * gives the same answer. Wire shapes: OpenAI's embeddings (as vLLM serves them), NVIDIA NIM's /v1/ranking,
 * Hugging Face TEI's /rerank and Cohere's /v2/rerank.
 */

/** AIPerf's mock server's latency knobs, in ms (already 0 under `--timing none`). */
export interface PoolingLatency {
  embeddingBaseMs: number;
  embeddingPerInputMs: number;
  rankingBaseMs: number;
  rankingPerPassageMs: number;
}

export interface PoolingConfig {
  /** The served model a request names (the default one when it names none); an unknown name is a 404. */
  resolveModel: (requested: string | null | undefined) => string;
  /** A text's token ids; one far beyond the context length is refused before all of it is tokenized. */
  encode: (text: string, addSpecialTokens: boolean) => Promise<number[]>;
  /** Throws the 400 for ids outside the vocabulary. */
  checkTokenIds: (ids: number[]) => void;
  /** Throws vLLM's 400 for an input of this many tokens that the context cannot hold. */
  checkInputLength: (tokens: number) => void;
  /** `--embedding-dimensions`: the vector length, and the largest `dimensions` a request may ask for. */
  embeddingDimensions: number;
  latency: PoolingLatency;
}

const int = z.number().int();
const tokenIds = z.custom<number[]>((v) => Array.isArray(v) && v.every((t) => Number.isInteger(t)), 'expected an array of integer token ids');

const embeddingRequest = z.looseObject({
  model: z.string().nullish(),
  input: z.union([z.string(), z.array(z.string()), tokenIds, z.array(tokenIds)]),
  encoding_format: z.enum(['float', 'base64']).nullish(),
  dimensions: int.nullish(),
  user: z.string().nullish(),
});

const nimRankingRequest = z.looseObject({
  model: z.string().nullish(),
  query: z.looseObject({ text: z.string() }),
  passages: z.array(z.looseObject({ text: z.string() })),
});

const teiRerankRequest = z.looseObject({
  query: z.string(),
  texts: z.array(z.string()),
  raw_scores: z.boolean().nullish(),
  return_text: z.boolean().nullish(),
});

const cohereRerankRequest = z.looseObject({
  model: z.string().nullish(),
  query: z.string(),
  documents: z.array(z.string()),
  top_n: int.nullish(),
});

type Json = Record<string, unknown>;

/** u32 from the sha256 of `parts` joined by NUL (a separator no text or id list contains). */
function hash32(...parts: string[]): number {
  return createHash('sha256').update(parts.join('\0')).digest().readUInt32BE(0);
}

/**
 * The unit vector of one input: seeded by its token ids, so a text and its ids embed alike (as in a real
 * model). Each component is a float32, as vLLM returns them, so `float` and `base64` answers carry the same
 * numbers. The first `dimensions` components of the full draw, renormalised: a matryoshka embedding.
 */
export function embeddingVector(ids: readonly number[], dimensions: number): Float32Array {
  const draw = seededUniform(hash32(ids.join(',')));
  const raw = Array.from({ length: dimensions }, () => draw() - 0.5);
  const norm = Math.sqrt(raw.reduce((sum, x) => sum + x * x, 0)) || 1;
  return Float32Array.from(raw, (x) => x / norm);
}

/** OpenAI's `base64` encoding: the float32 components little-endian, base64 text. */
function base64Floats(vector: Float32Array): string {
  const bytes = Buffer.alloc(vector.length * 4);
  vector.forEach((x, i) => bytes.writeFloatLE(x, i * 4));
  return bytes.toString('base64');
}

/** A query–passage relevance in (0, 1), the same on every endpoint and run. */
export function relevance(query: string, passage: string): number {
  return (hash32(query, passage) + 0.5) / 2 ** 32;
}

/** Passages by descending relevance (ties by index). */
function ranked(query: string, passages: string[]): { index: number; score: number }[] {
  return passages.map((p, index) => ({ index, score: relevance(query, p) })).sort((a, b) => b.score - a.score || a.index - b.index);
}

const logit = (p: number) => Math.log(p / (1 - p));

function checkNotEmpty(items: unknown[], field: string): void {
  if (items.length === 0) throw badRequest(`\`${field}\` must not be empty.`, field);
}

/** AIPerf's mock server's latency for `count` items; nothing under `--timing none`. */
async function wait(baseMs: number, perItemMs: number, count: number): Promise<void> {
  const ms = baseMs + perItemMs * count;
  if (ms > 0) await sleep(ms);
}

export function poolingEndpoints(config: PoolingConfig) {
  const { latency } = config;

  /**
   * vLLM tokenizes each (query, document) pair of a rerank and refuses one the context cannot hold: the query
   * with its special tokens, each document without. A slice of the loop's time at a time, for 10,000 documents.
   */
  async function checkPairs(query: string, documents: string[]): Promise<void> {
    const slice = new LoopSlice();
    const queryTokens = (await config.encode(query, true)).length;
    for (const document of documents) {
      config.checkInputLength(queryTokens + (await config.encode(document, false)).length);
      await slice.pause();
    }
  }

  /** `POST /v1/embeddings`: vLLM's EmbeddingResponse (pydantic field order), in parts. */
  async function embeddings(body: Json): Promise<string[]> {
    const req = parseBody(embeddingRequest, body);
    const model = config.resolveModel(req.model);
    const input = req.input;
    // A flat list of numbers is one tokenized input; a list of strings or of id lists is a batch.
    const items: (string | number[])[] =
      typeof input === 'string' ? [input] : input.length > 0 && typeof input[0] === 'number' ? [input as number[]] : (input as (string | number[])[]);
    checkNotEmpty(items, 'input');
    const dimensions = req.dimensions ?? config.embeddingDimensions;
    if (dimensions < 1 || dimensions > config.embeddingDimensions) {
      throw badRequest(`dimensions must be between 1 and ${config.embeddingDimensions} (the model's embedding size), got ${dimensions}.`, 'dimensions');
    }
    // 10,000 inputs are tokenized, and their vectors written, a slice of the event loop's time at a time.
    const slice = new LoopSlice();
    const prompts: number[][] = [];
    for (const [i, item] of items.entries()) {
      if (typeof item !== 'string') config.checkTokenIds(item);
      const ids = typeof item === 'string' ? await config.encode(item, true) : item;
      if (ids.length === 0) throw badRequest(`input[${i}] is empty: there is nothing to embed.`, 'input');
      config.checkInputLength(ids.length);
      prompts.push(ids);
      await slice.pause();
    }
    await wait(latency.embeddingBaseMs, latency.embeddingPerInputMs, items.length);
    const base64 = req.encoding_format === 'base64';
    // The body in parts, one per input: 10,000 vectors of 768 floats are 160 MB of JSON.
    const data: string[] = [];
    for (const [index, ids] of prompts.entries()) {
      const vector = embeddingVector(ids, dimensions);
      data.push(`${index > 0 ? ',' : ''}${JSON.stringify({ index, object: 'embedding', embedding: base64 ? base64Floats(vector) : Array.from(vector) })}`);
      await slice.pause();
    }
    const promptTokens = prompts.reduce((n, ids) => n + ids.length, 0);
    const head = JSON.stringify({ id: `embd-${randomUUID().replaceAll('-', '')}`, object: 'list', created: Math.floor(Date.now() / 1000), model });
    const usage = JSON.stringify({ usage: { prompt_tokens: promptTokens, total_tokens: promptTokens, completion_tokens: 0, prompt_tokens_details: null } });
    // {"id":…,"model":…,"data":[…],"usage":{…}}
    return [`${head.slice(0, -1)},"data":[`, ...data, `],${usage.slice(1)}`];
  }

  /** `POST /v1/ranking`: NVIDIA NIM's reranking, raw logits, best first. */
  async function nimRanking(body: Json): Promise<string> {
    const req = parseBody(nimRankingRequest, body);
    config.resolveModel(req.model);
    checkNotEmpty(req.passages, 'passages');
    await checkPairs(
      req.query.text,
      req.passages.map((p) => p.text),
    );
    await wait(latency.rankingBaseMs, latency.rankingPerPassageMs, req.passages.length);
    const rankings = ranked(
      req.query.text,
      req.passages.map((p) => p.text),
    ).map(({ index, score }) => ({ index, logit: logit(score) }));
    return JSON.stringify({ rankings });
  }

  /** `POST /rerank`: Hugging Face TEI's answer, a bare list best first (scores are sigmoids unless `raw_scores`). */
  async function teiRerank(body: Json): Promise<string> {
    const req = parseBody(teiRerankRequest, body);
    checkNotEmpty(req.texts, 'texts');
    await checkPairs(req.query, req.texts);
    await wait(latency.rankingBaseMs, latency.rankingPerPassageMs, req.texts.length);
    const results = ranked(req.query, req.texts).map(({ index, score }) => ({
      index,
      ...(req.return_text ? { text: req.texts[index] } : {}),
      score: req.raw_scores ? logit(score) : score,
    }));
    return JSON.stringify(results);
  }

  /** `POST /v2/rerank`: Cohere's v2 answer, the `top_n` best. */
  async function cohereRerank(body: Json): Promise<string> {
    const req = parseBody(cohereRerankRequest, body);
    config.resolveModel(req.model);
    checkNotEmpty(req.documents, 'documents');
    if (req.top_n !== undefined && req.top_n !== null && req.top_n < 1) throw badRequest(`top_n must be at least 1, got ${req.top_n}.`, 'top_n');
    await checkPairs(req.query, req.documents);
    await wait(latency.rankingBaseMs, latency.rankingPerPassageMs, req.documents.length);
    const results = ranked(req.query, req.documents)
      .slice(0, req.top_n ?? req.documents.length)
      .map(({ index, score }) => ({ index, relevance_score: score }));
    return JSON.stringify({
      id: randomUUID(),
      results,
      meta: { api_version: { version: '2' }, billed_units: { search_units: 1 } },
    });
  }

  return { embeddings, nimRanking, teiRerank, cohereRerank };
}
