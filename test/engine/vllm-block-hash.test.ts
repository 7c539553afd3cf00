import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { cdeEncodeOptions, encode } from 'cbor2';
import { afterEach, describe, expect, it } from 'vitest';
import { blockHashChain, defaultHashSeed, eventBlockHash, hashBlockTokens, noneHash } from '../../src/engine/kv/vllmBlockHash.js';
import { prng } from '../support/prng.js';

// Oracles here never call the code under test: CBOR bytes are written by hand from RFC 8949 and hashed
// with node:crypto, the cbor2 package encodes the same values a second way, and a few digests come
// from Python's cbor2 running vLLM's own functions.

const sha256 = (bytes: Uint8Array): Buffer => createHash('sha256').update(bytes).digest();
const fromHex = (text: string): Buffer => Buffer.from(text.replace(/\s+/g, ''), 'hex');
const asciiHex = (text: string): string => Buffer.from(text, 'ascii').toString('hex');

/** Each token id at a CBOR width boundary, with its encoding written out by hand (RFC 8949 §3.1, major type 0). */
const TOKEN_CBOR: ReadonlyArray<readonly [number, string]> = [
  [0, '00'],
  [23, '17'], // largest value held in the initial byte
  [24, '1818'], // smallest one-byte argument
  [255, '18ff'],
  [256, '190100'], // smallest two-byte argument
  [65535, '19ffff'],
  [65536, '1a00010000'], // smallest four-byte argument
  [151645, '1a0002505d'], // Qwen <|im_end|>
  [4294967295, '1affffffff'], // 2^32 - 1
];

/** `count` token ids cycling through TOKEN_CBOR, and their CBOR items concatenated. */
function boundaryTokens(count: number): { ids: number[]; itemsHex: string } {
  const ids: number[] = [];
  let itemsHex = '';
  for (let i = 0; i < count; i++) {
    const [id, cbor] = TOKEN_CBOR[i % TOKEN_CBOR.length];
    ids.push(id);
    itemsHex += cbor;
  }
  return { ids, itemsHex };
}

/** Array heads (major type 4) by item count, by hand. */
const ARRAY_HEAD: Record<number, string> = {
  1: '81',
  16: '90',
  23: '97',
  24: '9818',
  64: '9840',
  255: '98ff',
  256: '990100',
  65535: '99ffff',
  65536: '9a00010000',
};

/** Hand-built CBOR of vLLM's `(parent_bytes, tuple(token_ids), None)`: array(3), bstr(32), array(n), null. */
function blockCbor(parent: Buffer, arrayHead: string, tokenItemsHex: string): Buffer {
  expect(parent.length).toBe(32);
  return fromHex('83' + '5820' + parent.toString('hex') + arrayHead + tokenItemsHex + 'f6');
}

/** NONE_HASH for the default seed, by hand: text string of 14 bytes is head 0x6e. */
const NONE_HASH_DEFAULT = sha256(fromHex('6e' + asciiHex('vllm-none-hash')));

describe('noneHash', () => {
  it('is sha256 of the CBOR text string of the seed', () => {
    expect(noneHash('vllm-none-hash')).toEqual(NONE_HASH_DEFAULT);
    expect(noneHash('0')).toEqual(sha256(fromHex('61' + '30')));
    expect(noneHash('')).toEqual(sha256(fromHex('60')));
    // 23 bytes still fit the initial byte; 24 and up take a one-byte length (0x78).
    expect(noneHash('a'.repeat(23))).toEqual(sha256(fromHex('77' + '61'.repeat(23))));
    expect(noneHash('a'.repeat(30))).toEqual(sha256(fromHex('781e' + '61'.repeat(30))));
    expect(noneHash('a'.repeat(300))).toEqual(sha256(fromHex('79012c' + '61'.repeat(300))));
    // Non-ASCII: the length counts UTF-8 bytes ("é" = c3 a9).
    expect(noneHash('é')).toEqual(sha256(fromHex('62c3a9')));
  });

  it('matches Python cbor2 running vLLM init_none_hash', () => {
    expect(noneHash('vllm-none-hash').toString('hex')).toBe('9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0');
    expect(noneHash('0').toString('hex')).toBe('4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e');
    expect(noneHash('12345').toString('hex')).toBe('7292412b7aee6c72390673c639cb26bbadd61da0cb7af52fea097bf4c7b340b2');
  });
});

