/** What `mocker captures list`, `show`, `stats` and `export` read from a capture file (the CLI only prints it). */
import { outputIdsCheck, type OutputIdsCheck } from './outputIds.js';
import { ReplayCollector, type ReplayReport } from '../trace/collector.js';
import {
  CaptureStore,
  hasTokens,
  isAgentApi,
  isGeneration,
  namingCapture,
  type ExchangeFilter,
  type ExchangeSummary,
  type HeaderMap,
  type Outcome,
  type AgentApi,
  type RecordedEndpoint,
  type StoredExchange,
  type StoredRun,
} from '../store/captureStore.js';
import { ModelTokenizer } from '../tokenizer/index.js';
import { exchangeRecord, exportJsonl, type ExchangeLine } from './jsonl.js';

const iso = (ms: number) => new Date(ms).toISOString();

export interface RunListing {
  id: number;
  kind: string;
  engine: string | null;
  engineVersion: string | null;
  upstream: string | null;
  label: string | null;
  startedAt: string;
  /** Exchanges of the run the filter selects. */
  exchanges: number;
}

export interface Listing {
  runs: RunListing[];
  /** Models of the selected exchanges. */
  models: string[];
  outcomes: Record<Outcome, number>;
  /** Selected exchanges by endpoint (`other`: not a generation). */
  endpoints: Record<'chat' | 'completion' | AgentApi | 'other', number>;
  total: number;
  /** First and last selected exchange's start; null when none. */
  from: string | null;
  until: string | null;
  /** With `--exchanges`: one row per selected exchange. */
  exchanges?: (Omit<ExchangeSummary, 'startedAt'> & { startedAt: string })[];
}

/** `captures list`: what `file` holds of the exchanges `filter` selects. */
export function listCaptures(file: string, filter: ExchangeFilter, withExchanges: boolean): Promise<Listing> {
  return readCaptureFile(file, (store) => listingOf(store, filter, withExchanges));
}

function listingOf(store: CaptureStore, filter: ExchangeFilter, withExchanges: boolean): Listing {
  const selected = store.exchangeSummaries(filter);
  const perRun = new Map<number, number>();
  const outcomes: Record<Outcome, number> = { complete: 0, failed: 0, aborted: 0 };
  const endpoints = { chat: 0, completion: 0, generate: 0, responses: 0, messages: 0, other: 0 };
  const models = new Set<string>();
  for (const ex of selected) {
    perRun.set(ex.runId, (perRun.get(ex.runId) ?? 0) + 1);
    outcomes[ex.outcome]++;
    endpoints[isGeneration(ex.endpoint) || isAgentApi(ex.endpoint) ? ex.endpoint : 'other']++;
    if (ex.model !== null) models.add(ex.model);
  }
  const filtered = Object.values(filter).some((v) => v !== undefined);
  const runs = store
    .runs()
    // A filter shows the runs it selected exchanges of; no filter shows every run, empty ones too.
    .filter((run) => !filtered || perRun.has(run.id))
    .map((run) => ({
      id: run.id,
      kind: run.kind,
      engine: run.engine ?? null,
      engineVersion: run.engineVersion ?? null,
      upstream: run.upstream ?? null,
      label: run.label ?? null,
      startedAt: iso(run.startedAt),
      exchanges: perRun.get(run.id) ?? 0,
    }));
  const listing: Listing = {
    runs,
    models: [...models].sort(),
    outcomes,
    endpoints,
    total: selected.length,
    // Summaries come in captured order.
    from: selected.length > 0 ? iso(selected[0].startedAt) : null,
    until: selected.length > 0 ? iso(selected[selected.length - 1].startedAt) : null,
  };
  if (withExchanges) listing.exchanges = selected.map((e) => ({ ...e, startedAt: iso(e.startedAt) }));
  return listing;
}

/** The run's own tokenizer (stored in the file), for text the file holds only as ids. */
function runTokenizer(store: CaptureStore, run: StoredRun | undefined): ModelTokenizer | null {
  if (!run) return null;
  const files = store.tokenizerFiles(run);
  return files.has('tokenizer.json') ? new ModelTokenizer(run.tokenizerName ?? 'captured', files, { fromCapture: true }) : null;
}

export interface ChunkTiming {
  /** Arrival of the chunk's tokens, ms since the request was sent upstream. */
  atMs: number | null;
  /** Since the previous chunk of the choice (the first chunk: since the request). */
  gapMs: number | null;
  tokens: number;
  ids: number[];
  /** The chunk's delta as captured (absent when the bodies were redacted). */
  delta?: Record<string, unknown>;
}

