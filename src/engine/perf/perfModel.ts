/**
 * Performance models: how long a prefill and a decode step take (spec §4.1–4.3). Times are unscaled ms; the
 * scheduler applies `speedup_ratio` / `decode_speedup_ratio` itself (§1.5).
 */
import { readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { readNpz, type NpyArray } from './npy.js';

export interface PerfModel {
  /**
   * Prefill time in ms (unscaled), for `batchSize` prefilling requests with integer-mean input length `meanIsl` and mean
   * cached/previously computed prefix `meanPrefix` (tokens = batchSize × (meanIsl − meanPrefix)); a table by context
   * reads `attendedContext`, the context the new tokens attend over (their requests' lengths weighted by new tokens).
   */
  prefillMs(batchSize: number, meanIsl: number, meanPrefix: number, attendedContext?: number): number;
  /** One decode step in ms (unscaled); 0 when batchSize is 0. */
  decodeMs(batchSize: number, activeKvTokens: number, contextLength: number, totalKvTokens: number): number;
  /** For logs and /mocker/engine: e.g. "polynomial" or "interpolated (path)". */
  readonly description: string;
}

/** New prompt tokens of a prefill batch; a prefix beyond the input counts as nothing (Rust `saturating_sub`). */
function prefillTokens(batchSize: number, meanIsl: number, meanPrefix: number): number {
  return batchSize * Math.max(0, meanIsl - meanPrefix);
}

/** Decode steps must not collapse onto the same timestamp, so every decode step costs at least 1 ms (§4.1). */
const MIN_DECODE_MS = 1.0;

/** §4.1: the default model, fitted upstream (PR #6100). */
export const polynomialPerfModel: PerfModel = {
  description: 'polynomial',
  prefillMs(batchSize, meanIsl, meanPrefix) {
    const tokens = prefillTokens(batchSize, meanIsl, meanPrefix);
    return Math.max(0, 4.209989e-7 * tokens * tokens + 1.518344e-2 * tokens + 1.650142e1);
  },
  decodeMs(batchSize, activeKvTokens, _contextLength, totalKvTokens) {
    if (batchSize === 0) return 0;
    // Upstream warns and treats an engine without KV capacity as fully used.
    const usage = totalKvTokens > 0 ? activeKvTokens / totalKvTokens : 1.0;
    return Math.max(MIN_DECODE_MS, -25.74 * usage * usage + 54.01 * usage + 5.74);
  },
};

/** The five arrays of a mocker-format perf-data `.npz` (§4.2), named after its keys. */
export interface PerfTables {
  /** x-axis: prefill tokens, strictly increasing. */
  prefill_isl: ArrayLike<number>;
  /** Prefill time in ms at each `prefill_isl`. */
  prefill_ttft_ms: ArrayLike<number>;
  /** Decode axis 1 (rows of `decode_itl`), strictly increasing. */
  decode_active_kv_tokens: ArrayLike<number>;
  /** Decode axis 2 (columns of `decode_itl`), strictly increasing. */
  decode_context_length: ArrayLike<number>;
  /** ITL in ms: `decode_itl[i][j]` at (`decode_active_kv_tokens[i]`, `decode_context_length[j]`). */
  decode_itl: ArrayLike<ArrayLike<number>>;
  /**
   * Optional (a mocker extension, both or neither): prefill time by new tokens and the context they attend over
   * (the prefilling requests' lengths, cached prefix included, weighted by their new tokens). `prefill_ttft_ms_by_context[i][j]` at
   * (`prefill_isl[i]`, `prefill_context_length[j]`); when present it answers instead of `prefill_ttft_ms`.
   */
  prefill_context_length?: ArrayLike<number>;
  prefill_ttft_ms_by_context?: ArrayLike<ArrayLike<number>>;
}

/** A table over two strictly increasing axes, read by bilinear interpolation that extrapolates from the edge cells. */
class BilinearGrid {
  private readonly values: Float64Array;

  constructor(
    private readonly rows: Float64Array,
    private readonly columns: Float64Array,
    table: ArrayLike<ArrayLike<number>>,
    names: { table: string; rows: string; columns: string },
  ) {
    const raggedRow = Array.from(table).findIndex((row) => row.length !== columns.length);
    if (table.length !== rows.length || raggedRow >= 0) {
      const shape = raggedRow >= 0 ? `row ${raggedRow} has ${table[raggedRow].length} columns` : `shape (${table.length}, ${table[0]?.length ?? 0})`;
      throw new Error(
        `${names.table.split('_')[0]} array dimension mismatch: ${names.table} ${shape}, expected (${rows.length}, ${columns.length}) ` +
          `= (len(${names.rows}), len(${names.columns}))`,
      );
    }
    this.values = new Float64Array(rows.length * columns.length);
    for (let i = 0; i < rows.length; i++) this.values.set(checkedValues(`${names.table} row ${i}`, table[i]), i * columns.length);
  }

  at(rowValue: number, columnValue: number): number {
    const width = this.columns.length;
    const row = segmentIndex(this.rows, rowValue);
    const col = segmentIndex(this.columns, columnValue);
    const t = (rowValue - this.rows[row]) / (this.rows[row + 1] - this.rows[row]);
    const s = (columnValue - this.columns[col]) / (this.columns[col + 1] - this.columns[col]);
    const v = (r: number, c: number) => this.values[r * width + c];
    return (1 - t) * (1 - s) * v(row, col) + t * (1 - s) * v(row + 1, col) + (1 - t) * s * v(row, col + 1) + t * s * v(row + 1, col + 1);
  }
}

/**
 * §4.2: prefill by 1-D linear interpolation over total new tokens, decode by bilinear interpolation over
 * (active KV tokens, context length); both extrapolate linearly from the edge segment/cell outside the grid,
 * like upstream's `ndarray_interp` Linear/Bilinear with `extrapolate(true)`.
 */
export class InterpolatedPerfModel implements PerfModel {
  readonly description: string;
  private readonly prefillIsl: Float64Array;
  private readonly prefillTtftMs: Float64Array;
  /** Prefill by (new tokens, context), when the tables have it. */
  private readonly prefillByContext: BilinearGrid | null;
  private readonly itl: BilinearGrid;

  constructor(tables: PerfTables, description = 'interpolated') {
    this.description = description;
    const { prefill_isl, prefill_ttft_ms, decode_active_kv_tokens, decode_context_length, decode_itl } = tables;
    if (prefill_isl.length !== prefill_ttft_ms.length) {
      throw new Error(`prefill array length mismatch: prefill_isl has ${prefill_isl.length} values, prefill_ttft_ms has ${prefill_ttft_ms.length}`);
    }
    const activeKvAxis = checkedAxis('decode_active_kv_tokens', decode_active_kv_tokens);
    const contextAxis = checkedAxis('decode_context_length', decode_context_length);
    this.itl = new BilinearGrid(activeKvAxis, contextAxis, decode_itl, {
      table: 'decode_itl',
      rows: 'decode_active_kv_tokens',
      columns: 'decode_context_length',
    });
    this.prefillIsl = checkedAxis('prefill_isl', prefill_isl);
    this.prefillTtftMs = checkedValues('prefill_ttft_ms', prefill_ttft_ms);
    const { prefill_context_length: prefillContext, prefill_ttft_ms_by_context: byContext } = tables;
    if ((prefillContext === undefined) !== (byContext === undefined))
      throw new Error('prefill_context_length and prefill_ttft_ms_by_context go together: one is missing');
    this.prefillByContext =
      prefillContext && byContext
        ? new BilinearGrid(this.prefillIsl, checkedAxis('prefill_context_length', prefillContext), byContext, {
            table: 'prefill_ttft_ms_by_context',
            rows: 'prefill_isl',
            columns: 'prefill_context_length',
          })
        : null;
  }

  prefillMs(batchSize: number, meanIsl: number, meanPrefix: number, attendedContext = meanIsl): number {
    const tokens = prefillTokens(batchSize, meanIsl, meanPrefix);
    let ms: number;
    if (this.prefillByContext) ms = this.prefillByContext.at(tokens, attendedContext);
    else {
      const axis = this.prefillIsl;
      const i = segmentIndex(axis, tokens);
      const fraction = (tokens - axis[i]) / (axis[i + 1] - axis[i]);
      ms = this.prefillTtftMs[i] + fraction * (this.prefillTtftMs[i + 1] - this.prefillTtftMs[i]);
    }
    // Upstream maps an interpolation error to 0 ms.
    return Number.isNaN(ms) ? 0 : Math.max(0, ms);
  }

  decodeMs(batchSize: number, activeKvTokens: number, contextLength: number, _totalKvTokens: number): number {
    if (batchSize === 0) return 0;
    const ms = this.itl.at(activeKvTokens, contextLength);
    return Number.isNaN(ms) ? MIN_DECODE_MS : Math.max(MIN_DECODE_MS, ms);
  }
}

/** Index i of the segment [axis[i], axis[i+1]] used for `value`; the edge segments extend outward (extrapolation). */
function segmentIndex(axis: Float64Array, value: number): number {
  let low = 0;
  let high = axis.length - 2;
  while (low < high) {
    const mid = (low + high + 1) >> 1;
    if (axis[mid] <= value) low = mid;
    else high = mid - 1;
  }
  return low;
}

function checkedValues(name: string, values: ArrayLike<number>): Float64Array {
  const copy = Float64Array.from(values);
  const bad = copy.findIndex((v) => !Number.isFinite(v));
  if (bad >= 0) throw new Error(`${name}[${bad}] is ${copy[bad]}, expected a finite number`);
  return copy;
}

/** Interpolation axes need ≥ 2 strictly increasing points, as upstream's interpolator builder requires. */
function checkedAxis(name: string, values: ArrayLike<number>): Float64Array {
  const axis = checkedValues(name, values);
  if (axis.length < 2) throw new Error(`${name} needs at least 2 points to interpolate, got ${axis.length}`);
  for (let i = 1; i < axis.length; i++) {
    if (!(axis[i] > axis[i - 1])) throw new Error(`${name} must be strictly increasing: [${i - 1}] = ${axis[i - 1]}, [${i}] = ${axis[i]}`);
  }
  return axis;
}

// ---- loading (`--planner-profile-data`) ----

const PERF_DATA_KEYS = ['prefill_isl', 'prefill_ttft_ms', 'decode_active_kv_tokens', 'decode_context_length', 'decode_itl'] as const;

/**
 * `--planner-profile-data` (§4.3): a mocker-format `.npz` with the five §4.2 keys, or a profiler results directory
 * holding `selected_prefill_interpolation/raw_data.npz` (else `prefill_raw_data.json`) and
 * `selected_decode_interpolation/raw_data.npz` (else `decode_raw_data.json`).
 */
export async function loadPerfModel(path: string): Promise<PerfModel> {
  let isDirectory: boolean;
  try {
    isDirectory = (await stat(path)).isDirectory();
  } catch {
    throw new Error(`planner profile data '${path}' not found (expected a .npz file or a profiler results directory)`);
  }
  return isDirectory ? loadProfilerDirectory(path) : loadPerfDataNpz(path);
}

async function loadPerfDataNpz(path: string): Promise<PerfModel> {
  const arrays = await readNpzFile(path);
  for (const key of PERF_DATA_KEYS) requireKey(arrays, path, key);
  const vector = (key: string): Float64Array => {
    const array = requireKey(arrays, path, key);
    if (array.shape.length !== 1) throw new Error(`${path}: '${key}' must be 1-D, got shape (${array.shape.join(', ')})`);
    return array.data;
  };
  const itl = requireKey(arrays, path, 'decode_itl');
  const tables: PerfTables = {
    prefill_isl: vector('prefill_isl'),
    prefill_ttft_ms: vector('prefill_ttft_ms'),
    decode_active_kv_tokens: vector('decode_active_kv_tokens'),
    decode_context_length: vector('decode_context_length'),
    decode_itl: matrixRows(path, 'decode_itl', itl),
  };
  // The optional context-dependent prefill (PerfTables): files without it load as before.
  const byContext = arrays.get('prefill_ttft_ms_by_context');
  if (arrays.has('prefill_context_length')) tables.prefill_context_length = vector('prefill_context_length');
  if (byContext) tables.prefill_ttft_ms_by_context = matrixRows(path, 'prefill_ttft_ms_by_context', byContext);
  try {
    return new InterpolatedPerfModel(tables, `interpolated (${path})`);
  } catch (err) {
    throw new Error(`${path}: ${(err as Error).message}`);
  }
}

/** The rows of a 2-D array. */
function matrixRows(path: string, key: string, array: NpyArray): Float64Array[] {
  if (array.shape.length !== 2) throw new Error(`${path}: '${key}' must be 2-D, got shape (${array.shape.join(', ')})`);
  const [rows, columns] = array.shape;
  return Array.from({ length: rows }, (_, i) => array.data.subarray(i * columns, (i + 1) * columns));
}

async function readNpzFile(path: string): Promise<Map<string, NpyArray>> {
  const bytes = await readFile(path);
  try {
    return readNpz(new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength));
  } catch (err) {
    throw new Error(`${path}: ${(err as Error).message}`);
  }
}