describe('defaultHashSeed', () => {
  const original = process.env.PYTHONHASHSEED;
  afterEach(() => {
    if (original === undefined) delete process.env.PYTHONHASHSEED;
    else process.env.PYTHONHASHSEED = original;
  });

  it('is vLLM DEFAULT_NONE_HASH_SEED without PYTHONHASHSEED', () => {
    delete process.env.PYTHONHASHSEED;
    expect(defaultHashSeed()).toBe('vllm-none-hash');
  });

  it('is PYTHONHASHSEED when set, even when empty (vLLM tests `is not None`)', () => {
    process.env.PYTHONHASHSEED = '42';
    expect(defaultHashSeed()).toBe('42');
    process.env.PYTHONHASHSEED = '';
    expect(defaultHashSeed()).toBe('');
  });
});

describe('hashBlockTokens against hand-written CBOR', () => {
  const parent = fromHex('a5'.repeat(32));

  it.each(TOKEN_CBOR)('encodes token id %i minimally', (id, cbor) => {
    expect(hashBlockTokens(parent, NONE_HASH_DEFAULT, [id])).toEqual(sha256(blockCbor(parent, '81', cbor)));
  });

  it.each([1, 16, 23, 24, 64, 255, 256, 65535, 65536])('encodes a block of %i tokens with the right array head', (size) => {
    const { ids, itemsHex } = boundaryTokens(size);
    const expected = sha256(blockCbor(parent, ARRAY_HEAD[size], itemsHex));
    expect(hashBlockTokens(parent, NONE_HASH_DEFAULT, ids)).toEqual(expected);
    // The same ids in a typed array hash the same.
    expect(hashBlockTokens(parent, NONE_HASH_DEFAULT, Uint32Array.from(ids))).toEqual(expected);
  });

  it('uses NONE_HASH when the parent is null or empty (vLLM: `if not parent_block_hash`)', () => {
    const { ids, itemsHex } = boundaryTokens(16);
    const expected = sha256(blockCbor(NONE_HASH_DEFAULT, '90', itemsHex));
    expect(hashBlockTokens(null, NONE_HASH_DEFAULT, ids)).toEqual(expected);
    expect(hashBlockTokens(Buffer.alloc(0), NONE_HASH_DEFAULT, ids)).toEqual(expected);
    expect(hashBlockTokens(null, NONE_HASH_DEFAULT, ids, null)).toEqual(expected);
  });

  it('encodes extra keys as an array in place of null', () => {
    const { ids, itemsHex } = boundaryTokens(16);
    const prefix = '83' + '5820' + NONE_HASH_DEFAULT.toString('hex') + '90' + itemsHex;
    // ("my-lora",): array(1), text(7).
    expect(hashBlockTokens(null, NONE_HASH_DEFAULT, ids, ['my-lora'])).toEqual(sha256(fromHex(prefix + '81' + '67' + asciiHex('my-lora'))));
    // ("my-lora", ("mm-abc", -3), "salt", b"\x07" * 32): -3 is major type 1 with argument 2 (0x22).
    const digest = Buffer.alloc(32, 7);
    expect(hashBlockTokens(null, NONE_HASH_DEFAULT, ids, ['my-lora', ['mm-abc', -3], 'salt', digest])).toEqual(
      sha256(
        fromHex(prefix + '84' + '67' + asciiHex('my-lora') + '82' + '66' + asciiHex('mm-abc') + '22' + '64' + asciiHex('salt') + '5820' + '07'.repeat(32)),
      ),
    );
    // An empty tuple is an empty array, not null (vLLM itself passes None when there are no keys).
    expect(hashBlockTokens(null, NONE_HASH_DEFAULT, ids, [])).toEqual(sha256(fromHex(prefix + '80')));
    // Integers at the widths: 24 -> 1818, -25 -> 3818, 2^32 -> 1b 0000000100000000, true/false -> f5/f4, null -> f6.
    expect(hashBlockTokens(null, NONE_HASH_DEFAULT, ids, [24, -25, 2 ** 32, true, false, null])).toEqual(
      sha256(fromHex(prefix + '86' + '1818' + '3818' + '1b0000000100000000' + 'f5' + 'f4' + 'f6')),
    );
  });

  it('rejects values Python would not have encoded the same way', () => {
    for (const bad of [-1, 1.5, 2 ** 32, Number.NaN]) {
      expect(() => hashBlockTokens(null, NONE_HASH_DEFAULT, [1, bad])).toThrow(RangeError);
    }
    expect(() => hashBlockTokens(null, NONE_HASH_DEFAULT, [1], [0.5])).toThrow(TypeError);
    expect(() => hashBlockTokens(null, NONE_HASH_DEFAULT, [1], [{ a: 1 }])).toThrow(TypeError);
    expect(() => hashBlockTokens(null, NONE_HASH_DEFAULT, [1], ['\ud800'])).toThrow(TypeError);
    expect(() => hashBlockTokens(null, NONE_HASH_DEFAULT, [1], [1n << 64n])).toThrow(RangeError);
  });

  it('returns digests that later calls do not overwrite', () => {
    const first = hashBlockTokens(parent, NONE_HASH_DEFAULT, [1, 2, 3]);
    const copy = Buffer.from(first);
    hashBlockTokens(parent, NONE_HASH_DEFAULT, boundaryTokens(4096).ids);
    expect(first).toEqual(copy);
  });
});

