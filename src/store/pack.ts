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

/** An exchange's event tables and generations, as encodings 2 and 3 keep them in one record. */
export interface ExchangeTables {
  eventEnds: number[];
  eventTimes: number[];
  eventTokens: number[];
  generations: Generation[];
}

/** Encoding 3's record: the tables and, unless the capture was redacted, the request and response bodies. */
export interface ExchangeRecord extends ExchangeTables {
  requestBody: Buffer | null;
  responseBody: Buffer | null;
}

/** Byte strings and varints appended in order, concatenated once. */
class RecordWriter {
  private readonly parts: Buffer[] = [];

  varint(value: number): void {
    this.parts.push(packVarints([value]));
  }

  /** `data` prefixed by its length. */
  bytes(data: Uint8Array): void {
    this.varint(data.length);
    this.parts.push(Buffer.from(data.buffer, data.byteOffset, data.byteLength));
  }

  concat(): Buffer {
    return Buffer.concat(this.parts);
  }
}

/** Reads what a RecordWriter wrote, failing on anything truncated or left over. */
class RecordReader {
  private at = 0;

  constructor(private readonly data: Buffer) {}

  varint(): number {
    let value = 0;
    let scale = 1;
    for (;;) {
      if (this.at >= this.data.length) throw new Error('truncated exchange record');
      const byte = this.data[this.at++];
      value += (byte & 0x7f) * scale;
      if (byte < 0x80) return value;
      scale *= 0x80;
    }
  }

  bytes(): Buffer {
    const length = this.varint();
    if (this.at + length > this.data.length) throw new Error('truncated exchange record');
    return this.data.subarray(this.at, (this.at += length));
  }

  end(): void {
    if (this.at !== this.data.length) throw new Error('exchange record has trailing bytes');
  }
}

/** How a record keeps a generation's chunk deltas: JSON (encoding 2, and any delta with a value that is not a string), or by column. */
const DELTAS_AS_JSON = 0;
const DELTAS_BY_COLUMN = 1;

/** A lone UTF-16 surrogate, which UTF-8 cannot carry (JSON can, escaped). */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/**
 * Chunk deltas whose values are all strings (nearly all: `{text}`, `{content}`, `{reasoning_content}`), by column:
 * the distinct key lists, then per delta its key list's index and each value's length, then every value's text
 * in one string. JSON.stringify of 256 small objects costs more than deflating the whole exchange's SSE bytes.
 */
function deltasRecord(deltas: readonly ChunkDelta[]): Buffer {
  const shapes: string[] = [];
  const shapeIndex = new Map<string, number>();
  const codes: number[] = [];
  let values = '';
  let previousKeys: string[] = [];
  let previousShape = -1;
  for (const delta of deltas) {
    const keys = Object.keys(delta);
    let shape = previousShape;
    if (shape < 0 || keys.length !== previousKeys.length || keys.some((k, i) => k !== previousKeys[i])) {
      const key = JSON.stringify(keys);
      shape = shapeIndex.get(key) ?? -1;
      if (shape < 0) {
        shape = shapes.push(key) - 1;
        shapeIndex.set(key, shape);
      }
    }
    codes.push(shape);
    for (const key of keys) {
      const value = delta[key];
      if (typeof value !== 'string') return deltasAsJson(deltas);
      codes.push(value.length);
      values += value;
    }
    previousKeys = keys;
    previousShape = shape;
  }
  if (LONE_SURROGATE.test(values)) return deltasAsJson(deltas);
  const out = new RecordWriter();
  out.bytes(Buffer.from(`[${shapes.join(',')}]`));
  out.bytes(packVarints(codes));
  out.bytes(Buffer.from(values));
  return Buffer.concat([Buffer.from([DELTAS_BY_COLUMN]), out.concat()]);
}

function deltasAsJson(deltas: readonly ChunkDelta[]): Buffer {
  return Buffer.concat([Buffer.from([DELTAS_AS_JSON]), Buffer.from(JSON.stringify(deltas))]);
}

function readDeltas(data: Buffer): ChunkDelta[] {
  if (data[0] === DELTAS_AS_JSON) return JSON.parse(data.toString('utf8', 1)) as ChunkDelta[];
  if (data[0] !== DELTAS_BY_COLUMN) throw new Error(`unknown chunk-delta encoding ${data[0]}`);
  const record = new RecordReader(data.subarray(1));
  const shapes = JSON.parse(record.bytes().toString('utf8')) as string[][];
  const codes = unpackVarints(record.bytes());
  const values = record.bytes().toString('utf8');
  record.end();
  const deltas: ChunkDelta[] = [];
  let at = 0;
  for (let c = 0; c < codes.length; ) {
    const keys = shapes[codes[c++]];
    if (!keys) throw new Error('chunk delta names a missing key list');
    const delta: ChunkDelta = {};
    for (const key of keys) delta[key] = values.slice(at, (at += codes[c++]));
    deltas.push(delta);
  }
  if (at !== values.length) throw new Error('chunk delta values do not add up');
  return deltas;
}

