import type { ChunkDelta } from '../store/generation.js';
import { details, foldChatDeltas, head, reasoningOf, usageJson, type Finish, type RenderContext, type RenderedChoice } from './renderCommon.js';

/**
 * SGLang's response formats (test/fixtures/engines/sglang-shapes.md §2–§6): `matched_stop` where vLLM has
 * `stop_reason` (an EOS stop names the EOS id), usage with `reasoning_tokens`, `metadata` at the end of a body,
 * every chat delta opened by `reasoning_content`, the finish in a chunk of its own, and the token-id fields
 * absent (not null) unless asked for.
 */

/** `matched_stop`: the stop string or token id, the EOS id for an EOS stop (the last output token), else null. */
function matchedStop(reason: string, stopReason: string | number | null, lastToken: number | undefined): string {
  return JSON.stringify(stopReason ?? (reason === 'stop' ? (lastToken ?? null) : null));
}

function usage(promptTokens: number, completionTokens: number, cachedTokens: number | null, withNulls: boolean): string {
  const cached = details(cachedTokens);
  const detailsField = cached || withNulls ? `,"prompt_tokens_details":${cached ?? 'null'}` : '';
  return `{${usageJson(promptTokens, completionTokens)}${detailsField},"reasoning_tokens":0}`;
}

/** A chat delta as SGLang's msgspec chunk writes it: `reasoning_content` first and always, then what is set. */
function chatDelta(delta: ChunkDelta): string {
  const rest = Object.entries(delta)
    .filter(([key]) => key !== 'reasoning' && key !== 'reasoning_content')
    .map(([key, value]) => `,${JSON.stringify(key)}:${JSON.stringify(value)}`);
  return `{"reasoning_content":${JSON.stringify(reasoningOf(delta))}${rest.join('')}}`;
}

function chatChunk(ctx: RenderContext, index: number, delta: string, finishReason: string | null, matched: string, ids = ''): string {
  return `data: ${head(ctx, 'chat.completion.chunk')},"choices":[{"index":${index},"delta":${delta},"logprobs":null,"finish_reason":${JSON.stringify(finishReason)},"matched_stop":${matched}${ids}}]}\n\n`;
}

/**
 * SGLang refuses `return_token_ids` in a streamed chat (§6); mocker answers it as SGLang's streamed completions do:
 * `prompt_token_ids` on a choice's first chunk, `token_ids` on every chunk.
 */
export function roleEvent(ctx: RenderContext, index: number): string {
  const ids = ctx.returnTokenIds ? `,"prompt_token_ids":[${ctx.promptTokenIds.join(',')}]` : '';
  return chatChunk(ctx, index, '{"reasoning_content":null,"role":"assistant","content":""}', null, 'null', ids);
}

/** Whether a chat delta says anything: SGLang sends a chunk per non-empty text delta only. */
const saysSomething = (delta: ChunkDelta) =>
  Object.values(delta).some((value) => value !== null && value !== '' && !(Array.isArray(value) && value.length === 0));

/**
 * One engine output of one choice. Chat: a chunk when it says something (or carries asked-for ids), and after
 * the last output a chunk with only the finish. Completions: a chunk per output, empty text included, the finish
 * on the last; the ids when asked (`token_ids`, and `prompt_token_ids` on a choice's first chunk).
 */
export function chunkEvent(ctx: RenderContext, index: number, delta: ChunkDelta, tokenIds: readonly number[], finish: Finish | null, first: boolean): string {
  const matched = finish ? matchedStop(finish.reason, finish.stopReason, tokenIds.at(-1)) : 'null';
  const outputIds = (here: boolean) => (ctx.returnTokenIds ? `,"token_ids":[${here ? tokenIds.join(',') : ''}]` : '');
  if (ctx.kind === 'chat') {
    const sent = saysSomething(delta) || (ctx.returnTokenIds && !finish);
    const said = sent ? chatChunk(ctx, index, chatDelta(delta), null, 'null', outputIds(true)) : '';
    return said + (finish ? chatChunk(ctx, index, '{"reasoning_content":null}', finish.reason, matched, outputIds(!sent)) : '');
  }
  const text = typeof delta.text === 'string' ? delta.text : '';
  const promptIds = ctx.returnTokenIds && first ? `,"prompt_token_ids":[${ctx.promptTokenIds.join(',')}]` : '';
  return `data: ${head(ctx, 'text_completion')},"choices":[{"index":${index},"text":${JSON.stringify(text)},"logprobs":null,"finish_reason":${JSON.stringify(finish?.reason ?? null)},"matched_stop":${matched}${outputIds(true)}${promptIds}}],"usage":null}\n\n`;
}

/** The usage chunk: a chat's dumped whole, a completion's without its nulls. */
export function usageEvent(ctx: RenderContext, promptTokens: number, completionTokens: number, cachedTokens: number | null): string {
  const object = ctx.kind === 'chat' ? 'chat.completion.chunk' : 'text_completion';
  return `data: ${head(ctx, object)},"choices":[],"usage":${usage(promptTokens, completionTokens, cachedTokens, ctx.kind === 'chat')}}\n\n`;
}

function chatMessage(deltas: ChunkDelta[]): string {
  const { content, reasoningContent, reasoning, toolCalls } = foldChatDeltas(deltas);
  const calls = toolCalls.map(
    (c, index) =>
      `{"id":${JSON.stringify(c.id ?? null)},"index":${index},"type":"function","function":{"name":${JSON.stringify(c.name)},"arguments":${JSON.stringify(c.arguments)}}}`,
  );
  // `content` is "" when there is none, never null.
  return `{"role":"assistant","content":${JSON.stringify(content ?? '')},"reasoning_content":${JSON.stringify(reasoning ?? reasoningContent)},"tool_calls":${calls.length ? `[${calls.join(',')}]` : 'null'}}`;
}

export function fullResponse(ctx: RenderContext, choices: RenderedChoice[], promptTokens: number, cachedTokens: number | null): string {
  const completionTokens = choices.reduce((n, c) => n + c.plan.tokenIds.length, 0);
  const items = choices.map(({ plan, deltas, promptTokenIds }, index) => {
    const finish = `"logprobs":null,"finish_reason":${JSON.stringify(plan.finishReason)},"matched_stop":${matchedStop(plan.finishReason, plan.stopReason, plan.tokenIds.at(-1))}`;
    const output = `"token_ids":[${plan.tokenIds.join(',')}]`;
    const prompt = `"prompt_token_ids":[${promptTokenIds.join(',')}]`;
    if (ctx.kind === 'chat') return `{"index":${index},"message":${chatMessage(deltas)},${finish}${ctx.returnTokenIds ? `,${prompt},${output}` : ''}}`;
    const text = deltas.map((d) => (typeof d.text === 'string' ? d.text : '')).join('');
    return `{"index":${index},"text":${JSON.stringify(text)},${finish}${ctx.returnTokenIds ? `,${output},${prompt}` : ''}}`;
  });
  const object = ctx.kind === 'chat' ? 'chat.completion' : 'text_completion';
  return `${head(ctx, object)},"choices":[${items.join(',')}],"usage":${usage(promptTokens, completionTokens, cachedTokens, true)},"metadata":{"weight_version":"default"}}`;
}