describe('blockHashChain', () => {
  /** The chain built from hand-written CBOR: block 0's parent is NONE_HASH, block i's is block i-1's digest. */
  function handChain(ids: number[], itemsHex: string[], blockSize: number): Buffer[] {
    const out: Buffer[] = [];
    let parent = NONE_HASH_DEFAULT;
    for (let start = 0; start + blockSize <= ids.length; start += blockSize) {
      parent = sha256(blockCbor(parent, ARRAY_HEAD[blockSize], itemsHex.slice(start, start + blockSize).join('')));
      out.push(parent);
    }
    return out;
  }

  it.each([
    [16, 16 * 3 + 5, 3],
    [16, 16 * 4, 4],
    [64, 64 * 2 + 63, 2],
  ])('block size %i over %i tokens gives %i digests, partial tail unhashed', (blockSize, length, expectedBlocks) => {
    const ids: number[] = [];
    const itemsHex: string[] = [];
    for (let i = 0; i < length; i++) {
      const [id, cbor] = TOKEN_CBOR[(i * 5) % TOKEN_CBOR.length];
      ids.push(id);
      itemsHex.push(cbor);
    }
    const chain = blockHashChain(ids, blockSize, NONE_HASH_DEFAULT);
    expect(chain).toHaveLength(expectedBlocks);
    expect(chain).toEqual(handChain(ids, itemsHex, blockSize));
    // Filling the tail up to one short of a block changes nothing; one more token adds exactly one digest.
    const tailRoom = blockSize - 1 - (length % blockSize);
    const almostFull = ids.concat(new Array<number>(tailRoom).fill(7));
    expect(blockHashChain(almostFull, blockSize, NONE_HASH_DEFAULT)).toEqual(chain);
    const extended = blockHashChain(almostFull.concat([7]), blockSize, NONE_HASH_DEFAULT);
    expect(extended).toHaveLength(expectedBlocks + 1);
    expect(extended.slice(0, expectedBlocks)).toEqual(chain);
  });

  it('hashes nothing for fewer tokens than one block', () => {
    expect(blockHashChain([1, 2, 3], 16, NONE_HASH_DEFAULT)).toEqual([]);
    expect(blockHashChain([], 16, NONE_HASH_DEFAULT)).toEqual([]);
  });

  it('rejects a block size that is not a positive integer', () => {
    for (const bad of [0, -16, 1.5]) expect(() => blockHashChain([1], bad, NONE_HASH_DEFAULT)).toThrow(RangeError);
  });

  it('matches Python cbor2 running vLLM hash_block_tokens and maybe_convert_block_hash', () => {
    const ids = Array.from({ length: 40 }, (_, i) => (i * 7919 + 151643) % 152064);
    const chain = blockHashChain(ids, 16, noneHash('vllm-none-hash'));
    expect(chain.map((d) => d.toString('hex'))).toEqual([
      '7b799336e865d47b5d18b457d910ce9470232311e176b438d396d429f25b5014',
      'bfc9b95d0dc71026adac93529333aa81eafc220038de05dd603023257f270c0b',
    ]);
    expect(chain.map(eventBlockHash)).toEqual([15246606865134211092n, 6931078470477220875n]);
    const firstBlock = ids.slice(0, 16);
    expect(hashBlockTokens(null, NONE_HASH_DEFAULT, firstBlock, ['my-lora']).toString('hex')).toBe(
      '5fb55459cf58e9769158fa85b6787ee269eb609c09ccb9797a27a16e7243e086',
    );
    expect(hashBlockTokens(null, NONE_HASH_DEFAULT, firstBlock, ['my-lora', ['mm-abc', -3], 'salt', Buffer.alloc(32, 7)]).toString('hex')).toBe(
      '0df9301606b02513cd40bf05fa5fdf7527fdc5ae2a3b685b1cb45ac335be73e4',
    );
  });
});