function requireKey(arrays: Map<string, NpyArray>, path: string, key: string): NpyArray {
  const array = arrays.get(key);
  if (!array) throw new Error(`${path}: missing key '${key}' (found: ${[...arrays.keys()].join(', ') || 'none'})`);
  return array;
}

/** Raw profiler arrays of one file, read from either its `raw_data.npz` or its JSON form. */
interface RawProfile {
  path: string;
  /** A 1-D, non-empty, finite array under `key`. */
  values(key: string): number[];
}

async function exists(path: string): Promise<boolean> {
  return stat(path).then(
    () => true,
    () => false,
  );
}

async function openRawProfile(directory: string, npzPath: string, jsonPath: string): Promise<RawProfile> {
  const npz = join(directory, npzPath);
  const json = join(directory, jsonPath);
  if (await exists(npz)) {
    const arrays = await readNpzFile(npz);
    return {
      path: npz,
      values: (key) => checkedRawValues(npz, key, Array.from(requireKey(arrays, npz, key).data)),
    };
  }
  if (await exists(json)) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(await readFile(json, 'utf8'));
    } catch (err) {
      throw new Error(`${json}: not valid JSON: ${(err as Error).message}`);
    }
    if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) throw new Error(`${json}: expected a JSON object`);
    const record = parsed as Record<string, unknown>;
    return {
      path: json,
      values: (key) => {
        if (!(key in record)) throw new Error(`${json}: missing key '${key}'`);
        const value = record[key];
        // `max_kv_tokens` is a plain number in the JSON form; accept a bare number for any key.
        const list = typeof value === 'number' ? [value] : value;
        if (!Array.isArray(list) || !list.every((v): v is number => typeof v === 'number')) {
          throw new Error(`${json}: '${key}' must be an array of numbers`);
        }
        return checkedRawValues(json, key, list);
      },
    };
  }
  throw new Error(`profiler results directory '${directory}': neither ${npz} nor ${json} exists`);
}

