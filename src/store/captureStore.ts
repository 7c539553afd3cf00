import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import Database from 'better-sqlite3';
import { and, asc, desc, eq, gte, inArray, lt, sql } from 'drizzle-orm';
import { drizzle, type BetterSQLite3Database } from 'drizzle-orm/better-sqlite3';
import { migrate } from 'drizzle-orm/better-sqlite3/migrator';
import { LruCache } from '../util/lruCache.js';
import { packF64, packU32, unpackF64, unpackU32 } from './pack.js';
import * as schema from './schema.js';

const MIGRATIONS = resolve(dirname(fileURLToPath(import.meta.url)), '../../migrations');

/** How many migrations this version applies (a read-only open cannot apply missing ones). */
function migrationCount(): number {
  return (JSON.parse(readFileSync(join(MIGRATIONS, 'meta', '_journal.json'), 'utf8')) as { entries: unknown[] }).entries.length;
}

/** A capture file that cannot be opened or used: the message names the file. */
export class CaptureFileError extends Error {
  constructor(
    readonly path: string,
    reason: string,
  ) {
    super(`capture file ${path}: ${reason}`);
  }
}

export interface OpenOptions {
  /**
   * Only read: the file must exist, nothing is ever written to it or beside it (it may sit on read-only
   * storage), and it is not migrated.
   */
  readonly?: boolean;
}

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
/** One streamed chunk's payload for one choice: `{text}` for completions, the chat delta (minus role) for chat. */
export type ChunkDelta = Record<string, unknown>;

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

export interface Generation {
  choiceIndex: number;
  outputIds: number[];
  tokenTimes: number[];
  chunkTokens: number[];
  chunkDeltas: ChunkDelta[];
  text: string;
  finishReason: string | null;
  stopReason: string | number | null;
}

/** Embeddings and reranking endpoints (see generation/poolingKey.ts): stored and replayed whole, no token ids. */
export type PoolingKind = 'embeddings' | 'rerank';
/** What a recorded exchange was: a generation (the resolver's) or a pooling exchange. */
export type RecordedEndpoint = 'chat' | 'completion' | PoolingKind;

