import type { ModelTokenizer } from '../tokenizer/index.js';
import type { PlannedChunk } from './chunk.js';
import type { ChoicePlan, OutputParams } from './plan.js';
import { reasoningChunks, thinkingSpanLength, type ReasoningSpan } from './reasoning.js';
import { drawStructured } from './structured.js';
import { planToolCall } from './toolCalls.js';

/** How random answers imitate a reasoning model with tools (`--reasoning`, `--tool-call-rate`). */
export interface SyntheticConfig {
  /** The thinking span's token ids and ratio; null: answers do not think. */
  reasoning: ReasoningSpan | null;
  /** Share of `tool_choice: "auto"` answers that are a tool call. */
  toolCallRate: number;
}

/**
 * Shapes a random answer as a reasoning model with tools would write it: `bodyLength` random tokens (a final EOS
 * excluded) open with the thinking span (start token, thinking, end token), whose text a chat gets as
 * `reasoning_content`; a chat offering tools may then get a tool call after the span, ended by EOS, when it fits
 * between `min_tokens` and `max_tokens` (never with `ignore_eos`: the call must end the answer). `toolCall`: the
 * plan is a call, which stop rules do not cut. A constrained answer (`params.structured`) is, after the span, text
 * the constraint accepts then EOS (repeated up to `min_tokens`, or to `max_tokens` with `ignore_eos`, as a model
 * held by its grammar writes only EOS once the text is complete); cut at max_tokens when it does not fit (the
 * caller's stop rules then end it at its EOS, or by length). A named or required tool choice still calls a tool
 * (vLLM constrains that call instead); `auto` does not, the constraint holding the whole answer.
 */
export async function shapeRandomAnswer(
  tokenIds: number[],
  bodyLength: number,
  params: OutputParams,
  tokenizer: ModelTokenizer,
  config: SyntheticConfig,
  rand: () => number,
  /** The constrained answer's own stream, unread: the same seed draws the same answer whatever max_tokens is. */
  structuredRand: () => number,
): Promise<{ plan: ChoicePlan; toolCall: boolean }> {
  const span = config.reasoning ? thinkingSpanLength(config.reasoning, bodyLength, params.reasoningEffort ?? null) : 0;
  if (config.reasoning && span > 0) {
    tokenIds[0] = config.reasoning.startTokenId;
    tokenIds[span - 1] = config.reasoning.endTokenId;
  }
  // A completion's text is the raw tokens: vLLM parses reasoning (and tools) in chats only.
  const thinking = span > 0 && params.kind === 'chat' ? await reasoningChunks(tokenIds, span, tokenizer, params.skipSpecialTokens) : [];
  const structured = params.structured ?? null;
  if (params.tools && !(structured && params.tools.choice === 'auto') && !params.ignoreEos && tokenizer.eosTokenIds.length > 0) {
    // The call and its EOS fit in max_tokens after the span.
    const call = await planToolCall(params.tools, config.toolCallRate, rand, tokenizer, params.maxTokens - span - 1);
    const eosAt = span + (call?.tokenIds.length ?? 0);
    if (call && eosAt >= params.minTokens) {
      const ids = [...tokenIds.slice(0, span), ...call.tokenIds, tokenizer.eosTokenIds[0]];
      const chunks = [...thinking, ...call.chunks.map((c) => ({ ...c, end: c.end + span }))];
      // The EOS's text is skipped: it rides with the call's last chunk.
      chunks[chunks.length - 1].end = ids.length;
      return { plan: { tokenIds: ids, chunks, finishReason: call.finishReason, stopReason: null }, toolCall: true };
    }
  }
  if (structured) {
    const room = params.maxTokens - span;
    const { text, complete } = drawStructured(structured, structuredRand, room);
    let answer = (await tokenizer.encode(text, false)).slice(0, room);
    // An answer that never completes (a schema recursing forever) fills max_tokens: JSON's whitespace continues it.
    if (!complete && answer.length < room) answer = [...answer, ...Array<number>(room - answer.length).fill((await tokenizer.encode(' ', false))[0])];
    const eos = tokenizer.eosTokenIds[0];
    const used = span + answer.length;
    const eosCount =
      eos === undefined ? 0 : Math.max(0, Math.min(params.maxTokens - used, params.ignoreEos ? params.maxTokens : Math.max(1, params.minTokens - used + 1)));
    const ids = [...tokenIds.slice(0, span), ...answer, ...Array<number>(eosCount).fill(eos)];
    const from = thinking.length > 0 ? span : 0;
    const chunks: PlannedChunk[] = [...thinking, ...ids.slice(from).map((_, i) => ({ end: from + i + 1 }))];
    return { plan: { tokenIds: ids, chunks, finishReason: 'length', stopReason: null }, toolCall: false };
  }
  const answerFrom = thinking.length > 0 ? span : 0;
  const answer: PlannedChunk[] = tokenIds.slice(answerFrom).map((_, i) => ({ end: answerFrom + i + 1 }));
  return { plan: { tokenIds, chunks: [...thinking, ...answer], finishReason: 'length', stopReason: null }, toolCall: false };
}
