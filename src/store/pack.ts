/** Packed binary encodings for token ids and timings: format 0's raw little-endian arrays, format 1's compact ones. */
import { brotliCompressSync, brotliDecompressSync, inflateRawSync, constants as zlibConstants } from 'node:zlib';
import type { ChunkDelta, Generation } from './generation.js';

/**
 * Writes `values` as u32 into `into` from its start. A loop: Uint32Array.from walks a JS array through the iterator
 * protocol, and the constructor and `set` copy an array of tagged values (a holey one, as native bindings make)
 * element by element through V8's runtime, 40 µs for 1,000 ids where this loop takes 3.
 */
export function writeU32(values: ArrayLike<number>, into: Uint32Array): void {
  for (let i = 0; i < values.length; i++) into[i] = values[i];
}

export function packU32(values: ArrayLike<number>): Buffer {
  const arr = new Uint32Array(values.length);
  writeU32(values, arr);
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
  // A loop, not Float64Array.from: see writeU32.
  const floats = new Float64Array(n);
  for (let i = 0; i < n; i++) floats[i] = values[i];
  const bytes = new Uint8Array(floats.buffer);
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
const BROTLI = 2;
const TAG_STORED = Buffer.from([STORED]);
const TAG_BROTLI = Buffer.from([BROTLI]);
/**
 * Brotli at quality 1: on an exchange's record (SSE bodies with their prompt-id lists elided, tables) it takes
 * half the time of deflate level 3 against the prompt dictionary, the earlier encodings' choice, and comes out
 * smaller (measured: 47 vs 92 µs, 1,605 vs 1,964 bytes of a 78 KB stream); quality 2 is as small again at twice
 * the time. Deflated blobs of files written before are still read.
 */
const brotliOptions = (size: number) => ({ params: { [zlibConstants.BROTLI_PARAM_QUALITY]: 1, [zlibConstants.BROTLI_PARAM_SIZE_HINT]: size } });

/** `data` tagged by its first byte: compressed if that is smaller, else stored. */
export function squeeze(data: Uint8Array): Buffer {
  if (data.length > 16) {
    const compressed = brotliCompressSync(data, brotliOptions(data.length));
    if (compressed.length < data.length) return Buffer.concat([TAG_BROTLI, compressed]);
  }
  return Buffer.concat([TAG_STORED, data]);
}

/** What `squeeze` (or, in files of encodings 1 to 3, deflate against `dictionary`) made of a blob. */
export function unsqueeze(blob: Uint8Array, dictionary?: Buffer): Buffer {
  const body = Buffer.from(blob.buffer, blob.byteOffset + 1, blob.byteLength - 1);
  switch (blob[0]) {
    case STORED:
      return Buffer.from(body);
    case DEFLATED:
      return inflateRawSync(body, dictionary ? { dictionary } : {});
    case BROTLI:
      return brotliDecompressSync(body);
    default:
      throw new Error(`unknown blob encoding ${blob[0]}`);
  }
}

/**
 * What encodings 1 to 3 deflated the HTTP bodies of one exchange against: the JSON vLLM streams around every
 * chunk, then the prompt's ids as JSON lists them (`"prompt_token_ids":[…]` of a response with return_token_ids, or a prompt sent
 * as ids), last, where deflate's back-references to it are shortest. Rebuilt from the stored prompt ids to read.
 */
export function bodyDictionary(promptIds: ArrayLike<number> | null): Buffer {
  if (!promptIds || promptIds.length === 0) return BODY_PREAMBLE;
  const out = Buffer.allocUnsafe(BODY_PREAMBLE.length + promptIds.length * 12);
  const at = writeIdList(out, BODY_PREAMBLE.copy(out), promptIds, COMMA);
  return out.subarray(0, at);
}

const BODY_PREAMBLE = Buffer.from(
  'data: {"id":"chatcmpl-","object":"chat.completion.chunk","created":,"model":"","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null,"stop_reason":null,"token_ids":[]}],"usage":null}\n\n' +
    'data: {"id":"cmpl-","object":"text_completion","created":,"model":"","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"stop","stop_reason":null,"prompt_token_ids":[',
);

/** How a JSON list of ids separates its items: `1,2` (JSON.stringify, vLLM) or `1, 2` (Python's json.dumps). */
type Separator = typeof COMMA | typeof COMMA_SPACE;
const COMMA = 0;
const COMMA_SPACE = 1;

/** Writes `ids` as a JSON list's items (no brackets) at `at`; returns the position after them. `out` has room. */
function writeIdList(out: Buffer, at: number, ids: ArrayLike<number>, separator: Separator): number {
  // Digits written in place with int32 arithmetic: joining into a string first costs twice as much (measured).
  for (let i = 0; i < ids.length; i++) {
    if (i > 0) {
      out[at++] = 0x2c; // ','
      if (separator === COMMA_SPACE) out[at++] = 0x20;
    }
    const value = ids[i];
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
  return at;
}

/** Prompts shorter than this are left in the bodies: their lists are too short to be worth finding. */
const ELIDED_MIN_IDS = 8;

/**
 * `body` without the JSON lists of exactly `ids` it holds (a completion's `"prompt":[…]`, vLLM's
 * `"prompt_token_ids":[…]`: the prompt is stored once, in the prompt tree), as the parts left between them (views
 * of `body`), and where each was cut: its position in what is left and its separator. Only a list that is the
 * prompt as `writeIdList` writes it is cut (no leading zeros, no other spacing), so `restoreIdLists` gives back the
 * same bytes. `lists` caches the rendered lists across the bodies of one exchange.
 *
 * In an SSE stream (`eventEnds`: where each event ends) only the leading events are searched, up to the first one
 * after the first that holds no list: vLLM sends the prompt's ids on the first chunk of each choice (chat's on the
 * first chunk only), and searching the other ~75 KB of a 256-token stream cost as much as compressing it. A list
 * further on stays in place, to be compressed with the rest.
 */
export function elideIdLists(
  body: Buffer,
  ids: ArrayLike<number> | null,
  eventEnds: readonly number[] = [],
  lists = new IdLists(ids),
): { parts: Buffer[]; cuts: number[] } {
  if (!ids || ids.length < ELIDED_MIN_IDS) return { parts: [body], cuts: [] };
  // One search for both separators: lists hold no '[', so a list found is never inside another.
  const needle = Buffer.from(`[${ids[0]},`);
  const parts: Buffer[] = [];
  const cuts: number[] = [];
  let copied = 0;
  let kept = 0;
  // A body that is not a stream is searched whole, as one event.
  const ends = eventEnds.length > 0 ? eventEnds : [body.length];
  let from = 0;
  for (let event = 0; event < ends.length; event++) {
    // Events end with a blank line, which a list never holds: a list found in one ends in it.
    const end = Math.min(ends[event], body.length);
    const searched = body.subarray(0, end);
    let found = false;
    for (let hit = searched.indexOf(needle, from); hit >= 0; hit = searched.indexOf(needle, Math.max(hit + 1, copied))) {
      const start = hit + 1;
      const separator: Separator = body[hit + needle.length] === 0x20 ? COMMA_SPACE : COMMA;
      const list = lists.get(separator);
      const listEnd = start + list.length;
      // Compared natively: a list of 1,000 ids is ~6 KB.
      if (body[listEnd] !== 0x5d || body.compare(list, 0, list.length, start, listEnd) !== 0) continue;
      parts.push(body.subarray(copied, start));
      kept += start - copied;
      cuts.push(kept, separator);
      copied = listEnd;
      found = true;
    }
    if (event > 0 && !found) break;
    from = Math.max(end, copied);
  }
  parts.push(body.subarray(copied));
  return { parts, cuts };
}

/** A prompt's ids as JSON list items (`writeIdList`), rendered once per separator when first asked for. */
export class IdLists {
  private readonly rendered: (Buffer | undefined)[] = [];

  constructor(private readonly ids: ArrayLike<number> | null) {}

  get(separator: Separator): Buffer {
    let list = this.rendered[separator];
    if (!list) {
      const ids = this.ids ?? [];
      const out = Buffer.allocUnsafe(ids.length * 13);
      list = this.rendered[separator] = out.subarray(0, writeIdList(out, 0, ids, separator));
    }
    return list;
  }
}

/** `elideIdLists`'s body again, in a buffer of its own: the prompt's lists back where they were cut. */
export function restoreIdLists(rest: Buffer, cuts: readonly number[], lists: IdLists): Buffer {
  const parts: Buffer[] = [];
  let copied = 0;
  for (let c = 0; c < cuts.length; c += 2) {
    const at = cuts[c];
    const separator = cuts[c + 1];
    if (at < copied || at > rest.length || (separator !== COMMA && separator !== COMMA_SPACE)) throw new Error('a cut prompt list is out of place');
    parts.push(rest.subarray(copied, at), lists.get(separator));
    copied = at;
  }
  parts.push(rest.subarray(copied));
  return Buffer.concat(parts);
}

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

/**
 * Byte strings and varints appended in order into one buffer, which `scratch()` writers share: an
 * exchange's record is ~80 KB, and a fresh buffer of that size per save (and another to concatenate pieces into)
 * costs more in the collector than the copying does.
 */
class RecordWriter {
  private static shared = Buffer.allocUnsafeSlow(256 * 1024);
  private buffer: Buffer;
  private at = 0;

  private constructor(buffer: Buffer) {
    this.buffer = buffer;
  }

  /** A writer of its own small buffer. */
  static fresh(): RecordWriter {
    return new RecordWriter(Buffer.allocUnsafe(1024));
  }

  /** The writer of the shared scratch buffer: what it wrote (`written`) is valid until the next `scratch()`. */
  static scratch(): RecordWriter {
    return new RecordWriter(RecordWriter.shared);
  }

  private room(bytes: number): void {
    if (this.at + bytes <= this.buffer.length) return;
    const grown = Buffer.allocUnsafeSlow(Math.max(this.buffer.length * 2, this.at + bytes));
    this.buffer.copy(grown, 0, 0, this.at);
    if (this.buffer === RecordWriter.shared) RecordWriter.shared = grown;
    this.buffer = grown;
  }

  varint(value: number): void {
    this.room(10);
    this.at = writeVarint(this.buffer, this.at, value);
  }

  /** `data` prefixed by its length. */
  bytes(data: Uint8Array): void {
    this.pieces([data]);
  }

  /** The concatenation of `parts` prefixed by its length. */
  pieces(parts: readonly Uint8Array[]): void {
    let length = 0;
    for (const part of parts) length += part.length;
    this.varint(length);
    this.room(length);
    for (const part of parts) {
      this.buffer.set(part, this.at);
      this.at += part.length;
    }
  }

  written(): Buffer {
    return this.buffer.subarray(0, this.at);
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
  let keys: string[] = [];
  let shape = -1;
  for (const delta of deltas) {
    // Most deltas have the keys of the one before: checked without Object.keys' array.
    if (shape < 0 || !hasKeys(delta, keys)) {
      keys = Object.keys(delta);
      const key = JSON.stringify(keys);
      shape = shapeIndex.get(key) ?? -1;
      if (shape < 0) {
        shape = shapes.push(key) - 1;
        shapeIndex.set(key, shape);
      }
    }
    codes.push(shape);
    for (let k = 0; k < keys.length; k++) {
      const value = delta[keys[k]];
      if (typeof value !== 'string') return deltasAsJson(deltas);
      codes.push(value.length);
      values += value;
    }
  }
  if (LONE_SURROGATE.test(values)) return deltasAsJson(deltas);
  const out = RecordWriter.fresh();
  out.bytes(Buffer.from(`[${shapes.join(',')}]`));
  out.bytes(packVarints(codes));
  out.bytes(Buffer.from(values));
  return Buffer.concat([Buffer.from([DELTAS_BY_COLUMN]), out.written()]);
}

/** Whether `delta`'s own keys are `keys`, in order. */
function hasKeys(delta: ChunkDelta, keys: readonly string[]): boolean {
  let n = 0;
  for (const key in delta) {
    if (key !== keys[n++] || !Object.hasOwn(delta, key)) return false;
  }
  return n === keys.length;
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
 * Encoding 4: an exchange's bodies, event tables and generations as one record, `squeeze`d once (each
 * compression call has a fixed cost whatever its size; encoding 2 made three). Fields in order: flags (varint),
 * then, with HAS_BODIES, per body (request, response) the prompt lists `elideIdLists` cut from it (their number,
 * then per list its position and separator, as varints) and what is left of it; event ends (packDeltas), event
 * times (packTimes), event token counts (packDeltas), the number of generations, then per generation its choice
 * index (varint), output ids (packVarints), token times (tokenTimesRecord), chunk token counts (packVarints),
 * chunk deltas (deltasRecord) and `[text, finishReason, stopReason]` as JSON. Byte strings are prefixed by their
 * length. Encoding 3 had the bodies whole and deflated the record against `bodyDictionary`.
 */
export function packRecord(record: ExchangeRecord, promptIds: ArrayLike<number> | null): Buffer {
  const out = RecordWriter.scratch();
  const hasBodies = record.requestBody !== null && record.responseBody !== null;
  out.varint(hasBodies ? HAS_BODIES : 0);
  if (hasBodies) {
    const lists = new IdLists(promptIds);
    for (const [body, eventEnds] of [
      [record.requestBody as Buffer, []],
      [record.responseBody as Buffer, record.eventEnds],
    ] as const) {
      const { parts, cuts } = elideIdLists(body, promptIds, eventEnds, lists);
      out.varint(cuts.length / 2);
      for (const value of cuts) out.varint(value);
      out.pieces(parts);
    }
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
  return squeeze(out.written());
}

/** A record of encoding 4, or 3; `promptIds`: the exchange's prompt (read only if the record needs it). */
export function unpackRecord(blob: Uint8Array, encoding: 3 | 4, promptIds: () => ArrayLike<number> | null): ExchangeRecord {
  const record = new RecordReader(encoding === 3 ? unsqueeze(blob, bodyDictionary(promptIds())) : unsqueeze(blob));
  const hasBodies = (record.varint() & HAS_BODIES) !== 0;
  let lists: IdLists | undefined;
  const body = () => {
    if (encoding === 3) return Buffer.from(record.bytes());
    const cuts: number[] = [];
    for (let n = record.varint(); n > 0; n--) cuts.push(record.varint(), record.varint());
    // A view of the decompressed record: copied once, as it is or with the lists put back.
    const rest = record.bytes();
    if (cuts.length === 0) return Buffer.from(rest);
    if (!lists) {
      const ids = promptIds();
      if (!ids) throw new Error('a body refers to the prompt of an exchange that has none');
      lists = new IdLists(ids);
    }
    return restoreIdLists(rest, cuts, lists);
  };
  const requestBody = hasBodies ? body() : null;
  const responseBody = hasBodies ? body() : null;
  return { requestBody, responseBody, ...readTables(record, 3) };
}

/** Encoding 2's record of event tables and generations (written by earlier versions; read as they wrote it). */
export function unpackTables(blob: Uint8Array): ExchangeTables {
  return readTables(new RecordReader(unsqueeze(blob)), 2);
}

/** The tables of an encoding-2, -3 or -4 record, to its end: 2 keeps chunk deltas as JSON, the others by column (`3`). */
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
