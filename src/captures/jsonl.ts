/**
 * The JSONL face of a capture file (`mocker captures export` / `import`): one JSON object a line, so a capture
 * can be reviewed, edited and diffed in git, and turned back into a capture file without losing a byte.
 *
 * Lines, in this order: a header; the tokenizer files (`blob`, content-addressed as in the store, shared by
 * runs; brotli-compressed as the store keeps them: `"encoding":"brotli"`, the file's `size` and the compressed
 * bytes; version 1 files, which carried them as they are, still import); then each run followed by its exchanges
 * in captured order. Runs are numbered 1, 2, … in the file (the
 * store's own ids are not carried: they are not stable across files), and each exchange names its run by that
 * number. Bytes are a string when they are UTF-8 (the usual JSON bodies and SSE streams), else `{"base64": …}`;
 * a body `null` was redacted at capture (`--redact-bodies`). Token ids and timings are plain arrays (JSON
 * numbers give doubles back exactly).
 */
import { createReadStream, openSync } from 'node:fs';
import { z } from 'zod';
import type { CaptureStore, Exchange, RunInfo, StoredExchange, StoredRun } from '../store/captureStore.js';
import { BLOB_BROTLI, BLOB_RAW, BlobHashMismatch, fileOf, type StoredBlob } from '../store/fileBlobs.js';
import { FileError } from '../util/fileError.js';

export const FORMAT = 'mocker-captures';
/** 2: tokenizer files compressed (1: as they are; still read). */
export const FORMAT_VERSION = 2;

type Bytes = string | { base64: string };

/** `data` as a string when it is valid UTF-8 (it decodes and encodes back to the same bytes), else base64. */
function encodeBytes(data: Buffer): Bytes {
  const text = data.toString('utf8');
  return Buffer.byteLength(text) === data.length && Buffer.from(text, 'utf8').equals(data) ? text : { base64: data.toString('base64') };
}

function decodeBytes(value: Bytes): Buffer {
  return typeof value === 'string' ? Buffer.from(value, 'utf8') : Buffer.from(value.base64, 'base64');
}

const bytes = z.union([z.string(), z.strictObject({ base64: z.base64() })]);
const u32 = z.number().int().min(0).max(0xffffffff);
const headerMap = z.record(z.string(), z.union([z.string(), z.array(z.string())]));
const jsonObject = z.record(z.string(), z.unknown());

const headerLine = z.strictObject({ type: z.literal('header'), format: z.literal(FORMAT), version: z.union([z.literal(1), z.literal(FORMAT_VERSION)]) });
const blobLine = z.strictObject({
  type: z.literal('blob'),
  sha256: z.string().regex(/^[0-9a-f]{64}$/),
  /** Absent: `data` is the file itself. */
  encoding: z.literal('brotli').optional(),
  /** The file's own size (with `encoding`). */
  size: z.number().int().min(0).optional(),
  data: bytes,
});
const runLine = z.strictObject({
  type: z.literal('run'),
  run: z.number().int().min(1),
  startedAt: z.number().int(),
  kind: z.enum(['capture', 'record']),
  upstream: z.string().nullable(),
  engine: z.string().nullable(),
  engineVersion: z.string().nullable(),
  label: z.string().nullable(),
  versionJson: z.string().nullable(),
  modelsJson: z.string().nullable(),
  maxModelLen: z.number().int().nullable(),
  tokenizerName: z.string().nullable(),
  /** File name → sha256 of a blob line. */
  tokenizerFiles: z.record(z.string(), z.string()),
});
const generationLine = z.strictObject({
  choiceIndex: z.number().int().min(0),
  finishReason: z.string().nullable(),
  stopReason: z.union([z.string(), z.number(), z.null()]),
  text: z.string(),
  outputIds: z.array(u32),
  tokenTimes: z.array(z.number()),
  chunkTokens: z.array(u32),
  chunkDeltas: z.array(jsonObject),
});
const exchangeLine = z.strictObject({
  type: z.literal('exchange'),
  run: z.number().int().min(1),
  startedAt: z.number().int(),
  requestId: z.string().nullable(),
  method: z.string(),
  path: z.string(),
  endpoint: z.enum(['chat', 'completion', 'generate', 'responses', 'messages', 'embeddings', 'rerank']).nullable(),
  /** An embeddings or rerank exchange's replay key (null, or left out, for generations: keyed by their prompt ids). */
  poolingKey: z.string().nullable().default(null),
  outcome: z.enum(['complete', 'failed', 'aborted']),
  error: z.string().nullable(),
  status: z.number().int().nullable(),
  model: z.string().nullable(),
  stream: z.boolean(),
  totalMs: z.number(),
  tokenSource: z.enum(['engine', 'tokenize-endpoint', 'local']).nullable(),
  requestShape: z.string().nullable(),
  injected: z.array(z.string()),
  usage: z.unknown(),
  requestHeaders: headerMap,
  requestBody: bytes.nullable(),
  responseHeaders: headerMap,
  responseBody: bytes.nullable(),
  eventEnds: z.array(u32),
  eventTimes: z.array(z.number()),
  eventTokens: z.array(u32),
  promptIds: z.array(u32).nullable(),
  generations: z.array(generationLine),
});
const line = z.discriminatedUnion('type', [headerLine, blobLine, runLine, exchangeLine]);

