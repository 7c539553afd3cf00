import type { ChoicePlan, EndpointKind } from '../generation/plan.js';
import type { ChunkDelta } from '../store/generation.js';

/**
 * vLLM's response formats (≈v0.10.2–0.11: `return_token_ids`, `reasoning_content`), field for field and
 * in pydantic's declaration order: completion chunks serialize every field, chat chunks only those set.
 */
export interface RenderContext {
  kind: EndpointKind;
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

function head(ctx: RenderContext): string {
  const object = ctx.kind === 'chat' ? 'chat.completion.chunk' : 'text_completion';
  return `{"id":${JSON.stringify(ctx.id)},"object":"${object}","created":${ctx.created},"model":${JSON.stringify(ctx.model)}`;
}

const ids = (ctx: RenderContext, values: readonly number[]) => (ctx.returnTokenIds ? `[${values.join(',')}]` : 'null');

/** The chat stream's first chunk for a choice, sent when its first output is ready. */
export function roleEvent(ctx: RenderContext, index: number): string {
  return `data: ${head(ctx)},"choices":[{"index":${index},"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":${ids(ctx, ctx.promptTokenIds)}}\n\n`;
}

/** One streamed chunk of one choice. `first` marks the choice's first chunk (completions carry the prompt ids there). */
export function chunkEvent(ctx: RenderContext, index: number, delta: ChunkDelta, tokenIds: readonly number[], finish: Finish | null, first: boolean): string {
  if (ctx.kind === 'chat') {
    const stop = finish ? `,"stop_reason":${JSON.stringify(finish.stopReason)}` : '';
    return `data: ${head(ctx)},"choices":[{"index":${index},"delta":${JSON.stringify(delta)},"logprobs":null,"finish_reason":${JSON.stringify(finish?.reason ?? null)}${stop},"token_ids":${ids(ctx, tokenIds)}}]}\n\n`;
  }
  const text = typeof delta.text === 'string' ? delta.text : '';
  return `data: ${head(ctx)},"choices":[{"index":${index},"text":${JSON.stringify(text)},"logprobs":null,"finish_reason":${JSON.stringify(finish?.reason ?? null)},"stop_reason":${JSON.stringify(finish?.stopReason ?? null)},"prompt_token_ids":${first ? ids(ctx, ctx.promptTokenIds) : 'null'},"token_ids":${ids(ctx, tokenIds)}}],"usage":null}\n\n`;
}

function usageJson(promptTokens: number, completionTokens: number): string {
  return `"prompt_tokens":${promptTokens},"total_tokens":${promptTokens + completionTokens},"completion_tokens":${completionTokens}`;
}

/** `prompt_tokens_details` (only with `--enable-prompt-tokens-details`, as vLLM). */
const details = (cachedTokens: number | null) => (cachedTokens === null ? null : `{"cached_tokens":${cachedTokens}}`);

/** The final `stream_options.include_usage` chunk (dumped without nulls, as vLLM does). */
export function usageEvent(ctx: RenderContext, promptTokens: number, completionTokens: number, cachedTokens: number | null): string {
  const cached = details(cachedTokens);
  return `data: ${head(ctx)},"choices":[],"usage":{${usageJson(promptTokens, completionTokens)}${cached ? `,"prompt_tokens_details":${cached}` : ''}}}\n\n`;
}

export const DONE_EVENT = 'data: [DONE]\n\n';

/** Whether a stream ends with the usage chunk: `stream_options` given, its include_usage defaults to true (vLLM ≈0.10–0.13), an explicit null is off. */
export function includesUsage(stream: boolean, streamOptions: { include_usage?: boolean | null } | null | undefined): boolean {
  return stream && !!streamOptions && (streamOptions.include_usage === undefined || streamOptions.include_usage === true);
}

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
  /** vLLM ≥ 0.11's second name for the reasoning. */
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

/** A choice's deltas as a non-streamed chat message. */
function chatMessage(deltas: ChunkDelta[]): string {
  const { content, reasoningContent, reasoning, toolCalls } = foldChatDeltas(deltas);
  const calls = toolCalls.map(
    (c) =>
      `{"id":${JSON.stringify(c.id ?? null)},"type":${JSON.stringify(c.type ?? 'function')},"function":{"name":${JSON.stringify(c.name)},"arguments":${JSON.stringify(c.arguments)}}}`,
  );
  const reasoningFields =
    reasoning !== null
      ? `,"reasoning":${JSON.stringify(reasoning)},"reasoning_content":${JSON.stringify(reasoningContent ?? reasoning)}`
      : `,"reasoning_content":${JSON.stringify(reasoningContent)}`;
  return `{"role":"assistant","content":${JSON.stringify(content)},"refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[${calls.join(',')}]${reasoningFields}}`;
}

export interface RenderedChoice {
  plan: ChoicePlan;
  deltas: ChunkDelta[];
  /** The prompt this choice answers (a batched completion has several). */
  promptTokenIds: readonly number[];
}

/** The non-streamed response body; `promptTokens` counts every prompt of the request (vLLM sums a batch's). */
export function fullResponse(ctx: RenderContext, choices: RenderedChoice[], promptTokens: number, cachedTokens: number | null): string {
  const completionTokens = choices.reduce((n, c) => n + c.plan.tokenIds.length, 0);
  const usage = `{${usageJson(promptTokens, completionTokens)},"prompt_tokens_details":${details(cachedTokens) ?? 'null'}}`;
  const object = ctx.kind === 'chat' ? 'chat.completion' : 'text_completion';
  const top = `{"id":${JSON.stringify(ctx.id)},"object":"${object}","created":${ctx.created},"model":${JSON.stringify(ctx.model)}`;
  if (ctx.kind === 'chat') {
    const items = choices.map(
      ({ plan, deltas }, index) =>
        `{"index":${index},"message":${chatMessage(deltas)},"logprobs":null,"finish_reason":${JSON.stringify(plan.finishReason)},"stop_reason":${JSON.stringify(plan.stopReason)},"token_ids":${ids(ctx, plan.tokenIds)}}`,
    );
    return `${top},"choices":[${items.join(',')}],"service_tier":null,"system_fingerprint":null,"usage":${usage},"prompt_logprobs":null,"prompt_token_ids":${ids(ctx, ctx.promptTokenIds)},"kv_transfer_params":${JSON.stringify(ctx.kvTransferParams ?? null)}}`;
  }
  const items = choices.map(({ plan, deltas, promptTokenIds }, index) => {
    const text = deltas.map((d) => (typeof d.text === 'string' ? d.text : '')).join('');
    return `{"index":${index},"text":${JSON.stringify(text)},"logprobs":null,"finish_reason":${JSON.stringify(plan.finishReason)},"stop_reason":${JSON.stringify(plan.stopReason)},"token_ids":${ids(ctx, plan.tokenIds)},"prompt_logprobs":null,"prompt_token_ids":${ids(ctx, promptTokenIds)}}`;
  });
  return `${top},"choices":[${items.join(',')}],"service_tier":null,"system_fingerprint":null,"usage":${usage},"kv_transfer_params":${JSON.stringify(ctx.kvTransferParams ?? null)}}`;
}

const ID_PREFIX = /^(data: )?\{"id":"[^"]*"(?:,"object":"([^"]*)","created":\d+)?/;

/** `{"id":…` with the `object` and `created` that follow it (none for `object` null: a rerank answer has only its id). */
export function stampedPrefix(id: string, object: string | null, created: number): string {
  const stamp = object === null ? '' : `,"object":"${object}","created":${created}`;
  return `{"id":${JSON.stringify(id)}${stamp}`;
}

/** A captured event or body around its stamp (`object` undefined: it has none, `lead` is the whole text). */
export function splitStamp(text: string): { lead: string; object: string | null | undefined; tail: string } {
  const match = ID_PREFIX.exec(text);
  if (!match) return { lead: text, object: undefined, tail: '' };
  return { lead: match[1] ?? '', object: match[2] ?? null, tail: text.slice(match[0].length) };
}

/**
 * Regenerates `id` and `created` in a captured event or body, as vLLM does per request (a rerank answer has no
 * `object`/`created`: only its id).
 */
export function restamp(text: string, id: string, created: number): string {
  const { lead, object, tail } = splitStamp(text);
  return object === undefined ? text : `${lead}${stampedPrefix(id, object, created)}${tail}`;
}
