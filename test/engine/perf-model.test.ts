import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { zipSync } from 'fflate';
import { afterAll, describe, expect, it } from 'vitest';
import { readNpz } from '../../src/engine/perf/npy.js';
import { InterpolatedPerfModel, loadPerfModel, polynomialPerfModel, type PerfModel, type PerfTables } from '../../src/engine/perf/perfModel.js';
import { testTmpdir } from '../support/tempRoot.js';

// Every expected number below comes from the spec (§4.1 example tables) or is computed by hand in the comments.

const dir = mkdtempSync(join(testTmpdir(), 'perf-model-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Asserts `actual` is within `tolerance` of `expected` (the spec prints 2-decimal values). */
function near(actual: number, expected: number, tolerance = 0.01) {
  expect(Math.abs(actual - expected), `${actual} vs ${expected}`).toBeLessThanOrEqual(tolerance);
}

// ---- hand-written .npy / .npz files, per https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html ----

type Descr = '<f8' | '<f4' | '<i8' | '<i4' | '>f8' | '|u1';
const ITEM_SIZE: Record<Descr, number> = { '<f8': 8, '<f4': 4, '<i8': 8, '<i4': 4, '>f8': 8, '|u1': 1 };

interface NpyOptions {
  descr?: Descr;
  /** Defaults to 1-D of the values' length. */
  shape?: number[];
  fortranOrder?: boolean;
  version?: 1 | 2 | 3;
}

/** A .npy file: magic, version, header length (u16 LE for 1.0, u32 LE for 2.0/3.0), dict header padded to 64 bytes, data. */
function npy(values: number[], { descr = '<f8', shape = [values.length], fortranOrder = false, version = 1 }: NpyOptions = {}): Uint8Array {
  const shapeText = shape.length === 1 ? `(${shape[0]},)` : `(${shape.join(', ')})`;
  const dict = `{'descr': '${descr}', 'fortran_order': ${fortranOrder ? 'True' : 'False'}, 'shape': ${shapeText}, }`;
  const preamble = version === 1 ? 10 : 12;
  const dataStart = Math.ceil((preamble + dict.length + 1) / 64) * 64;
  const header = dict + ' '.repeat(dataStart - preamble - dict.length - 1) + '\n';
  const size = ITEM_SIZE[descr];
  const bytes = new Uint8Array(dataStart + values.length * size);
  const view = new DataView(bytes.buffer);
  bytes.set([0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, version, 0]); // "\x93NUMPY", major, minor
  if (version === 1) view.setUint16(8, header.length, true);
  else view.setUint32(8, header.length, true);
  bytes.set(new TextEncoder().encode(header), preamble);
  values.forEach((value, i) => {
    const at = dataStart + i * size;
    if (descr === '<f8') view.setFloat64(at, value, true);
    else if (descr === '>f8') view.setFloat64(at, value, false);
    else if (descr === '<f4') view.setFloat32(at, value, true);
    else if (descr === '<i8') view.setBigInt64(at, BigInt(value), true);
    else if (descr === '<i4') view.setInt32(at, value, true);
    else view.setUint8(at, value);
  });
  return bytes;
}

type Compression = 'stored' | 'deflated';

/** An .npz: each array as `KEY.npy` in a zip. */
function npz(arrays: Record<string, Uint8Array>, compression: Compression = 'deflated'): Uint8Array {
  const files = Object.fromEntries(Object.entries(arrays).map(([key, bytes]) => [`${key}.npy`, bytes]));
  return zipSync(files, { level: compression === 'stored' ? 0 : 6 });
}

/** Compression method of every local file header in a zip (0 = stored, 8 = deflated). */
function zipMethods(zip: Uint8Array): number[] {
  const view = new DataView(zip.buffer, zip.byteOffset, zip.byteLength);
  const methods: number[] = [];
  let at = 0;
  while (at + 30 <= zip.length && view.getUint32(at, true) === 0x04034b50) {
    methods.push(view.getUint16(at + 8, true));
    const compressedSize = view.getUint32(at + 18, true);
    at += 30 + view.getUint16(at + 26, true) + view.getUint16(at + 28, true) + compressedSize;
  }
  return methods;
}

let fileCounter = 0;
function writeTemp(bytes: Uint8Array | string, name = `file-${++fileCounter}.npz`): string {
  const path = join(dir, name);
  writeFileSync(path, bytes);
  return path;
}

// ---- a small perf-data table with hand-computed answers ----

/**
 * prefill: isl [100, 300, 700] → ttft [20, 30, 70] (slopes 0.05 then 0.1 ms/token).
 * decode: active_kv [0, 1000, 3000] × context [100, 500]; itl rows per active_kv: [5, 7], [9, 15], [13, 19].
 */
const TABLES: PerfTables = {
  prefill_isl: [100, 300, 700],
  prefill_ttft_ms: [20, 30, 70],
  decode_active_kv_tokens: [0, 1000, 3000],
  decode_context_length: [100, 500],
  decode_itl: [
    [5, 7],
    [9, 15],
    [13, 19],
  ],
};

function perfDataNpz(compression: Compression, overrides: Record<string, Uint8Array | undefined> = {}): Uint8Array {
  const arrays: Record<string, Uint8Array | undefined> = {
    prefill_isl: npy([100, 300, 700]),
    prefill_ttft_ms: npy([20, 30, 70]),
    decode_active_kv_tokens: npy([0, 1000, 3000]),
    decode_context_length: npy([100, 500]),
    decode_itl: npy([5, 7, 9, 15, 13, 19], { shape: [3, 2] }),
    ...overrides,
  };
  const present = Object.fromEntries(Object.entries(arrays).filter((entry): entry is [string, Uint8Array] => entry[1] !== undefined));
  return npz(present, compression);
}

/** The hand-computed answers for TABLES, shared by the in-memory and loaded models. */
function expectTableAnswers(model: PerfModel) {
  // Prefill at batch × (isl − prefix) tokens.
  expect(model.prefillMs(2, 150, 50)).toBeCloseTo(25, 9); // 200 tokens: 20 + 100·0.05
  expect(model.prefillMs(1, 500, 0)).toBeCloseTo(50, 9); // 500: 30 + 200·0.1
  expect(model.prefillMs(3, 100, 0)).toBeCloseTo(30, 9); // 300: a knot
  expect(model.prefillMs(1, 50, 0)).toBeCloseTo(17.5, 9); // below the range: 20 − 50·0.05
  expect(model.prefillMs(1, 1100, 0)).toBeCloseTo(110, 9); // above the range: 70 + 400·0.1
  // Decode at (active_kv, context).
  expect(model.decodeMs(4, 500, 300, 99_999)).toBeCloseTo(9, 9); // cell centre: (5 + 7 + 9 + 15) / 4
  expect(model.decodeMs(4, 2000, 100, 99_999)).toBeCloseTo(11, 9); // edge: (9 + 13) / 2
  expect(model.decodeMs(4, 1000, 500, 99_999)).toBeCloseTo(15, 9); // a grid point
  expect(model.decodeMs(4, 2000, 400, 99_999)).toBeCloseTo(15.5, 9); // 9 + .75·6 = 13.5, 13 + .75·6 = 17.5, mean 15.5
}

describe('polynomial perf model (§4.1)', () => {
  it('prefill matches the spec examples (tokens = batch × (isl − prefix))', () => {
    const examples: [number, number][] = [
      [0, 16.5],
      [64, 17.47],
      [512, 24.39],
      [1000, 32.11],
      [4096, 85.76],
      [8192, 169.14],
      [16384, 378.28],
    ];
    for (const [tokens, ms] of examples) near(polynomialPerfModel.prefillMs(1, tokens, 0), ms);
    // The same token counts reached through batch and prefix.
    near(polynomialPerfModel.prefillMs(4, 1100, 76), 85.76); // 4 × 1024 = 4096
    near(polynomialPerfModel.prefillMs(8, 1500, 476), 169.14); // 8 × 1024 = 8192
    // A prefix beyond the input counts as no new tokens (only the intercept).
    near(polynomialPerfModel.prefillMs(2, 10, 20), 16.5);
  });

  it('charges the integer-mean token count (batch 2, isl_sum 9, prefix 0 → 8 tokens)', () => {
    // The caller passes floor(9 / 2) = 4; 8 tokens: 4.209989e-7·64 + 1.518344e-2·8 + 16.50142 = 16.6229144639...
    expect(polynomialPerfModel.prefillMs(2, Math.floor(9 / 2), 0)).toBeCloseTo(16.6229144639, 9);
  });

  it('decode matches the spec examples (u = active / total), independent of batch size and context', () => {
    const examples: [number, number][] = [
      [0, 5.74],
      [0.1, 10.88],
      [0.25, 17.63],
      [0.5, 26.31],
      [0.75, 31.77],
      [1.0, 34.01],
    ];
    for (const [usage, ms] of examples) {
      near(polynomialPerfModel.decodeMs(1, usage * 10_000, 1, 10_000), ms);
      near(polynomialPerfModel.decodeMs(200, usage * 4096, 32_000, 4096), ms);
    }
  });

  it('decode: 0 for an empty batch, u = 1 without KV capacity, at least 1 ms', () => {
    expect(polynomialPerfModel.decodeMs(0, 500, 100, 1000)).toBe(0);
    near(polynomialPerfModel.decodeMs(3, 500, 100, 0), 34.01);
    // u = 2.5: −25.74·6.25 + 54.01·2.5 + 5.74 = −20.11 → clamped.
    expect(polynomialPerfModel.decodeMs(3, 2500, 100, 1000)).toBe(1);
    expect(polynomialPerfModel.description).toBe('polynomial');
  });
});

describe('interpolated perf model (§4.2)', () => {
  it('interpolates linearly inside and extrapolates linearly outside (prefill 1-D, decode bilinear)', () => {
    const model = new InterpolatedPerfModel(TABLES);
    expectTableAnswers(model);
    // Decode extrapolation along each axis and both at once.
    expect(model.decodeMs(1, 5000, 100, 0)).toBeCloseTo(17, 9); // active: 9 + 2·(13 − 9)
    expect(model.decodeMs(1, 0, 900, 0)).toBeCloseTo(9, 9); // context: 5 + 2·(7 − 5)
    expect(model.decodeMs(1, 1000, 0, 0)).toBeCloseTo(7.5, 9); // context below: 9 − .25·6
    expect(model.decodeMs(1, -500, 100, 0)).toBeCloseTo(3, 9); // active below: 5 − .5·4
    // (4000, 700): 1.5 cells past both edges: 9 + 1.5·6 = 18, 13 + 1.5·6 = 22, then 18 + 1.5·4 = 24.
    expect(model.decodeMs(1, 4000, 700, 0)).toBeCloseTo(24, 9);
  });

  it('clamps prefill at 0 ms and decode at 1 ms; decode is 0 for an empty batch', () => {
    const model = new InterpolatedPerfModel({
      prefill_isl: [100, 200],
      prefill_ttft_ms: [10, 5],
      decode_active_kv_tokens: [0, 100],
      decode_context_length: [10, 20],
      decode_itl: [
        [3, 3],
        [2, 2],
      ],
    });
    expect(model.prefillMs(1, 250, 0)).toBeCloseTo(2.5, 9); // 5 − 50·0.05
    expect(model.prefillMs(1, 400, 0)).toBe(0); // would be −5
    expect(model.decodeMs(1, 150, 15, 0)).toBeCloseTo(1.5, 9); // 2 − 0.5
    expect(model.decodeMs(1, 300, 15, 0)).toBe(1); // would be 0
    expect(model.decodeMs(1, 1000, 15, 0)).toBe(1); // would be −7
    expect(model.decodeMs(0, 50, 15, 0)).toBe(0);
  });

  it('validates the table shapes with clear messages', () => {
    const build = (overrides: Partial<PerfTables>) => () => new InterpolatedPerfModel({ ...TABLES, ...overrides });
    expect(build({ prefill_ttft_ms: [20, 30] })).toThrow('prefill array length mismatch: prefill_isl has 3 values, prefill_ttft_ms has 2');
    expect(
      build({
        decode_itl: [
          [5, 7],
          [9, 15],
        ],
      }),
    ).toThrow('decode array dimension mismatch: decode_itl shape (2, 2), expected (3, 2)');
    expect(
      build({
        decode_itl: [
          [5, 7, 1],
          [9, 15, 1],
          [13, 19, 1],
        ],
      }),
    ).toThrow('decode array dimension mismatch: decode_itl row 0 has 3 columns, expected (3, 2)');
    expect(build({ decode_itl: [[5, 7], [9], [13, 19]] })).toThrow('decode_itl row 1 has 1 columns, expected (3, 2)');
    expect(build({ decode_context_length: [500, 100] })).toThrow('decode_context_length must be strictly increasing: [0] = 500, [1] = 100');
    expect(build({ prefill_isl: [100, 100, 700] })).toThrow('prefill_isl must be strictly increasing');
    expect(build({ prefill_isl: [100], prefill_ttft_ms: [20] })).toThrow('prefill_isl needs at least 2 points to interpolate, got 1');
    expect(build({ prefill_ttft_ms: [20, Number.NaN, 70] })).toThrow('prefill_ttft_ms[1] is NaN, expected a finite number');
  });
});

describe('NPZ reading', () => {
  it('builds real stored and deflated zips (sanity check of the fixtures)', () => {
    expect(new Set(zipMethods(perfDataNpz('stored')))).toEqual(new Set([0]));
    expect(new Set(zipMethods(perfDataNpz('deflated')))).toEqual(new Set([8]));
    expect(zipMethods(perfDataNpz('stored'))).toHaveLength(5);
  });

  it('reads every supported dtype, header versions 1.0/2.0/3.0, 0-d and 2-D shapes', () => {
    for (const compression of ['stored', 'deflated'] as const) {
      const arrays = readNpz(
        npz(
          {
            f8: npy([1.5, -2.25, 1e300]),
            f4: npy([0.5, -8], { descr: '<f4' }),
            i8: npy([1, -2, 3, 2 ** 53 - 1], { descr: '<i8', shape: [2, 2] }),
            i4: npy([-7, 2_000_000_000], { descr: '<i4' }),
            v2: npy([4, 5], { version: 2 }),
            v3: npy([6], { version: 3 }),
            scalar: npy([3.25], { shape: [] }),
            fortran1d: npy([1, 2, 3], { fortranOrder: true }),
          },
          compression,
        ),
      );
      const plain = Object.fromEntries([...arrays].map(([key, array]) => [key, { shape: array.shape, data: Array.from(array.data) }]));
      expect(plain).toEqual({
        f8: { shape: [3], data: [1.5, -2.25, 1e300] },
        f4: { shape: [2], data: [0.5, -8] },
        i8: { shape: [2, 2], data: [1, -2, 3, 2 ** 53 - 1] },
        i4: { shape: [2], data: [-7, 2_000_000_000] },
        v2: { shape: [2], data: [4, 5] },
        v3: { shape: [1], data: [6] },
        scalar: { shape: [], data: [3.25] },
        fortran1d: { shape: [3], data: [1, 2, 3] },
      });
    }
  });

  it('fails clearly on unsupported data', () => {
    const read = (array: Uint8Array) => () => readNpz(npz({ x: array }));
    expect(read(npy([1], { descr: '|u1' }))).toThrow("x: unsupported dtype '|u1'; expected one of <f8, <f4, <i4, <i8");
    expect(read(npy([1], { descr: '>f8' }))).toThrow("x: unsupported dtype '>f8' (big-endian data is not supported)");
    expect(read(npy([1, 2, 3, 4], { shape: [2, 2], fortranOrder: true }))).toThrow('x: fortran_order arrays are not supported (shape (2, 2))');
    expect(read(npy([1, 2], { shape: [3] }))).toThrow("x: truncated data: shape (3) of '<f8' needs 24 bytes, file has 16");
    expect(read(npy([2 ** 53 + 2], { descr: '<i8' }))).toThrow('x: int64 value 9007199254740994 does not fit a double exactly');
    expect(read(new TextEncoder().encode('not numpy at all'))).toThrow('x: not a .npy array (bad magic)');
    expect(() => readNpz(new TextEncoder().encode('not a zip'))).toThrow('not a readable .npz (zip) archive');
  });
});

describe('loadPerfModel: mocker-format .npz', () => {
  for (const compression of ['stored', 'deflated'] as const) {
    it(`loads the five §4.2 keys (${compression} entries)`, async () => {
      const path = writeTemp(perfDataNpz(compression));
      const model = await loadPerfModel(path);
      expectTableAnswers(model);
      expect(model.description).toBe(`interpolated (${path})`);
    });
  }

  it('reports the file and key on errors', async () => {
    const missing = writeTemp(perfDataNpz('deflated', { decode_itl: undefined }));
    await expect(loadPerfModel(missing)).rejects.toThrow(
      `${missing}: missing key 'decode_itl' (found: prefill_isl, prefill_ttft_ms, decode_active_kv_tokens, decode_context_length)`,
    );

    const mismatch = writeTemp(perfDataNpz('stored', { decode_itl: npy([5, 7, 9, 15], { shape: [2, 2] }) }));
    await expect(loadPerfModel(mismatch)).rejects.toThrow(`${mismatch}: decode array dimension mismatch: decode_itl shape (2, 2), expected (3, 2)`);

    const prefillMismatch = writeTemp(perfDataNpz('stored', { prefill_ttft_ms: npy([20, 30]) }));
    await expect(loadPerfModel(prefillMismatch)).rejects.toThrow(
      `${prefillMismatch}: prefill array length mismatch: prefill_isl has 3 values, prefill_ttft_ms has 2`,
    );

    const flatItl = writeTemp(perfDataNpz('stored', { decode_itl: npy([5, 7, 9, 15, 13, 19]) }));
    await expect(loadPerfModel(flatItl)).rejects.toThrow(`${flatItl}: 'decode_itl' must be 2-D, got shape (6)`);

    const badDtype = writeTemp(perfDataNpz('deflated', { prefill_isl: npy([1, 2, 3], { descr: '|u1' }) }));
    await expect(loadPerfModel(badDtype)).rejects.toThrow(`${badDtype}: prefill_isl: unsupported dtype '|u1'`);

    const notZip = writeTemp('hello');
    await expect(loadPerfModel(notZip)).rejects.toThrow(`${notZip}: not a readable .npz (zip) archive`);

    const nowhere = join(dir, 'does-not-exist.npz');
    await expect(loadPerfModel(nowhere)).rejects.toThrow(`planner profile data '${nowhere}' not found`);
  });
});

describe('loadPerfModel: the optional context-dependent prefill (prefill_context_length, prefill_ttft_ms_by_context)', () => {
  // Rows: prefill_isl 100, 300, 700 new tokens; columns: a context of 100 and 1100 tokens (the mean prompt length).
  const byContext = {
    prefill_context_length: npy([100, 1100]),
    prefill_ttft_ms_by_context: npy([20, 40, 30, 90, 70, 210], { shape: [3, 2] }),
  };

  it('reads prefill bilinearly over (new tokens, mean prompt length), the cached prefix counted in the context', async () => {
    const model = await loadPerfModel(writeTemp(perfDataNpz('deflated', byContext)));
    expect(model.prefillMs(1, 100, 0)).toBeCloseTo(20, 9); // a grid point: 100 tokens over a context of 100
    // 600 tokens over 600: t = (600 − 300) / 400 = .75, s = (600 − 100) / 1000 = .5: .125·30 + .375·70 + .125·90 + .375·210
    expect(model.prefillMs(1, 600, 0)).toBeCloseTo(120, 9);
    // 300 new tokens (a prompt of 1100, 800 cached) over a context of 1100: a grid point, not the 1-D table's 30.
    expect(model.prefillMs(1, 1100, 800)).toBeCloseTo(90, 9);
    // Without the context table the same query reads prefill_ttft_ms: 300 tokens → 30.
    expect((await loadPerfModel(writeTemp(perfDataNpz('deflated')))).prefillMs(1, 1100, 800)).toBeCloseTo(30, 9);
  });

  it('loads files without them as before, and refuses one without the other', async () => {
    expectTableAnswers(await loadPerfModel(writeTemp(perfDataNpz('stored'))));
    const half = writeTemp(perfDataNpz('stored', { prefill_context_length: byContext.prefill_context_length }));
    await expect(loadPerfModel(half)).rejects.toThrow(`${half}: prefill_context_length and prefill_ttft_ms_by_context go together: one is missing`);
    const ragged = writeTemp(perfDataNpz('stored', { ...byContext, prefill_ttft_ms_by_context: npy([20, 40, 30, 90], { shape: [2, 2] }) }));
    await expect(loadPerfModel(ragged)).rejects.toThrow(
      `${ragged}: prefill array dimension mismatch: prefill_ttft_ms_by_context shape (2, 2), expected (3, 2) = (len(prefill_isl), len(prefill_context_length))`,
    );
  });
});

describe('loadPerfModel: profiler results directory (§4.3)', () => {
  /*
   * Raw prefill points (isl, ttft): (300, 28), (100, 20), (700, 70), (300, 32) → sorted, the two 300s averaged:
   * isl [100, 300, 700], ttft [20, 30, 70] — the TABLES prefill, so the prefill answers are the same.
   *
   * Raw decode points (kv_usage, context, itl) with max_kv_tokens 1000:
   *   (0.125, 100, 5) (0.5, 100, 9) (0.5, 100, 11) (0.125, 300, 7) (0.75, 300, 21)
   * Axes: active_kv [125, 500, 750] (range 625), context [100, 300] (range 200).
   * Measured cells: (125,100) = 5, (500,100) = mean(9, 11) = 10, (125,300) = 7, (750,300) = 21.
   * Empty (500,300): normalised squared distances to (125,300) .6² = .36, to (750,300) .4² = .16, to (500,100) 1 → 21.
   * Empty (750,100): to (500,100) .4² = .16, to (750,300) 1, to (125,100) 1 → 10.
   * Grid rows: 125 → [5, 7], 500 → [10, 21], 750 → [10, 21].
   */
  const prefillRaw = { prefill_isl: [300, 100, 700, 300], prefill_ttft: [28, 20, 70, 32], prefill_thpt_per_gpu: [1, 1, 1, 1] };
  const decodeRaw = {
    x_kv_usage: [0.125, 0.5, 0.5, 0.125, 0.75],
    y_context_length: [100, 100, 100, 300, 300],
    z_itl: [5, 9, 11, 7, 21],
    z_thpt_per_gpu: [1, 1, 1, 1, 1],
  };

  function expectProfileAnswers(model: PerfModel) {
    expect(model.prefillMs(2, 150, 50)).toBeCloseTo(25, 9);
    expect(model.prefillMs(1, 500, 0)).toBeCloseTo(50, 9);
    expect(model.prefillMs(1, 1100, 0)).toBeCloseTo(110, 9);
    expect(model.decodeMs(1, 125, 100, 0)).toBeCloseTo(5, 9);
    expect(model.decodeMs(1, 500, 100, 0)).toBeCloseTo(10, 9); // duplicates averaged
    expect(model.decodeMs(1, 500, 300, 0)).toBeCloseTo(21, 9); // filled from the nearest measured cell
    expect(model.decodeMs(1, 750, 100, 0)).toBeCloseTo(10, 9); // filled from the nearest measured cell
    expect(model.decodeMs(1, 312.5, 200, 0)).toBeCloseTo(10.75, 9); // (5 + 7 + 10 + 21) / 4
    expect(model.decodeMs(1, 625, 200, 0)).toBeCloseTo(15.5, 9); // (10 + 21 + 10 + 21) / 4
    expect(model.decodeMs(1, 125, 500, 0)).toBeCloseTo(9, 9); // context extrapolated: 5 + 2·(7 − 5)
  }

  function profilerDir(name: string): string {
    const path = join(dir, name);
    mkdirSync(path);
    return path;
  }

  function writeRawNpz(directory: string, kind: 'prefill' | 'decode', arrays: Record<string, Uint8Array>) {
    mkdirSync(join(directory, `selected_${kind}_interpolation`), { recursive: true });
    writeFileSync(join(directory, `selected_${kind}_interpolation`, 'raw_data.npz'), npz(arrays));
  }

  const rawNpzArrays = (data: Record<string, number[]>) => Object.fromEntries(Object.entries(data).map(([key, values]) => [key, npy(values)]));

  it('converts selected_*_interpolation/raw_data.npz', async () => {
    const directory = profilerDir('npz-profile');
    writeRawNpz(directory, 'prefill', rawNpzArrays(prefillRaw));
    writeRawNpz(directory, 'decode', { ...rawNpzArrays(decodeRaw), max_kv_tokens: npy([1000], { descr: '<i8' }) });
    const model = await loadPerfModel(directory);
    expectProfileAnswers(model);
    expect(model.description).toBe(`interpolated (${directory}, profiler raw data)`);
  });

  it('converts prefill_raw_data.json and decode_raw_data.json (max_kv_tokens as a number or an array)', async () => {
    for (const maxKvTokens of [1000, [1000, 5]]) {
      const directory = profilerDir(`json-profile-${Array.isArray(maxKvTokens) ? 'array' : 'number'}`);
      writeFileSync(join(directory, 'prefill_raw_data.json'), JSON.stringify(prefillRaw));
      writeFileSync(join(directory, 'decode_raw_data.json'), JSON.stringify({ ...decodeRaw, max_kv_tokens: maxKvTokens }));
      expectProfileAnswers(await loadPerfModel(directory));
    }
  });

  it('prefers raw_data.npz over the JSON file', async () => {
    const directory = profilerDir('both-forms');
    writeRawNpz(directory, 'prefill', rawNpzArrays(prefillRaw));
    writeFileSync(join(directory, 'prefill_raw_data.json'), JSON.stringify({ prefill_isl: [1, 2], prefill_ttft: [1000, 2000] }));
    writeFileSync(join(directory, 'decode_raw_data.json'), JSON.stringify({ ...decodeRaw, max_kv_tokens: 1000 }));
    expectProfileAnswers(await loadPerfModel(directory));
  });

  it('reports the file and key on errors', async () => {
    const noDecode = profilerDir('no-decode');
    writeFileSync(join(noDecode, 'prefill_raw_data.json'), JSON.stringify(prefillRaw));
    await expect(loadPerfModel(noDecode)).rejects.toThrow(
      `profiler results directory '${noDecode}': neither ${join(noDecode, 'selected_decode_interpolation', 'raw_data.npz')} nor ${join(noDecode, 'decode_raw_data.json')} exists`,
    );

    const missingKey = profilerDir('missing-key');
    writeRawNpz(missingKey, 'prefill', rawNpzArrays(prefillRaw));
    writeRawNpz(missingKey, 'decode', { x_kv_usage: npy(decodeRaw.x_kv_usage), y_context_length: npy(decodeRaw.y_context_length), max_kv_tokens: npy([1000]) });
    const decodeNpz = join(missingKey, 'selected_decode_interpolation', 'raw_data.npz');
    await expect(loadPerfModel(missingKey)).rejects.toThrow(`${decodeNpz}: missing key 'z_itl'`);

    const jsonErrors: [string, Record<string, unknown>, string][] = [
      [
        'length',
        { ...decodeRaw, y_context_length: [100, 100, 300, 300], max_kv_tokens: 1000 },
        "length mismatch: 'x_kv_usage' has 5, 'y_context_length' has 4, 'z_itl' has 5",
      ],
      ['empty', { x_kv_usage: [], y_context_length: [], z_itl: [], max_kv_tokens: 1000 }, "'x_kv_usage' is empty"],
      ['no-max', { ...decodeRaw }, "missing key 'max_kv_tokens'"],
      ['text', { ...decodeRaw, z_itl: ['5', 9, 11, 7, 21], max_kv_tokens: 1000 }, "'z_itl' must be an array of numbers"],
      [
        'one-context',
        { ...decodeRaw, y_context_length: [100, 100, 100, 100, 100], max_kv_tokens: 1000 },
        "'y_context_length' needs at least 2 distinct values to interpolate, got 1",
      ],
    ];
    for (const [name, decodeJson, message] of jsonErrors) {
      const directory = profilerDir(`json-error-${name}`);
      writeFileSync(join(directory, 'prefill_raw_data.json'), JSON.stringify(prefillRaw));
      writeFileSync(join(directory, 'decode_raw_data.json'), JSON.stringify(decodeJson));
      await expect(loadPerfModel(directory)).rejects.toThrow(`${join(directory, 'decode_raw_data.json')}: ${message}`);
    }

    const prefillErrors: [string, Record<string, unknown>, string][] = [
      ['length', { prefill_isl: [100, 300], prefill_ttft: [20] }, "length mismatch: 'prefill_isl' has 2, 'prefill_ttft' has 1"],
      ['no-ttft', { prefill_isl: [100, 300] }, "missing key 'prefill_ttft'"],
      ['one-isl', { prefill_isl: [100, 100], prefill_ttft: [20, 30] }, "'prefill_isl' needs at least 2 distinct values to interpolate, got 1"],
    ];
    for (const [name, prefillJson, message] of prefillErrors) {
      const directory = profilerDir(`prefill-error-${name}`);
      writeFileSync(join(directory, 'prefill_raw_data.json'), JSON.stringify(prefillJson));
      writeFileSync(join(directory, 'decode_raw_data.json'), JSON.stringify({ ...decodeRaw, max_kv_tokens: 1000 }));
      await expect(loadPerfModel(directory)).rejects.toThrow(`${join(directory, 'prefill_raw_data.json')}: ${message}`);
    }
  });
});