export type RunLine = z.infer<typeof runLine>;
export type ExchangeLine = z.infer<typeof exchangeLine>;

const json = (value: unknown) => `${JSON.stringify(value)}\n`;

export function headerJsonl(): string {
  return json({ type: 'header', format: FORMAT, version: FORMAT_VERSION });
}

export function blobJsonl(blob: StoredBlob): string {
  if (blob.encoding === BLOB_RAW) return json({ type: 'blob', sha256: blob.sha256, data: encodeBytes(blob.data) });
  return json({ type: 'blob', sha256: blob.sha256, encoding: 'brotli', size: blob.size, data: encodeBytes(blob.data) });
}

export function runJsonl(run: StoredRun, ordinal: number): string {
  const line: RunLine = {
    type: 'run',
    run: ordinal,
    startedAt: run.startedAt,
    kind: run.kind,
    upstream: run.upstream ?? null,
    engine: run.engine ?? null,
    engineVersion: run.engineVersion ?? null,
    label: run.label ?? null,
    versionJson: run.versionJson ?? null,
    modelsJson: run.modelsJson ?? null,
    maxModelLen: run.maxModelLen ?? null,
    tokenizerName: run.tokenizerName ?? null,
    tokenizerFiles: run.tokenizerFiles,
  };
  return json(line);
}

/** An exchange as its line's object (also what `show --json` starts from). */
export function exchangeRecord(ex: StoredExchange, runOrdinal: number): ExchangeLine {
  return {
    type: 'exchange',
    run: runOrdinal,
    startedAt: ex.startedAt,
    requestId: ex.requestId,
    method: ex.method,
    path: ex.path,
    endpoint: ex.endpoint,
    poolingKey: ex.poolingKey ?? null,
    outcome: ex.outcome,
    error: ex.error,
    status: ex.status,
    model: ex.model,
    stream: ex.stream,
    totalMs: ex.totalMs,
    tokenSource: ex.tokenSource,
    requestShape: ex.requestShape,
    injected: ex.injected,
    usage: ex.usage ?? null,
    requestHeaders: ex.requestHeaders,
    requestBody: ex.bodiesRedacted ? null : encodeBytes(ex.requestBody),
    responseHeaders: ex.responseHeaders,
    responseBody: ex.bodiesRedacted ? null : encodeBytes(ex.responseBody),
    eventEnds: ex.eventEnds,
    eventTimes: ex.eventTimes,
    eventTokens: ex.eventTokens,
    promptIds: ex.promptIds,
    generations: ex.generations.map((g) => ({
      choiceIndex: g.choiceIndex,
      finishReason: g.finishReason,
      stopReason: g.stopReason,
      text: g.text,
      outputIds: g.outputIds,
      tokenTimes: g.tokenTimes,
      chunkTokens: g.chunkTokens,
      chunkDeltas: g.chunkDeltas,
    })),
  };
}

