import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import Database from 'better-sqlite3';
import { and, asc, desc, eq, gte, inArray, lt, sql } from 'drizzle-orm';
import { drizzle, type BetterSQLite3Database } from 'drizzle-orm/better-sqlite3';
import { migrate } from 'drizzle-orm/better-sqlite3/migrator';
import { FileError, namingFile } from '../util/fileError.js';
import { LruCache } from '../util/lruCache.js';
import { sha256Hex } from '../util/sha256.js';
import {
  bodyDictionary,
  packRecord,
  packU32,
  packVarints,
  squeeze,
  unpackDeltas,
  type ExchangeRecord,
  type ExchangeTables,
  unpackF64,
  unpackRecord,
  unpackTables,
  unpackTimes,
  unpackTokenTimes,
  unpackU32,
  unpackVarints,
  unsqueeze,
  writeU32,
} from './pack.js';
import { BackgroundCheckpointer } from './checkpointer.js';
import { BLOB_RAW, blobOf, fileOf, type BlobEncoding, type StoredBlob } from './fileBlobs.js';
import type { ChunkDelta, Generation } from './generation.js';
import { PromptTree } from './promptTree.js';
import * as schema from './schema.js';

const MIGRATIONS = resolve(dirname(fileURLToPath(import.meta.url)), '../../migrations');

/** How many migrations this version applies (a read-only open cannot apply missing ones). */
function migrationCount(): number {
  return (JSON.parse(readFileSync(join(MIGRATIONS, 'meta', '_journal.json'), 'utf8')) as { entries: unknown[] }).entries.length;
}

/** How errors name a capture file (`capture file PATH: …`). */
const CAPTURE_FILE = 'capture file';

/** A capture file that cannot be opened or used: the message names the file. */
export class CaptureFileError extends FileError {
  constructor(path: string, reason: string) {
    super(path, reason, { kind: CAPTURE_FILE });
  }
}

/** `work` on a capture file: any failure of it is reported as the file's (see namingFile). */
export function namingCapture<T>(path: string, work: () => T): T {
  return namingFile(path, CAPTURE_FILE, work);
}

export interface OpenOptions {
  /**
   * Only read: the file must exist, nothing is ever written to it or beside it (it may sit on read-only
   * storage), and it is not migrated.
   */
  readonly?: boolean;
  /**
   * A long-lived writer (the recorder): the write-ahead log is checkpointed by a worker thread (checkpointer.ts),
   * so that no save waits for a checkpoint's copying and syncing.
   */
  backgroundCheckpoints?: boolean;
}

/** How often the background checkpointer folds the log into the database file. */
const CHECKPOINT_INTERVAL_MS = 200;
/** The writer's own checkpoints with a background checkpointer: only the bound on the log (256 MB of 4 KB pages) while writes never pause. */
const WRITER_CHECKPOINT_PAGES = 65_536;

/** What a capture file holds, as `serve` reports it at start. */
export interface CaptureContents {
  runs: number;
  /** The engines the runs captured (`runs.engine`), as stored. */
  engines: string[];
  models: string[];
  outcomes: Record<Outcome, number>;
}

export type Outcome = 'complete' | 'failed' | 'aborted';
export type TokenSource = 'engine' | 'tokenize-endpoint' | 'local';
export type HeaderMap = Record<string, string | string[]>;
export interface RunInfo {
  kind: 'capture' | 'record';
  upstream?: string;
  /** The upstream engine's kind (see capture/upstreamEngine.ts). */
  engine?: string;
  label?: string;
  engineVersion?: string;
  versionJson?: string;
  modelsJson?: string;
  maxModelLen?: number;
  tokenizerName?: string;
}

/** Embeddings and reranking endpoints (see generation/poolingKey.ts): stored and replayed whole, no token ids. */
export type PoolingKind = 'embeddings' | 'rerank';
/**
 * The agents' APIs (issue #39): vLLM's token-in/token-out `/inference/v1/generate`, OpenAI Responses and
 * Anthropic Messages. Recorded with their events, times and token ids; only `generate` is replayed so far.
 */
export type AgentApi = 'generate' | 'responses' | 'messages';
/** What a recorded exchange was: a generation (the resolver's), an agent API's, or a pooling exchange. */
export type RecordedEndpoint = 'chat' | 'completion' | AgentApi | PoolingKind;

/** Chat and completions: the OpenAI-shaped generations every reader of captures understands field by field. */
export function isGeneration(endpoint: RecordedEndpoint | null): endpoint is 'chat' | 'completion' {
  return endpoint === 'chat' || endpoint === 'completion';
}

export function isAgentApi(endpoint: RecordedEndpoint | null): endpoint is AgentApi {
  return endpoint === 'generate' || endpoint === 'responses' || endpoint === 'messages';
}

/** Exchanges with prompt and output token ids, replayable by prompt: chat, completions and vLLM's generate. */
export function hasTokens(endpoint: RecordedEndpoint | null): endpoint is 'chat' | 'completion' | 'generate' {
  return isGeneration(endpoint) || endpoint === 'generate';
}

export interface Exchange {
  runId: number;
  startedAt: number;
  requestId: string | null;
  method: string;
  path: string;
  endpoint: RecordedEndpoint | null;
  outcome: Outcome;
  error: string | null;
  status: number | null;
  model: string | null;
  stream: boolean;
  requestHeaders: HeaderMap;
  requestBody: Buffer;
  responseHeaders: HeaderMap;
  responseBody: Buffer;
  eventEnds: number[];
  eventTimes: number[];
  eventTokens: number[];
  totalMs: number;
  tokenSource: TokenSource | null;
  promptIds: number[] | null;
  requestShape: string | null;
  injected: string[];
  usage: unknown;
  generations: Generation[];
  /** A pooling exchange's replay key (generation/poolingKey.ts); generations are keyed by model and prompt ids. */
  poolingKey?: string | null;
  /**
   * `capture --redact-bodies`: no request body, response bytes or text were stored (token ids and timing
   * were): stored as NULL bodies, which an exchange captured whole never has.
   */
  bodiesRedacted?: boolean;
}

export interface StoredExchange extends Exchange {
  id: number;
  bodiesRedacted: boolean;
}

export interface StoredRun extends RunInfo {
  id: number;
  startedAt: number;
  tokenizerFiles: Record<string, string>;
}

/** Which exchanges `mocker captures` lists or prunes (every given field must match; times in epoch ms). */
export interface ExchangeFilter {
  runId?: number;
  model?: string;
  endpoint?: RecordedEndpoint;
  outcome?: Outcome;
  /** Started at or after. */
  since?: number;
  /** Started before. */
  until?: number;
}

/** An exchange's small columns: what a listing shows without reading bodies or token ids. */
export type ExchangeSummary = Pick<
  StoredExchange,
  'id' | 'runId' | 'startedAt' | 'method' | 'path' | 'endpoint' | 'outcome' | 'error' | 'status' | 'model' | 'stream' | 'bodiesRedacted'
> & {
  totalMs: number | null;
  promptLen: number | null;
};

export interface NearestCapture {
  exchangeId: number;
  promptIds: number[];
  /** Length of the longest common prefix with the probe = index of the first diverging token. */
  commonPrefix: number;
}

/**
 * A prompt key's bytes (the model, NUL, the ids as packed u32) are laid out in reused buffers and hashed in one
 * call: a buffer per key would be an ArrayBuffer outside V8's heap, whose allocation and collection cost a lookup
 * as much as its SQLite query.
 */
