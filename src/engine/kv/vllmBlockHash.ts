/**
 * vLLM V1 prefix-cache block hashes (spec: vllm-wire-reference.md §6, events §5), for
 * `--prefix-caching-hash-algo sha256_cbor` and `sha256` (vLLM's default).
 *
 * vLLM computes `sha256(cbor2.dumps((parent, tuple(token_ids), extra_keys), canonical=True))` or
 * `sha256(pickle.dumps(same tuple, protocol=5))`. The bytes are written here by hand into a reused scratch
 * buffer, because this runs for every full block of every request; test/engine/vllm-block-hash.test.ts checks
 * them against hand-written encodings, the cbor2 package's encoder and digests from Python itself.
 */
import { sha256 } from '../../util/sha256.js';

export type BlockHashAlgo = 'sha256' | 'sha256_cbor';

/** vLLM's DEFAULT_NONE_HASH_SEED, used by sha256-family algorithms when PYTHONHASHSEED is unset. */
const DEFAULT_NONE_HASH_SEED = 'vllm-none-hash';

// CBOR major types (RFC 8949 §3.1), already shifted into the top three bits of the initial byte.
const MAJOR_UNSIGNED = 0x00;
const MAJOR_NEGATIVE = 0x20;
const MAJOR_BYTES = 0x40;
const MAJOR_TEXT = 0x60;
const MAJOR_ARRAY = 0x80;
const CBOR_FALSE = 0xf4;
const CBOR_TRUE = 0xf5;
const CBOR_NULL = 0xf6;

const UINT64_MAX = (1n << 64n) - 1n;
// Python's cbor2 switches to bignum tags outside [-2^64, 2^64-1]; extra keys never need that.
const NEGATIVE_INT_MIN = -(1n << 64n);

/** Reused encode buffer; grown on demand. Single-threaded, and never escapes a call. */
let scratch = Buffer.allocUnsafe(1024);

function ensureScratch(bytes: number): Buffer {
  if (scratch.length < bytes) scratch = Buffer.allocUnsafe(Math.max(bytes, scratch.length * 2));
  return scratch;
}

/** Writes a CBOR head (major type + argument, shortest form) for an argument below 2^32. Returns the new offset. */
function writeHead(buf: Buffer, offset: number, major: number, argument: number): number {
  if (argument < 24) {
    buf[offset] = major | argument;
    return offset + 1;
  }
  if (argument < 0x100) {
    buf[offset] = major | 24;
    buf[offset + 1] = argument;
    return offset + 2;
  }
  if (argument < 0x10000) {
    buf[offset] = major | 25;
    buf[offset + 1] = argument >>> 8;
    buf[offset + 2] = argument & 0xff;
    return offset + 3;
  }
  buf[offset] = major | 26;
  buf.writeUInt32BE(argument, offset + 1);
  return offset + 5;
}

/** A Python `str`'s UTF-8 bytes. */
function pythonUtf8(text: string): Buffer {
  // Python cannot even hold a string with a lone surrogate as UTF-8; Buffer.from would silently replace it.
  if (/\p{Surrogate}/u.test(text)) throw new TypeError('vLLM block hash: string contains a lone surrogate');
  return Buffer.from(text, 'utf8');
}

/** The CBOR text string for `text` (Python `str`): UTF-8, definite length. */
function encodeText(text: string): Buffer {
  const utf8 = pythonUtf8(text);
  const head = Buffer.allocUnsafe(5);
  const headLength = writeHead(head, 0, MAJOR_TEXT, utf8.length);
  return Buffer.concat([head.subarray(0, headLength), utf8]);
}

/** CBOR head for an integer argument up to 2^64-1 (bigint path, only for extra keys). */
function encodeBigHead(major: number, argument: bigint): Buffer {
  if (argument < 0x1_0000_0000n) {
    const head = Buffer.allocUnsafe(5);
    return head.subarray(0, writeHead(head, 0, major, Number(argument)));
  }
  const head = Buffer.allocUnsafe(9);
  head[0] = major | 27;
  head.writeBigUInt64BE(argument, 1);
  return head;
}

function encodeInteger(value: bigint): Buffer {
  if (value > UINT64_MAX || value < NEGATIVE_INT_MIN) {
    throw new RangeError(`vLLM block hash: integer ${value} is outside the CBOR 64-bit range`);
  }
  return value >= 0n ? encodeBigHead(MAJOR_UNSIGNED, value) : encodeBigHead(MAJOR_NEGATIVE, -1n - value);
}