/** Writes the whole file as JSONL through `write` (which may wait for the output to drain). */
export async function exportJsonl(store: CaptureStore, write: (text: string) => Promise<void>): Promise<void> {
  await write(headerJsonl());
  const runs = store.runs();
  const written = new Set<string>();
  for (const run of runs) {
    for (const blob of store.storedTokenizerFiles(run).values()) {
      if (written.has(blob.sha256)) continue;
      written.add(blob.sha256);
      await write(blobJsonl(blob));
    }
  }
  for (const [i, run] of runs.entries()) {
    await write(runJsonl(run, i + 1));
    for (const id of store.exchangeIds(run.id)) {
      const ex = store.getExchange(id);
      if (ex) await write(json(exchangeRecord(ex, i + 1)));
    }
  }
}

/** A run line, checked, with its tokenizer files (from the blob lines before it). */
export interface ImportedRun {
  type: 'run';
  /** Its number in the file (exchange lines name their run by it). */
  ordinal: number;
  info: RunInfo;
  startedAt: number;
  tokenizerFiles: Map<string, StoredBlob>;
}

/** An exchange line, checked, and the number of its run in the file. */
export interface ImportedExchange {
  type: 'exchange';
  run: number;
  exchange: Omit<Exchange, 'runId'>;
}

/** Where a line is wrong, as a one-line message: `FILE line N: path: problem`. */
export class JsonlError extends FileError {
  constructor(source: string, line: number | null, problem: string) {
    super(source, problem, { at: line === null ? undefined : `line ${line}` });
  }
}

/**
 * The lines of a byte stream (separated by `\n`; a last one without it too), each as its bytes: one line is held
 * at a time, whatever the size of the stream.
 */
async function* byteLines(input: AsyncIterable<Buffer>): AsyncGenerator<Buffer> {
  let pending: Buffer[] = [];
  for await (const chunk of input) {
    let start = 0;
    for (let end = chunk.indexOf(10); end !== -1; end = chunk.indexOf(10, start)) {
      pending.push(chunk.subarray(start, end));
      yield pending.length === 1 ? pending[0] : Buffer.concat(pending);
      pending = [];
      start = end + 1;
    }
    if (start < chunk.length) pending.push(chunk.subarray(start));
  }
  if (pending.length > 0) yield Buffer.concat(pending);
}

/** Strict: bytes that are not UTF-8 are refused, not turned into U+FFFD. */
const utf8 = new TextDecoder('utf-8', { fatal: true });

/**
 * Reads a JSONL capture line by line and yields its runs and exchanges as they come, each checked: the schema,
 * the header first, every blob's sha256 against its data, runs defined once and before their exchanges. The
 * caller writes as it reads (in a transaction: `import` is all or nothing); memory holds one line and the
 * tokenizer files. Errors name `source` and the line.
 */
