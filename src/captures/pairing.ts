/**
 * What comparing two capture files exchange by exchange needs on both sides (`captures diff`, `rerun`): the key
 * that pairs an exchange with the other file's answer to the same request, and where two sequences part.
 */
import type { StoredExchange } from '../store/captureStore.js';

/** JSON with object keys sorted at every level: two values that differ only in key order or spacing are one. */
export function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
  if (value !== null && typeof value === 'object') {
    const entries = Object.entries(value as Record<string, unknown>).sort(([x], [y]) => (x < y ? -1 : x > y ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(',')}}`;
  }
  return JSON.stringify(value) ?? 'null';
}

/**
 * The request as a key: its path and its body (JSON with keys sorted; other bytes as they are). The model is in
 * the body when the client named one; the stored `model` column is not used, as it falls back to the answer's.
 */
export function requestKey(ex: Pick<StoredExchange, 'path' | 'requestBody'>): string {
  let body: string;
  try {
    body = canonicalJson(JSON.parse(ex.requestBody.toString('utf8')));
  } catch {
    body = ex.requestBody.toString('base64');
  }
  return `${ex.path}\0${body}`;
}

/** Index of the first element that differs (the shorter length when one is a prefix of the other), or null. */
export function firstDifference<T>(a: readonly T[], b: readonly T[], same: (x: T, y: T) => boolean = (x, y) => x === y): number | null {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (!same(a[i], b[i])) return i;
  return a.length === b.length ? null : n;
}
