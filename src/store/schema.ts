import { sql } from 'drizzle-orm';
import { blob, index, integer, primaryKey, real, sqliteTable, text, uniqueIndex } from 'drizzle-orm/sqlite-core';

/** Content-addressed files (tokenizer files of the capture), keyed by the SHA-256 of the file's own bytes. */
export const blobs = sqliteTable('blobs', {
  sha256: text('sha256').primaryKey(),
  /** The file's own size (before compression). */
  size: integer('size').notNull(),
  data: blob('data', { mode: 'buffer' }).notNull(),
  /**
   * How `data` holds the file (store/fileBlobs.ts). 0: as it is (every file written before migration
   * 0004_blob_encoding; read as it is). 1: brotli-compressed.
   */
  encoding: integer('encoding').notNull().default(0),
});

/** One `mocker capture` (or record-on-miss) session: the engine's identity and the tokenizer it used. */
export const runs = sqliteTable('runs', {
  id: integer('id').primaryKey({ autoIncrement: true }),
  startedAt: integer('started_at').notNull(),
  kind: text('kind').notNull(),
  upstream: text('upstream'),
  /** What the upstream was: `vllm` | `sglang` | `llama.cpp` | `transformers` | `openai` | `unknown`. */
  engine: text('engine'),
  label: text('label'),
  engineVersion: text('engine_version'),
  versionJson: text('version_json'),
  modelsJson: text('models_json'),
  maxModelLen: integer('max_model_len'),
  tokenizerName: text('tokenizer_name'),
  /** JSON object: file name -> sha256 in `blobs`. */
  tokenizerFiles: text('tokenizer_files'),
});

/**
 * One proxied HTTP exchange. Written in a single transaction once the exchange is over,
 * so replay never sees a half-recorded answer.
 */
export const exchanges = sqliteTable(
  'exchanges',
  {
    id: integer('id').primaryKey({ autoIncrement: true }),
    runId: integer('run_id')
      .notNull()
      .references(() => runs.id),
    startedAt: integer('started_at').notNull(),
    requestId: text('request_id'),
    method: text('method').notNull(),
    path: text('path').notNull(),
    /** `chat` | `completion` for recorded generation endpoints, `embeddings` | `rerank` for pooling ones, null otherwise. */
    endpoint: text('endpoint'),
    /** `complete` | `failed` | `aborted`. Only `complete` exchanges answer replays. */
    outcome: text('outcome').notNull(),
    error: text('error'),
    status: integer('status'),
    model: text('model'),
    stream: integer('stream', { mode: 'boolean' }),
    // Small columns first: the lookup and miss paths read them without walking the large blobs' overflow pages.
    totalMs: real('total_ms'),
    /** `engine` | `tokenize-endpoint` | `local`. */
    tokenSource: text('token_source'),
    /** Packed u32 prompt token ids. */
    promptIds: blob('prompt_ids', { mode: 'buffer' }),
    promptLen: integer('prompt_len'),
    /** The replay lookup key: sha256(model NUL packed prompt ids) for generations, generation/poolingKey.ts's for pooling exchanges. */
    promptKey: text('prompt_key'),
    /** Canonical JSON of the request fields that shape the response bytes. */
    requestShape: text('request_shape'),
    /** JSON list of request fields the proxy added (removed again from what the client saw). */
    injected: text('injected'),
    usage: text('usage'),
    requestHeaders: text('request_headers'),
    requestBody: blob('request_body', { mode: 'buffer' }),
    responseHeaders: text('response_headers'),
    /** The upstream's bytes as received (including fields the proxy injected). */
    responseBody: blob('response_body', { mode: 'buffer' }),
    /** Packed u32: byte offset where each SSE event ends in `response_body`. */
    eventEnds: blob('event_ends', { mode: 'buffer' }),
    /** Packed f64: arrival time of each SSE event, ms since the request was sent upstream. */
    eventTimes: blob('event_times', { mode: 'buffer' }),
    /** Packed u32: output tokens (all choices) received up to and including each SSE event. */
    eventTokens: blob('event_tokens', { mode: 'buffer' }),
    /**
     * How this row and its generations are laid out. 0: as the comments above say (files written before
     * encoding 1; read as they are). 1: bodies and event tables in `exchange_bodies`, the prompt's ids in
     * `prompt_nodes` (`prompt_ids` only for an exchange without a model), every blob in pack.ts's compact encodings.
     * 2: as 1, but the event tables and generations are one record in `exchange_bodies.event_ends` (pack.ts's
     * `packTables`, which earlier versions wrote; `event_times` and `event_tokens` empty) and the exchange has no `generations` rows.
     * 3: as 2, but the record holds the request and response bodies too (pack.ts's `packRecord`, one deflate call
     * against the prompt's dictionary) and chunk deltas by column; `request_body` and `response_body` are empty,
     * or NULL when the capture was redacted.
     * 4: as 3, but the bodies in the record have the prompt's id lists cut out (re-rendered from the prompt tree)
     * and the record is brotli-compressed, with no dictionary (pack.ts's `packRecord`).
     * Added last (as ALTER TABLE adds columns): a row of encoding 1 holds no large value, so reading this never
     * walks a blob's overflow pages.
     */
    encoding: integer('encoding').notNull().default(0),
    /** The `prompt_nodes` node of the whole prompt (an exchange with a model and prompt ids). */
    promptNode: integer('prompt_node'),
  },
  (t) => [
    // Covering: a lookup by prompt key reads its answer from the index alone (CaptureStore's head columns), not
    // the table's pages, which at 100,000 exchanges are mostly outside the cache (12 µs a lookup instead of 27).
    index('exchanges_prompt_key_head')
      .on(t.promptKey, t.id, t.runId, t.startedAt, t.endpoint, t.outcome, t.status, t.model, t.stream, t.totalMs, t.requestShape, t.promptNode, t.encoding)
      .where(sql`outcome = 'complete'`),
    index('exchanges_model').on(t.model),
  ],
);

