import type { EndpointKind } from '../generation/plan.js';
import type { ChunkDelta } from '../store/generation.js';
import type { WireShape } from '../wire/shapes.js';
import { details, foldChatDeltas, head, ids, reasoningOf, usageJson, type Finish, type RenderContext, type RenderedChoice } from './renderCommon.js';
import * as sglang from './renderSglang.js';

export { foldChatDeltas, type Finish, type FoldedChat, type RenderContext, type RenderedChoice } from './renderCommon.js';

/**
 * The response formats of `serve --wire`, field for field and in pydantic's declaration order. vLLM's
 * (vllm-wire-reference.md §1.3–1.4): completion chunks serialize every field, chat chunks only those set; each
 * release names the reasoning its own way and main adds fields (see wire/shapes.ts). SGLang's: renderSglang.ts.
 */

/** The names vLLM's chat message and delta give the reasoning, in their order. */
const REASONING_NAMES: Record<Exclude<WireShape, 'sglang'>, readonly string[]> = {
  'vllm-0.11': ['reasoning_content'],
  'vllm-0.12': ['reasoning', 'reasoning_content'],
  'vllm-main': ['reasoning'],
};

const reasoningNames = (wire: WireShape) => REASONING_NAMES[wire as Exclude<WireShape, 'sglang'>];

/** A chat delta in vLLM's form (only the fields set), its reasoning under this release's names, where it came. */
function vllmDelta(wire: WireShape, delta: ChunkDelta): string {
  const parts: string[] = [];
  let reasoningDone = false;
  for (const [key, value] of Object.entries(delta)) {
    if (key !== 'reasoning' && key !== 'reasoning_content') parts.push(`${JSON.stringify(key)}:${JSON.stringify(value)}`);
    else if (!reasoningDone) {
      reasoningDone = true;
      for (const name of reasoningNames(wire)) parts.push(`"${name}":${JSON.stringify(reasoningOf(delta))}`);
    }
  }
  return `{${parts.join(',')}}`;
}

/** The chat stream's first chunk for a choice, sent when its first output is ready. */
export function roleEvent(ctx: RenderContext, index: number): string {
  if (ctx.wire === 'sglang') return sglang.roleEvent(ctx, index);
  return `data: ${head(ctx, 'chat.completion.chunk')},"choices":[{"index":${index},"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":${ids(ctx, ctx.promptTokenIds)}}\n\n`;
}

/** One streamed chunk of one choice. `first` marks the choice's first chunk (completions carry the prompt ids there). */
export function chunkEvent(ctx: RenderContext, index: number, delta: ChunkDelta, tokenIds: readonly number[], finish: Finish | null, first: boolean): string {
  if (ctx.wire === 'sglang') return sglang.chunkEvent(ctx, index, delta, tokenIds, finish, first);
  if (ctx.kind === 'chat') {
    const stop = finish ? `,"stop_reason":${JSON.stringify(finish.stopReason)}` : '';
    return `data: ${head(ctx, 'chat.completion.chunk')},"choices":[{"index":${index},"delta":${vllmDelta(ctx.wire, delta)},"logprobs":null,"finish_reason":${JSON.stringify(finish?.reason ?? null)}${stop},"token_ids":${ids(ctx, tokenIds)}}]}\n\n`;
  }
  const text = typeof delta.text === 'string' ? delta.text : '';
  // Main's chunk declares `system_fingerprint` and `metrics` after `usage`: every field is dumped, so null.
  const mainFields = ctx.wire === 'vllm-main' ? ',"system_fingerprint":null,"metrics":null' : '';
  return `data: ${head(ctx, 'text_completion')},"choices":[{"index":${index},"text":${JSON.stringify(text)},"logprobs":null,"finish_reason":${JSON.stringify(finish?.reason ?? null)},"stop_reason":${JSON.stringify(finish?.stopReason ?? null)},"prompt_token_ids":${first ? ids(ctx, ctx.promptTokenIds) : 'null'},"token_ids":${ids(ctx, tokenIds)}}],"usage":null${mainFields}}\n\n`;
}

