/**
 * Minimal reader (and float64 writer) for NumPy `.npy` arrays and `.npz` archives (a zip of `.npy` files, stored or deflated), enough
 * for the performance-model tables: little-endian float64/float32/int64/int32, C order (or any order for ≤ 1-D).
 * Format: https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
 */
import { unzipSync, zipSync } from 'fflate';

export interface NpyArray {
  /** Dimensions; `[]` for a 0-d (scalar) array. */
  shape: number[];
  /** Values in C (row-major) order, converted to float64. */
  data: Float64Array;
}

const MAGIC = [0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59]; // "\x93NUMPY"

/** Byte size and reader of each supported little-endian dtype. */
const DTYPES: Record<string, { size: number; read: (view: DataView, at: number) => number }> = {
  '<f8': { size: 8, read: (v, at) => v.getFloat64(at, true) },
  '<f4': { size: 4, read: (v, at) => v.getFloat32(at, true) },
  '<i4': { size: 4, read: (v, at) => v.getInt32(at, true) },
  '<i8': {
    size: 8,
    read: (v, at) => {
      const big = v.getBigInt64(at, true);
      // Integers beyond 2^53 would silently change value as doubles.
      if (big > BigInt(Number.MAX_SAFE_INTEGER) || big < BigInt(Number.MIN_SAFE_INTEGER)) {
        throw new Error(`int64 value ${big} does not fit a double exactly`);
      }
      return Number(big);
    },
  },
};

/** Parses one `.npy` file; `name` only labels error messages. */
export function parseNpy(bytes: Uint8Array, name = 'array'): NpyArray {
  const fail = (why: string): never => {
    throw new Error(`${name}: ${why}`);
  };
  if (bytes.length < 10 || MAGIC.some((b, i) => bytes[i] !== b)) fail('not a .npy array (bad magic)');
  const major = bytes[6];
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let headerStart: number;
  let headerLength: number;
  if (major === 1) {
    headerStart = 10;
    headerLength = view.getUint16(8, true);
  } else if (major === 2 || major === 3) {
    if (bytes.length < 12) fail('truncated .npy header');
    headerStart = 12;
    headerLength = view.getUint32(8, true);
  } else {
    return fail(`unsupported .npy format version ${major}.${bytes[7]}`);
  }
  const dataStart = headerStart + headerLength;
  if (dataStart > bytes.length) fail('truncated .npy header');
  // Versions 1 and 2 use latin1 headers, version 3 utf8; the keys we need are ASCII either way.
  const headerText = new TextDecoder(major === 3 ? 'utf-8' : 'latin1').decode(bytes.subarray(headerStart, dataStart));

  let header: PyValue;
  try {
    header = parsePythonLiteral(headerText);
  } catch (err) {
    return fail(`unreadable .npy header ${JSON.stringify(headerText.trim())}: ${(err as Error).message}`);
  }
  if (!(header instanceof Map)) return fail('.npy header is not a dict');
  const descr = header.get('descr');
  const fortranOrder = header.get('fortran_order');
  const shapeValue = header.get('shape');
  if (typeof descr !== 'string') {
    return fail(`unsupported dtype ${describe(descr)} (structured dtypes are not supported; expected one of ${Object.keys(DTYPES).join(', ')})`);
  }
  if (typeof fortranOrder !== 'boolean') fail(`.npy header has no boolean 'fortran_order'`);
  if (!Array.isArray(shapeValue) || !shapeValue.every((d) => typeof d === 'number' && Number.isInteger(d) && d >= 0)) {
    return fail(`.npy header has no valid 'shape' (got ${describe(shapeValue)})`);
  }
  const shape = shapeValue as number[];

  const dtype = DTYPES[descr];
  if (!dtype) {
    const bigEndian = descr.startsWith('>') ? ' (big-endian data is not supported)' : '';
    return fail(`unsupported dtype '${descr}'${bigEndian}; expected one of ${Object.keys(DTYPES).join(', ')}`);
  }
  // Fortran order only changes the memory layout of arrays with 2 or more dimensions.
  if (fortranOrder && shape.length >= 2) fail(`fortran_order arrays are not supported (shape (${shape.join(', ')}))`);

  const count = shape.reduce((a, b) => a * b, 1);
  const needed = count * dtype.size;
  if (bytes.length - dataStart < needed) {
    fail(`truncated data: shape (${shape.join(', ')}) of '${descr}' needs ${needed} bytes, file has ${bytes.length - dataStart}`);
  }
  const data = new Float64Array(count);
  try {
    for (let i = 0; i < count; i++) data[i] = dtype.read(view, dataStart + i * dtype.size);
  } catch (err) {
    return fail((err as Error).message);
  }
  return { shape, data };
}

/** Reads every `NAME.npy` entry of an `.npz` archive, keyed by NAME. */
export function readNpz(bytes: Uint8Array): Map<string, NpyArray> {
  let entries: Record<string, Uint8Array>;
  try {
    entries = unzipSync(bytes);
  } catch (err) {
    throw new Error(`not a readable .npz (zip) archive: ${(err as Error).message}`);
  }
  const arrays = new Map<string, NpyArray>();
  for (const [entryName, content] of Object.entries(entries)) {
    if (!entryName.endsWith('.npy')) continue; // directories or foreign files: np.load ignores them too
    const key = entryName.slice(0, -'.npy'.length);
    arrays.set(key, parseNpy(content, key));
  }
  return arrays;
}

