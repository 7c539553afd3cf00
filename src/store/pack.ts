/** Packed binary encodings for token ids and timings: format 0's raw little-endian arrays, format 1's compact ones. */
import { deflateRawSync, inflateRawSync } from 'node:zlib';
import type { ChunkDelta, Generation } from './captureStore.js';

export function packU32(values: ArrayLike<number>): Buffer {
  // The constructor, not Uint32Array.from: from() walks a JS array through the iterator protocol (5 µs for 1,000 ids).
  const arr = new Uint32Array(values);
  return Buffer.from(arr.buffer, arr.byteOffset, arr.byteLength);
}

export function unpackU32(buf: Buffer | Uint8Array | null | undefined): number[] {
  if (!buf || buf.byteLength === 0) return [];
  // Copy: SQLite buffers are not guaranteed to be 4-byte aligned.
  const copy = new Uint8Array(buf);
  return Array.from(new Uint32Array(copy.buffer, 0, copy.byteLength >>> 2));
}

export function packF64(values: ArrayLike<number>): Buffer {
  const arr = Float64Array.from(values as ArrayLike<number>);
  return Buffer.from(arr.buffer, arr.byteOffset, arr.byteLength);
}

export function unpackF64(buf: Buffer | Uint8Array | null | undefined): number[] {
  if (!buf || buf.byteLength === 0) return [];
  const copy = new Uint8Array(buf);
  return Array.from(new Float64Array(copy.buffer, 0, copy.byteLength >>> 3));
}

/*
 * The compact encodings of capture-file format 1 (`exchanges.encoding = 1`, see schema.ts). Token ids as LEB128
 * varints (a 151k vocabulary takes 3 bytes an id where u32 takes 4; random ids do not deflate further), counts and
 * offsets as varint deltas, times as byte planes, and every blob through `squeeze`, which deflates when that is
 * smaller. Any change here is a new encoding number: files written with this one must stay readable.
 */

const TWO_32 = 2 ** 32;

/** Writes `value` (an integer in [0, 2^53)) at `at` as an unsigned LEB128 varint; returns the position after it. */
function writeVarint(out: Buffer, at: number, value: number): number {
  if (value < 0x80000000) {
    while (value >= 0x80) {
      out[at++] = (value & 0x7f) | 0x80;
      value >>>= 7;
    }
  } else {
    // Arithmetic, not bit operators: zigzagged deltas of u32 values reach 2^33.
    while (value >= 0x80) {
      out[at++] = (value % 0x80) | 0x80;
      value = Math.floor(value / 0x80);
    }
  }
  out[at++] = value;
  return at;
}

/** Room for `count` varints of values below 2^35. */
const varintRoom = (count: number) => Buffer.allocUnsafe(count * 5);

/** Calls `each` with every varint of `buf`, in order. */
function readVarints(buf: Uint8Array, each: (value: number) => void): void {
  let value = 0;
  let scale = 1;
  for (let i = 0; i < buf.length; i++) {
    const byte = buf[i];
    value += (byte & 0x7f) * scale;
    if (byte < 0x80) {
      each(value);
      value = 0;
      scale = 1;
    } else scale *= 0x80;
  }
  if (scale !== 1) throw new Error('truncated varint');
}

/** Token ids (u32 each) as varints. */
export function packVarints(ids: ArrayLike<number>): Buffer {
  const out = varintRoom(ids.length);
  let at = 0;
  for (let i = 0; i < ids.length; i++) at = writeVarint(out, at, ids[i]);
  return out.subarray(0, at);
}

export function unpackVarints(buf: Uint8Array): number[] {
  const out: number[] = [];
  readVarints(buf, (v) => out.push(v));
  return out;
}

/** u32 values that mostly grow (byte offsets, cumulative counts): zigzagged differences as varints. */
export function packDeltas(values: ArrayLike<number>): Buffer {
  const out = varintRoom(values.length);
  let at = 0;
  let prev = 0;
  for (let i = 0; i < values.length; i++) {
    const delta = values[i] - prev;
    at = writeVarint(out, at, delta >= 0 ? delta * 2 : -delta * 2 - 1);
    prev = values[i];
  }
  return out.subarray(0, at);
}

export function unpackDeltas(buf: Uint8Array): number[] {
  const out: number[] = [];
  let prev = 0;
  readVarints(buf, (z) => out.push((prev += z % 2 === 0 ? z / 2 : -(z + 1) / 2)));
  // A wrong delta would silently yield ids outside u32: the data is corrupt, say so.
  if (out.some((v) => v < 0 || v >= TWO_32)) throw new Error('delta-packed values out of range');
  return out;
}