export async function* readJsonl(input: AsyncIterable<Buffer>, source: string): AsyncGenerator<ImportedRun | ImportedExchange> {
  const blobs = new Map<string, StoredBlob>();
  const runs = new Set<number>();
  let sawHeader = false;
  let number = 0;
  const lines = byteLines(input);
  for (;;) {
    let next: IteratorResult<Buffer>;
    try {
      next = await lines.next();
    } catch (err) {
      throw new JsonlError(source, null, `cannot be read (${(err as Error).message})`);
    }
    if (next.done) break;
    number++;
    const fail = (problem: string) => new JsonlError(source, number, problem);
    let text: string;
    try {
      text = utf8.decode(next.value);
    } catch {
      throw fail('not valid UTF-8 (JSONL is UTF-8 text; bytes that are not go in {"base64": …})');
    }
    let value: unknown;
    try {
      value = JSON.parse(text);
    } catch (err) {
      throw fail(`not JSON (${(err as Error).message})`);
    }
    const parsed = line.safeParse(value);
    if (!parsed.success) {
      const issue = parsed.error.issues[0];
      throw fail(`${issue.path.length > 0 ? `${issue.path.join('.')}: ` : ''}${issue.message}`);
    }
    const l = parsed.data;
    if (!sawHeader && l.type !== 'header') throw fail(`the first line must be the header {"type":"header","format":"${FORMAT}","version":${FORMAT_VERSION}}`);
    if (l.type === 'header') {
      if (sawHeader) throw fail('a second header');
      sawHeader = true;
    } else if (l.type === 'blob') {
      if ((l.encoding === undefined) !== (l.size === undefined)) throw fail('encoding and size come together (a compressed file) or not at all');
      const stored = decodeBytes(l.data);
      const blob: StoredBlob = { sha256: l.sha256, size: l.size ?? stored.length, encoding: l.encoding === undefined ? BLOB_RAW : BLOB_BROTLI, data: stored };
      try {
        fileOf(blob);
      } catch (err) {
        throw fail(`${err instanceof BlobHashMismatch ? 'sha256' : 'data'}: ${(err as Error).message}`);
      }
      // Kept as it came (compressed, the store's form): memory holds the compressed files, and the store need not compress them again.
      blobs.set(l.sha256, blob);
    } else if (l.type === 'run') {
      if (runs.has(l.run)) throw fail(`run ${l.run} is defined twice`);
      runs.add(l.run);
      const files = new Map<string, StoredBlob>();
      for (const [name, hash] of Object.entries(l.tokenizerFiles)) {
        const data = blobs.get(hash);
        if (!data) throw fail(`tokenizerFiles.${name}: no blob line ${hash} before this run`);
        files.set(name, data);
      }
      const optional = <T>(v: T | null) => v ?? undefined;
      yield {
        type: 'run',
        ordinal: l.run,
        info: {
          kind: l.kind,
          upstream: optional(l.upstream),
          engine: optional(l.engine),
          engineVersion: optional(l.engineVersion),
          label: optional(l.label),
          versionJson: optional(l.versionJson),
          modelsJson: optional(l.modelsJson),
          maxModelLen: optional(l.maxModelLen),
          tokenizerName: optional(l.tokenizerName),
        },
        startedAt: l.startedAt,
        tokenizerFiles: files,
      };
    } else {
      if (!runs.has(l.run)) throw fail(`run ${l.run} has no run line before it`);
      if ((l.requestBody === null) !== (l.responseBody === null)) throw fail('requestBody and responseBody are redacted together (both null) or not at all');
      const { type: _, run, requestBody, responseBody, usage, ...rest } = l;
      yield {
        type: 'exchange',
        run,
        exchange: {
          ...rest,
          usage: usage ?? undefined,
          bodiesRedacted: requestBody === null,
          requestBody: requestBody === null ? Buffer.alloc(0) : decodeBytes(requestBody),
          responseBody: responseBody === null ? Buffer.alloc(0) : decodeBytes(responseBody),
        },
      };
    }
  }
  if (!sawHeader) throw new JsonlError(source, null, 'empty (no header line)');
}

/** A JSONL input as bytes: a file (opened now, so that a missing one is said at once) or stdin (`-`). */
export function jsonlInput(path: string): AsyncIterable<Buffer> {
  if (path === '-') return process.stdin;
  try {
    return createReadStream(path, { fd: openSync(path, 'r'), highWaterMark: 1 << 20 });
  } catch (err) {
    throw new FileError(path, (err as NodeJS.ErrnoException).code === 'ENOENT' ? 'no such file' : (err as Error).message);
  }
}
