/**
 * How a capture file holds the files it carries (the tokenizer's): brotli-compressed, content-addressed by the
 * SHA-256 of the file's own bytes. A capture file comes from anyone, so reading one back is bounded: a blob that
 * would inflate past its recorded size, or past any tokenizer file's, is refused before it is held in memory.
 */
import { brotliCompressSync, brotliDecompressSync, constants as zlibConstants } from 'node:zlib';
import { sha256Hex } from '../util/sha256.js';

/** `blobs.encoding` (schema.ts): the file as it is (files written before migration 0004_blob_encoding). */
export const BLOB_RAW = 0;
/** `blobs.encoding`: brotli-compressed. */
export const BLOB_BROTLI = 1;
export type BlobEncoding = typeof BLOB_RAW | typeof BLOB_BROTLI;

/**
 * The largest file a stored blob may inflate to: the largest tokenizer.json files in use are tens of MB (Qwen3's
 * 11 MB, Gemma 3's 33 MB); what is above this is a decompression bomb or not a tokenizer.
 */
export const MAX_FILE_BYTES = 128 * 1024 * 1024;

/** A file as a capture file stores it. */
export interface StoredBlob {
  /** SHA-256 of the file's own bytes (hex). */
  sha256: string;
  /** The file's own size. */
  size: number;
  encoding: BlobEncoding;
  data: Buffer;
}

/**
 * Brotli at quality 6: Qwen3's 11.4 MB tokenizer.json becomes 1.90 MB in 0.4 s, paid once per capture file
 * (measured 2026-11-28; gzip -9: 2.06 MB in 1.3 s; zstd -9, not built into Node 20: 1.96 MB; brotli 11: 1.52 MB
 * but 17.6 s; a 16 MB window instead of 4 MB: no smaller). Inflating it takes 30 ms.
 */
function compress(data: Buffer): Buffer {
  return brotliCompressSync(data, { params: { [zlibConstants.BROTLI_PARAM_QUALITY]: 6, [zlibConstants.BROTLI_PARAM_SIZE_HINT]: data.length } });
}

/** A file's stored form: compressed. `sha256` when the caller knows it already. */
export function blobOf(data: Buffer, sha256 = sha256Hex(data)): StoredBlob {
  return { sha256, size: data.length, encoding: BLOB_BROTLI, data: compress(data) };
}

/**
 * The file a blob holds, checked: it inflates to at most its recorded size (and `MAX_FILE_BYTES`), and to the
 * bytes its SHA-256 names. Throws an error saying which.
 */
export function fileOf(blob: StoredBlob): Buffer {
  const data = inflated(blob);
  const hash = sha256Hex(data);
  if (hash !== blob.sha256) throw new BlobHashMismatch(`the blob's data hashes to ${hash}, not ${blob.sha256}`);
  return data;
}

/** `fileOf`'s refusal of a blob that inflates, but not to the bytes its SHA-256 names. */
export class BlobHashMismatch extends Error {}

/** The bytes a blob inflates to, at most its recorded size and `MAX_FILE_BYTES` (its hash not checked). */
function inflated(blob: StoredBlob): Buffer {
  if (blob.encoding === BLOB_RAW) return blob.data;
  if (blob.encoding !== BLOB_BROTLI) throw new Error(`unknown blob encoding ${String(blob.encoding)}`);
  const limit = Math.min(blob.size, MAX_FILE_BYTES);
  let data: Buffer;
  try {
    data = brotliDecompressSync(blob.data, { maxOutputLength: Math.max(limit, 1) });
  } catch (err) {
    if ((err as { code?: string }).code === 'ERR_BUFFER_TOO_LARGE') {
      throw new Error(
        `the blob's compressed data inflates to more than ${limit} bytes (${limit === MAX_FILE_BYTES ? 'the most a tokenizer file may be' : 'its recorded size'}): a damaged or hostile capture`,
      );
    }
    throw new Error(`the blob's compressed data cannot be inflated (${(err as Error).message})`);
  }
  if (data.length !== blob.size) throw new Error(`the blob's compressed data inflates to ${data.length} bytes, not its recorded ${blob.size}`);
  return data;
}
