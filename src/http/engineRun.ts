import type { AgentApi } from '../store/captureStore.js';
import type { ServerResponse } from 'node:http';
import type { EngineStream } from '../engine/index.js';
import type { ChoicePlan } from '../generation/plan.js';
import type { RenderContext } from '../api/render.js';

type Json = Record<string, unknown>;

/**
 * One request through the same prompts, resolver and engine as `/v1/completions` or `/v1/chat/completions` (so
 * it queues, shares the KV cache and counts in the metrics), for endpoints that render the engine's token events
 * in their own shape: TGI's, the multimodal one, and the agents' APIs translated into a chat request.
 */
export interface EngineRun {
  model: string;
  promptIds: number[];
  plan: ChoicePlan;
  /** What the chat or completions renderer would have been given (id, created, model, prompt ids). */
  ctx: RenderContext;
  events: EngineStream;
}

/** Runs a completions (or, for a chat runner, chat completions) body; throws ApiError for bad input. */
export type RunEndpoint = (body: Json, arrivalMs: number, signal: AbortSignal) => Promise<EngineRun>;

/** Whose captures answer a request run as a completion (generate) or a chat (Responses, Messages), and the request's own shape (generation/shape.ts). */
export interface CapturedAs {
  endpoint: AgentApi;
  shape: string;
}

/** A capture of the same request shape, served as captured under the response's own id. */
export interface CapturedAnswer {
  verbatim: (res: ServerResponse, id: string) => Promise<void>;
}

/** Runs a completions or chat body looked up among `captured.endpoint`'s captures: its capture's bytes, else the engine's run. */
export type ReplayableEndpoint = (body: Json, captured: CapturedAs, arrivalMs: number, signal: AbortSignal) => Promise<EngineRun | CapturedAnswer>;