export interface ShownChoice {
  index: number;
  finishReason: string | null;
  stopReason: string | number | null;
  text: string;
  /** The text was decoded from the ids with the run's tokenizer (redacted bodies), not captured. */
  textDecoded: boolean;
  outputIds: number[];
  chunks: ChunkTiming[];
}

export interface Shown {
  id: number;
  run: number;
  startedAt: string;
  method: string;
  path: string;
  endpoint: RecordedEndpoint | null;
  stream: boolean;
  model: string | null;
  outcome: Outcome;
  status: number | null;
  error: string | null;
  totalMs: number;
  tokenSource: ExchangeLine['tokenSource'];
  bodiesRedacted: boolean;
  requestHeaders: HeaderMap;
  /** The request body as text (bytes that are not UTF-8: base64), null when redacted. */
  requestBody: ExchangeLine['requestBody'];
  /** The response headers as stored (a failed exchange's too). */
  responseHeaders: HeaderMap;
  /** The response body as stored, like the request body. */
  responseBody: ExchangeLine['responseBody'];
  promptIds: number[] | null;
  /** The prompt ids decoded by the run's tokenizer, special tokens kept (null: no ids or no tokenizer). */
  promptText: string | null;
  usage: unknown;
  /** Whether the output ids are the engine's own. */
  outputIds: OutputIdsCheck;
  choices: ShownChoice[];
}

function chunkTimings(tokenTimes: number[], chunkTokens: number[], outputIds: number[], deltas: Record<string, unknown>[]): ChunkTiming[] {
  const out: ChunkTiming[] = [];
  let end = 0;
  let previous = 0;
  for (const [i, count] of chunkTokens.entries()) {
    const start = end;
    end += count;
    // A chunk without tokens (text held back until the end) arrived with the previous token.
    const atMs = end > 0 ? tokenTimes[end - 1] : null;
    out.push({
      atMs,
      gapMs: atMs === null ? null : atMs - previous,
      tokens: count,
      ids: outputIds.slice(start, end),
      ...(deltas[i] ? { delta: deltas[i] } : {}),
    });
    if (atMs !== null) previous = atMs;
  }
  return out;
}

/** `captures show`: exchange `id` of `file`. */
export function showExchange(file: string, id: number): Promise<Shown> {
  return readCaptureFile(file, (store) => {
    const ex = store.getExchange(id);
    if (!ex) throw new Error(`no exchange ${id}`);
    return shown(store, ex);
  });
}

async function shown(store: CaptureStore, ex: StoredExchange): Promise<Shown> {
  const run = store.getRun(ex.runId);
  const needsTokenizer = ex.promptIds !== null || ex.bodiesRedacted;
  const tokenizer = needsTokenizer ? runTokenizer(store, run) : null;
  const record = exchangeRecord(ex, ex.runId);
  const choices: ShownChoice[] = [];
  for (const g of ex.generations) {
    const decode = ex.bodiesRedacted && tokenizer !== null;
    choices.push({
      index: g.choiceIndex,
      finishReason: g.finishReason,
      stopReason: g.stopReason,
      text: decode ? await tokenizer.decode(g.outputIds, true) : g.text,
      textDecoded: decode,
      outputIds: g.outputIds,
      chunks: chunkTimings(g.tokenTimes, g.chunkTokens, g.outputIds, g.chunkDeltas),
    });
  }
  return {
    id: ex.id,
    run: ex.runId,
    startedAt: iso(ex.startedAt),
    method: ex.method,
    path: ex.path,
    endpoint: ex.endpoint,
    stream: ex.stream,
    model: ex.model,
    outcome: ex.outcome,
    status: ex.status,
    error: ex.error,
    totalMs: ex.totalMs,
    tokenSource: ex.tokenSource,
    bodiesRedacted: ex.bodiesRedacted,
    requestHeaders: ex.requestHeaders,
    requestBody: record.requestBody,
    responseHeaders: ex.responseHeaders,
    responseBody: record.responseBody,
    promptIds: ex.promptIds,
    promptText: ex.promptIds && tokenizer ? await tokenizer.decode(ex.promptIds, false) : null,
    usage: ex.usage ?? null,
    outputIds: outputIdsCheck(ex),
    choices,
  };
}