function checkedRawValues(path: string, key: string, values: number[]): number[] {
  if (values.length === 0) throw new Error(`${path}: '${key}' is empty`);
  const bad = values.findIndex((v) => !Number.isFinite(v));
  if (bad >= 0) throw new Error(`${path}: '${key}'[${bad}] is ${values[bad]}, expected a finite number`);
  return values;
}

function requireSameLength(path: string, lengths: Record<string, number>): void {
  const entries = Object.entries(lengths);
  if (entries.some(([, n]) => n !== entries[0][1])) {
    throw new Error(`${path}: length mismatch: ${entries.map(([key, n]) => `'${key}' has ${n}`).join(', ')}`);
  }
}

function sortedUnique(values: number[]): number[] {
  return [...new Set(values)].sort((a, b) => a - b);
}

/** Position of each value of `axis`, for placing raw points on it. */
function positionsOf(axis: number[]): Map<number, number> {
  return new Map(axis.map((value, i) => [value, i]));
}

/**
 * Converts profiler raw data into interpolation tables. Upstream fits regression models and resamples them on a
 * 100-point grid; we instead use the measurements themselves, deterministically:
 * - prefill: the raw (isl, ttft) points sorted by isl, ttfts of equal isls averaged;
 * - decode: axes active_kv = sorted unique(x_kv_usage × max_kv_tokens[0]) and context = sorted unique(y_context_length);
 *   a cell holding raw points gets their mean ITL; every other cell copies the nearest such cell, by Euclidean
 *   distance with each axis scaled to [0, 1] by its range (ties: the first in row-major order).
 */
