/**
 * `mocker captures fit FILE -o profile.npz`: the perf model learnt from a capture's timings (perfFit.ts),
 * written as the NPZ `serve --planner-profile-data` reads (engine-reference §4.2).
 */
import { npzBytes, type NpyArray } from '../engine/perf/npy.js';
import type { PerfTables } from '../engine/perf/perfModel.js';
import { CaptureStore, namingCapture, type StoredExchange } from '../store/captureStore.js';
import { writeOutputFile } from '../util/outputFile.js';
import { fitPerfProfile, type CaptureTimeline, type PerfFit, type TermFit } from './perfFit.js';

export interface FitCommandOptions {
  output: string;
  blockSize: number;
  /** Only these capture runs (default: all). */
  run?: number[];
  /** Fitting points only from this model's requests (every request still occupies the engine). */
  model?: string;
  /** Replace an existing output file (see util/outputFile.ts). */
  force?: boolean;
}

/** Cached prompt tokens from a usage object (vLLM's `prompt_tokens_details.cached_tokens`), else 0. */
function cachedTokens(usage: unknown): number {
  const details = (usage as { prompt_tokens_details?: { cached_tokens?: unknown } } | undefined)?.prompt_tokens_details;
  return typeof details?.cached_tokens === 'number' ? details.cached_tokens : 0;
}

/** Per token of a generation: whether it came alone in its chunk. */
function aloneInChunk(chunkTokens: number[]): boolean[] {
  return chunkTokens.flatMap((count) => new Array<boolean>(count).fill(count === 1));
}

/**
 * The capture's generation requests on one time line (send time + ms since sent). A streamed, complete one
 * gives a sequence per choice; any other that reached the engine (not refused with a 4xx/5xx status before
 * streaming) only says the engine was busy from its sending to its end.
 */
export function captureTimeline(store: CaptureStore, options: Pick<FitCommandOptions, 'run' | 'model'>): CaptureTimeline {
  const runs = options.run && new Set(options.run);
  const timeline: CaptureTimeline = { sequences: [], opaque: [] };
  const add = (ex: StoredExchange) => {
    if (ex.endpoint === null || (ex.status !== null && ex.status >= 400)) return;
    const known =
      ex.outcome === 'complete' &&
      ex.stream &&
      ex.promptIds !== null &&
      ex.generations.length > 0 &&
      ex.generations.every((g) => g.tokenTimes.length > 0 && g.chunkTokens.reduce((a, b) => a + b, 0) === g.tokenTimes.length);
    if (!known) return void timeline.opaque.push({ sentMs: ex.startedAt, endMs: ex.startedAt + ex.totalMs });
    for (const g of ex.generations) {
      timeline.sequences.push({
        label: ex.generations.length > 1 ? `exchange ${ex.id} choice ${g.choiceIndex}` : `exchange ${ex.id}`,
        sentMs: ex.startedAt,
        promptTokens: ex.promptIds!.length,
        cachedTokens: cachedTokens(ex.usage),
        tokenMs: g.tokenTimes.map((t) => ex.startedAt + t),
        aloneInChunk: aloneInChunk(g.chunkTokens),
        fitted: options.model === undefined || ex.model === options.model,
      });
    }
  };
  for (const id of store.exchangeIds()) {
    const ex = store.getExchange(id);
    if (ex && (!runs || runs.has(ex.runId))) add(ex);
  }
  return timeline;
}

/** Fits the capture file's timings and writes the NPZ (the output checked before the work); returns the fit for the report. */
export function fitCaptureFile(file: string, options: FitCommandOptions): Promise<PerfFit> {
  return writeOutputFile(options.output, { inputs: [file], force: options.force }, (write) => {
    const timeline = namingCapture(file, () => {
      const store = CaptureStore.open(file, { readonly: true });
      try {
        for (const id of options.run ?? []) if (!store.getRun(id)) throw new Error(`no capture run ${id}`);
        return captureTimeline(store, options);
      } finally {
        store.close();
      }
    });
    if (options.model !== undefined && !timeline.sequences.some((s) => s.fitted))
      throw new Error(`${file} has no streamed, complete generation of model '${options.model}'`);
    const fit = fitPerfProfile(timeline, { blockSize: options.blockSize });
    write(npzBytes(perfTablesArrays(fit.tables)));
    return fit;
  });
}