describe('eventBlockHash', () => {
  it('is the last 8 digest bytes read big-endian, unsigned', () => {
    const counting = Buffer.from(Array.from({ length: 32 }, (_, i) => i)); // 00 01 … 1f
    expect(eventBlockHash(counting)).toBe(0x18191a1b1c1d1e1fn);
    expect(eventBlockHash(Buffer.alloc(32, 0xff))).toBe(18446744073709551615n);
    const highBitSet = Buffer.alloc(32);
    highBitSet[24] = 0x80;
    expect(eventBlockHash(highBitSet)).toBe(9223372036854775808n);
  });

  it('equals int.from_bytes(digest, "big") & (2**64 - 1) computed by hand', () => {
    const digest = fromHex('9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0');
    expect(eventBlockHash(digest)).toBe(BigInt('0x' + digest.toString('hex')) & ((1n << 64n) - 1n));
    expect(eventBlockHash(digest)).toBe(0x941b276b9581eef0n);
  });
});

describe('hashBlockTokens against the cbor2 package (second oracle)', () => {
  // cbor2 (JS) would encode a Node Buffer through its toJSON as a map, so oracle inputs use plain Uint8Arrays.
  const cborSha256 = (value: unknown): Buffer => sha256(encode(value, cdeEncodeOptions));

  it('agrees on 3000 random blocks across all token widths and array-head sizes', () => {
    const random = prng(0x5eed).next;
    const widthRanges: ReadonlyArray<readonly [number, number]> = [
      [0, 23],
      [24, 255],
      [256, 65535],
      [65536, 4294967295],
    ];
    const blockSizes = [1, 15, 16, 23, 24, 32, 64, 255, 256, 300];
    const randomToken = (): number => {
      const [low, high] = widthRanges[Math.floor(random() * widthRanges.length)];
      return low + Math.floor(random() * (high - low + 1));
    };
    const randomBytes = (length: number): Uint8Array => Uint8Array.from({ length }, () => Math.floor(random() * 256));
    const randomExtraKeys = (): unknown[] | null => {
      const pick = random();
      if (pick < 0.7) return null;
      if (pick < 0.8) return ['lora-' + Math.floor(random() * 1000)];
      if (pick < 0.9) return [['mm-' + Math.floor(random() * 1e6).toString(16), Math.floor(random() * 200) - 100], 'salt'];
      return [randomBytes(32), randomToken()];
    };

    for (let i = 0; i < 3000; i++) {
      const size = blockSizes[Math.floor(random() * blockSizes.length)];
      const tokens = Array.from({ length: size }, randomToken);
      const parent = random() < 0.2 ? null : randomBytes(32);
      const extraKeys = randomExtraKeys();
      const expected = cborSha256([parent ?? new Uint8Array(NONE_HASH_DEFAULT), tokens, extraKeys]);
      const actual = hashBlockTokens(parent ? Buffer.from(parent) : null, NONE_HASH_DEFAULT, tokens, extraKeys);
      expect(actual, `block ${i}`).toEqual(expected);
    }
  });

  it('agrees on NONE_HASH for random seeds', () => {
    const random = prng(7).next;
    for (let i = 0; i < 200; i++) {
      const seed = Array.from({ length: Math.floor(random() * 300) }, () => String.fromCharCode(32 + Math.floor(random() * 95))).join('');
      expect(noneHash(seed)).toEqual(cborSha256(seed));
    }
  });
});

