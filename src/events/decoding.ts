/**
 * Reading vLLM's KV event batches as a router subscribed to an engine does (vllm-wire-reference §5): the
 * batch `[ts, events, dp_rank]` (the oldest publishers send `[ts, events]`; one main-2026 copy a map), each
 * event a tagged array (vLLM ≤ 0.2x, with or without the later trailing fields) or a map with a `type`
 * field (vLLM PR #42892). Hashes arrive as u64 ints, as negative ints (old builtin `hash()`) or as raw
 * digests (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`); all become vLLM's u64 event form.
 */
import { Decoder } from '@msgpack/msgpack';
import type { VllmKvEvent } from '../engine/index.js';

export interface DecodedKvEventBatch {
  tsSeconds: number;
  /** The engine's device-tier events (see `decodeKvEvent`). */
  events: VllmKvEvent[];
  /** The publisher's data-parallel rank; null when the batch has none. */
  dataParallelRank: number | null;
}

/** A payload that is not a KV event batch; the message says what was wrong. */
export class KvEventDecodeError extends Error {}

// u64 hashes above 2^53 must stay exact.
const decoder = new Decoder({ useBigInt64: true });

type Fields = Record<string, unknown>;

const isFields = (value: unknown): value is Fields => value !== null && typeof value === 'object' && !Array.isArray(value) && !(value instanceof Uint8Array);

function fail(what: string, value: unknown): never {
  const shown = typeof value === 'bigint' ? `${value}n` : value instanceof Uint8Array ? `${value.length} bytes` : JSON.stringify(value);
  throw new KvEventDecodeError(`${what}, got ${shown}`);
}

/** vLLM's event form of a hash: the low 64 bits, unsigned (`int.from_bytes(digest, "big") & (2**64 - 1)` for a digest). */
function blockHash(value: unknown): bigint {
  if (typeof value === 'bigint') return BigInt.asUintN(64, value);
  if (typeof value === 'number' && Number.isSafeInteger(value)) return BigInt.asUintN(64, BigInt(value));
  if (value instanceof Uint8Array && value.length >= 8) return new DataView(value.buffer, value.byteOffset, value.byteLength).getBigUint64(value.length - 8);
  return fail('a block hash must be an integer or a digest', value);
}

function blockHashes(value: unknown): bigint[] {
  if (!Array.isArray(value)) fail('block_hashes must be an array', value);
  return value.map(blockHash);
}

function integer(name: string, value: unknown): number {
  if (typeof value === 'number' && Number.isSafeInteger(value)) return value;
  if (typeof value === 'bigint' && value >= 0n && value <= BigInt(Number.MAX_SAFE_INTEGER)) return Number(value);
  return fail(`${name} must be an integer`, value);
}

function tokenIds(value: unknown): number[] {
  if (!Array.isArray(value)) fail('token_ids must be an array', value);
  return value.map((t) => integer('a token id', t));
}

/** Only the device (GPU) cache is a router's prefix cache: offload tiers (CPU, disk) publish events of their own. */
const onDevice = (medium: unknown) => medium === undefined || medium === null || (typeof medium === 'string' && medium.toUpperCase() === 'GPU');

/**
 * One event in either layout; null for events a router of the device cache does not index (another
 * medium, an event type it does not know).
 */
export function decodeKvEvent(raw: unknown): VllmKvEvent | null {
  let fields: Fields;
  if (Array.isArray(raw)) {
    // Tagged array: [tag, fields in declaration order…]; trailing defaulted fields may be absent.
    const [type, ...rest] = raw as unknown[];
    if (type === 'BlockStored') {
      const [block_hashes, parent_block_hash, token_ids, block_size, , medium] = rest;
      fields = { type, block_hashes, parent_block_hash, token_ids, block_size, medium };
    } else if (type === 'BlockRemoved') {
      const [block_hashes, medium] = rest;
      fields = { type, block_hashes, medium };
    } else fields = { type };
  } else if (isFields(raw)) fields = raw;
  else return fail('an event must be a tagged array or a map', raw);

  switch (fields.type) {
    case 'BlockStored': {
      if (!onDevice(fields.medium)) return null;
      const parent = fields.parent_block_hash;
      return {
        type: 'BlockStored',
        blockHashes: blockHashes(fields.block_hashes),
        parentBlockHash: parent === null || parent === undefined ? null : blockHash(parent),
        tokenIds: tokenIds(fields.token_ids),
        blockSize: integer('block_size', fields.block_size),
      };
    }
    case 'BlockRemoved':
      return onDevice(fields.medium) ? { type: 'BlockRemoved', blockHashes: blockHashes(fields.block_hashes) } : null;
    case 'AllBlocksCleared':
      return { type: 'AllBlocksCleared' };
    default:
      if (typeof fields.type !== 'string') fail('an event needs its type tag', fields.type);
      return null;
  }
}

/** One ZMQ payload (the message's last frame). Throws `KvEventDecodeError` when it is not a batch. */
export function decodeKvEventBatch(payload: Uint8Array): DecodedKvEventBatch {
  let raw: unknown;
  try {
    raw = decoder.decode(payload);
  } catch (err) {
    throw new KvEventDecodeError(`not msgpack: ${(err as Error).message}`);
  }
  let ts: unknown;
  let events: unknown;
  let rank: unknown;
  if (Array.isArray(raw)) [ts, events, rank] = raw as unknown[];
  else if (isFields(raw)) ({ ts, events, data_parallel_rank: rank } = raw);
  else fail('a batch must be [ts, events, dp_rank] or a map', raw);
  if (typeof ts !== 'number') fail('the batch timestamp must be a number', ts);
  if (!Array.isArray(events)) fail('the batch events must be an array', events);
  return {
    tsSeconds: ts,
    events: events.map(decodeKvEvent).filter((e): e is VllmKvEvent => e !== null),
    dataParallelRank: rank === undefined || rank === null ? null : integer('data_parallel_rank', rank),
  };
}