/**
 * Canonical CBOR for one extra-key value, as Python cbor2 would encode the value vLLM builds:
 * str (LoRA name, cache_salt, multimodal identifier), int (multimodal offset, may be negative),
 * bytes (prompt-embeds digest), tuple (multimodal pair), None, bool.
 * Floats and maps are rejected: a JS number cannot say whether Python held 1 or 1.0, and Python's map
 * key order is not something vLLM's keys rely on.
 */
function encodeExtraValue(value: unknown, out: Buffer[]): void {
  if (value === null) out.push(Buffer.of(CBOR_NULL));
  else if (value === false) out.push(Buffer.of(CBOR_FALSE));
  else if (value === true) out.push(Buffer.of(CBOR_TRUE));
  else if (typeof value === 'string') out.push(encodeText(value));
  else if (typeof value === 'bigint') out.push(encodeInteger(value));
  else if (typeof value === 'number') {
    if (!Number.isSafeInteger(value)) throw new TypeError(`vLLM block hash: extra key ${value} is not a safe integer`);
    out.push(encodeInteger(BigInt(value)));
  } else if (value instanceof Uint8Array) {
    out.push(encodeBigHead(MAJOR_BYTES, BigInt(value.length)), Buffer.from(value.buffer, value.byteOffset, value.length));
  } else if (Array.isArray(value)) {
    out.push(encodeBigHead(MAJOR_ARRAY, BigInt(value.length)));
    for (const item of value as readonly unknown[]) encodeExtraValue(item, out);
  } else {
    throw new TypeError(`vLLM block hash: unsupported extra key type ${typeof value}`);
  }
}

/** Encodes `[parent, [tokens…], extra]` as canonical CBOR into the scratch buffer and hashes it. */
function cborBlockDigest(parent: Buffer, tokenIds: ArrayLike<number>, start: number, count: number, extraKeys: readonly unknown[] | null | undefined): Buffer {
  let extraBytes: Buffer | null = null;
  if (extraKeys != null) {
    const parts: Buffer[] = [];
    encodeExtraValue(extraKeys, parts);
    extraBytes = Buffer.concat(parts);
  }
  // Worst case: outer head 1, parent head 5 + bytes, tokens head 5 + 5 per token, extras (or null).
  const buf = ensureScratch(1 + 5 + parent.length + 5 + 5 * count + (extraBytes ? extraBytes.length : 1));

  buf[0] = MAJOR_ARRAY | 3;
  let offset = writeHead(buf, 1, MAJOR_BYTES, parent.length);
  offset += parent.copy(buf, offset);
  offset = writeHead(buf, offset, MAJOR_ARRAY, count);
  const end = start + count;
  for (let i = start; i < end; i++) {
    const token = tokenIds[i];
    // `>>> 0` round-trips only integers in [0, 2^32-1]: rejects negatives, fractions, NaN and larger ids.
    if (token >>> 0 !== token) throw new RangeError(`vLLM block hash: token id ${token} is not a uint32`);
    if (token < 24) buf[offset++] = token;
    else if (token < 0x100) {
      buf[offset++] = 24;
      buf[offset++] = token;
    } else if (token < 0x10000) {
      buf[offset++] = 25;
      buf[offset++] = token >>> 8;
      buf[offset++] = token & 0xff;
    } else {
      buf[offset++] = 26;
      buf[offset++] = token >>> 24;
      buf[offset++] = (token >>> 16) & 0xff;
      buf[offset++] = (token >>> 8) & 0xff;
      buf[offset++] = token & 0xff;
    }
  }
  if (extraBytes) offset += extraBytes.copy(buf, offset);
  else buf[offset++] = CBOR_NULL;
  return sha256(buf.subarray(0, offset));
}

// Pickle protocol 5 opcodes (CPython Lib/pickletools.py) for the values vLLM hashes.
const PICKLE_PROTO = 0x80;
const PICKLE_FRAME = 0x95;
const PICKLE_SHORT_BINBYTES = 0x43;
const PICKLE_SHORT_BINUNICODE = 0x8c;
const PICKLE_BINUNICODE = 0x58;
const PICKLE_MEMOIZE = 0x94;
const PICKLE_MARK = 0x28;
const PICKLE_TUPLE = 0x74;
const PICKLE_TUPLE1 = 0x85;
const PICKLE_EMPTY_TUPLE = 0x29;
const PICKLE_BININT1 = 0x4b;
const PICKLE_BININT2 = 0x4d;
const PICKLE_BININT = 0x4a;
const PICKLE_LONG1 = 0x8a;
const PICKLE_NONE = 0x4e;
const PICKLE_STOP = 0x2e;
/** PROTO 5, then FRAME with its 8-byte length: the pickle body starts here. */
const PICKLE_BODY = 11;

