/**
 * The in-memory store of `--enable-responses-api-store` (vLLM's VLLM_ENABLE_RESPONSES_API_STORE), apart from the
 * Responses API's routes: the settings name its limit without loading the server.
 */
import { ApiError } from '../wire/errors.js';
import type { Json } from './serveConfig.js';

/**
 * vLLM keeps every stored response forever; a mock that runs for days under a benchmark must not grow without
 * limit, so the oldest are dropped past this many (a client chaining `previous_response_id` uses recent ones).
 */
export const RESPONSES_STORE_LIMIT = 10_000;

export interface Stored {
  response: Json;
  messages: Json[];
}

/** Insertion-ordered map used as a first-in, first-out store of at most RESPONSES_STORE_LIMIT responses. */
export class ResponseStore {
  private readonly entries = new Map<string, Stored>();

  get(id: string): Stored {
    const hit = this.entries.get(id);
    if (!hit) throw new ApiError(404, `Response with id '${id}' not found.`, 'invalid_request_error', 'response_id');
    return hit;
  }

  set(id: string, stored: Stored): void {
    this.entries.delete(id);
    this.entries.set(id, stored);
    if (this.entries.size > RESPONSES_STORE_LIMIT) this.entries.delete(this.entries.keys().next().value as string);
  }
}