let keyIds = new Uint32Array(4096);
let keyBytes = Buffer.allocUnsafe(4 * 4096 + 256);

export function promptKey(model: string, promptIds: ArrayLike<number>): string {
  const n = promptIds.length;
  if (keyIds.length < n) keyIds = new Uint32Array(n);
  writeU32(promptIds, keyIds);
  const modelLength = Buffer.byteLength(model);
  const length = modelLength + 1 + 4 * n;
  if (keyBytes.length < length) keyBytes = Buffer.allocUnsafe(length);
  keyBytes.write(model, 0);
  keyBytes[modelLength] = 0;
  keyBytes.set(new Uint8Array(keyIds.buffer, 0, 4 * n), modelLength + 1);
  return sha256Hex(keyBytes.subarray(0, length));
}

/** The migrations a file needs for the layout before encoding 1 (0000_init, 0001_run_engine), which a read-only open still reads. */
const LEGACY_MIGRATIONS = 2;
/**
 * The migrations of the compact layout's tables (0002_compact_store). Later ones only add indexes, which make
 * lookups faster but which a file opened read-only does without, or `blobs.encoding` (0004_blob_encoding), whose
 * absence means every blob is stored as it is: a new migration that changes tables or columns otherwise must
 * raise this.
 */
const COMPACT_MIGRATIONS = 3;

/**
 * A read-only file cannot be migrated: it must have the compact layout's tables already, or the ones before it
 * (read as they are: the nearest-capture search then scans). Returns whether it is the latter.
 */
function checkMigrated(sqlite: Database.Database): boolean {
  const n = appliedMigrations(sqlite);
  if (n === null) throw new Error('not a mocker capture file (no capture tables)');
  const expected = migrationCount();
  refuseNewer(n, expected);
  if (n >= COMPACT_MIGRATIONS) return false;
  if (n === LEGACY_MIGRATIONS) return true;
  throw new Error(`written by an older mocker (schema ${n} of ${expected}); open it once for writing (e.g. mocker serve --on-miss record) to upgrade it`);
}

/** How many migrations the file has had; null when it has no migration table (new, or not a capture file). */
function appliedMigrations(sqlite: Database.Database): number | null {
  if (!sqlite.prepare(`select 1 from sqlite_master where type = 'table' and name = '__drizzle_migrations'`).get()) return null;
  return (sqlite.prepare('select count(*) as n from __drizzle_migrations').get() as { n: number }).n;
}

/** A file a newer mocker wrote may hold what this one cannot read (a compressed tokenizer, say): refused by name. */
function refuseNewer(applied: number, known: number): void {
  if (applied > known) throw new Error(`written by a newer mocker (schema ${applied}; this one knows ${known}): upgrade mocker to read it`);
}

/** Why a capture file could not be opened, in words that say what to do. */
function openFailure(err: unknown, readonly: boolean): string {
  const code = (err as { code?: string }).code ?? '';
  const message = err instanceof Error ? err.message : String(err);
  // A WAL-mode file (not closed cleanly, or open in a writer) needs its -wal/-shm files, even to be read.
  if (readonly && (code === 'SQLITE_READONLY_DIRECTORY' || code === 'SQLITE_CANTOPEN')) {
    return `${message}: it is in WAL mode (a writer has it open, or did not close it cleanly) and its directory cannot be written; stop the writer with SIGINT/SIGTERM (it then leaves the file self-contained), or copy the file to a writable directory`;
  }
  if (code === 'SQLITE_NOTADB') return `${message} (not a SQLite capture file)`;
  return message;
}

type Db = BetterSQLite3Database<typeof schema>;

/** The columns of `exchanges` a lookup reads: those a replay chooses among captures by, none of the large ones. */
interface ExchangeHead {
  id: number;
  runId: number;
  startedAt: number;
  endpoint: string | null;
  outcome: string;
  status: number | null;
  model: string | null;
  stream: number | null;
  totalMs: number | null;
  requestShape: string | null;
  promptKey: string | null;
  promptNode: number | null;
  encoding: number;
}

/** `ExchangeHead`'s columns in order, as a raw row holds them. */
type HeadColumns = [
  number,
  number,
  number,
  string | null,
  string,
  number | null,
  string | null,
  number | null,
  number | null,
  string | null,
  string | null,
  number | null,
  number,
];

function exchangeHead(c: HeadColumns): ExchangeHead {
  return {
    id: c[0],
    runId: c[1],
    startedAt: c[2],
    endpoint: c[3],
    outcome: c[4],
    status: c[5],
    model: c[6],
    stream: c[7],
    totalMs: c[8],
    requestShape: c[9],
    promptKey: c[10],
    promptNode: c[11],
    encoding: c[12],
  };
}

/** The other small columns of `exchanges`, read together on first use of any of them. */
interface ExchangeDetails {
  requestId: string | null;
  method: string;
  path: string;
  error: string | null;
  tokenSource: string | null;
  injected: string | null;
  usage: string | null;
  requestHeaders: string | null;
  responseHeaders: string | null;
}

/** An exchange's large values as stored (encoding 0: in `exchanges`; 1 and 2: in `exchange_bodies`, `squeeze`d, see schema.ts). */
interface ExchangeBlobs {
  requestBody: Buffer | null;
  responseBody: Buffer | null;
  eventEnds: Buffer | null;
  eventTimes: Buffer | null;
  eventTokens: Buffer | null;
}

interface GenerationRow {
  choiceIndex: number;
  outputIds: Buffer;
  tokenTimes: Buffer;
  chunkTokens: Buffer;
  chunkDeltas: string | Buffer;
  text: string | Buffer;
  finishReason: string | null;
  stopReason: string | null;
}

/** The values of a stored exchange a lookup does not read until they are used. */
type LazyKey =
  | 'requestId'
  | 'method'
  | 'path'
  | 'error'
  | 'tokenSource'
  | 'promptIds'
  | 'requestHeaders'
  | 'responseHeaders'
  | 'injected'
  | 'usage'
  | 'requestBody'
  | 'responseBody'
  | 'bodiesRedacted'
  | 'eventEnds'
  | 'eventTimes'
  | 'eventTokens'
  | 'generations';
type LazyValues = Pick<StoredExchange, LazyKey>;
const LAZY_KEYS: readonly LazyKey[] = [
  'requestId',
  'method',
  'path',
  'error',
  'tokenSource',
  'promptIds',
  'requestHeaders',
  'responseHeaders',
  'injected',
  'usage',
  'requestBody',
  'responseBody',
  'bodiesRedacted',
  'eventEnds',
  'eventTimes',
  'eventTokens',
  'generations',
];

/** What a found exchange reads its large values with: the store's statements. */
interface ExchangeReader {
  details(row: ExchangeHead): ExchangeDetails;
  prompt(row: ExchangeHead): number[] | null;
  blobs(row: ExchangeHead): ExchangeBlobs;
  generations(row: ExchangeHead, eventTimes: () => number[]): Generation[];
}

// The head's fields, assigned in the constructor: declared by merging, as a class cannot list a type's fields.
// biome-ignore lint/correctness/noUnusedVariables: merged into the class below
interface FoundExchange extends Omit<StoredExchange, LazyKey> {}

/**
 * A stored exchange as a lookup returns it: its small values read, each large one read from the file on first
 * use and kept. Getters on the prototype and no closure per exchange: a lookup costs a few µs over its query.
 * Assigning a value works as on a plain object; `plain` (and `toJSON`) give every value.
 */
