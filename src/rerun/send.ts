/**
 * Sends a golden capture's requests again, each as the client sent it, at the pace asked for: `concurrency` at a
 * time as fast as the target answers, or at the captured arrival times (divided by `speedup`). Answers are read
 * to their end and dropped: the capture proxy in front of the target records them.
 */
import http from 'node:http';
import type { RerunRequest } from './requests.js';

export type Pacing = { kind: 'concurrency'; concurrency: number } | { kind: 'as-captured'; speedup: number };

export interface SendOptions {
  pacing: Pacing;
  /** Added to every request, over the stored ones (`--header`, `--api-key`): secrets never come from the file. */
  headers: Record<string, string>;
  /** Told after each answer ends (done so far). */
  onDone?: (done: number) => void;
}

/** Resolves once the answer has ended, or failed (the proxy records how). */
function send(base: URL, request: RerunRequest, extra: Record<string, string>): Promise<void> {
  return new Promise((resolve) => {
    const headers: http.OutgoingHttpHeaders = { ...request.headers };
    // Case-insensitively replaced: a flag's header wins over a stored one of the same name.
    for (const [name, value] of Object.entries(extra)) {
      for (const key of Object.keys(headers)) if (key.toLowerCase() === name.toLowerCase()) delete headers[key];
      headers[name] = value;
    }
    headers['content-length'] = request.body.length;
    let req: http.ClientRequest;
    try {
      req = http.request(new URL(request.path, base), { method: request.method, headers }, (res) => {
        res.on('data', () => undefined);
        res.on('end', resolve);
        res.on('error', () => resolve());
      });
    } catch {
      // A stored header node:http will not send (a file imported from JSONL): this request is not sent, the rest are.
      return resolve();
    }
    req.on('error', () => resolve());
    req.end(request.body);
  });
}

/** Sends every request to `base` (the capture proxy) and resolves once all have been answered. */
export async function sendRequests(base: URL, requests: readonly RerunRequest[], options: SendOptions): Promise<void> {
  let done = 0;
  const one = async (request: RerunRequest) => {
    await send(base, request, options.headers);
    options.onDone?.(++done);
  };
  const { pacing } = options;
  if (pacing.kind === 'as-captured') {
    const first = requests.reduce((min, r) => Math.min(min, r.startedAt), Infinity);
    const start = performance.now();
    await Promise.all(
      requests.map(async (request) => {
        const at = start + (request.startedAt - first) / pacing.speedup;
        await new Promise((r) => setTimeout(r, Math.max(0, at - performance.now())));
        await one(request);
      }),
    );
  } else {
    let next = 0;
    const worker = async () => {
      while (next < requests.length) await one(requests[next++]);
    };
    await Promise.all(Array.from({ length: Math.min(pacing.concurrency, requests.length) }, worker));
  }
}
