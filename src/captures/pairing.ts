/**
 * What comparing two capture files exchange by exchange needs on both sides (`captures diff`, `rerun`): the key
 * that pairs an exchange with the other file's answer to the same request, and where two sequences part.
 */
import type { StoredExchange } from '../store/captureStore.js';
import { distribution } from '../trace/collector.js';

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

/** A streamed exchange's first token (of any choice), ms after the request was sent; null when it streamed none. */
export function firstTokenMs(ex: StoredExchange): number | null {
  if (!ex.stream) return null;
  let first: number | null = null;
  for (const g of ex.generations) if (g.tokenTimes.length > 0 && (first === null || g.tokenTimes[0] < first)) first = g.tokenTimes[0];
  return first;
}

/** The gaps between each choice's successive tokens of a streamed exchange (none for a non-streamed one). */
export function tokenGaps(ex: StoredExchange): number[] {
  const out: number[] = [];
  if (!ex.stream) return out;
  for (const g of ex.generations) for (let i = 1; i < g.tokenTimes.length; i++) out.push(g.tokenTimes[i] - g.tokenTimes[i - 1]);
  return out;
}

/** A sample's percentiles (ms); null when it has no sample: an absent figure, not a zero. */
export interface Percentiles {
  count: number;
  p50: number | null;
  p90: number | null;
  p99: number | null;
}

/** The trace report's percentiles of a sample (Dynamo's replay report: nearest rank). */
export function percentiles(values: number[]): Percentiles {
  if (values.length === 0) return { count: 0, p50: null, p90: null, p99: null };
  const d = distribution(values);
  return { count: values.length, p50: d.median, p90: d.p90, p99: d.p99 };
}

/** `after` − `before`, per percentile; null where either side has no sample. */
export function percentileShift(before: Percentiles, after: Percentiles): { p50: number | null; p90: number | null; p99: number | null } {
  const change = (x: number | null, y: number | null) => (x === null || y === null ? null : y - x);
  return { p50: change(before.p50, after.p50), p90: change(before.p90, after.p90), p99: change(before.p99, after.p99) };
}

/** A figure in ms for a report's text: two decimals, `n/a` when absent. */
export const formatMs = (v: number | null): string => (v === null ? 'n/a' : v.toFixed(2));
/** A shift in ms with its sign: `+1.25`, `-0.50`, `n/a`; one that rounds to zero is `0.00`, as unsigned figures are. */
export function formatSignedMs(v: number | null): string {
  const text = formatMs(v);
  if (v === null) return text;
  // -0.001 is `-0.00` in toFixed: no shift, whichever side of zero.
  const rounded = Number(text);
  if (rounded === 0) return formatMs(0);
  return rounded > 0 ? `+${text}` : text;
}