async function loadProfilerDirectory(directory: string): Promise<PerfModel> {
  const prefill = await openRawProfile(directory, join('selected_prefill_interpolation', 'raw_data.npz'), 'prefill_raw_data.json');
  const decode = await openRawProfile(directory, join('selected_decode_interpolation', 'raw_data.npz'), 'decode_raw_data.json');

  const isl = prefill.values('prefill_isl');
  const ttft = prefill.values('prefill_ttft');
  requireSameLength(prefill.path, { prefill_isl: isl.length, prefill_ttft: ttft.length });
  const prefillAxis = sortedUnique(isl);
  if (prefillAxis.length < 2) throw new Error(`${prefill.path}: 'prefill_isl' needs at least 2 distinct values to interpolate, got ${prefillAxis.length}`);
  const islPosition = positionsOf(prefillAxis);
  const prefillMean = meanByPosition(
    isl.map((x, i) => ({ position: islPosition.get(x)!, value: ttft[i] })),
    prefillAxis.length,
  );

  const kvUsage = decode.values('x_kv_usage');
  const contextLengths = decode.values('y_context_length');
  const itl = decode.values('z_itl');
  const maxKvTokens = decode.values('max_kv_tokens')[0];
  requireSameLength(decode.path, { x_kv_usage: kvUsage.length, y_context_length: contextLengths.length, z_itl: itl.length });
  if (!(maxKvTokens > 0)) throw new Error(`${decode.path}: 'max_kv_tokens' must be positive, got ${maxKvTokens}`);
  const activeKv = kvUsage.map((usage) => usage * maxKvTokens);
  const activeAxis = sortedUnique(activeKv);
  const contextAxis = sortedUnique(contextLengths);
  if (activeAxis.length < 2)
    throw new Error(`${decode.path}: 'x_kv_usage' × 'max_kv_tokens' needs at least 2 distinct values to interpolate, got ${activeAxis.length}`);
  if (contextAxis.length < 2) throw new Error(`${decode.path}: 'y_context_length' needs at least 2 distinct values to interpolate, got ${contextAxis.length}`);

  const columns = contextAxis.length;
  const activePosition = positionsOf(activeAxis);
  const contextPosition = positionsOf(contextAxis);
  const cellMean = meanByPosition(
    activeKv.map((kv, i) => ({ position: activePosition.get(kv)! * columns + contextPosition.get(contextLengths[i])!, value: itl[i] })),
    activeAxis.length * columns,
  );
  const activeRange = activeAxis[activeAxis.length - 1] - activeAxis[0];
  const contextRange = contextAxis[columns - 1] - contextAxis[0];
  const measured = cellMean.flatMap((value, cell) => (Number.isNaN(value) ? [] : [cell]));
  const grid = activeAxis.map((kv, row) =>
    contextAxis.map((context, col) => {
      const own = cellMean[row * columns + col];
      if (!Number.isNaN(own)) return own;
      let nearest = measured[0];
      let nearestDistance = Infinity;
      for (const cell of measured) {
        const dx = (activeAxis[Math.floor(cell / columns)] - kv) / activeRange;
        const dy = (contextAxis[cell % columns] - context) / contextRange;
        const distance = dx * dx + dy * dy;
        if (distance < nearestDistance) {
          nearest = cell;
          nearestDistance = distance;
        }
      }
      return cellMean[nearest];
    }),
  );

  const tables: PerfTables = {
    prefill_isl: prefillAxis,
    prefill_ttft_ms: prefillMean,
    decode_active_kv_tokens: activeAxis,
    decode_context_length: contextAxis,
    decode_itl: grid,
  };
  return new InterpolatedPerfModel(tables, `interpolated (${directory}, profiler raw data)`);
}

/** Mean value per position (NaN where a position got no value). */
function meanByPosition(points: { position: number; value: number }[], positions: number): number[] {
  const sums = new Array<number>(positions).fill(0);
  const counts = new Array<number>(positions).fill(0);
  for (const { position, value } of points) {
    sums[position] += value;
    counts[position]++;
  }
  return sums.map((sum, i) => (counts[i] > 0 ? sum / counts[i] : Number.NaN));
}