export interface RunStats {
  run: number;
  engine: string | null;
  label: string | null;
  startedAt: string;
  /**
   * The run's generation exchanges by how they were answered. Only streamed ones have a first-token time and
   * gaps between tokens: TTFT, ITL and the per-user token rate are over them alone.
   */
  exchanges: { streamed: number; notStreamed: number };
  /**
   * The trace report's keys and statistics (src/trace/collector.ts), over the run's generation exchanges. The
   * token-timing keys are absent when no streamed exchange gave such a sample (rather than zeros).
   */
  report: ReplayReport;
}

/** Report keys of the figures only streamed answers give: first token; then the gaps between tokens. */
const FIRST_TOKEN_STATS = ['ttft_ms'];
const TOKEN_GAP_STATS = ['ttst_ms', 'tpot_ms', 'itl_ms', 'output_token_throughput_per_user'];

/**
 * Per run, the statistics `mocker trace` reports, from the captured timing: each generation exchange is a
 * request arriving at its start (the run's clock starts at its first exchange), a streamed one's output tokens
 * (all choices) arriving at their captured times, a non-streamed one's all at its end. Exchanges that produced
 * no token (failed) count as requests, not completed.
 */
export function captureStats(file: string, runId?: number): Promise<RunStats[]> {
  return readCaptureFile(file, (store) => {
    if (runId !== undefined && !store.getRun(runId)) throw new Error(`no run ${runId}`);
    return runStats(store, runId);
  });
}

function runStats(store: CaptureStore, runId?: number): RunStats[] {
  const runs = store.runs().filter((run) => runId === undefined || run.id === runId);
  return runs.map((run) => {
    const collector = new ReplayCollector([]);
    const exchanges = store.exchangeSummaries({ runId: run.id }).filter((e) => hasTokens(e.endpoint));
    const origin = exchanges.length > 0 ? exchanges[0].startedAt : 0;
    const counts = { streamed: 0, notStreamed: 0 };
    let timedFirstTokens = 0;
    let timedGaps = 0;
    let lastMs = 0;
    for (const summary of exchanges) {
      const ex = store.getExchange(summary.id);
      if (!ex) continue;
      const uuid = String(ex.id);
      const arrival = ex.startedAt - origin;
      const times = ex.generations.flatMap((g) => g.tokenTimes).sort((a, b) => a - b);
      collector.onArrival(uuid, arrival, ex.promptIds?.length ?? 0, times.length);
      collector.onAdmit(uuid, arrival, 0);
      if (ex.stream) {
        counts.streamed++;
        for (const t of times) collector.onTokens(uuid, arrival + t);
        if (times.length > 0) timedFirstTokens++;
        if (times.length > 1) timedGaps++;
      } else {
        counts.notStreamed++;
        if (times.length > 0) collector.onAnswered(uuid, arrival + ex.totalMs, times.length);
      }
      if (times.length > 0) lastMs = Math.max(lastMs, arrival + (ex.stream ? times[times.length - 1] : ex.totalMs));
    }
    const report = collector.report(lastMs);
    // A capture knows nothing of the engine's prefix cache.
    for (const key of [
      'prefix_cache_reused_ratio',
      'first_admission_prefix_cache_reused_ratio',
      'total_reused_input_tokens',
      'total_first_admission_reused_input_tokens',
    ])
      delete report[key];
    // No sample is no figure, not a zero.
    const absent = [...(timedFirstTokens === 0 ? FIRST_TOKEN_STATS : []), ...(timedGaps === 0 ? TOKEN_GAP_STATS : [])];
    for (const key of Object.keys(report)) if (absent.some((suffix) => key.endsWith(`_${suffix}`))) delete report[key];
    return { run: run.id, engine: run.engine ?? null, label: run.label ?? null, startedAt: iso(run.startedAt), exchanges: counts, report };
  });
}

/** Reads a capture file: any failure, opening it or later (a damaged page), names the file. */
async function readCaptureFile<T>(file: string, work: (store: CaptureStore) => T | Promise<T>): Promise<T> {
  return namingCapture(file, async () => {
    const store = CaptureStore.open(file, { readonly: true });
    try {
      return await work(store);
    } finally {
      store.close();
    }
  });
}

/** `captures export`: `file` as JSONL, handed to `write` piece by piece. */
export function exportCaptures(file: string, write: (text: string) => Promise<void>): Promise<void> {
  return readCaptureFile(file, (store) => exportJsonl(store, write));
}