// biome-ignore lint/suspicious/noUnsafeDeclarationMerging: the constructor assigns every field the interface above declares
class FoundExchange implements StoredExchange {
  readonly #reader: ExchangeReader;
  readonly #row: ExchangeHead;
  readonly #prompt: number[] | undefined;
  readonly #read: Partial<LazyValues> = {};
  #blobs: ExchangeBlobs | undefined;
  #details: ExchangeDetails | undefined;
  #dictionary: Buffer | undefined;
  #decodedTables: ExchangeTables | undefined;
  #decodedRecord: ExchangeRecord | undefined;

  constructor(reader: ExchangeReader, row: ExchangeHead, prompt: number[] | undefined) {
    this.#reader = reader;
    this.#row = row;
    this.#prompt = prompt;
    this.id = row.id;
    this.runId = row.runId;
    this.startedAt = row.startedAt;
    this.endpoint = row.endpoint as Exchange['endpoint'];
    this.outcome = row.outcome as Outcome;
    this.status = row.status;
    this.model = row.model;
    this.stream = Boolean(row.stream);
    this.totalMs = row.totalMs ?? 0;
    this.requestShape = row.requestShape;
    // The key column holds a pooling exchange's own key; a generation's is derived from its model and prompt.
    this.poolingKey = this.endpoint === 'embeddings' || this.endpoint === 'rerank' ? row.promptKey : null;
  }