/** The final `stream_options.include_usage` chunk (dumped without nulls, as vLLM does). */
export function usageEvent(ctx: RenderContext, promptTokens: number, completionTokens: number, cachedTokens: number | null): string {
  if (ctx.wire === 'sglang') return sglang.usageEvent(ctx, promptTokens, completionTokens, cachedTokens);
  const object = ctx.kind === 'chat' ? 'chat.completion.chunk' : 'text_completion';
  const cached = details(cachedTokens);
  return `data: ${head(ctx, object)},"choices":[],"usage":{${usageJson(promptTokens, completionTokens)}${cached ? `,"prompt_tokens_details":${cached}` : ''}}}\n\n`;
}

/** The response `id`: vLLM's `chatcmpl-`/`cmpl-` and the request id; SGLang's is the bare request id (its `rid`). */
export function responseId(wire: WireShape, kind: EndpointKind, requestId: string): string {
  return wire === 'sglang' ? requestId : `${kind === 'chat' ? 'chatcmpl' : 'cmpl'}-${requestId}`;
}

export const DONE_EVENT = 'data: [DONE]\n\n';

/**
 * Whether a stream ends with the usage chunk. vLLM ≈0.10–0.13: `stream_options` given, its include_usage
 * defaults to true (an explicit null is off); vLLM main and SGLang: only `include_usage: true`.
 */
export function includesUsage(wire: WireShape, stream: boolean, streamOptions: { include_usage?: boolean | null } | null | undefined): boolean {
  if (!stream || !streamOptions) return false;
  if (wire === 'vllm-main' || wire === 'sglang') return streamOptions.include_usage === true;
  return streamOptions.include_usage === undefined || streamOptions.include_usage === true;
}

/** A choice's deltas as vLLM's non-streamed chat message. */
function chatMessage(wire: WireShape, deltas: ChunkDelta[]): string {
  const { content, reasoningContent, reasoning, toolCalls } = foldChatDeltas(deltas);
  const calls = toolCalls.map(
    (c) =>
      `{"id":${JSON.stringify(c.id ?? null)},"type":${JSON.stringify(c.type ?? 'function')},"function":{"name":${JSON.stringify(c.name)},"arguments":${JSON.stringify(c.arguments)}}}`,
  );
  // Main's serializer drops an empty tool_calls.
  const toolCallsField = calls.length === 0 && wire === 'vllm-main' ? '' : `,"tool_calls":[${calls.join(',')}]`;
  const text = JSON.stringify(reasoning ?? reasoningContent);
  const reasoningFields = reasoningNames(wire)
    .map((name) => `,"${name}":${text}`)
    .join('');
  return `{"role":"assistant","content":${JSON.stringify(content)},"refusal":null,"annotations":null,"audio":null,"function_call":null${toolCallsField}${reasoningFields}}`;
}

