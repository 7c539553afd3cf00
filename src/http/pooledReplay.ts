import { randomUUID } from 'node:crypto';
import type { OutgoingHttpHeaders, ServerResponse } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { z } from 'zod';
import { poolingInputs } from '../generation/poolingKey.js';
import type { OutputResolver } from '../generation/resolver.js';
import type { MockerMetrics } from '../metrics/mockerMetrics.js';
import type { PoolingKind, StoredExchange } from '../store/captureStore.js';
import type { PoolingLatency } from './poolingEndpoints.js';
import { LoopSlice } from '../util/loopSlice.js';
import { restamp } from '../api/render.js';
import { parseBody } from '../api/schemas.js';

type Json = Record<string, unknown>;

/** What every embeddings or rerank request is checked for before its lookup; the rest is the upstream's (or the synthetic answer's) to check. */
const lookupRequest = z.looseObject({ model: z.string().nullish() });

/** What the outcome of a lookup is turned into: the server's own pieces. */
export interface PooledReplayConfig {
  resolver: OutputResolver;
  /** Throws the 404 for a model this server does not serve. */
  resolveModel: (requested: string | null | undefined) => string;
  latency: PoolingLatency;
  /** Under `--timing captured`: how long a captured answer takes, from its captured duration. Else the endpoint's own latency. */
  capturedDuration?: (capturedMs: number) => number;
  mockerMetrics?: MockerMetrics;
  /** The captured response headers worth sending again. */
  capturedHeaders: (ex: StoredExchange) => OutgoingHttpHeaders;
}

/** One request: what it asked, and how each answer is sent. */
export interface PooledRequest {
  url: string;
  kind: PoolingKind;
  body: unknown;
  /** X-Request-Id, else a fresh uuid hex: the new id of a vLLM answer (`embd-<it>`, `rerank-<it>`). */
  requestId: string;
  /** The synthetic answer's text, or its parts in order (10,000 embeddings are written part by part). */
  synthetic: (body: Json) => Promise<string | string[]>;
  forward: () => Promise<void>;
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-/i;

/**
 * Writes a body's parts and ends it, a slice of the event loop's time at a time, waiting for the client to take
 * what is buffered (a 160 MB answer is not all held for a slow reader); stops when the client leaves.
 */
async function writeParts(res: ServerResponse, parts: string[]): Promise<void> {
  const slice = new LoopSlice();
  for (const part of parts) {
    if (res.destroyed) return;
    if (!res.write(part)) {
      await new Promise<void>((resolve) => {
        const go = () => {
          res.off('drain', go).off('close', go);
          resolve();
        };
        res.on('drain', go).on('close', go);
      });
    }
    await slice.pause();
  }
  res.end();
}

/** A captured answer's id for a new request: vLLM's prefix with this request's id, a fresh uuid for Cohere's uuid. */
function freshId(capturedId: string, requestId: string): string {
  if (UUID.test(capturedId)) return randomUUID();
  return `${/^[A-Za-z]+-/.exec(capturedId)?.[0] ?? ''}${requestId}`;
}

/**
 * Answers an embeddings or rerank request: a capture of the same route, named model and inputs gives its bytes
 * (id and created regenerated) after the endpoint's latency or its captured duration; a miss goes where
 * `--on-miss` says. Resolves once the response is sent.
 */
export async function answerPooled(config: PooledReplayConfig, res: ServerResponse, req: PooledRequest): Promise<void> {
  const body = parseBody(lookupRequest, req.body);
  config.resolveModel(body.model);
  const resolution = config.resolver.resolvePooling(req.url, req.kind, body);
  config.mockerMetrics?.captureLookup(resolution.lookup);
  if (resolution.type === 'error') throw resolution.error;
  if (resolution.type === 'forward') return req.forward();
  if (resolution.type === 'synthetic') {
    const parts = [await req.synthetic(body)].flat();
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': parts.reduce((n, part) => n + Buffer.byteLength(part), 0) });
    await writeParts(res, parts);
    return;
  }
  const ex = resolution.exchange;
  const { latency } = config;
  const items = poolingInputs(req.kind, body).items;
  const ownMs =
    req.kind === 'embeddings' ? latency.embeddingBaseMs + latency.embeddingPerInputMs * items : latency.rankingBaseMs + latency.rankingPerPassageMs * items;
  const waitMs = config.capturedDuration ? config.capturedDuration(ex.totalMs) : ownMs;
  if (waitMs > 0) await sleep(waitMs);
  if (res.destroyed) return;
  const text = ex.responseBody.toString('utf8');
  const capturedId = /^\{"id":"([^"\\]*)"/.exec(text)?.[1];
  // TEI's bare list and NIM's `{rankings}` carry no id: sent as captured.
  const out = capturedId === undefined ? text : restamp(text, freshId(capturedId, req.requestId), Math.floor(Date.now() / 1000));
  res.writeHead(ex.status ?? 200, { ...config.capturedHeaders(ex), 'content-length': Buffer.byteLength(out) }).end(out);
}
