import { contentHash } from '../kv/fastHash.js';
import type { RadixCache } from './radixCache.js';
import type { SglangRequest } from './request.js';

export type SglangSchedulePolicy = 'fifo' | 'lpm';

/** LPM falls back to FIFO above this many waiting requests (sglang's scheduling cost guard). */
export const LPM_FALLBACK_THRESHOLD = 128;
/** Only requests whose cached prefix is at most this long are checked against the other waiting requests. */
export const IN_BATCH_PREFIX_CHECK_THRESHOLD = 32;
/** A checked request sharing at least this long a prefix with an earlier waiting one waits behind the rest. */
export const IN_BATCH_PREFIX_DEPRIORITIZE_THRESHOLD = 32;

/**
 * The longest-prefix-match order (engine-reference §2.3 step 1, Dynamo's `apply_schedule_policy`): the
 * waiting requests sorted by their cached prefix (longest first, stable), except that a request with little
 * cached whose first tokens an earlier waiting request shares is "temporarily deprioritized" behind all
 * others — the earlier one will put that prefix in the cache. Returns null when the policy keeps the order.
 *
 * Dynamo matches each request against a scratch radix tree of the earlier ones; a match there counts only
 * in whole pages, so "at least 32 tokens shared" means "the first ceil(32 / page) pages equal", which a hash
 * of that many leading tokens answers (verified token by token).
 */
export function lpmOrder(waiting: Iterable<SglangRequest> & { readonly size: number }, cache: RadixCache | null, pageSize: number): SglangRequest[] | null {
  if (waiting.size > LPM_FALLBACK_THRESHOLD) return null;
  const sharedLength = Math.ceil(IN_BATCH_PREFIX_DEPRIORITIZE_THRESHOLD / pageSize) * pageSize;
  const leaders = new Map<number, Uint32Array[]>();
  const scored = Array.from(waiting, (request, index) => {
    const tokens = request.tokens;
    const length = request.length;
    const prefix = cache === null ? 0 : cache.prefixMatchLength(tokens, length);
    let deprioritized = false;
    if (prefix <= IN_BATCH_PREFIX_CHECK_THRESHOLD && length >= sharedLength) {
      const hash = contentHash(tokens, 0, sharedLength);
      const sameHash = leaders.get(hash);
      if (sameHash?.some((other) => samePrefix(other, tokens, sharedLength))) deprioritized = true;
      else if (sameHash) sameHash.push(tokens);
      else leaders.set(hash, [tokens]);
    }
    return { request, index, prefix, deprioritized };
  });
  scored.sort((a, b) => Number(a.deprioritized) - Number(b.deprioritized) || b.prefix - a.prefix || a.index - b.index);
  return scored.map((s) => s.request);
}

function samePrefix(a: Uint32Array, b: Uint32Array, length: number): boolean {
  for (let i = 0; i < length; i++) if (a[i] !== b[i]) return false;
  return true;
}
