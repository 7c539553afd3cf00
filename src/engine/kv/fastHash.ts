/**
 * A fast non-cryptographic chained block hash for simulation (the role xxh3 plays in Dynamo's mocker):
 * two independent 32-bit lanes folded into a 53-bit non-negative integer, so a block id is a
 * plain JS number (a Map key with no allocation). Collision odds for a million blocks are about 1e-4 of a
 * percent; vLLM-compatible hashes for KV events are computed separately (sha256_cbor).
 */
import type { TokenIds } from '../contract.js';

const C1 = 0xcc9e2d51;
const C2 = 0x1b873593;

function mix(h: number, k: number): number {
  k = Math.imul(k, C1);
  k = (k << 15) | (k >>> 17);
  k = Math.imul(k, C2);
  h ^= k;
  h = (h << 13) | (h >>> 19);
  return (Math.imul(h, 5) + 0xe6546b64) | 0;
}

function finish(h: number, length: number): number {
  h ^= length;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

const SEED_HIGH = 1337;
const SEED_LOW = 0x9e3779b9;
const fold = (high: number, low: number) => (high & 0x1fffff) * 0x100000000 + low;

/** Hash of tokens[start, end): murmur3 for the low 32 bits, a cheaper multiplicative lane for the high 21. */
export function contentHash(tokens: ArrayLike<number>, start: number, end: number): number {
  let high = SEED_HIGH;
  let low = SEED_LOW;
  for (let i = start; i < end; i++) {
    const token = tokens[i];
    low = mix(low, token);
    high = (Math.imul(high ^ token, 0x2c1b3c6d) + 0x297a2d39) | 0;
  }
  return fold(finish(high, end - start), finish(low, end - start));
}

/** A block's sequence hash: the first block's is its content hash, later ones chain their parent's. */
export function chainHash(parent: number | null, content: number): number {
  if (parent === null) return content;
  // The 32-bit halves of parent and content, in that order (unrolled: this runs for every block).
  const parentLow = parent % 0x100000000;
  const parentHigh = Math.floor(parent / 0x100000000);
  const contentLow = content % 0x100000000;
  const contentHigh = Math.floor(content / 0x100000000);
  const high = mix(mix(mix(mix(SEED_HIGH, parentLow), parentHigh), contentLow), contentHigh);
  const low = mix(mix(mix(mix(SEED_LOW, parentLow ^ 0x5bd1e995), parentHigh ^ 0x5bd1e995), contentLow ^ 0x5bd1e995), contentHigh ^ 0x5bd1e995);
  return fold(finish(high, 16), finish(low, 16));
}

/**
 * The parent a LoRA adapter's first block chains from (vLLM puts the adapter's name in every block's hash): the
 * same tokens under two adapters, or under an adapter and the base model, never share a block id.
 */
export function loraChainSeed(name: string): number {
  const codes = Array.from(name, (c) => c.codePointAt(0)!);
  // Mixed with the length of the name: a seed that is itself a content hash of some block's tokens is not enough.
  return chainHash(contentHash(codes, 0, codes.length), codes.length);
}

/** Whether tokens[a, a + n) equal tokens[b, b + n). */
function sameTokens(tokens: TokenIds, a: number, b: number, n: number): boolean {
  for (let i = 0; i < n; i++) if (tokens[a + i] !== tokens[b + i]) return false;
  return true;
}

/** The last prompt hashed: a simulated router and then the engine it routes to ask for the same one in a row. */
let last: { tokens: TokenIds; blockSize: number; seed: number | null; hashes: readonly number[] } | null = null;

/** The sequence hashes of the full blocks of `tokens`; `seed` is the first block's parent (a LoRA adapter's, else none). */
export function blockHashes(tokens: TokenIds, blockSize: number, seed: number | null = null): readonly number[] {
  if (last !== null && last.tokens === tokens && last.blockSize === blockSize && last.seed === seed) return last.hashes;
  const count = Math.floor(tokens.length / blockSize);
  const hashes = new Array<number>(count);
  let parent: number | null = seed;
  let content = 0;
  for (let i = 0, start = 0; i < count; i++, start += blockSize) {
    // A trace's prompt repeats each hash id over several blocks: a block equal to the one before reuses its hash.
    if (i === 0 || !sameTokens(tokens, start - blockSize, start, blockSize)) content = contentHash(tokens, start, start + blockSize);
    parent = chainHash(parent, content);
    hashes[i] = parent;
  }
  last = { tokens, blockSize, seed, hashes };
  return hashes;
}