/** The non-streamed response body; `promptTokens` counts every prompt of the request (vLLM sums a batch's). */
export function fullResponse(ctx: RenderContext, choices: RenderedChoice[], promptTokens: number, cachedTokens: number | null): string {
  if (ctx.wire === 'sglang') return sglang.fullResponse(ctx, choices, promptTokens, cachedTokens);
  const completionTokens = choices.reduce((n, c) => n + c.plan.tokenIds.length, 0);
  const usage = `{${usageJson(promptTokens, completionTokens)},"prompt_tokens_details":${details(cachedTokens) ?? 'null'}}`;
  const main = ctx.wire === 'vllm-main';
  // Main: `routed_experts` per choice (only with --enable-return-routed-experts), encoder-cache transfer and per-request metrics.
  const routedExperts = main ? ',"routed_experts":null' : '';
  const transfer = `,"kv_transfer_params":${JSON.stringify(ctx.kvTransferParams ?? null)}${main ? ',"ec_transfer_params":null,"metrics":null' : ''}`;
  const top = head(ctx, ctx.kind === 'chat' ? 'chat.completion' : 'text_completion');
  if (ctx.kind === 'chat') {
    const items = choices.map(
      ({ plan, deltas }, index) =>
        `{"index":${index},"message":${chatMessage(ctx.wire, deltas)},"logprobs":null,"finish_reason":${JSON.stringify(plan.finishReason)},"stop_reason":${JSON.stringify(plan.stopReason)},"token_ids":${ids(ctx, plan.tokenIds)}${routedExperts}}`,
    );
    const promptText = main ? ',"prompt_text":null' : '';
    return `${top},"choices":[${items.join(',')}],"service_tier":null,"system_fingerprint":null,"usage":${usage},"prompt_logprobs":null,"prompt_token_ids":${ids(ctx, ctx.promptTokenIds)}${promptText}${transfer}}`;
  }
  const items = choices.map(({ plan, deltas, promptTokenIds }, index) => {
    const text = deltas.map((d) => (typeof d.text === 'string' ? d.text : '')).join('');
    return `{"index":${index},"text":${JSON.stringify(text)},"logprobs":null,"finish_reason":${JSON.stringify(plan.finishReason)},"stop_reason":${JSON.stringify(plan.stopReason)},"token_ids":${ids(ctx, plan.tokenIds)},"prompt_logprobs":null,"prompt_token_ids":${ids(ctx, promptTokenIds)}${routedExperts}}`;
  });
  return `${top},"choices":[${items.join(',')}],"service_tier":null,"system_fingerprint":null,"usage":${usage}${transfer}}`;
}

const ID_PREFIX = /^(data: )?\{"id":"[^"]*"(?:,"object":"([^"]*)","created":\d+)?/;
/** vLLM's generate answers and chunks: `request_id`, then (the non-streamed answer only) `model` and `created`. */
const REQUEST_ID_PREFIX = /^(data: )?\{"request_id":"[^"]*"(?:(,"model":"(?:[^"\\]|\\.)*","created":)\d+)?/;

/**
 * The stamp kind of generate's, followed by what stands between its id and its `created` (none in a chunk). No
 * `object` starts so: an `object` is a JSON string's content, and this starts with a quote.
 */
const REQUEST_ID_STAMP = '"request_id"';

/**
 * `{"id":…` with the `object` and `created` that follow it (none for `object` null: a rerank answer has only its
 * id); `{"request_id":…` (and its model and `created`) for generate's.
 */
export function stampedPrefix(id: string, object: string | null, created: number): string {
  if (object?.startsWith(REQUEST_ID_STAMP)) {
    const model = object.slice(REQUEST_ID_STAMP.length);
    return `{"request_id":${JSON.stringify(id)}${model && `${model}${created}`}`;
  }
  const stamp = object === null ? '' : `,"object":"${object}","created":${created}`;
  return `{"id":${JSON.stringify(id)}${stamp}`;
}

/** A captured event or body around its stamp (`object` undefined: it has none, `lead` is the whole text). */
export function splitStamp(text: string): { lead: string; object: string | null | undefined; tail: string } {
  const match = ID_PREFIX.exec(text);
  if (match) return { lead: match[1] ?? '', object: match[2] ?? null, tail: text.slice(match[0].length) };
  const generate = REQUEST_ID_PREFIX.exec(text);
  if (generate) return { lead: generate[1] ?? '', object: REQUEST_ID_STAMP + (generate[2] ?? ''), tail: text.slice(generate[0].length) };
  return { lead: text, object: undefined, tail: '' };
}

/**
 * Regenerates `id` and `created` in a captured event or body, as vLLM does per request (a rerank answer has no
 * `object`/`created`: only its id).
 */
export function restamp(text: string, id: string, created: number): string {
  const { lead, object, tail } = splitStamp(text);
  return object === undefined ? text : `${lead}${stampedPrefix(id, object, created)}${tail}`;
}
