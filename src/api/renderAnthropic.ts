import { randomUUID } from 'node:crypto';
import type { ChoicePlan } from '../generation/plan.js';
import type { ChunkDelta } from '../store/generation.js';
import type { ApiError } from '../wire/errors.js';
import { foldChatDeltas, reasoningOf } from './renderCommon.js';

/**
 * A chat answer rendered as Anthropic's Messages API response, as vLLM renders it (AnthropicServingMessages
 * `messages_full_converter` and `message_stream_converter`): the chat completion's id, content blocks thinking →
 * text → tool_use, the chat finish mapped to a stop_reason, nulls dropped; the stream as `event:` + `data:` pairs
 * without `ping` and without `[DONE]`.
 */

type Json = Record<string, unknown>;

/** What the chat usage says, in Anthropic's terms: the cached prompt tokens only with `--enable-prompt-tokens-details`. */
export interface AnthropicUsageCounts {
  promptTokens: number;
  outputTokens: number;
  /** null: prompt token details are off (the cache field is then absent). */
  cachedTokens: number | null;
}

/** vLLM's `_build_anthropic_usage`: input_tokens are the prompt tokens the cache did not supply. */
function usage(u: AnthropicUsageCounts): Json {
  if (u.cachedTokens === null) return { input_tokens: u.promptTokens, output_tokens: u.outputTokens };
  return { input_tokens: Math.max(0, u.promptTokens - u.cachedTokens), output_tokens: u.outputTokens, cache_read_input_tokens: u.cachedTokens };
}

const STOP_REASONS: Record<string, string> = { stop: 'end_turn', length: 'max_tokens', tool_calls: 'tool_use' };

/** The stop_reason (and stop_sequence, for a stop string) of a chat finish; an unmapped finish (abort) has none. */
function stopFields(plan: ChoicePlan): { stop_reason?: string; stop_sequence?: string } {
  if (plan.finishReason === 'stop' && typeof plan.stopReason === 'string') return { stop_reason: 'stop_sequence', stop_sequence: plan.stopReason };
  const reason = STOP_REASONS[plan.finishReason];
  return reason ? { stop_reason: reason } : {};
}

/** The non-streamed Messages response of a chat choice whose deltas are `deltas`. */
export function anthropicMessage(id: string, model: string, plan: ChoicePlan, deltas: readonly ChunkDelta[], counts: AnthropicUsageCounts): string {
  const folded = foldChatDeltas(deltas);
  const reasoning = folded.reasoning ?? folded.reasoningContent;
  const content: Json[] = [];
  if (reasoning) content.push({ type: 'thinking', thinking: reasoning, signature: randomUUID().replaceAll('-', '') });
  if (folded.content) content.push({ type: 'text', text: folded.content });
  for (const call of folded.toolCalls) content.push({ type: 'tool_use', id: call.id, name: call.name, input: JSON.parse(call.arguments) });
  if (content.length === 0) content.push({ type: 'text', text: '' });
  return JSON.stringify({ id, type: 'message', role: 'assistant', content, model, ...stopFields(plan), usage: usage(counts) });
}

/** vLLM's translation of a handler's error: its ErrorResponse's type (vLLM's class-style name) and message. */
export function anthropicError(err: ApiError): string {
  return JSON.stringify({ type: 'error', error: { type: err.type, message: err.message } });
}

/** An error once the stream has started (vLLM's `event: error` with type internal_error). */
export const anthropicStreamError = (message: string) => sseEvent('error', { type: 'error', error: { type: 'internal_error', message } });

/** `/v1/messages/count_tokens`'s answer. */
export const countTokensBody = (inputTokens: number) =>
  JSON.stringify({ input_tokens: inputTokens, context_management: { original_input_tokens: inputTokens } });

const sseEvent = (name: string, data: Json) => `event: ${name}\ndata: ${JSON.stringify(data)}\n\n`;

type BlockType = 'text' | 'thinking' | 'tool_use';

/**
 * The Messages stream of one chat choice: fed the chat deltas as the engine completes them, it opens a block on
 * each block type's first non-empty delta, closes the open one before another starts (a thinking block with its
 * signature_delta), and holds text that comes while a tool_use block is open for a text block after it.
 */
