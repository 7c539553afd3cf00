import type { AgentApi } from '../store/captureStore.js';
import { ApiError } from '../wire/errors.js';

/** Request fields that do not change the shape of the response bytes (the prompt, in each API's fields, is the lookup key). */
const NOT_SHAPE = new Set(['messages', 'prompt', 'token_ids', 'input', 'instructions', 'system', 'model', 'request_id', 'user', 'return_token_ids']);

/** `value` with object keys sorted and null members dropped (JSON.stringify of it is the canonical form). */
export function canonical(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(canonical);
  if (value && typeof value === 'object') {
    const out: Record<string, unknown> = {};
    for (const key of Object.keys(value).sort()) {
      const v = (value as Record<string, unknown>)[key];
      if (v !== null && v !== undefined) out[key] = canonical(v);
    }
    return out;
  }
  return value;
}

/**
 * Canonical JSON of everything in a request that shapes the answer's bytes. Two requests with the same
 * prompt tokens and the same shape get the captured bytes verbatim.
 */
export function requestShape(kind: 'chat' | 'completion' | AgentApi, request: Record<string, unknown>): string {
  const shaped: Record<string, unknown> = { endpoint: kind };
  for (const [k, v] of Object.entries(request)) if (!NOT_SHAPE.has(k)) shaped[k] = v;
  try {
    return JSON.stringify(canonical(shaped));
  } catch (err) {
    // Nesting JSON.parse took but recursion cannot walk (vLLM's Python parser gives up near 1,000 levels: FastAPI's 400).
    if (err instanceof RangeError) throw new ApiError(400, 'There was an error parsing the body', 'Bad Request');
    throw err;
  }
}

/**
 * A `requestShape` without the top-level request fields `ignored` (`serve --ignore-field`): two requests whose
 * shapes are equal without them get the captured bytes verbatim.
 */
export function shapeWithout(shape: string, ignored: readonly string[]): string {
  if (ignored.length === 0) return shape;
  const fields = JSON.parse(shape) as Record<string, unknown>;
  for (const name of ignored) delete fields[name];
  // Still canonical: parsing keeps the sorted key order.
  return JSON.stringify(fields);
}