/** Writes PROTO and the FRAME header for a body that ends at `end`; returns the whole pickle. */
function finishPickle(buf: Buffer, end: number): Buffer {
  buf[0] = PICKLE_PROTO;
  buf[1] = 5;
  buf[2] = PICKLE_FRAME;
  buf.writeBigUInt64LE(BigInt(end - PICKLE_BODY), 3);
  return buf.subarray(0, end);
}

/** A pickled `str` (SHORT_BINUNICODE or BINUNICODE, then MEMOIZE) written at `offset`; returns the new offset. */
function writePickledText(buf: Buffer, offset: number, utf8: Buffer): number {
  if (utf8.length <= 0xff) {
    buf[offset++] = PICKLE_SHORT_BINUNICODE;
    buf[offset++] = utf8.length;
  } else {
    buf[offset++] = PICKLE_BINUNICODE;
    offset = buf.writeUInt32LE(utf8.length, offset);
  }
  offset += utf8.copy(buf, offset);
  buf[offset++] = PICKLE_MEMOIZE;
  return offset;
}

/**
 * `pickle.dumps((parent, tuple(tokens), extra), protocol=5)` into the scratch buffer, hashed (vLLM `sha256`);
 * `extra` is None or a tuple of strings (a LoRA name: the only extra key the simulator produces).
 */
function pickleBlockDigest(
  parent: Buffer,
  tokenIds: ArrayLike<number>,
  start: number,
  count: number,
  extraKeys: readonly unknown[] | null | undefined,
): Buffer {
  if (parent.length > 0xff) throw new RangeError(`vLLM block hash: parent hash of ${parent.length} bytes`);
  const extras = extraKeys?.map((key) => {
    if (typeof key !== 'string') throw new TypeError('vLLM block hash: with sha256 (pickle) only string extra keys are supported');
    return pythonUtf8(key);
  });
  // Equal strings would be one memoized object to Python only if they were the same object: not a case vLLM makes.
  if (extras && new Set(extraKeys).size !== extras.length) throw new TypeError('vLLM block hash: repeated extra keys');
  const extrasBytes = extras ? extras.reduce((n, utf8) => n + 6 + utf8.length, 3) : 0;
  const buf = ensureScratch(PICKLE_BODY + 3 + parent.length + 2 + 6 * count + 5 + extrasBytes);
  let offset = PICKLE_BODY;
  buf[offset++] = PICKLE_SHORT_BINBYTES;
  buf[offset++] = parent.length;
  offset += parent.copy(buf, offset);
  buf[offset++] = PICKLE_MEMOIZE;
  if (count > 3) buf[offset++] = PICKLE_MARK;
  const end = start + count;
  for (let i = start; i < end; i++) {
    const token = tokenIds[i];
    if (token >>> 0 !== token) throw new RangeError(`vLLM block hash: token id ${token} is not a uint32`);
    if (token < 0x100) {
      buf[offset++] = PICKLE_BININT1;
      buf[offset++] = token;
    } else if (token < 0x10000) {
      buf[offset++] = PICKLE_BININT2;
      offset = buf.writeUInt16LE(token, offset);
    } else if (token < 0x80000000) {
      buf[offset++] = PICKLE_BININT;
      offset = buf.writeInt32LE(token, offset);
    } else {
      // Python's minimal two's complement: a uint32 with the top bit set needs a fifth, zero byte.
      buf[offset++] = PICKLE_LONG1;
      buf[offset++] = 5;
      offset = buf.writeUInt32LE(token, offset);
      buf[offset++] = 0;
    }
  }
  // TUPLE1/2/3 for short tuples, MARK … TUPLE otherwise; tuples are memoized, the empty one is not.
  if (count === 0) buf[offset++] = PICKLE_EMPTY_TUPLE;
  else {
    buf[offset++] = count > 3 ? PICKLE_TUPLE : PICKLE_TUPLE1 + count - 1;
    buf[offset++] = PICKLE_MEMOIZE;
  }
  if (!extras) buf[offset++] = PICKLE_NONE;
  else if (extras.length === 0) buf[offset++] = PICKLE_EMPTY_TUPLE;
  else {
    if (extras.length > 3) buf[offset++] = PICKLE_MARK;
    for (const utf8 of extras) offset = writePickledText(buf, offset, utf8);
    buf[offset++] = extras.length > 3 ? PICKLE_TUPLE : PICKLE_TUPLE1 + extras.length - 1;
    buf[offset++] = PICKLE_MEMOIZE;
  }
  buf[offset++] = PICKLE_TUPLE1 + 2;
  buf[offset++] = PICKLE_MEMOIZE;
  buf[offset++] = PICKLE_STOP;
  return sha256(finishPickle(buf, offset));
}

