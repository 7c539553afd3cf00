import { createHash } from 'node:crypto';
import type { ModelTokenizer } from '../tokenizer/index.js';
import { cutAtStopString, cutAtStopToken, type ChoicePlan, type OutputParams } from './plan.js';
import { shapeRandomAnswer, type SyntheticConfig } from './synthetic.js';

/** Length of a random answer when the client sets no max_tokens: up to this many tokens, then EOS. */
export const RANDOM_FREE_LENGTH = 128;

/** xoshiro128**: small, fast, and the same sequence on every machine for the same seed. */
class Xoshiro128 {
  private s: Uint32Array;
  constructor(seed: Buffer) {
    this.s = new Uint32Array(4);
    for (let i = 0; i < 4; i++) this.s[i] = seed.readUInt32LE(i * 4);
    if (this.s.every((v) => v === 0)) this.s[0] = 1;
  }
  next(): number {
    const s = this.s;
    const result = Math.imul(rotl(Math.imul(s[1], 5), 7), 9) >>> 0;
    const t = s[1] << 9;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 11);
    return result / 2 ** 32;
  }
}

function rotl(x: number, k: number): number {
  return ((x << k) | (x >>> (32 - k))) >>> 0;
}

/** A generator of random output tokens, deterministic for (prompt tokens, --seed, request seed, choice). */
export function randomStream(promptIds: readonly number[], serverSeed: number, requestSeed: number | null, choice: number): () => number {
  const hash = createHash('sha256');
  hash.update(Uint32Array.from(promptIds));
  hash.update(`|${serverSeed}|${requestSeed ?? ''}|${choice}`);
  const rng = new Xoshiro128(hash.digest());
  return () => rng.next();
}

/**
 * Random tokens from the real vocabulary (never special tokens), with vLLM's stop rules applied; `synthetic`
 * shapes them as a reasoning model's with tools.
 */
export async function planRandom(
  promptIds: readonly number[],
  params: OutputParams,
  tokenizer: ModelTokenizer,
  serverSeed: number,
  choice: number,
  synthetic?: SyntheticConfig,
): Promise<ChoicePlan> {
  const rand = randomStream(promptIds, serverSeed, params.seed, choice);
  const pool = tokenizer.ordinaryTokenIds();
  const endsWithEos = !params.maxTokensRequested && !params.ignoreEos && tokenizer.eosTokenIds.length > 0;
  const length = endsWithEos ? Math.min(params.maxTokens, params.minTokens + 1 + Math.floor(rand() * RANDOM_FREE_LENGTH)) : params.maxTokens;
  const tokenIds: number[] = [];
  while (tokenIds.length < length) tokenIds.push(pool[Math.floor(rand() * pool.length)]);
  const reachedEos = endsWithEos && length < params.maxTokens;
  if (reachedEos) tokenIds[length - 1] = tokenizer.eosTokenIds[0];
  let plan: ChoicePlan = {
    tokenIds,
    chunks: tokenIds.map((_, i) => ({ end: i + 1 })),
    finishReason: 'length',
    stopReason: null,
  };
  if (synthetic) {
    const structuredRand = randomStream(promptIds, serverSeed, params.seed, choice);
    const shaped = await shapeRandomAnswer(tokenIds, reachedEos ? length - 1 : length, params, tokenizer, synthetic, rand, structuredRand);
    if (shaped.toolCall) return shaped.plan;
    plan = shaped.plan;
  }
  return cutAtStopString(cutAtStopToken(plan, params, tokenizer.eosTokenIds), params, tokenizer);
}
