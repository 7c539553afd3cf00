import type { TokenIds } from '../contract.js';

/**
 * llama.cpp's `--slot-prompt-similarity` default (common/common.h `slot_prompt_similarity = 0.1f`): an idle slot
 * is chosen for its cached prompt only when the common prefix covers more than this fraction of the new prompt.
 */
export const SLOT_PROMPT_SIMILARITY = 0.1;

/** One of llama-server's `-np` slots: a sequence in the unified KV cache, and what its cells hold. */
export interface Slot {
  readonly id: number;
  /** The tokens whose KV the slot holds (its last prompt and output, or the one in progress). */
  cache: number[];
  /** llama.cpp's `t_last_used`: when its last request ended (-1: never used). */
  lastUsed: number;
  /** The request it runs, or null when idle. */
  busyWith: string | null;
}

/** Length of the common prefix of a slot's cache and a prompt (llama.cpp's `get_common_prefix`). */
export function commonPrefix(cache: readonly number[], prompt: TokenIds): number {
  const n = Math.min(cache.length, prompt.length);
  let i = 0;
  while (i < n && cache[i] === prompt[i]) i++;
  return i;
}

/**
 * llama.cpp's `get_available_slot` (tools/server/server-context.cpp): of the idle slots holding tokens, the one
 * whose cache shares the largest fraction of the prompt, above `SLOT_PROMPT_SIMILARITY`; else the least recently
 * used idle slot (`t_last_used <= t_last`: among equals, the last one). Null when every slot is busy.
 */
export function chooseSlot(slots: readonly Slot[], prompt: TokenIds): Slot | null {
  let best: Slot | null = null;
  let bestSimilarity = 0;
  for (const slot of slots) {
    if (slot.busyWith !== null || slot.cache.length === 0) continue;
    const similarity = commonPrefix(slot.cache, prompt) / prompt.length;
    if (similarity > bestSimilarity && similarity > SLOT_PROMPT_SIMILARITY) {
      bestSimilarity = similarity;
      best = slot;
    }
  }
  if (best) return best;
  let lru: Slot | null = null;
  for (const slot of slots) {
    if (slot.busyWith !== null) continue;
    if (!lru || slot.lastUsed <= lru.lastUsed) lru = slot;
  }
  return lru;
}