  #get<K extends LazyKey>(key: K): LazyValues[K] {
    if (!(key in this.#read)) this.#read[key] = this.#load(key) as LazyValues[K];
    return this.#read[key] as LazyValues[K];
  }

  #load(key: LazyKey): LazyValues[LazyKey] {
    const row = this.#row;
    switch (key) {
      case 'requestId':
      case 'method':
      case 'path':
      case 'error':
        return this.#detail()[key];
      case 'tokenSource':
        return this.#detail().tokenSource as TokenSource | null;
      case 'promptIds':
        return this.#prompt ?? this.#reader.prompt(row);
      case 'requestHeaders':
        return JSON.parse(this.#detail().requestHeaders ?? '{}') as HeaderMap;
      case 'responseHeaders':
        return JSON.parse(this.#detail().responseHeaders ?? '{}') as HeaderMap;
      case 'injected':
        return JSON.parse(this.#detail().injected ?? '[]') as string[];
      case 'usage': {
        const { usage } = this.#detail();
        return usage === null ? undefined : (JSON.parse(usage) as unknown);
      }
      case 'requestBody':
      case 'responseBody':
        if (row.encoding >= 3) return this.#record()[key] ?? Buffer.alloc(0);
        return this.#bytes(key, true);
      case 'bodiesRedacted':
        return this.#blob('requestBody') === null && this.#blob('responseBody') === null;
      case 'eventEnds':
      case 'eventTokens':
        if (row.encoding >= 2) return this.#tables()[key];
        return row.encoding === 0 ? unpackU32(this.#blob(key)) : unpackDeltas(this.#bytes(key, false));
      case 'eventTimes':
        if (row.encoding >= 2) return this.#tables().eventTimes;
        return row.encoding === 0 ? unpackF64(this.#blob(key)) : unpackTimes(this.#bytes(key, false));
      case 'generations':
        if (row.encoding >= 2) return this.#tables().generations;
        return this.#reader.generations(row, () => this.eventTimes);
    }
  }

  /** The record in `event_ends` of encodings 2 (event tables and generations), 3 and 4 (`#record`), decoded once. */
  #tables(): ExchangeTables {
    if (this.#row.encoding >= 3) return this.#record();
    this.#decodedTables ??= unpackTables(this.#blob('eventEnds') ?? NO_BYTES);
    return this.#decodedTables;
  }

  /** The record of encodings 3 and 4: the tables and the bodies (see `packRecord`); decoded once. */
  #record(): ExchangeRecord {
    this.#decodedRecord ??= unpackRecord(this.#blob('eventEnds') ?? NO_BYTES, this.#row.encoding as 3 | 4, () => this.promptIds);
    return this.#decodedRecord;
  }

  #bodyDictionary(): Buffer {
    this.#dictionary ??= bodyDictionary(this.promptIds);
    return this.#dictionary;
  }

  #detail(): ExchangeDetails {
    this.#details ??= this.#reader.details(this.#row);
    return this.#details;
  }

  #blob(key: keyof ExchangeBlobs): Buffer | null {
    this.#blobs ??= this.#reader.blobs(this.#row);
    return this.#blobs[key];
  }

  /** A blob as stored in encoding 0, unsqueezed in encodings 1 and 2 (bodies against the prompt's dictionary). */
  #bytes(key: keyof ExchangeBlobs, withDictionary: boolean): Buffer {
    const blob = this.#blob(key);
    if (!blob) return Buffer.alloc(0);
    if (this.#row.encoding === 0) return blob;
    return withDictionary ? unsqueeze(blob, this.#bodyDictionary()) : unsqueeze(blob);
  }

  get requestId() {
    return this.#get('requestId');
  }
  set requestId(value) {
    this.#read.requestId = value;
  }
  get method() {
    return this.#get('method');
  }
  set method(value) {
    this.#read.method = value;
  }
  get path() {
    return this.#get('path');
  }
  set path(value) {
    this.#read.path = value;
  }
  get error() {
    return this.#get('error');
  }
  set error(value) {
    this.#read.error = value;
  }
  get tokenSource() {
    return this.#get('tokenSource');
  }
  set tokenSource(value) {
    this.#read.tokenSource = value;
  }
  get promptIds() {
    return this.#get('promptIds');
  }
  set promptIds(value) {
    this.#read.promptIds = value;
  }
  get requestHeaders() {
    return this.#get('requestHeaders');
  }
  set requestHeaders(value) {
    this.#read.requestHeaders = value;
  }
  get responseHeaders() {
    return this.#get('responseHeaders');
  }
  set responseHeaders(value) {
    this.#read.responseHeaders = value;
  }
  get injected() {
    return this.#get('injected');
  }
  set injected(value) {
    this.#read.injected = value;
  }
  get usage() {
    return this.#get('usage');
  }
  set usage(value) {
    this.#read.usage = value;
  }
  get requestBody() {
    return this.#get('requestBody');
  }
  set requestBody(value) {
    this.#read.requestBody = value;
  }
  get responseBody() {
    return this.#get('responseBody');
  }
  set responseBody(value) {
    this.#read.responseBody = value;
  }
  get bodiesRedacted() {
    return this.#get('bodiesRedacted');
  }
  set bodiesRedacted(value) {
    this.#read.bodiesRedacted = value;
  }
  get eventEnds() {
    return this.#get('eventEnds');
  }
  set eventEnds(value) {
    this.#read.eventEnds = value;
  }
  get eventTimes() {
    return this.#get('eventTimes');
  }
  set eventTimes(value) {
    this.#read.eventTimes = value;
  }
  get eventTokens() {
    return this.#get('eventTokens');
  }
  set eventTokens(value) {
    this.#read.eventTokens = value;
  }
  get generations() {
    return this.#get('generations');
  }
  set generations(value) {
    this.#read.generations = value;
  }

  /** Every value, read, as a plain object. */
  plain(): StoredExchange {
    const lazy = Object.fromEntries(LAZY_KEYS.map((key) => [key, this.#get(key)]));
    return { ...this, ...lazy } as StoredExchange;
  }

  toJSON(): StoredExchange {
    return this.plain();
  }
}

const NO_BYTES = Buffer.alloc(0);

/**
 * An exchange's `exchange_bodies` values in the current encoding, as `saveExchanges` inserts them: its record in
 * `event_ends`; the body columns empty, or NULL when the capture was redacted (what listings test).
 */
function packExchange(ex: Exchange) {
  const redacted = ex.bodiesRedacted === true;
  const record: ExchangeRecord = {
    requestBody: redacted ? null : ex.requestBody,
    responseBody: redacted ? null : ex.responseBody,
    eventEnds: ex.eventEnds,
    eventTimes: ex.eventTimes,
    eventTokens: ex.eventTokens,
    generations: ex.generations,
  };
  const body = redacted ? null : NO_BYTES;
  return { ex, bodies: [body, body, packRecord(record, ex.promptIds), NO_BYTES, NO_BYTES] as const };
}

/** Prompt keys per query of findByLongestPrefix (well under SQLite's 32,766 bound variables). */
const PREFIX_KEYS_PER_QUERY = 512;
/**
 * How long a read-only connection keeps one read transaction for its reads (see holdReads): what a writer in
 * another process may wait, against one lock cycle per slice instead of per statement.
 */
const READ_SLICE_MS = 10;

/** The current format: see `exchanges.encoding` in schema.ts. */
const ENCODING = 4;

/**
 * The capture file: one SQLite database, in WAL mode while open for writing and migrated at open; closed
 * cleanly, everything is in the database file itself (see `close`).
 *
 * The hot paths (saving, lookup by prompt key, the nearest prompt) run on prepared better-sqlite3 statements of
 * their own; an exchange found by a lookup reads its large values (bodies, event tables, generations, prompt ids)
 * only when they are used.
 */
export class CaptureStore {
  readonly path: string;
  readonly readonly: boolean;
  private readonly sqlite: Database.Database;
  private readonly db: Db;
  /** A file at the schema before encoding 1, opened read-only: no `encoding`, `prompt_node` or prompt tree. */
  private readonly legacy: boolean;
  /** Whether `blobs` has its `encoding` column (a file opened read-only may predate it). */
  private readonly blobsEncoded: boolean;
  private readonly tree: PromptTree | null;
  /** The statements that write exchanges (none for a legacy file: its tables lack their columns). */
  private readonly writes;
  private readonly selectByKey;
  private readonly selectById;
  private readonly selectDetails;
  private readonly selectBlobs;
  private readonly selectLegacyBlobs;
  private readonly selectPromptIds;
  private readonly selectGenerations;
  private readonly selectPrompts;
  private readonly recentLookups = new LruCache<string, StoredExchange[]>(256);
  private readonly checkpointer: BackgroundCheckpointer | null = null;
  /** Whether reads share read transactions (see holdReads): read-only, the file in rollback mode when opened. */
  private readonly slicedReads: boolean;
  /** When the open read slice began (performance.now()); -1: none is open. */
  private sliceStart = -1;
  private sliceTimer: NodeJS.Timeout | null = null;

  private constructor(path: string, { readonly = false, backgroundCheckpoints = false }: OpenOptions) {
    this.path = path;
    this.readonly = readonly;
    if (readonly && !existsSync(path)) throw new CaptureFileError(path, 'no such file');
    let sqlite: Database.Database | undefined;
    let legacy = false;
    try {
      if (!readonly && path !== ':memory:') mkdirSync(dirname(resolve(path)), { recursive: true });
      sqlite = new Database(path, { readonly, fileMustExist: readonly });
      if (!readonly) {
        sqlite.pragma('journal_mode = WAL');
        sqlite.pragma('synchronous = NORMAL');
      }
      sqlite.pragma('foreign_keys = ON');
      sqlite.pragma('busy_timeout = 5000');
      // At 100,000 exchanges a lookup's index and row pages outgrow SQLite's 2 MB default cache; mapped, a page
      // missing from the cache costs a memory read instead of a read system call.
      sqlite.pragma('cache_size = -65536');
      sqlite.pragma('mmap_size = 1073741824');
      this.db = drizzle(sqlite, { schema });
      if (readonly) legacy = checkMigrated(sqlite);
      else {
        const applied = appliedMigrations(sqlite);
        if (applied !== null) refuseNewer(applied, migrationCount());
        migrate(this.db, { migrationsFolder: MIGRATIONS });
        indexOlderPrompts(sqlite);
      }
    } catch (err) {
      sqlite?.close();
      throw new CaptureFileError(path, openFailure(err, readonly));
    }
    this.sqlite = sqlite;
    this.legacy = legacy;
    this.blobsEncoded = sqlite.prepare(`select 1 from pragma_table_info('blobs') where name = 'encoding'`).get() !== undefined;
    this.slicedReads = readonly && sqlite.pragma('journal_mode', { simple: true }) !== 'wal';
    this.tree = legacy ? null : new PromptTree(sqlite);

    this.writes = legacy
      ? null
      : {
          exchange: sqlite.prepare(
            `insert into exchanges (run_id, started_at, request_id, method, path, endpoint, outcome, error, status, model, stream, total_ms,
               token_source, prompt_ids, prompt_len, prompt_key, request_shape, injected, usage, request_headers, response_headers, encoding, prompt_node)
             values (@runId, @startedAt, @requestId, @method, @path, @endpoint, @outcome, @error, @status, @model, @stream, @totalMs,
               @tokenSource, @promptIds, @promptLen, @promptKey, @requestShape, @injected, @usage, @requestHeaders, @responseHeaders, ${ENCODING}, @promptNode)`,
          ),
          bodies: sqlite.prepare(
            'insert into exchange_bodies (exchange_id, request_body, response_body, event_ends, event_times, event_tokens) values (?, ?, ?, ?, ?, ?)',
          ),
        };
    // Raw rows made into objects here: better-sqlite3 builds an object a property at a time, slower than the query.
    const head = `id, run_id, started_at, endpoint, outcome, status, model, stream, total_ms, request_shape, prompt_key, ${legacy ? 'null, 0' : 'prompt_node, encoding'}`;
    this.selectByKey = sqlite.prepare<[string], HeadColumns>(`select ${head} from exchanges where prompt_key = ? and outcome = 'complete' order by id`).raw();
    this.selectById = sqlite.prepare<[number], HeadColumns>(`select ${head} from exchanges where id = ?`).raw();
    this.selectDetails = sqlite.prepare<[number], ExchangeDetails>(
      `select request_id as requestId, method, path, error, token_source as tokenSource, injected, usage, request_headers as requestHeaders,
         response_headers as responseHeaders from exchanges where id = ?`,
    );
    this.selectBlobs = legacy
      ? null
      : sqlite.prepare<[number], ExchangeBlobs>(
          `select request_body as requestBody, response_body as responseBody, event_ends as eventEnds, event_times as eventTimes, event_tokens as eventTokens
           from exchange_bodies where exchange_id = ?`,
        );
    this.selectLegacyBlobs = sqlite.prepare<[number], ExchangeBlobs>(
      `select request_body as requestBody, response_body as responseBody, event_ends as eventEnds, event_times as eventTimes, event_tokens as eventTokens
       from exchanges where id = ?`,
    );
    this.selectPromptIds = sqlite.prepare<[number], { promptIds: Buffer | null }>('select prompt_ids as promptIds from exchanges where id = ?');
    this.selectGenerations = sqlite.prepare<[number], GenerationRow>(
      `select choice_index as choiceIndex, output_ids as outputIds, token_times as tokenTimes, chunk_tokens as chunkTokens, chunk_deltas as chunkDeltas,
         text, finish_reason as finishReason, stop_reason as stopReason
       from generations where exchange_id = ? order by choice_index`,
    );
    this.selectPrompts = sqlite.prepare(
      `select id, prompt_ids as promptIds from exchanges where model = ? and outcome = 'complete' and prompt_ids is not null order by id desc`,
    );
    // Last: nothing after it can fail and leave the worker running.
    if (!readonly && backgroundCheckpoints && path !== ':memory:') {
      sqlite.pragma(`wal_autocheckpoint = ${WRITER_CHECKPOINT_PAGES}`);
      this.checkpointer = new BackgroundCheckpointer(path, CHECKPOINT_INTERVAL_MS);
    }
  }

  static open(path: string, options: OpenOptions = {}): CaptureStore {
    return new CaptureStore(path, options);
  }

  /**
   * On a read-only connection to a file in rollback mode, reads share one read transaction for READ_SLICE_MS.
   * Outside a transaction SQLite takes and drops the file's shared lock and checks for a hot journal and a
   * changed file around every statement (four `fcntl` and three `stat` calls), most of a lookup's time. The
   * slice ends on a timer, or at the first read after it, so a whole-file command that never yields lets a
   * writer in too; a writer in another process waits at most about a slice (its busy timeout covers that),
   * and once it holds the pending lock the next slice's first read waits, as any read would, until it has
   * written. A file in WAL mode when opened (a writer has it) is read a statement at a time: its readers do not
   * block the writer, and read marks held slice after slice would keep its checkpoints from finishing.
   */
  private holdReads(): void {
    if (!this.slicedReads) return;
    if (this.sliceStart >= 0) {
      if (performance.now() - this.sliceStart < READ_SLICE_MS) return;
      this.endReads();
    } else if (this.sqlite.inTransaction) return;
    this.sqlite.exec('begin');
    this.sliceStart = performance.now();
    this.endReadsLater();
  }

  private endReadsLater(): void {
    if (this.sliceTimer) clearTimeout(this.sliceTimer);
    this.sliceTimer = setTimeout(() => {
      this.sliceTimer = null;
      try {
        this.endReads();
      } catch {
        // Tried again later: a failed commit must not take the server down, and the slice must still end.
        this.endReadsLater();
      }
    }, READ_SLICE_MS);
    this.sliceTimer.unref();
  }

  /** Ends the read slice, if one is open. */
  private endReads(): void {
    if (this.sliceStart < 0) return;
    if (this.sqlite.open && this.sqlite.inTransaction) this.sqlite.exec('commit');
    this.sliceStart = -1;
  }

  /**
   * Closes the connection. A writer folds the write-ahead log into the database file
   * (`wal_checkpoint(TRUNCATE)`) and, when no other connection has the file open, leaves WAL mode: the `.db`
   * file alone then holds everything, and a reader that cannot create `-wal`/`-shm` files (read-only storage)
   * can open it. The next writer turns WAL mode on again.
   */
  close(): void {
    if (!this.sqlite.open) return;
    if (this.sliceTimer) clearTimeout(this.sliceTimer);
    try {
      this.endReads();
    } catch {
      // Closing ends it anyway.
    }
    this.checkpointer?.stop();
    if (!this.readonly) {
      try {
        // Another connection (a reader, another writer) makes these fail at once instead of waiting.
        this.sqlite.pragma('busy_timeout = 0');
        this.sqlite.pragma('wal_checkpoint(TRUNCATE)');
        this.sqlite.pragma('journal_mode = DELETE');
      } catch {
        // The file stays in WAL mode: the last connection to close checkpoints it.
      }
    }
    this.sqlite.close();
  }

  /**
   * Starts a capture run; tokenizer files are stored compressed and content-addressed (deduplicated across runs):
   * each as its bytes, or as another capture file stored it (import, merge: carried as they are). `startedAt` is
   * given when a run is copied from another file.
   */
  startRun(info: RunInfo, tokenizerFiles: Map<string, Buffer | StoredBlob>, startedAt = Date.now()): number {
    return this.sqlite.transaction(() => {
      const files = this.storeFiles(tokenizerFiles);
      const row = this.db
        .insert(schema.runs)
        .values({ ...info, startedAt, tokenizerFiles: JSON.stringify(files) })
        .returning({ id: schema.runs.id })
        .get();
      return row.id;
    })();
  }

  /** Replaces a run's tokenizer (one learnt after the run started: its engine was down at the start). */
  setRunTokenizer(id: number, name: string, tokenizerFiles: Map<string, Buffer>): void {
    this.sqlite.transaction(() => {
      const files = this.storeFiles(tokenizerFiles);
      this.db
        .update(schema.runs)
        .set({ tokenizerName: name, tokenizerFiles: JSON.stringify(files) })
        .where(eq(schema.runs.id, id))
        .run();
    })();
  }

  private storeFiles(tokenizerFiles: Map<string, Buffer | StoredBlob>): Record<string, string> {
    const files: Record<string, string> = {};
    const stored = this.sqlite.prepare<[string], 1>('select 1 from blobs where sha256 = ?').pluck();
    for (const [name, file] of tokenizerFiles) {
      const hash = Buffer.isBuffer(file) ? sha256Hex(file) : file.sha256;
      files[name] = hash;
      // Compressing takes 0.4 s on Qwen3's tokenizer: not again for a file the capture holds already.
      if (stored.get(hash) !== undefined) continue;
      this.db
        .insert(schema.blobs)
        .values(Buffer.isBuffer(file) ? blobOf(file, hash) : file.encoding === BLOB_RAW ? blobOf(file.data, hash) : file)
        .onConflictDoNothing()
        .run();
    }
    return files;
  }

  /**
   * Writes one exchange and its generations atomically (one transaction: the recorder calls this once an exchange
   * is over, and answers its client only after it returns). Compression runs before the transaction starts.
   */
  saveExchange(ex: Exchange): number {
    return this.saveExchanges([ex])[0];
  }

  /**
   * Writes exchanges in one transaction, all or none (group commit: the recorder saves the exchanges that ended
   * while it was busy together); returns their ids in order. Compression runs before the transaction starts.
   */
  saveExchanges(list: readonly Exchange[]): number[] {
    if (!this.tree || !this.writes) throw new CaptureFileError(this.path, 'opened read-only, in the layout before encoding 1');
    const { tree, writes } = this;
    this.recentLookups.clear();
    const packed = list.map((ex) => packExchange(ex));
    // Immediate: the tree is read before anything is written, and a deferred transaction whose snapshot another
    // writer (the recorder's worker beside `serve --on-miss record`) has moved past could not then write.
    return this.sqlite
      .transaction(() =>
        packed.map(({ ex, bodies }) => {
          const inTree = ex.promptIds !== null && ex.model !== null;
          const placed = inTree ? tree.place(ex.model as string, ex.promptIds as number[]) : null;
          const id = Number(
            writes.exchange.run({
              runId: ex.runId,
              startedAt: ex.startedAt,
              requestId: ex.requestId,
              method: ex.method,
              path: ex.path,
              endpoint: ex.endpoint,
              outcome: ex.outcome,
              error: ex.error,
              status: ex.status,
              model: ex.model,
              stream: ex.stream ? 1 : 0,
              totalMs: ex.totalMs,
              tokenSource: ex.tokenSource,
              // Only an exchange without a model keeps its prompt here: the others' is in the prompt tree.
              promptIds: ex.promptIds && !inTree ? squeeze(packVarints(ex.promptIds)) : null,
              promptLen: ex.promptIds?.length ?? null,
              promptKey: ex.poolingKey ?? (ex.promptIds && ex.model !== null ? promptKey(ex.model, ex.promptIds) : null),
              requestShape: ex.requestShape,
              injected: JSON.stringify(ex.injected),
              usage: ex.usage === undefined ? null : JSON.stringify(ex.usage),
              requestHeaders: JSON.stringify(ex.requestHeaders),
              responseHeaders: JSON.stringify(ex.responseHeaders),
              promptNode: placed?.node ?? null,
            }).lastInsertRowid,
          );
          if (placed && ex.outcome === 'complete') tree.raise(placed.path, id);
          writes.bodies.run(id, ...bodies);
          return id;
        }),
      )
      .immediate();
  }

  /**
   * Every complete capture of exactly this model and prompt, oldest first. Remembered (replay asks for the
   * same prompts again and again); any write forgets. Their large values are read on first use, so only while
   * the store is open (`getExchange` gives one whole).
   */
  findByPrompt(model: string, promptIds: ArrayLike<number>): StoredExchange[] {
    return this.findByKey(promptKey(model, promptIds), promptIds);
  }

  /**
   * Every complete exchange stored under `key` (a prompt key or a pooling key), oldest first; remembered likewise.
   * `prompt`: the prompt the key was made of, when it is a prompt key: its captures' prompt (copied), not read again.
   */
  findByKey(key: string, prompt?: ArrayLike<number>): StoredExchange[] {
    let found = this.recentLookups.get(key);
    if (!found) {
      this.holdReads();
      const rows = this.selectByKey.all(key);
      // Copied: what the store remembers must not change with the caller's array.
      const ids = prompt && rows.length > 0 ? (Array.prototype.slice.call(prompt) as number[]) : undefined;
      found = rows.map((row) => this.hydrate(exchangeHead(row), ids));
      this.recentLookups.set(key, found);
    }
    return found;
  }

  /** How many complete exchanges were recorded at `path` (as requested: query string included). */
  completeAt(path: string): number {
    const e = schema.exchanges;
    return (
      this.db
        .select({ n: sql<number>`count(*)` })
        .from(e)
        .where(and(eq(e.path, path), eq(e.outcome, 'complete')))
        .get()?.n ?? 0
    );
  }

  /** Every exchange's id (or only a run's), in captured order (request start, then id): a number each, for tools that read them one by one. */
  exchangeIds(runId?: number): number[] {
    const e = schema.exchanges;
    return this.db
      .select({ id: e.id })
      .from(e)
      .where(runId === undefined ? undefined : eq(e.runId, runId))
      .orderBy(asc(e.startedAt), asc(e.id))
      .all()
      .map((r) => r.id);
  }

  /** One exchange with all its values read (it stays usable after `close`). */
  getExchange(id: number): StoredExchange | undefined {
    this.holdReads();
    const columns = this.selectById.get(id);
    const row = columns && exchangeHead(columns);
    if (!row) return undefined;
    return this.hydrate(row).plain();
  }

  /**
   * The complete capture of `model` sharing the longest prompt-token prefix with `promptIds` (ties: the newest):
   * a walk down the prompt tree. A legacy file opened read-only has none: its prompts are scanned.
   */
  nearest(model: string, promptIds: ArrayLike<number>): NearestCapture | null {
    this.holdReads();
    if (!this.tree) return this.scanNearest(model, promptIds);
    const found = this.tree.nearest(model, promptIds);
    if (!found) return null;
    const columns = this.selectById.get(found.exchangeId);
    const row = columns && exchangeHead(columns);
    if (!row) throw new CaptureFileError(this.path, `the prompt index names exchange #${found.exchangeId}, which is not in the file`);
    return { exchangeId: found.exchangeId, promptIds: this.readPrompt(row) ?? [], commonPrefix: found.commonPrefix };
  }

  private scanNearest(model: string, promptIds: ArrayLike<number>): NearestCapture | null {
    // Iterated: memory stays flat however many captures the file holds.
    const rows = this.selectPrompts.iterate(model) as IterableIterator<{ id: number; promptIds: Buffer }>;
    let best: { exchangeId: number; packed: Buffer; commonPrefix: number } | null = null;
    for (const row of rows) {
      // Compared packed, in place: unpacking every stored prompt would dominate a scan of 100k captures.
      const packed = row.promptIds;
      const n = Math.min(packed.length >>> 2, promptIds.length);
      let k = 0;
      while (k < n && packed.readUInt32LE(k << 2) === promptIds[k]) k++;
      if (!best || k > best.commonPrefix) best = { exchangeId: row.id, packed, commonPrefix: k };
    }
    return best && { exchangeId: best.exchangeId, promptIds: unpackU32(best.packed), commonPrefix: best.commonPrefix };
  }

  /** What was learnt about a run's upstream after it started (an engine that was down at the start). */
  updateRun(id: number, info: Pick<RunInfo, 'engine' | 'engineVersion' | 'versionJson' | 'modelsJson' | 'maxModelLen'>): void {
    this.db.update(schema.runs).set(info).where(eq(schema.runs.id, id)).run();
  }

  latestRun(): StoredRun | undefined {
    const row = this.db.select().from(schema.runs).orderBy(desc(schema.runs.id)).limit(1).get();
    return row && this.storedRun(row);
  }

  getRun(id: number): StoredRun | undefined {
    const row = this.db.select().from(schema.runs).where(eq(schema.runs.id, id)).get();
    return row && this.storedRun(row);
  }

  private storedRun(row: typeof schema.runs.$inferSelect): StoredRun {
    return {
      id: row.id,
      startedAt: row.startedAt,
      kind: row.kind as RunInfo['kind'],
      upstream: row.upstream ?? undefined,
      engine: row.engine ?? undefined,
      label: row.label ?? undefined,
      engineVersion: row.engineVersion ?? undefined,
      versionJson: row.versionJson ?? undefined,
      modelsJson: row.modelsJson ?? undefined,
      maxModelLen: row.maxModelLen ?? undefined,
      tokenizerName: row.tokenizerName ?? undefined,
      tokenizerFiles: JSON.parse(row.tokenizerFiles ?? '{}') as Record<string, string>,
    };
  }

  /** The tokenizer files a run recorded, by file name: inflated, and checked (see `fileOf`). */
  tokenizerFiles(run: StoredRun): Map<string, Buffer> {
    return this.checkedBlobs(run, fileOf);
  }

  /** The tokenizer files a run recorded, by file name, as stored, once checked: what export and merge carry into another file. */
  storedTokenizerFiles(run: StoredRun): Map<string, StoredBlob> {
    return this.checkedBlobs(run, (blob) => (fileOf(blob), blob));
  }

  /** `read` of each tokenizer file of the run; a file that fails its check fails naming the capture file and the tokenizer file. */
  private checkedBlobs<T>(run: StoredRun, read: (blob: StoredBlob) => T): Map<string, T> {
    const hashes = Object.values(run.tokenizerFiles);
    const out = new Map<string, T>();
    if (hashes.length === 0) return out;
    const byHash = new Map(this.blobRows(hashes).map((r) => [r.sha256, r]));
    for (const [name, hash] of Object.entries(run.tokenizerFiles)) {
      const blob = byHash.get(hash);
      if (!blob) continue;
      try {
        out.set(name, read(blob));
      } catch (err) {
        throw new CaptureFileError(this.path, `tokenizer file ${name} (blob ${hash}): ${(err as Error).message}`);
      }
    }
    return out;
  }

  private blobRows(hashes: string[]): StoredBlob[] {
    // A file opened read-only before migration 0004_blob_encoding has no `encoding` column: its blobs are raw.
    const encoding = this.blobsEncoded ? 'encoding' : `${BLOB_RAW} as encoding`;
    return this.sqlite
      .prepare<string[], { sha256: string; size: number; encoding: BlobEncoding; data: Buffer }>(
        `select sha256, size, ${encoding}, data from blobs where sha256 in (${hashes.map(() => '?').join(', ')})`,
      )
      .all(...hashes);
  }

  /** Models that have complete captures: those with generations first (the first is `serve`'s default model), then by name. */
  capturedModels(): string[] {
    const e = schema.exchanges;
    return this.db
      .select({ model: e.model })
      .from(e)
      .where(and(eq(e.outcome, 'complete'), sql`${e.model} is not null`))
      .groupBy(e.model)
      .orderBy(sql`max(${e.endpoint} in ('chat', 'completion')) desc`, asc(e.model))
      .all()
      .map((r) => r.model as string);
  }

  /** What the file holds: runs, the engines they captured, the models with complete captures, exchanges by outcome. */
  contents(): CaptureContents {
    const engines = this.db
      .selectDistinct({ engine: schema.runs.engine })
      .from(schema.runs)
      .where(sql`${schema.runs.engine} is not null`)
      .all()
      .map((r) => r.engine as string);
    const [{ n: runs }] = this.db.select({ n: sql<number>`count(*)` }).from(schema.runs).all();
    return { runs, engines, models: this.capturedModels(), outcomes: this.counts() };
  }

  counts(): Record<Outcome, number> {
    const e = schema.exchanges;
    const rows = this.db.select({ outcome: e.outcome, n: sql<number>`count(*)` }).from(e).groupBy(e.outcome).all();
    const out: Record<Outcome, number> = { complete: 0, failed: 0, aborted: 0 };
    for (const r of rows) out[r.outcome as Outcome] = r.n;
    return out;
  }

  // --- `mocker captures` (src/captures/): listing without reading blobs, copying, pruning ---

  /** Every run, oldest first. */
  runs(): StoredRun[] {
    return this.db
      .select()
      .from(schema.runs)
      .orderBy(asc(schema.runs.id))
      .all()
      .map((row) => this.storedRun(row));
  }

  /** The exchanges `filter` selects, in captured order, from their small columns only (no blob is read). */
  exchangeSummaries(filter: ExchangeFilter = {}): ExchangeSummary[] {
    const e = schema.exchanges;
    const conditions = [
      filter.runId === undefined ? undefined : eq(e.runId, filter.runId),
      filter.model === undefined ? undefined : eq(e.model, filter.model),
      filter.endpoint === undefined ? undefined : eq(e.endpoint, filter.endpoint),
      filter.outcome === undefined ? undefined : eq(e.outcome, filter.outcome),
      filter.since === undefined ? undefined : gte(e.startedAt, filter.since),
      filter.until === undefined ? undefined : lt(e.startedAt, filter.until),
    ];
    // Redacted: NULL bodies, in `exchanges` (encoding 0) or in `exchange_bodies` (encodings 1 and 2).
    const redacted = this.legacy
      ? sql<number>`${e.requestBody} is null and ${e.responseBody} is null`
      : sql<number>`case when ${e.encoding} = 0 then ${e.requestBody} is null and ${e.responseBody} is null
          else (select b.request_body is null and b.response_body is null from exchange_bodies b where b.exchange_id = ${e.id}) end`;
    return this.db
      .select({
        id: e.id,
        runId: e.runId,
        startedAt: e.startedAt,
        method: e.method,
        path: e.path,
        endpoint: e.endpoint,
        outcome: e.outcome,
        error: e.error,
        status: e.status,
        model: e.model,
        stream: e.stream,
        totalMs: e.totalMs,
        promptLen: e.promptLen,
        bodiesRedacted: redacted,
      })
      .from(e)
      .where(and(...conditions))
      .orderBy(asc(e.startedAt), asc(e.id))
      .all()
      .map((r) => ({
        ...r,
        endpoint: r.endpoint as ExchangeSummary['endpoint'],
        outcome: r.outcome as Outcome,
        stream: Boolean(r.stream),
        bodiesRedacted: Boolean(r.bodiesRedacted),
      }));
  }

  /**
   * Reads every page of the file and checks its structure (SQLite's `quick_check`): a tool that reads the whole
   * file (`captures diff`, `verify`) then fails on damage in pages its queries would not have touched.
   */
  checkIntegrity(): void {
    let problems: string[];
    try {
      problems = (this.sqlite.pragma('quick_check(5)') as { quick_check: string }[]).map((row) => row.quick_check);
    } catch (err) {
      throw new CaptureFileError(this.path, `damaged: ${(err as Error).message}`);
    }
    if (problems.length !== 1 || problems[0] !== 'ok') throw new CaptureFileError(this.path, `damaged: ${problems.join('; ').replaceAll('\n', ' ')}`);
  }

  /**
   * Runs `work` in one write transaction although it awaits (import reads its input as it writes): all of it is
   * written, or (it throws) none. The store's own transactions within it become savepoints.
   */
  async transactionAsync<T>(work: () => Promise<T>): Promise<T> {
    this.sqlite.exec('BEGIN IMMEDIATE');
    try {
      const result = await work();
      this.sqlite.exec('COMMIT');
      return result;
    } catch (err) {
      if (this.sqlite.inTransaction) this.sqlite.exec('ROLLBACK');
      throw err;
    }
  }

  /** Runs `work` in one transaction: all of it is written, or (it throws) none. */
  transaction<T>(work: () => T): T {
    return this.sqlite.transaction(work)();
  }

  /**
   * Removes exchanges with their bodies and generations; the prompt tree then names only captures that are left
   * (its prompts stay: other exchanges' ids live there).
   */
  deleteExchanges(ids: readonly number[]): void {
    if (!this.tree) throw new CaptureFileError(this.path, 'opened read-only, in the layout before encoding 1');
    const tree = this.tree;
    this.recentLookups.clear();
    this.sqlite.transaction(() => {
      // Chunked: SQLite limits the host parameters of one statement.
      for (let i = 0; i < ids.length; i += 500) {
        const chunk = ids.slice(i, i + 500);
        this.db.delete(schema.generations).where(inArray(schema.generations.exchangeId, chunk)).run();
        this.db.delete(schema.exchangeBodies).where(inArray(schema.exchangeBodies.exchangeId, chunk)).run();
        this.db.delete(schema.exchanges).where(inArray(schema.exchanges.id, chunk)).run();
      }
      tree.clearNewest();
      const left = this.sqlite.prepare<[], { id: number; model: string; promptNode: number | null; encoding: number; promptIds: Buffer | null }>(
        `select id, model, prompt_node as promptNode, encoding, prompt_ids as promptIds from exchanges
         where outcome = 'complete' and model is not null and (prompt_node is not null or prompt_ids is not null) order by id`,
      );
      for (const row of left.all()) {
        const prompt =
          row.promptNode !== null ? tree.prompt(row.promptNode) : row.encoding === 0 ? unpackU32(row.promptIds!) : unpackVarints(unsqueeze(row.promptIds!));
        tree.raise(tree.place(row.model, prompt).path, row.id);
      }
    })();
  }

  /** Removes those of `runIds` that hold no exchange, then the tokenizer files no run names; returns the runs removed. */
  deleteEmptyRuns(runIds: readonly number[]): number[] {
    return this.sqlite.transaction(() => {
      const holding = this.sqlite.prepare('select 1 from exchanges where run_id = ? limit 1');
      const ids = runIds.filter((id) => holding.get(id) === undefined);
      if (ids.length > 0) this.db.delete(schema.runs).where(inArray(schema.runs.id, ids)).run();
      const named = new Set(this.runs().flatMap((run) => Object.values(run.tokenizerFiles)));
      for (const { sha256: hash } of this.db.select({ sha256: schema.blobs.sha256 }).from(schema.blobs).all()) {
        if (!named.has(hash)) this.db.delete(schema.blobs).where(eq(schema.blobs.sha256, hash)).run();
      }
      return ids;
    })();
  }

  /** Rewrites the file without the free pages deleted rows left. */
  vacuum(): void {
    this.sqlite.exec('VACUUM');
  }

  /**
   * `serve --match prefix`: the complete `endpoint` exchanges of the longest proper prefix of `promptIds`, at
   * least `minLength` tokens long, that `model` was captured with as a whole prompt (oldest first); empty if
   * none was. Each candidate length's prompt key comes from one running hash (promptKey's bytes), and the keys
   * are looked up in the prompt-key index, longest first, in batches.
   */
  findByLongestPrefix(model: string, endpoint: 'chat' | 'completion' | AgentApi, promptIds: readonly number[], minLength: number): StoredExchange[] {
    this.holdReads();
    const first = Math.max(1, minLength);
    const packed = packU32(promptIds);
    const running = createHash('sha256')
      .update(model)
      .update('\0')
      .update(packed.subarray(0, 4 * first));
    // keys[i]: the key of the first `first + i` tokens.
    const keys: string[] = [];
    for (let length = first; length < promptIds.length; length++) {
      keys.push(running.copy().digest('hex'));
      running.update(packed.subarray(4 * length, 4 * length + 4));
    }
    const e = schema.exchanges;
    for (let end = keys.length; end > 0; end -= PREFIX_KEYS_PER_QUERY) {
      const start = Math.max(0, end - PREFIX_KEYS_PER_QUERY);
      const batch = keys.slice(start, end);
      const rows = this.db
        .selectDistinct({ key: e.promptKey })
        .from(e)
        .where(and(inArray(e.promptKey, batch), eq(e.outcome, 'complete'), eq(e.endpoint, endpoint)))
        .all();
      if (rows.length === 0) continue;
      const longest = Math.max(...rows.map((row) => batch.indexOf(row.key ?? '')));
      return this.findByPrompt(model, promptIds.slice(0, first + start + longest));
    }
    return [];
  }

  /** The prompt's ids of an exchange: in the prompt tree, else in `prompt_ids` as its encoding packs them. */
  private readPrompt(row: ExchangeHead): number[] | null {
    if (row.promptNode !== null && this.tree) return this.tree.prompt(row.promptNode);
    const packed = this.selectPromptIds.get(row.id)?.promptIds ?? null;
    if (!packed) return null;
    return row.encoding === 0 ? unpackU32(packed) : unpackVarints(unsqueeze(packed));
  }

  /**
   * A stored exchange whose small values are read and whose large ones are read on first use (`prompt`: the
   * prompt's ids, when the caller knows them).
   */
  private hydrate(row: ExchangeHead, prompt?: number[]): FoundExchange {
    return new FoundExchange(this.reader, row, prompt);
  }

  /** How found exchanges read their large values. */
  private readonly reader: ExchangeReader = {
    details: (row) => {
      this.holdReads();
      const found = this.selectDetails.get(row.id);
      if (!found) throw new CaptureFileError(this.path, `exchange #${row.id} is no longer in the file`);
      return found;
    },
    prompt: (row) => {
      this.holdReads();
      return this.readPrompt(row);
    },
    blobs: (row) => {
      this.holdReads();
      const found = row.encoding === 0 ? this.selectLegacyBlobs.get(row.id) : this.selectBlobs?.get(row.id);
      if (!found) throw new CaptureFileError(this.path, `exchange #${row.id} has no stored bodies`);
      return found;
    },
    generations: (row, eventTimes) => {
      this.holdReads();
      return this.selectGenerations.all(row.id).map((g) => this.generation(g, row.encoding, eventTimes));
    },
  };

  private generation(g: GenerationRow, encoding: number, eventTimes: () => number[]): Generation {
    const stopReason = JSON.parse(g.stopReason ?? 'null') as string | number | null;
    if (encoding === 0) {
      return {
        choiceIndex: g.choiceIndex,
        outputIds: unpackU32(g.outputIds),
        tokenTimes: unpackF64(g.tokenTimes),
        chunkTokens: unpackU32(g.chunkTokens),
        chunkDeltas: JSON.parse(String(g.chunkDeltas)) as ChunkDelta[],
        text: String(g.text),
        finishReason: g.finishReason,
        stopReason,
      };
    }
    const bytes = (value: string | Buffer) => unsqueeze(typeof value === 'string' ? Buffer.from(value) : value);
    return {
      choiceIndex: g.choiceIndex,
      outputIds: unpackVarints(unsqueeze(g.outputIds)),
      tokenTimes: unpackTokenTimes(g.tokenTimes, eventTimes),
      chunkTokens: unpackVarints(unsqueeze(g.chunkTokens)),
      chunkDeltas: JSON.parse(bytes(g.chunkDeltas).toString('utf8')) as ChunkDelta[],
      text: bytes(g.text).toString('utf8'),
      finishReason: g.finishReason,
      stopReason,
    };
  }
}

/**
 * After the migration that adds the prompt tree (0002_compact_store): the prompts of the exchanges written before
 * it, added to the tree so the nearest-capture search finds them. Their rows stay as they are (encoding 0, prompt
 * ids in `prompt_ids`): rewriting them would copy every body of the file. Runs once: while the tree is empty.
 */
function indexOlderPrompts(sqlite: Database.Database): void {
  const tree = new PromptTree(sqlite);
  // Only complete ones: the others are never a nearest capture, and their rows keep their own prompt ids.
  const page = sqlite.prepare<[number], { id: number; model: string; promptIds: Buffer }>(
    `select id, model, prompt_ids as promptIds from exchanges
     where id > ? and encoding = 0 and outcome = 'complete' and model is not null and prompt_ids is not null order by id limit 1000`,
  );
  // Immediate, the check inside: two connections opening the file at once build it once.
  sqlite
    .transaction(() => {
      if (sqlite.prepare('select 1 from prompt_nodes limit 1').get()) return;
      // By pages: memory stays flat however many exchanges the file holds.
      for (let rows = page.all(0); rows.length > 0; rows = page.all(rows[rows.length - 1].id)) {
        for (const row of rows) tree.raise(tree.place(row.model, unpackU32(row.promptIds)).path, row.id);
      }
    })
    .immediate();
}