/** The NPZ arrays of perf tables, under the keys `--planner-profile-data` reads (perfModel.ts). */
export function perfTablesArrays(tables: PerfTables): Record<string, NpyArray> {
  const vector = (values: ArrayLike<number>) => ({ shape: [values.length], data: Float64Array.from(values) });
  const matrix = (rows: ArrayLike<ArrayLike<number>>) => ({
    shape: [rows.length, rows[0].length],
    data: Float64Array.from(Array.from(rows, (row) => Array.from(row)).flat()),
  });
  return {
    prefill_isl: vector(tables.prefill_isl),
    prefill_ttft_ms: vector(tables.prefill_ttft_ms),
    decode_active_kv_tokens: vector(tables.decode_active_kv_tokens),
    decode_context_length: vector(tables.decode_context_length),
    decode_itl: matrix(tables.decode_itl),
    ...(tables.prefill_context_length && tables.prefill_ttft_ms_by_context
      ? { prefill_context_length: vector(tables.prefill_context_length), prefill_ttft_ms_by_context: matrix(tables.prefill_ttft_ms_by_context) }
      : {}),
  };
}

const number = (value: number, digits = 4) => Number(value.toPrecision(digits)).toLocaleString('en-US', { maximumSignificantDigits: digits });
const span = ([low, high]: [number, number]) => (low === high ? number(low) : `${number(low)}–${number(high)}`);

function formula(fit: TermFit, units: Record<string, string>): string {
  const terms = Object.entries(fit.coefficients).map(([name, c]) => (name === 'base' ? number(c) : `${number(c)} × ${units[name]}`));
  return `ms = ${terms.join(' + ').replaceAll('+ -', '− ')}   R² ${fit.r2.toFixed(3)}, median |residual| ${number(fit.medianAbsResidualMs, 3)} ms`;
}

function prefillSummary(prefill: PerfFit['prefill']): string {
  const tokens = `${span(prefill.ranges.new_prompt_tokens)} new prompt tokens over a context of ${span(prefill.ranges.context_tokens)}`;
  if (prefill.source === 'idle first tokens')
    return `prefill: ${prefill.points} requests that met an idle engine (too few prefill steps under load to tell the time outside the engine); ${tokens}`;
  const idle =
    prefill.overheadMs === null
      ? 'no request met an idle engine'
      : `${prefill.idleRequests} requests that met an idle engine, whose first token came ${number(prefill.overheadMs, 3)} ms after the passes (HTTP and request handling: not in the profile)`;
  return `prefill: ${prefill.steps} steps under load and ${idle}; ${tokens}`;
}

/** The fit report printed on a terminal. */
export function formatFitReport(fit: PerfFit, output: string | null): string {
  const { decode, prefill, tables } = fit;
  const last = (values: ArrayLike<number>) => values[values.length - 1];
  const lines = [
    `decode step: ${decode.points} output gaps (left out: ${decode.excluded.prefillInStep} with a prefill in the step, ${decode.excluded.unknownRequestInFlight} beside a request of unknown timing, ${decode.excluded.irregular} irregular); ` +
      `batch ${span(decode.ranges.batch)}, active KV ${span(decode.ranges.active_kv_tokens)} tokens, context ${span(decode.ranges.context_length)}`,
    `  ${formula(decode, { per_sequence: 'sequences', per_kv_token: 'active KV tokens' })}`,
    prefillSummary(prefill),
    `  ${formula(prefill, { per_token: 'tokens', per_token_context: 'tokens × context', per_token_squared: 'tokens²' })}`,
    ...[...decode.notes, ...prefill.notes].map((note) => `note: ${note}`),
    `${output === null ? 'profile' : `wrote ${output}`}: prefill ${tables.prefill_isl.length} points up to ${number(last(tables.prefill_isl))} tokens; decode ${tables.decode_active_kv_tokens.length} × ${tables.decode_context_length.length} ` +
      `up to ${number(last(tables.decode_active_kv_tokens))} active KV tokens, context ${number(tables.decode_context_length[0])}–${number(last(tables.decode_context_length))}`,
  ];
  return lines.join('\n');
}