/** Bit 0 of an encoding-3 record's flags: the bodies are in it. */
const HAS_BODIES = 1;

/**
 * Encoding 3: an exchange's bodies, event tables and generations as one record, deflated once against the
 * prompt's `bodyDictionary` (each deflate call costs 10–20 µs whatever its size; encoding 2 made three). Fields in
 * order: flags (varint), then, with HAS_BODIES, request and response bodies; event ends (packDeltas), event times
 * (packTimes), event token counts (packDeltas), the number of generations, then per generation its choice index
 * (varint), output ids (packVarints), token times (tokenTimesRecord), chunk token counts (packVarints), chunk
 * deltas (deltasRecord) and `[text, finishReason, stopReason]` as JSON. Byte strings are prefixed by their length.
 */
export function packRecord(record: ExchangeRecord, dictionary: Buffer): Buffer {
  const out = new RecordWriter();
  const hasBodies = record.requestBody !== null && record.responseBody !== null;
  out.varint(hasBodies ? HAS_BODIES : 0);
  if (hasBodies) {
    out.bytes(record.requestBody as Buffer);
    out.bytes(record.responseBody as Buffer);
  }
  out.bytes(packDeltas(record.eventEnds));
  out.bytes(packTimes(record.eventTimes));
  out.bytes(packDeltas(record.eventTokens));
  out.varint(record.generations.length);
  for (const gen of record.generations) {
    out.varint(gen.choiceIndex);
    out.bytes(packVarints(gen.outputIds));
    out.bytes(tokenTimesRecord(gen.tokenTimes, record.eventTimes));
    out.bytes(packVarints(gen.chunkTokens));
    out.bytes(deltasRecord(gen.chunkDeltas));
    out.bytes(Buffer.from(JSON.stringify([gen.text, gen.finishReason, gen.stopReason])));
  }
  return squeeze(out.concat(), dictionary);
}

export function unpackRecord(blob: Uint8Array, dictionary: Buffer): ExchangeRecord {
  const record = new RecordReader(unsqueeze(blob, dictionary));
  const hasBodies = (record.varint() & HAS_BODIES) !== 0;
  const requestBody = hasBodies ? Buffer.from(record.bytes()) : null;
  const responseBody = hasBodies ? Buffer.from(record.bytes()) : null;
  return { requestBody, responseBody, ...readTables(record, 3) };
}

/** Encoding 2's record of event tables and generations (written by earlier versions; read as they wrote it). */
export function unpackTables(blob: Uint8Array): ExchangeTables {
  return readTables(new RecordReader(unsqueeze(blob)), 2);
}

/** The tables of an encoding-2 or -3 record, to its end: the two differ only in how chunk deltas are kept. */
function readTables(record: RecordReader, encoding: 2 | 3): ExchangeTables {
  const eventEnds = unpackDeltas(record.bytes());
  const eventTimes = unpackTimes(record.bytes());
  const eventTokens = unpackDeltas(record.bytes());
  const generations: Generation[] = [];
  for (let n = record.varint(); n > 0; n--) {
    const choiceIndex = record.varint();
    const outputIds = unpackVarints(record.bytes());
    const tokenTimes = readTokenTimes(record.bytes(), () => eventTimes);
    const chunkTokens = unpackVarints(record.bytes());
    let chunkDeltas: ChunkDelta[];
    let rest: [string, string | null, string | number | null];
    if (encoding === 2) {
      const [deltas, ...others] = JSON.parse(record.bytes().toString('utf8')) as [ChunkDelta[], string, string | null, string | number | null];
      chunkDeltas = deltas;
      rest = others;
    } else {
      chunkDeltas = readDeltas(record.bytes());
      rest = JSON.parse(record.bytes().toString('utf8')) as typeof rest;
    }
    const [text, finishReason, stopReason] = rest;
    generations.push({ choiceIndex, outputIds, tokenTimes, chunkTokens, chunkDeltas, text, finishReason, stopReason });
  }
  record.end();
  return { eventEnds, eventTimes, eventTokens, generations };
}