/**
 * f64 values as byte planes (every value's most significant byte, then the next…): times of one exchange share
 * sign, exponent and high mantissa bits, which then sit side by side for `squeeze` to deflate. Lossless.
 */
export function packTimes(values: ArrayLike<number>): Buffer {
  const n = values.length;
  const bytes = new Uint8Array(Float64Array.from(values as ArrayLike<number>).buffer);
  const planes = Buffer.allocUnsafe(n * 8);
  for (let i = 0; i < n; i++) for (let b = 0; b < 8; b++) planes[b * n + i] = bytes[i * 8 + 7 - b];
  return planes;
}

export function unpackTimes(planes: Uint8Array): number[] {
  const n = planes.length >>> 3;
  const bytes = new Uint8Array(n * 8);
  for (let i = 0; i < n; i++) for (let b = 0; b < 8; b++) bytes[i * 8 + 7 - b] = planes[b * n + i];
  return Array.from(new Float64Array(bytes.buffer));
}

const STORED = 0;
const DEFLATED = 1;
const TAG_STORED = Buffer.from([STORED]);
const TAG_DEFLATED = Buffer.from([DEFLATED]);
/**
 * Level 3: as small as 6 on SSE bodies (measured: 2,103 vs 2,058 bytes of a 78 KB stream) at a third of the time.
 * zlib's default memLevel (8): 9 compresses no smaller and its larger tables cost ~45 µs a call to set up.
 */
const DEFLATE = { level: 3 };

/**
 * `data` tagged by its first byte: deflated (raw, with `dictionary` when given) if that is smaller, else stored.
 * The same dictionary must be given to `unsqueeze`.
 */
export function squeeze(data: Uint8Array, dictionary?: Buffer): Buffer {
  if (data.length > 16) {
    const deflated = deflateRawSync(data, dictionary ? { ...DEFLATE, dictionary } : DEFLATE);
    if (deflated.length < data.length) return Buffer.concat([TAG_DEFLATED, deflated]);
  }
  return Buffer.concat([TAG_STORED, data]);
}

export function unsqueeze(blob: Uint8Array, dictionary?: Buffer): Buffer {
  const body = Buffer.from(blob.buffer, blob.byteOffset + 1, blob.byteLength - 1);
  switch (blob[0]) {
    case STORED:
      return Buffer.from(body);
    case DEFLATED:
      return inflateRawSync(body, dictionary ? { dictionary } : {});
    default:
      throw new Error(`unknown blob encoding ${blob[0]}`);
  }
}

/**
 * What HTTP bodies of one exchange are deflated against: the JSON vLLM streams around every chunk, then the
 * prompt's ids as JSON lists them (`"prompt_token_ids":[…]` of a response with return_token_ids, or a prompt sent
 * as ids), last, where deflate's back-references to it are shortest. Rebuilt from the stored prompt ids to read.
 */
export function bodyDictionary(promptIds: ArrayLike<number> | null): Buffer {
  if (!promptIds || promptIds.length === 0) return BODY_PREAMBLE;
  // Digits written in place with int32 arithmetic: joining into a string first costs twice as much (measured).
  const out = Buffer.allocUnsafe(BODY_PREAMBLE.length + promptIds.length * 11);
  let at = BODY_PREAMBLE.copy(out);
  for (let i = 0; i < promptIds.length; i++) {
    if (i > 0) out[at++] = 0x2c; // ','
    const value = promptIds[i];
    if (value > 0x7fffffff) {
      at += out.write(String(value), at, 'latin1');
      continue;
    }
    let id = value | 0;
    let end = at + 1;
    for (let bound = 10; id >= bound && bound <= 1e9; bound *= 10) end++;
    at = end;
    do {
      out[--end] = 0x30 + (id % 10);
      id = (id / 10) | 0;
    } while (id > 0);
  }
  return out.subarray(0, at);
}

const BODY_PREAMBLE = Buffer.from(
  'data: {"id":"chatcmpl-","object":"chat.completion.chunk","created":,"model":"","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null,"stop_reason":null,"token_ids":[]}],"usage":null}\n\n' +
    'data: {"id":"cmpl-","object":"text_completion","created":,"model":"","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"stop","stop_reason":null,"prompt_token_ids":[',
);

const TIMES_AS_PLANES = 0;
const TIMES_AS_EVENTS = 1;

/**
 * A choice's token times: each is the arrival time of the SSE event that carried the token, so they are stored as
 * indices into `eventTimes` (non-decreasing: varint deltas, mostly 0 and 1) when every one of them is found there,
 * else as `packTimes`. Tagged by the first byte.
 */