/**
 * The large values of an exchange of encoding 1, read only when used (a lookup by prompt key reads none of them).
 * Each is pack.ts's `squeeze`d: bodies deflated against `bodyDictionary` of the exchange's prompt ids, event ends
 * and token counts as varint deltas, event times as byte planes. Encoding 2 keeps all event tables and the
 * generations in `event_ends`, as one record (one deflate call instead of eight), the other two columns empty;
 * encodings 3 and 4 add the bodies to that record (their columns empty, NULL when redacted).
 */
export const exchangeBodies = sqliteTable('exchange_bodies', {
  exchangeId: integer('exchange_id')
    .primaryKey()
    .references(() => exchanges.id, { onDelete: 'cascade' }),
  /** NULL (both): `capture --redact-bodies` stored no bodies. */
  requestBody: blob('request_body', { mode: 'buffer' }),
  responseBody: blob('response_body', { mode: 'buffer' }),
  eventEnds: blob('event_ends', { mode: 'buffer' }).notNull(),
  eventTimes: blob('event_times', { mode: 'buffer' }).notNull(),
  eventTokens: blob('event_tokens', { mode: 'buffer' }).notNull(),
});

/**
 * Captured prompts as a radix tree per model (store/promptTree.ts): a root per model (`model` set, no parent),
 * and below it nodes whose `tokens` (varint-packed ids) continue their parent's prefix; siblings start with
 * distinct tokens. `newest` is the newest complete exchange at or below the node (0: none), which the miss path's
 * nearest-capture search reads instead of scanning every prompt.
 */
export const promptNodes = sqliteTable(
  'prompt_nodes',
  {
    id: integer('id').primaryKey(),
    parent: integer('parent'),
    firstToken: integer('first_token'),
    model: text('model'),
    tokens: blob('tokens', { mode: 'buffer' }).notNull(),
    newest: integer('newest').notNull(),
  },
  (t) => [
    uniqueIndex('prompt_nodes_child').on(t.parent, t.firstToken).where(sql`parent is not null`),
    uniqueIndex('prompt_nodes_root').on(t.model).where(sql`model is not null`),
  ],
);

/**
 * One choice of a recorded generation, with its per-token data packed (encodings 0 and 1; encoding 2 keeps
 * generations in `exchange_bodies`). Encoding 1 (the exchange's): output ids and
 * chunk token counts as varints, token times as `packTokenTimes`, chunk deltas and text deflated (blobs), all
 * `squeeze`d.
 */
export const generations = sqliteTable(
  'generations',
  {
    exchangeId: integer('exchange_id')
      .notNull()
      .references(() => exchanges.id),
    choiceIndex: integer('choice_index').notNull(),
    /** Packed u32 output token ids. */
    outputIds: blob('output_ids', { mode: 'buffer' }).notNull(),
    /** Packed f64: arrival time of each output token, ms since the request was sent upstream. */
    tokenTimes: blob('token_times', { mode: 'buffer' }).notNull(),
    /** Packed u32: number of output tokens carried by each streamed chunk (one entry if not streamed). */
    chunkTokens: blob('chunk_tokens', { mode: 'buffer' }).notNull(),
    /** JSON array, one delta per chunk: `{text}` for completions, the chat delta without `role` for chat. */
    chunkDeltas: text('chunk_deltas').notNull(),
    text: text('text').notNull(),
    finishReason: text('finish_reason'),
    /** JSON: string, token id or null. */
    stopReason: text('stop_reason'),
  },
  (t) => [primaryKey({ columns: [t.exchangeId, t.choiceIndex] })],
);