describe('the kv-hashes oracle fixtures (Python hashlib + cbor2, as vLLM computes them)', () => {
  const rows = readFileSync(new URL('../fixtures/kv-hashes/vllm-block-hashes.jsonl', import.meta.url), 'utf8')
    .trim()
    .split('\n')
    .map(
      (l) =>
        JSON.parse(l) as {
          algo: string;
          seed: string;
          none_hash_hex: string;
          block_size: number;
          token_ids: number[];
          blocks: { hex: string; event_u64: string }[];
        },
    );
  const cbor = rows.filter((r) => r.algo === 'sha256_cbor');
  const pickle = rows.filter((r) => r.algo === 'sha256');

  it('covers every seed and block size of the fixture file', () => {
    expect(new Set(cbor.map((r) => `${r.seed}/${r.block_size}`))).toEqual(
      new Set(['0/16', '0/64', '42/16', '42/64', 'vllm-none-hash/16', 'vllm-none-hash/64']),
    );
  });

  it('reproduces NONE_HASH, every block digest and every event value for sha256_cbor', () => {
    for (const row of cbor) {
      const none = noneHash(row.seed);
      expect(none.toString('hex'), `seed ${row.seed}`).toBe(row.none_hash_hex);
      const chain = blockHashChain(row.token_ids, row.block_size, none);
      expect(chain.map((d) => d.toString('hex'))).toEqual(row.blocks.map((b) => b.hex));
      expect(chain.map((d) => eventBlockHash(d).toString())).toEqual(row.blocks.map((b) => b.event_u64));
    }
  });

  it("reproduces NONE_HASH, every block digest and every event value for sha256 (pickle, vLLM's default)", () => {
    expect(new Set(pickle.map((r) => `${r.seed}/${r.block_size}`)).size).toBe(6);
    for (const row of pickle) {
      const none = noneHash(row.seed, 'sha256');
      expect(none.toString('hex'), `seed ${row.seed}`).toBe(row.none_hash_hex);
      const chain = blockHashChain(row.token_ids, row.block_size, none, 'sha256');
      expect(chain.map((d) => d.toString('hex'))).toEqual(row.blocks.map((b) => b.hex));
      expect(chain.map((d) => eventBlockHash(d).toString())).toEqual(row.blocks.map((b) => b.event_u64));
    }
  });
});

describe("sha256 (pickle protocol 5) against bytes from Python's pickle.dumps", () => {
  // Hex printed by CPython 3 `pickle.dumps(value, protocol=5)`: PROTO 5, FRAME, opcodes, STOP.
  it('pickles the seed string', () => {
    expect(noneHash('0', 'sha256')).toEqual(sha256(fromHex('80059505000000000000008c0130942e')));
  });

  it('pickles (parent, tuple(tokens), None) at every int width, MARK…TUPLE for long tuples', () => {
    const parent = Buffer.alloc(32, 1);
    const expected = fromHex('80059544000000000000004320' + '01'.repeat(32) + '94284b014b024d2c014a701101004affffff7f8a05ffffffff004b0074944e87942e');
    expect(hashBlockTokens(parent, NONE_HASH_DEFAULT, [1, 2, 300, 70000, 2147483647, 4294967295, 0], null, 'sha256')).toEqual(sha256(expected));
  });

  it('uses TUPLE2 for a two-token block', () => {
    const parent = Buffer.alloc(32, 1);
    const expected = fromHex('8005952d000000000000004320' + '01'.repeat(32) + '944b014b0286944e87942e');
    expect(hashBlockTokens(parent, NONE_HASH_DEFAULT, [1, 2], null, 'sha256')).toEqual(sha256(expected));
  });

  it("pickles a LoRA name's extra keys tuple (vLLM's (lora_name,)) after the tokens", () => {
    const parent = Buffer.alloc(32, 1);
    // pickle.dumps((b"\x01" * 32, (1, 2), ("lora",)), protocol=5)
    const expected = fromHex('80059535000000000000004320' + '01'.repeat(32) + '944b014b0286948c046c6f726194859487942e');
    expect(hashBlockTokens(parent, NONE_HASH_DEFAULT, [1, 2], ['lora'], 'sha256')).toEqual(sha256(expected));
  });

  it('refuses extra keys other than strings, which only the CBOR path encodes', () => {
    expect(() => hashBlockTokens(null, NONE_HASH_DEFAULT, [1, 2], [7], 'sha256')).toThrow(TypeError);
  });
});
