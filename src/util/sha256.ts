// Namespace import: a named import of `hash` would fail to link on Node < 20.12, where it does not exist.
import * as nodeCrypto from 'node:crypto';

/**
 * SHA-256 of `data` in one call. crypto.hash (Node >= 20.12) skips the Hash object, which costs as much as hashing
 * a few kilobytes (block hashes of every full block; a lookup's prompt key).
 */
export const sha256: (data: Uint8Array) => Buffer =
  typeof nodeCrypto.hash === 'function' ? (data) => nodeCrypto.hash('sha256', data, 'buffer') : (data) => nodeCrypto.createHash('sha256').update(data).digest();

export const sha256Hex: (data: Uint8Array) => string =
  typeof nodeCrypto.hash === 'function'
    ? (data) => nodeCrypto.hash('sha256', data, 'hex')
    : (data) => nodeCrypto.createHash('sha256').update(data).digest('hex');