// ---- Python literal parser for the header dict ----

/** The subset of Python literals a .npy header uses: dict, tuple/list, str, int, float, bool, None. */
type PyValue = string | number | boolean | null | PyValue[] | Map<string, PyValue>;

function describe(value: PyValue | undefined): string {
  if (value === undefined) return 'nothing';
  if (value instanceof Map) return 'a dict';
  if (Array.isArray(value)) return `(${value.map((v) => describe(v)).join(', ')})`;
  return typeof value === 'string' ? `'${value}'` : String(value);
}

function parsePythonLiteral(text: string): PyValue {
  let at = 0;
  const skipSpace = () => {
    while (at < text.length && /\s/.test(text[at])) at++;
  };
  const expect = (char: string) => {
    skipSpace();
    if (text[at] !== char) throw new Error(`expected '${char}' at offset ${at}`);
    at++;
  };
  const parseValue = (): PyValue => {
    skipSpace();
    const char = text[at];
    if (char === '{') {
      at++;
      const dict = new Map<string, PyValue>();
      for (;;) {
        skipSpace();
        if (text[at] === '}') {
          at++;
          return dict;
        }
        const key = parseValue();
        if (typeof key !== 'string') throw new Error(`dict key at offset ${at} is not a string`);
        expect(':');
        dict.set(key, parseValue());
        skipSpace();
        if (text[at] === ',') at++;
        else if (text[at] !== '}') throw new Error(`expected ',' or '}' at offset ${at}`);
      }
    }
    if (char === '(' || char === '[') {
      const close = char === '(' ? ')' : ']';
      at++;
      const items: PyValue[] = [];
      for (;;) {
        skipSpace();
        if (text[at] === close) {
          at++;
          return items;
        }
        items.push(parseValue());
        skipSpace();
        if (text[at] === ',') at++;
        else if (text[at] !== close) throw new Error(`expected ',' or '${close}' at offset ${at}`);
      }
    }
    if (char === "'" || char === '"') {
      const end = text.indexOf(char, at + 1);
      if (end < 0) throw new Error(`unterminated string at offset ${at}`);
      const value = text.slice(at + 1, end);
      at = end + 1;
      return value;
    }
    const word = /^[A-Za-z_][A-Za-z_0-9]*|^[-+]?[0-9][0-9.eE+-]*L?/.exec(text.slice(at));
    if (!word) throw new Error(`unexpected '${char ?? 'end of header'}' at offset ${at}`);
    at += word[0].length;
    if (word[0] === 'True') return true;
    if (word[0] === 'False') return false;
    if (word[0] === 'None') return null;
    // Python 2 era headers wrote shape dims as e.g. `3L`.
    const number = Number(word[0].replace(/L$/, ''));
    if (Number.isNaN(number)) throw new Error(`unexpected '${word[0]}' at offset ${at - word[0].length}`);
    return number;
  };
  const value = parseValue();
  skipSpace();
  if (at !== text.length) throw new Error(`trailing text at offset ${at}`);
  return value;
}

// ---- writer ----

/** One `.npy` file (format 1.0) of `array` as little-endian float64 in C order, as `np.save` writes it. */
export function npyBytes(array: NpyArray): Uint8Array {
  const count = array.shape.reduce((a, b) => a * b, 1);
  if (count !== array.data.length) throw new Error(`shape (${array.shape.join(', ')}) holds ${count} values, got ${array.data.length}`);
  const shape = array.shape.length === 1 ? `(${array.shape[0]},)` : `(${array.shape.join(', ')})`;
  const dict = `{'descr': '<f8', 'fortran_order': False, 'shape': ${shape}, }`;
  // The header (magic, version, length, dict, padding, newline) ends on a 64-byte boundary.
  const unpadded = MAGIC.length + 4 + dict.length + 1;
  const header = dict + ' '.repeat((64 - (unpadded % 64)) % 64) + '\n';
  const bytes = new Uint8Array(MAGIC.length + 4 + header.length + count * 8);
  const view = new DataView(bytes.buffer);
  bytes.set(MAGIC, 0);
  bytes[6] = 1;
  bytes[7] = 0;
  view.setUint16(8, header.length, true);
  bytes.set(new TextEncoder().encode(header), 10);
  const dataStart = 10 + header.length;
  for (let i = 0; i < count; i++) view.setFloat64(dataStart + i * 8, array.data[i], true);
  return bytes;
}

/** An `.npz` archive: each array as `NAME.npy`, deflated (as `np.savez_compressed`). */
export function npzBytes(arrays: Record<string, NpyArray>): Uint8Array {
  return zipSync(Object.fromEntries(Object.entries(arrays).map(([name, array]) => [`${name}.npy`, npyBytes(array)])));
}