export function isGeneration(endpoint: RecordedEndpoint | null): endpoint is 'chat' | 'completion' {
  return endpoint === 'chat' || endpoint === 'completion';
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
export interface ExchangeSummary {
  id: number;
  runId: number;
  startedAt: number;
  method: string;
  path: string;
  endpoint: 'chat' | 'completion' | null;
  outcome: Outcome;
  error: string | null;
  status: number | null;
  model: string | null;
  stream: boolean;
  totalMs: number | null;
  promptLen: number | null;
  bodiesRedacted: boolean;
}

export interface NearestCapture {
  exchangeId: number;
  promptIds: number[];
  /** Length of the longest common prefix with the probe = index of the first diverging token. */
  commonPrefix: number;
}

export function promptKey(model: string, promptIds: ArrayLike<number>): string {
  return createHash('sha256').update(model).update('\0').update(packU32(promptIds)).digest('hex');
}

/** A read-only file cannot be migrated: it must be at this version's schema already. */
function checkMigrated(sqlite: Database.Database): void {
  const table = sqlite.prepare(`select 1 from sqlite_master where type = 'table' and name = '__drizzle_migrations'`).get();
  if (!table) throw new Error('not a mocker capture file (no capture tables)');
  const { n } = sqlite.prepare('select count(*) as n from __drizzle_migrations').get() as { n: number };
  const expected = migrationCount();
  if (n < expected) throw new Error(`written by an older mocker (schema ${n} of ${expected}); open it once for writing (e.g. mocker serve --on-miss record) to upgrade it`);
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

function sha256(data: Buffer): string {
  return createHash('sha256').update(data).digest('hex');
}

type Db = BetterSQLite3Database<typeof schema>;
const p = sql.placeholder;

/**
 * The capture file: one SQLite database, in WAL mode while open for writing and migrated at open; closed
 * cleanly, everything is in the database file itself (see `close`).
 */
export class CaptureStore {
  readonly path: string;
  readonly readonly: boolean;
  private readonly sqlite: Database.Database;
  private readonly db: Db;
  private readonly insertExchange;
  private readonly insertGeneration;
  private readonly selectByKey;
  private readonly selectGenerations;
  private readonly selectPrompts;
  private readonly recentLookups = new LruCache<string, StoredExchange[]>(256);

  private constructor(path: string, { readonly = false }: OpenOptions) {
    this.path = path;
    this.readonly = readonly;
    if (readonly && !existsSync(path)) throw new CaptureFileError(path, 'no such file');
    let sqlite: Database.Database | undefined;
    try {
      if (!readonly && path !== ':memory:') mkdirSync(dirname(resolve(path)), { recursive: true });
      sqlite = new Database(path, { readonly, fileMustExist: readonly });
      if (!readonly) {
        sqlite.pragma('journal_mode = WAL');
        sqlite.pragma('synchronous = NORMAL');
      }
      sqlite.pragma('foreign_keys = ON');
      sqlite.pragma('busy_timeout = 5000');
      this.db = drizzle(sqlite, { schema });
      if (readonly) checkMigrated(sqlite);
      else migrate(this.db, { migrationsFolder: MIGRATIONS });
    } catch (err) {
      sqlite?.close();
      throw new CaptureFileError(path, openFailure(err, readonly));
    }
    this.sqlite = sqlite;

    const e = schema.exchanges;
    this.insertExchange = this.db
      .insert(e)
      .values({
        runId: p('runId'),
        startedAt: p('startedAt'),
        requestId: p('requestId'),
        method: p('method'),
        path: p('path'),
        endpoint: p('endpoint'),
        outcome: p('outcome'),
        error: p('error'),
        status: p('status'),
        model: p('model'),
        stream: p('stream'),
        requestHeaders: p('requestHeaders'),
        requestBody: p('requestBody'),
        responseHeaders: p('responseHeaders'),
        responseBody: p('responseBody'),
        eventEnds: p('eventEnds'),
        eventTimes: p('eventTimes'),
        eventTokens: p('eventTokens'),
        totalMs: p('totalMs'),
        tokenSource: p('tokenSource'),
        promptIds: p('promptIds'),
        promptLen: p('promptLen'),
        promptKey: p('promptKey'),
        requestShape: p('requestShape'),
        injected: p('injected'),
        usage: p('usage'),
      })
      .returning({ id: e.id })
      .prepare();
    const g = schema.generations;
    this.insertGeneration = this.db
      .insert(g)
      .values({
        exchangeId: p('exchangeId'),
        choiceIndex: p('choiceIndex'),
        outputIds: p('outputIds'),
        tokenTimes: p('tokenTimes'),
        chunkTokens: p('chunkTokens'),
        chunkDeltas: p('chunkDeltas'),
        text: p('text'),
        finishReason: p('finishReason'),
        stopReason: p('stopReason'),
      })
      .prepare();
    this.selectByKey = this.db
      .select()
      .from(e)
      .where(and(eq(e.promptKey, p('key')), eq(e.outcome, 'complete')))
      .orderBy(asc(e.id))
      .prepare();
    this.selectPrompts = this.sqlite.prepare(
      `select id, prompt_ids as promptIds from exchanges where model = ? and outcome = 'complete' and prompt_ids is not null order by id desc`,
    );
    this.selectGenerations = this.db
      .select()
      .from(g)
      .where(eq(g.exchangeId, p('id')))
      .orderBy(asc(g.choiceIndex))
      .prepare();
  }

  static open(path: string, options: OpenOptions = {}): CaptureStore {
    return new CaptureStore(path, options);
  }

  /**
   * Closes the connection. A writer folds the write-ahead log into the database file
   * (`wal_checkpoint(TRUNCATE)`) and, when no other connection has the file open, leaves WAL mode: the `.db`
   * file alone then holds everything, and a reader that cannot create `-wal`/`-shm` files (read-only storage)
   * can open it. The next writer turns WAL mode on again.
   */
  close(): void {
    if (!this.sqlite.open) return;
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
   * Starts a capture run; tokenizer files are stored content-addressed (deduplicated across runs). `startedAt`
   * is given when a run is copied from another file (import, merge).
   */
  startRun(info: RunInfo, tokenizerFiles: Map<string, Buffer>, startedAt = Date.now()): number {
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
      this.db.update(schema.runs).set({ tokenizerName: name, tokenizerFiles: JSON.stringify(files) }).where(eq(schema.runs.id, id)).run();
    })();
  }

  private storeFiles(tokenizerFiles: Map<string, Buffer>): Record<string, string> {
    const files: Record<string, string> = {};
    for (const [name, data] of tokenizerFiles) {
      const hash = sha256(data);
      this.db.insert(schema.blobs).values({ sha256: hash, size: data.length, data }).onConflictDoNothing().run();
      files[name] = hash;
    }
    return files;
  }

  /** Writes one exchange and its generations atomically. */
  saveExchange(ex: Exchange): number {
    this.recentLookups.clear();
    return this.sqlite.transaction(() => {
      const { id } = this.insertExchange.get({
        ...ex,
        stream: ex.stream ? 1 : 0,
        requestHeaders: JSON.stringify(ex.requestHeaders),
        requestBody: ex.bodiesRedacted ? null : ex.requestBody,
        responseHeaders: JSON.stringify(ex.responseHeaders),
        responseBody: ex.bodiesRedacted ? null : ex.responseBody,
        eventEnds: packU32(ex.eventEnds),
        eventTimes: packF64(ex.eventTimes),
        eventTokens: packU32(ex.eventTokens),
        promptIds: ex.promptIds ? packU32(ex.promptIds) : null,
        promptLen: ex.promptIds?.length ?? null,
        promptKey: ex.poolingKey ?? (ex.promptIds && ex.model !== null ? promptKey(ex.model, ex.promptIds) : null),
        injected: JSON.stringify(ex.injected),
        usage: ex.usage === undefined ? null : JSON.stringify(ex.usage),
      }) as { id: number };
      for (const gen of ex.generations) {
        this.insertGeneration.run({
          exchangeId: id,
          choiceIndex: gen.choiceIndex,
          outputIds: packU32(gen.outputIds),
          tokenTimes: packF64(gen.tokenTimes),
          chunkTokens: packU32(gen.chunkTokens),
          chunkDeltas: JSON.stringify(gen.chunkDeltas),
          text: gen.text,
          finishReason: gen.finishReason,
          stopReason: JSON.stringify(gen.stopReason),
        });
      }
      return id;
    })();
  }

  /**
   * Every complete capture of exactly this model and prompt, oldest first. Remembered (replay asks for the
   * same prompts again and again); any write forgets.
   */
  findByPrompt(model: string, promptIds: ArrayLike<number>): StoredExchange[] {
    return this.findByKey(promptKey(model, promptIds));
  }

  /** Every complete exchange stored under `key` (a prompt key or a pooling key), oldest first; remembered likewise. */
  findByKey(key: string): StoredExchange[] {
    let found = this.recentLookups.get(key);
    if (!found) {
      found = this.selectByKey.all({ key }).map((row) => this.hydrate(row));
      this.recentLookups.set(key, found);
    }
    return found;
  }

  /** How many complete exchanges were recorded at `path` (as requested: query string included). */
  completeAt(path: string): number {
    const e = schema.exchanges;
    return this.db.select({ n: sql<number>`count(*)` }).from(e).where(and(eq(e.path, path), eq(e.outcome, 'complete'))).get()?.n ?? 0;
  }

  /** Every exchange's id, in captured order (request start, then id). */
  exchangeIds(): number[] {
    const e = schema.exchanges;
    return this.db.select({ id: e.id }).from(e).orderBy(asc(e.startedAt), asc(e.id)).all().map((r) => r.id);
  }

  getExchange(id: number): StoredExchange | undefined {
    const row = this.db.select().from(schema.exchanges).where(eq(schema.exchanges.id, id)).get();
    return row && this.hydrate(row);
  }

  /**
   * The complete capture of `model` sharing the longest prompt-token prefix with `promptIds`
   * (ties: the newest). A linear scan: it only runs on the miss path.
   */
  nearest(model: string, promptIds: ArrayLike<number>): NearestCapture | null {
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

  /** The tokenizer files a run recorded, by file name. */
  tokenizerFiles(run: StoredRun): Map<string, Buffer> {
    const hashes = Object.values(run.tokenizerFiles);
    const out = new Map<string, Buffer>();
    if (hashes.length === 0) return out;
    const rows = this.db.select().from(schema.blobs).where(inArray(schema.blobs.sha256, hashes)).all();
    const byHash = new Map(rows.map((r) => [r.sha256, r.data]));
    for (const [name, hash] of Object.entries(run.tokenizerFiles)) {
      const data = byHash.get(hash);
      if (data) out.set(name, data);
    }
    return out;
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
    return this.db.select().from(schema.runs).orderBy(asc(schema.runs.id)).all().map((row) => this.storedRun(row));
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
        bodiesRedacted: sql<number>`${e.requestBody} is null and ${e.responseBody} is null`,
      })
      .from(e)
      .where(and(...conditions))
      .orderBy(asc(e.startedAt), asc(e.id))
      .all()
      .map((r) => ({ ...r, endpoint: r.endpoint as ExchangeSummary['endpoint'], outcome: r.outcome as Outcome, stream: Boolean(r.stream), bodiesRedacted: Boolean(r.bodiesRedacted) }));
  }

  /** Runs `work` in one transaction: all of it is written, or (it throws) none. */
  transaction<T>(work: () => T): T {
    return this.sqlite.transaction(work)();
  }

  /** Removes exchanges with their generations. */
  deleteExchanges(ids: readonly number[]): void {
    this.recentLookups.clear();
    this.sqlite.transaction(() => {
      // Chunked: SQLite limits the host parameters of one statement.
      for (let i = 0; i < ids.length; i += 500) {
        const chunk = ids.slice(i, i + 500);
        this.db.delete(schema.generations).where(inArray(schema.generations.exchangeId, chunk)).run();
        this.db.delete(schema.exchanges).where(inArray(schema.exchanges.id, chunk)).run();
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

  private hydrate(row: typeof schema.exchanges.$inferSelect): StoredExchange {
    const gens = this.selectGenerations.all({ id: row.id });
    return {
      id: row.id,
      runId: row.runId,
      startedAt: row.startedAt,
      requestId: row.requestId,
      method: row.method,
      path: row.path,
      endpoint: row.endpoint as Exchange['endpoint'],
      outcome: row.outcome as Outcome,
      error: row.error,
      status: row.status,
      model: row.model,
      stream: Boolean(row.stream),
      requestHeaders: JSON.parse(row.requestHeaders ?? '{}') as HeaderMap,
      requestBody: row.requestBody ?? Buffer.alloc(0),
      responseHeaders: JSON.parse(row.responseHeaders ?? '{}') as HeaderMap,
      responseBody: row.responseBody ?? Buffer.alloc(0),
      eventEnds: unpackU32(row.eventEnds),
      eventTimes: unpackF64(row.eventTimes),
      eventTokens: unpackU32(row.eventTokens),
      totalMs: row.totalMs ?? 0,
      tokenSource: row.tokenSource as TokenSource | null,
      promptIds: row.promptIds ? unpackU32(row.promptIds) : null,
      requestShape: row.requestShape,
      injected: JSON.parse(row.injected ?? '[]') as string[],
      usage: row.usage === null ? undefined : (JSON.parse(row.usage) as unknown),
      bodiesRedacted: row.requestBody === null && row.responseBody === null,
      poolingKey: isGeneration(row.endpoint as Exchange['endpoint']) ? null : row.promptKey,
      generations: gens.map((g) => ({
        choiceIndex: g.choiceIndex,
        outputIds: unpackU32(g.outputIds),
        tokenTimes: unpackF64(g.tokenTimes),
        chunkTokens: unpackU32(g.chunkTokens),
        chunkDeltas: JSON.parse(g.chunkDeltas) as ChunkDelta[],
        text: g.text,
        finishReason: g.finishReason,
        stopReason: JSON.parse(g.stopReason ?? 'null') as string | number | null,
      })),
    };
  }

  /**
   * `serve --match prefix`: the complete `endpoint` exchanges of the longest proper prefix of `promptIds`, at
   * least `minLength` tokens long, that `model` was captured with as a whole prompt (oldest first); empty if
   * none was. Each candidate length's prompt key comes from one running hash (promptKey's bytes), and the keys
   * are looked up in the prompt-key index, longest first, in batches.
   */
  findByLongestPrefix(model: string, endpoint: 'chat' | 'completion', promptIds: readonly number[], minLength: number): StoredExchange[] {
    const first = Math.max(1, minLength);
    const packed = packU32(promptIds);
    const running = createHash('sha256').update(model).update('\0').update(packed.subarray(0, 4 * first));
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
}

/** Prompt keys per query of findByLongestPrefix (well under SQLite's 32,766 bound variables). */
const PREFIX_KEYS_PER_QUERY = 512;