export class AnthropicStream {
  private nextIndex = 0;
  private open: { type: BlockType; index: number; toolUseId: string | null } | null = null;
  private pending: string[] = [];
  private readonly toolIds = new Map<number, string>();

  constructor(
    private readonly id: string,
    private readonly model: string,
  ) {}

  /** `message_start`, with the prompt's tokens and no output yet. */
  start(promptTokens: number): string {
    const message = { id: this.id, type: 'message', role: 'assistant', content: [], model: this.model, stop_reason: null, stop_sequence: null };
    return sseEvent('message_start', { type: 'message_start', message: { ...message, usage: usage({ promptTokens, outputTokens: 0, cachedTokens: null }) } });
  }

  /** The events of one chat delta: its reasoning, then its text, then its tool call fragments. */
  delta(d: ChunkDelta): string {
    let out = '';
    const reasoning = reasoningOf(d);
    if (reasoning) {
      if (this.open?.type !== 'thinking') out += this.closeAndFlush() + this.startBlock({ type: 'thinking', thinking: '' });
      out += this.blockDelta({ type: 'thinking_delta', thinking: reasoning });
    }
    const text = typeof d.content === 'string' ? d.content : '';
    if (text && this.open?.type === 'tool_use') this.pending.push(text);
    else if (text) {
      if (this.open?.type !== 'text') out += this.closeAndFlush() + this.startBlock({ type: 'text', text: '' });
      out += this.blockDelta({ type: 'text_delta', text });
    }
    for (const call of (Array.isArray(d.tool_calls) ? d.tool_calls : []) as Json[]) out += this.toolCall(call);
    return out;
  }

  /** The last events: the open block closed, `message_delta` with the stop reason and the usage, `message_stop`. */
  end(plan: ChoicePlan, counts: AnthropicUsageCounts): string {
    const stop = stopFields(plan);
    const delta = 'stop_reason' in stop ? stop : { stop_reason: null };
    return (
      this.closeAndFlush() +
      sseEvent('message_delta', { type: 'message_delta', delta, usage: usage(counts) }) +
      sseEvent('message_stop', { type: 'message_stop' })
    );
  }

  private toolCall(call: Json): string {
    const index = Number(call.index ?? 0);
    const fn = (call.function ?? {}) as Json;
    const args = typeof fn.arguments === 'string' ? fn.arguments : '';
    let out = '';
    let id: string | undefined;
    if (typeof call.id === 'string') {
      id = call.id;
      this.toolIds.set(index, id);
      if (this.open?.toolUseId !== id && typeof fn.name === 'string')
        out += this.closeAndFlush() + this.startBlock({ type: 'tool_use', id, name: fn.name, input: {} });
    } else id = this.toolIds.get(index);
    if (args && id !== undefined && this.open?.toolUseId === id) out += this.blockDelta({ type: 'input_json_delta', partial_json: args });
    return out;
  }

  private startBlock(block: Json & { type: BlockType }): string {
    const index = this.nextIndex;
    this.open = { type: block.type, index, toolUseId: block.type === 'tool_use' ? (block.id as string) : null };
    return sseEvent('content_block_start', { type: 'content_block_start', content_block: block, index });
  }

  private blockDelta(delta: Json): string {
    return sseEvent('content_block_delta', { type: 'content_block_delta', delta, index: this.open?.index ?? this.nextIndex });
  }

  private close(): string {
    if (!this.open) return '';
    const { type, index } = this.open;
    const signature = type === 'thinking' ? this.blockDelta({ type: 'signature_delta', signature: randomUUID().replaceAll('-', '') }) : '';
    this.open = null;
    this.nextIndex++;
    return signature + sseEvent('content_block_stop', { type: 'content_block_stop', index });
  }

  /** Closes the open block; text held back while a tool_use block was open follows as a text block of its own. */
  private closeAndFlush(): string {
    const held = this.pending.join('');
    this.pending = [];
    let out = this.close();
    if (held) out += this.startBlock({ type: 'text', text: '' }) + this.blockDelta({ type: 'text_delta', text: held }) + this.close();
    return out;
  }
}