/** `pickle.dumps(text, protocol=5)`. */
function pickleText(text: string): Buffer {
  const bytes = pythonUtf8(text);
  const buf = Buffer.allocUnsafe(PICKLE_BODY + 5 + bytes.length + 2);
  let offset = writePickledText(buf, PICKLE_BODY, bytes);
  buf[offset++] = PICKLE_STOP;
  return finishPickle(buf, offset);
}

function hashBlockRange(
  algo: BlockHashAlgo,
  parent: Buffer,
  tokenIds: ArrayLike<number>,
  start: number,
  count: number,
  extraKeys: readonly unknown[] | null | undefined,
): Buffer {
  if (algo === 'sha256_cbor') return cborBlockDigest(parent, tokenIds, start, count, extraKeys);
  return pickleBlockDigest(parent, tokenIds, start, count, extraKeys);
}

/** NONE_HASH for a seed string (vLLM init_none_hash: the algorithm applied to the seed string). */
export function noneHash(seed: string, algo: BlockHashAlgo = 'sha256_cbor'): Buffer {
  return sha256(algo === 'sha256_cbor' ? encodeText(seed) : pickleText(seed));
}

/** The seed vLLM would use: process.env.PYTHONHASHSEED, else "vllm-none-hash". */
export function defaultHashSeed(): string {
  // vLLM tests `is not None`, so an empty PYTHONHASHSEED is used as the seed "" too.
  return process.env.PYTHONHASHSEED ?? DEFAULT_NONE_HASH_SEED;
}

/** vLLM hash_block_tokens: 32-byte digest of (parent (or noneHash), tuple(token ids), extraKeys ?? None). */
export function hashBlockTokens(
  parent: Buffer | null,
  noneHash: Buffer,
  tokenIds: ArrayLike<number>,
  extraKeys?: readonly unknown[] | null,
  algo: BlockHashAlgo = 'sha256_cbor',
): Buffer {
  // vLLM: `if not parent_block_hash: parent_block_hash = NONE_HASH`, so empty bytes count as "no parent".
  const effectiveParent = parent && parent.length > 0 ? parent : noneHash;
  return hashBlockRange(algo, effectiveParent, tokenIds, 0, tokenIds.length, extraKeys);
}

/** The chain over all full blocks of `tokenIds` (block size `blockSize`), digests in order; a trailing partial block is not hashed. */
export function blockHashChain(tokenIds: ArrayLike<number>, blockSize: number, noneHash: Buffer, algo: BlockHashAlgo = 'sha256_cbor'): Buffer[] {
  if (!Number.isInteger(blockSize) || blockSize <= 0) throw new RangeError(`vLLM block hash: bad block size ${blockSize}`);
  const fullBlocks = Math.floor(tokenIds.length / blockSize);
  const digests = new Array<Buffer>(fullBlocks);
  let parent = noneHash;
  for (let block = 0; block < fullBlocks; block++) {
    parent = hashBlockRange(algo, parent, tokenIds, block * blockSize, blockSize, null);
    digests[block] = parent;
  }
  return digests;
}

/** The form used in KV events (vLLM's conversion of a digest to an int), as a bigint. */
export function eventBlockHash(digest: Buffer): bigint {
  // maybe_convert_block_hash: int.from_bytes(digest, "big") & (2**64 - 1), i.e. the last 8 bytes, big-endian, unsigned.
  if (digest.length >= 8) return digest.readBigUInt64BE(digest.length - 8);
  let value = 0n;
  for (const byte of digest) value = (value << 8n) | BigInt(byte);
  return value;
}
