/** A plain node:http streaming client (fetch adds its own milliseconds): POSTs JSON, timestamps SSE events. */
import http from 'node:http';
import { nowMs } from './stats.js';

export interface StreamResult {
  status: number;
  /** nowMs() just before the request was sent. */
  sentAt: number;
  /** nowMs() at which each SSE event (blank-line terminated) had fully arrived, [DONE] included. */
  arrivals: number[];
  /** Number of SSE events ([DONE] included). */
  events: number;
  bytes: number;
}

/** POSTs `body` and reads the whole response; `timestamps: false` only counts events (`arrivals` stays empty). */
export function postStream(agent: http.Agent, url: string, body: string, headers: Record<string, string> = {}, timestamps = true): Promise<StreamResult> {
  return new Promise((resolve, reject) => {
    const arrivals: number[] = [];
    let events = 0;
    let bytes = 0;
    let lastWasLf = false;
    const req = http.request(
      url,
      { method: 'POST', agent, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), ...headers } },
      (res) => {
        res.on('data', (chunk: Buffer) => {
          const at = timestamps ? nowMs() : 0;
          bytes += chunk.length;
          // An event ends at "\n\n", possibly split across two chunks.
          let from = 0;
          if (lastWasLf && chunk[0] === 0x0a) {
            events++;
            if (timestamps) arrivals.push(at);
            from = 1;
          }
          let consumedEnd = from;
          let i = chunk.indexOf(0x0a, from);
          while (i >= 0 && i + 1 < chunk.length) {
            if (chunk[i + 1] === 0x0a) {
              events++;
              if (timestamps) arrivals.push(at);
              consumedEnd = i + 2;
              i = chunk.indexOf(0x0a, i + 2);
            } else i = chunk.indexOf(0x0a, i + 1);
          }
          lastWasLf = chunk[chunk.length - 1] === 0x0a && consumedEnd < chunk.length;
        });
        res.on('end', () => resolve({ status: res.statusCode ?? 0, sentAt, arrivals, events, bytes }));
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    const sentAt = nowMs();
    req.end(body);
  });
}
