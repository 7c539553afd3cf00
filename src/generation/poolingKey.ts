import { createHash } from 'node:crypto';
import type { PoolingKind } from '../store/captureStore.js';
import { canonical } from './shape.js';

/**
 * Embeddings and reranking exchanges (vLLM's, TEI's, Cohere's and NIM's endpoints) as the capture file keys
 * them: no token ids, the answer is a function of the endpoint, the model the request names and its inputs.
 */
const POOLING_PATHS: Record<string, PoolingKind> = {
  '/v1/embeddings': 'embeddings',
  '/rerank': 'rerank',
  '/v1/rerank': 'rerank',
  '/v2/rerank': 'rerank',
  '/v1/ranking': 'rerank',
};

/** A request's path without its query string and trailing slashes. */
export function routePath(url: string): string {
  return url.split('?')[0].replace(/\/+$/, '');
}

export function poolingEndpoint(method: string, url: string): PoolingKind | null {
  if (method !== 'POST') return null;
  return POOLING_PATHS[routePath(url)] ?? null;
}

/** The request fields an answer depends on, besides the model: the inputs and the options that change the bytes. */
const INPUT_FIELDS: Record<PoolingKind, readonly string[]> = {
  embeddings: ['input', 'dimensions', 'encoding_format'],
  // vLLM's and Cohere's `documents`, TEI's `texts`, NIM's `passages`; TEI's `raw_scores` / `return_text` shape its scores and items.
  rerank: ['query', 'documents', 'texts', 'passages', 'top_n', 'return_documents', 'raw_scores', 'return_text'],
};

export interface PoolingInputs {
  /** The model the request names, or null (TEI's requests name none). */
  model: string | null;
  /** Canonical JSON of the inputs (keys sorted, nulls dropped). */
  inputs: string;
  /** Inputs embedded, or passages ranked: what the endpoint's latency is counted in. */
  items: number;
}

const length = (value: unknown) => (Array.isArray(value) ? value.length : 0);

export function poolingInputs(kind: PoolingKind, request: Record<string, unknown>): PoolingInputs {
  const picked: Record<string, unknown> = {};
  for (const field of INPUT_FIELDS[kind]) picked[field] = request[field];
  // OpenAI's (and vLLM's) default format: asking for `float` or for nothing gets the same bytes.
  if (kind === 'embeddings') picked.encoding_format ??= 'float';
  const input = request.input;
  const items =
    kind === 'embeddings'
      ? Array.isArray(input) && input.length > 0 && typeof input[0] !== 'number'
        ? input.length
        : 1
      : length(request.documents) + length(request.texts) + length(request.passages);
  return { model: typeof request.model === 'string' ? request.model : null, inputs: JSON.stringify(canonical(picked)), items };
}

/** The replay key of a pooling exchange: sha256 of the route, the model named (if any) and the canonical inputs. */
export function poolingKey(url: string, inputs: PoolingInputs): string {
  return createHash('sha256')
    .update(`pooling\0${routePath(url)}\0${inputs.model ?? ''}\0${inputs.inputs}`)
    .digest('hex');
}
