/** Packed binary encodings for token ids and timings (little-endian, as typed arrays lay them out). */

export function packU32(values: ArrayLike<number>): Buffer {
  const arr = Uint32Array.from(values as ArrayLike<number>);
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