function tokenTimesRecord(tokenTimes: ArrayLike<number>, eventTimes: ArrayLike<number>): Buffer {
  const indices: number[] = [];
  let event = 0;
  for (let i = 0; i < tokenTimes.length && indices.length === i; i++) {
    // Tokens arrive in event order: search forward from the previous token's event (its own included).
    for (let e = event; e < eventTimes.length; e++) {
      if (Object.is(eventTimes[e], tokenTimes[i])) {
        indices.push((event = e));
        break;
      }
    }
  }
  if (indices.length === tokenTimes.length) return Buffer.concat([Buffer.from([TIMES_AS_EVENTS]), packDeltas(indices)]);
  return Buffer.concat([Buffer.from([TIMES_AS_PLANES]), packTimes(tokenTimes)]);
}

function readTokenTimes(data: Buffer, eventTimes: () => number[]): number[] {
  const rest = data.subarray(1);
  if (data[0] === TIMES_AS_PLANES) return unpackTimes(rest);
  if (data[0] !== TIMES_AS_EVENTS) throw new Error(`unknown token-time encoding ${data[0]}`);
  const events = eventTimes();
  return unpackDeltas(rest).map((e) => {
    if (e >= events.length) throw new Error('token time refers to a missing event');
    return events[e];
  });
}

/** Encoding 1's token times (a column of their own). */
export function unpackTokenTimes(blob: Uint8Array, eventTimes: () => number[]): number[] {
  return readTokenTimes(unsqueeze(blob), eventTimes);
}

/** What encoding 2 keeps in one record: an exchange's event tables and its generations. */
export interface ExchangeTables {
  eventEnds: number[];
  eventTimes: number[];
  eventTokens: number[];
  generations: Generation[];
}

/**
 * Encoding 2: the event tables and generations of an exchange as one record, `squeeze`d once — each deflate call
 * costs ~10 µs whatever its size, and encoding 1 made eight of them. Fields in order, each byte string prefixed by
 * its length (varint): event ends (packDeltas), event times (packTimes), event token counts (packDeltas), the
 * number of generations, then per generation its choice index (varint), output ids (packVarints), token times
 * (as encoding 1 tags them), chunk token counts (packVarints) and `[chunkDeltas, text, finishReason, stopReason]`
 * as JSON.
 */
export function packTables(tables: ExchangeTables): Buffer {
  const parts: Buffer[] = [];
  const add = (data: Buffer) => parts.push(packVarints([data.length]), data);
  add(packDeltas(tables.eventEnds));
  add(packTimes(tables.eventTimes));
  add(packDeltas(tables.eventTokens));
  parts.push(packVarints([tables.generations.length]));
  for (const gen of tables.generations) {
    parts.push(packVarints([gen.choiceIndex]));
    add(packVarints(gen.outputIds));
    add(tokenTimesRecord(gen.tokenTimes, tables.eventTimes));
    add(packVarints(gen.chunkTokens));
    add(Buffer.from(JSON.stringify([gen.chunkDeltas, gen.text, gen.finishReason, gen.stopReason])));
  }
  return squeeze(Buffer.concat(parts));
}

export function unpackTables(blob: Uint8Array): ExchangeTables {
  const data = unsqueeze(blob);
  let at = 0;
  const varint = () => {
    let value = 0;
    let scale = 1;
    for (;;) {
      if (at >= data.length) throw new Error('truncated exchange record');
      const byte = data[at++];
      value += (byte & 0x7f) * scale;
      if (byte < 0x80) return value;
      scale *= 0x80;
    }
  };
  const bytes = () => {
    const length = varint();
    if (at + length > data.length) throw new Error('truncated exchange record');
    return data.subarray(at, (at += length));
  };
  const eventEnds = unpackDeltas(bytes());
  const eventTimes = unpackTimes(bytes());
  const eventTokens = unpackDeltas(bytes());
  const generations: Generation[] = [];
  for (let n = varint(); n > 0; n--) {
    const choiceIndex = varint();
    const outputIds = unpackVarints(bytes());
    const tokenTimes = readTokenTimes(bytes(), () => eventTimes);
    const chunkTokens = unpackVarints(bytes());
    const [chunkDeltas, text, finishReason, stopReason] = JSON.parse(bytes().toString('utf8')) as [ChunkDelta[], string, string | null, string | number | null];
    generations.push({ choiceIndex, outputIds, tokenTimes, chunkTokens, chunkDeltas, text, finishReason, stopReason });
  }
  if (at !== data.length) throw new Error('exchange record has trailing bytes');
  return { eventEnds, eventTimes, eventTokens, generations };
}
