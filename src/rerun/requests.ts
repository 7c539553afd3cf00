/**
 * The requests a rerun sends: every complete exchange of the golden capture whose request can be sent again as
 * the client sent it (its path, body byte for byte and non-secret headers), and how many could not, by why.
 */
import { DEFAULT_REDACTED_HEADERS } from '../capture/forward.js';
import type { HeaderMap, RecordedEndpoint, StoredExchange } from '../store/captureStore.js';
import { CaptureStore } from '../store/captureStore.js';

export interface RerunRequest {
  /** The golden exchange's id. */
  id: number;
  startedAt: number;
  method: string;
  path: string;
  endpoint: RecordedEndpoint;
  /** The stored headers a client sets itself (no hop-by-hop ones; secrets were never stored). */
  headers: Record<string, string | string[]>;
  body: Buffer;
}

/**
 * Headers never sent from the file: those the sending client computes for itself (RFC 9110 §7.6.1's hop-by-hop
 * ones, framing, host), and secrets — a capture never stores them, but a file imported from JSONL may hold them.
 */
const NOT_SENT = new Set([
  'host',
  'content-length',
  'transfer-encoding',
  'connection',
  'keep-alive',
  'proxy-connection',
  'te',
  'trailer',
  'upgrade',
  'expect',
  ...DEFAULT_REDACTED_HEADERS,
]);

function sendableHeaders(stored: HeaderMap): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const [name, value] of Object.entries(stored)) if (!NOT_SENT.has(name.toLowerCase())) out[name] = value;
  return out;
}

/** Why a golden exchange is not sent again (null: it is). */
export function whyNotSent(ex: Pick<StoredExchange, 'outcome' | 'bodiesRedacted'>): string | null {
  if (ex.outcome !== 'complete') return `${ex.outcome} in the capture`;
  if (ex.bodiesRedacted) return 'captured with --redact-bodies (no request body to send)';
  return null;
}

export interface GoldenRequests {
  requests: RerunRequest[];
  skipped: { reason: string; count: number }[];
}

/** Reads what to send from a golden capture (opened read-only; it is never written). */
export function goldenRequests(file: string): GoldenRequests {
  const store = CaptureStore.open(file, { readonly: true });
  const requests: RerunRequest[] = [];
  const skipped = new Map<string, number>();
  const skip = (reason: string) => skipped.set(reason, (skipped.get(reason) ?? 0) + 1);
  try {
    for (const id of store.exchangeIds()) {
      const ex = store.getExchange(id)!; // listed a moment ago, by this reader alone
      if (ex.endpoint === null) continue;
      const why = whyNotSent(ex);
      if (why !== null) skip(why);
      else
        requests.push({
          id,
          startedAt: ex.startedAt,
          method: ex.method,
          path: ex.path,
          endpoint: ex.endpoint,
          headers: sendableHeaders(ex.requestHeaders),
          body: ex.requestBody,
        });
    }
  } finally {
    store.close();
  }
  return { requests, skipped: [...skipped].map(([reason, count]) => ({ reason, count })) };
}
