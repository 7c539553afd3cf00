import { Encoder } from '@msgpack/msgpack';
import type { VllmKvEvent } from '../engine/index.js';

/**
 * `array`: vLLM ≤ 0.2x's tagged arrays (`KVCacheEvent(array_like=True, tag=True)`, the ≈0.10.2 field set
 * with `medium`); `map`: the named-field layout of vLLM PR #42892 (vllm-wire-reference.md §5).
 */
export type KvEventsFormat = 'array' | 'map';

/** GPU memory: the only tier a simulated engine has. */
const MEDIUM = 'GPU';

// bigint only above 2^32: below it msgpack-js must see a number to pick the shortest encoding (as msgspec does),
// and with useBigInt64 it would write numbers from 2^32 up as floats.
const encoder = new Encoder({ useBigInt64: true });
const compactHash = (hash: bigint): number | bigint => (hash < 0x1_0000_0000n ? Number(hash) : hash);

function eventValue(event: VllmKvEvent, format: KvEventsFormat): unknown {
  switch (event.type) {
    case 'BlockStored': {
      const blockHashes = event.blockHashes.map(compactHash);
      const parent = event.parentBlockHash === null ? null : compactHash(event.parentBlockHash);
      const lora = event.lora ?? null;
      if (format === 'array') return ['BlockStored', blockHashes, parent, event.tokenIds, event.blockSize, lora?.id ?? null, MEDIUM];
      return {
        type: 'BlockStored',
        block_hashes: blockHashes,
        parent_block_hash: parent,
        token_ids: event.tokenIds,
        block_size: event.blockSize,
        lora_id: lora?.id ?? null,
        medium: MEDIUM,
        lora_name: lora?.name ?? null,
        // One per block: vLLM's extra keys tuple, here the adapter's name alone.
        extra_keys: blockHashes.map(() => (lora ? [lora.name] : null)),
        group_idx: 0,
        kv_cache_spec_kind: 'full_attention',
      };
    }
    case 'BlockRemoved': {
      const blockHashes = event.blockHashes.map(compactHash);
      return format === 'array' ? ['BlockRemoved', blockHashes, MEDIUM] : { type: 'BlockRemoved', block_hashes: blockHashes, medium: MEDIUM, group_idx: 0 };
    }
    case 'AllBlocksCleared':
      return format === 'array' ? ['AllBlocksCleared'] : { type: 'AllBlocksCleared' };
  }
}

/** msgspec's encoding of `KVEventBatch(ts, events, data_parallel_rank)` (array_like): `[ts: float64, events, rank]`. */
export function encodeKvEventBatch(tsSeconds: number, events: readonly VllmKvEvent[], dpRank: number, format: KvEventsFormat): Buffer {
  const body = encoder.encode(events.map((e) => eventValue(e, format)));
  const rank = encoder.encode(dpRank);
  const out = Buffer.allocUnsafe(1 + 9 + body.length + rank.length);
  out[0] = 0x93; // fixarray of 3
  out[1] = 0xcb; // float64 even when the timestamp happens to be whole, as Python's float is
  out.writeDoubleBE(tsSeconds, 2);
  out.set(body, 10);
  out.set(rank, 10 + body.length);
  return out;
}
