import type { ChoicePlan, EndpointKind } from '../generation/plan.js';
import type { ChunkDelta } from '../store/generation.js';
import type { WireShape } from '../wire/shapes.js';

/** What every rendered event and body of one response shares. */
export interface RenderContext {
  kind: EndpointKind;
  /** The engine (and release) whose response shape is rendered (`serve --wire`, or the replayed capture's). */
  wire: WireShape;
  id: string;
  created: number;
  model: string;
  returnTokenIds: boolean;
  promptTokenIds: readonly number[];
  /** The response's top-level `kv_transfer_params` (a prefill for a remote decode); null otherwise. */
  kvTransferParams?: Record<string, unknown> | null;
}

export interface Finish {
  reason: string;
  stopReason: string | number | null;
}

export interface RenderedChoice {
  plan: ChoicePlan;
  deltas: ChunkDelta[];
  /** The prompt this choice answers (a batched completion has several). */
  promptTokenIds: readonly number[];
}

/** `{"id":…,"object":…,"created":…,"model":…` (no closing brace). */
export function head(ctx: RenderContext, object: string): string {
  return `{"id":${JSON.stringify(ctx.id)},"object":"${object}","created":${ctx.created},"model":${JSON.stringify(ctx.model)}`;
}

/** The token ids as a JSON list, or null when the request did not ask for them. */
export const ids = (ctx: RenderContext, values: readonly number[]) => (ctx.returnTokenIds ? `[${values.join(',')}]` : 'null');

/** Usage's counts, in vLLM's and SGLang's field order. */
export function usageJson(promptTokens: number, completionTokens: number): string {
  return `"prompt_tokens":${promptTokens},"total_tokens":${promptTokens + completionTokens},"completion_tokens":${completionTokens}`;
}

/** `prompt_tokens_details` (only with `--enable-prompt-tokens-details`, as vLLM). */
export const details = (cachedTokens: number | null) => (cachedTokens === null ? null : `{"cached_tokens":${cachedTokens}}`);

export interface FoldedToolCall {
  id?: unknown;
  type?: unknown;
  name: string;
  arguments: string;
}

/** A choice's deltas put together: the message a client holds once the answer is over (null: no such field came). */
export interface FoldedChat {
  content: string | null;
  reasoningContent: string | null;
  /** vLLM ≥ 0.12's second name for the reasoning. */
  reasoning: string | null;
  /** By index. */
  toolCalls: FoldedToolCall[];
}

/** Folds a choice's streamed (or stored) chat deltas into the message they make. */
export function foldChatDeltas(deltas: readonly ChunkDelta[]): FoldedChat {
  let content: string | null = null;
  let reasoningContent: string | null = null;
  let reasoning: string | null = null;
  const calls = new Map<number, FoldedToolCall>();
  for (const d of deltas) {
    if (typeof d.content === 'string') content = (content ?? '') + d.content;
    if (typeof d.reasoning_content === 'string') reasoningContent = (reasoningContent ?? '') + d.reasoning_content;
    if (typeof d.reasoning === 'string') reasoning = (reasoning ?? '') + d.reasoning;
    for (const raw of (Array.isArray(d.tool_calls) ? d.tool_calls : []) as Record<string, unknown>[]) {
      const index = Number(raw.index ?? calls.size);
      const acc = calls.get(index) ?? { name: '', arguments: '' };
      const fn = (raw.function ?? {}) as Record<string, unknown>;
      if (raw.id !== undefined) acc.id = raw.id;
      if (raw.type !== undefined) acc.type = raw.type;
      if (typeof fn.name === 'string') acc.name += fn.name;
      if (typeof fn.arguments === 'string') acc.arguments += fn.arguments;
      calls.set(index, acc);
    }
  }
  const toolCalls = [...calls.entries()].sort(([a], [b]) => a - b).map(([, c]) => c);
  return { content, reasoningContent, reasoning, toolCalls };
}

/** A delta's reasoning text, under whichever name the engine that made it used (null: none). */
export function reasoningOf(delta: ChunkDelta): string | null {
  const text = delta.reasoning ?? delta.reasoning_content;
  return typeof text === 'string' ? text : null;
}
