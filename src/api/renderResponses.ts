import { randomUUID } from 'node:crypto';
import type { ChunkDelta } from '../store/generation.js';
import { foldChatDeltas, reasoningOf } from './renderCommon.js';
import type { ResponsesRequest, ToolChoice } from './responsesRequest.js';

/**
 * The Responses API's answer in vLLM's shape: the response object (§1.2 of the spec, every field, nulls kept, in
 * OpenAI's declaration order) and its event stream (`event:` + `data:` lines, `sequence_number` from 0, no
 * `[DONE]`), built from the chat deltas the plan's chunks carry (reasoning, content, tool calls). Pure.
 */

type Json = Record<string, unknown>;

/** A number pydantic dumps as a float (`1.0`, not `1`). */
class PyFloat {
  constructor(readonly value: number) {}
}

/** Compact JSON as pydantic's `model_dump_json` writes it, floats keeping their `.0`. */
export function responsesJson(value: unknown): string {
  if (value instanceof PyFloat) return Number.isInteger(value.value) ? value.value.toFixed(1) : JSON.stringify(value.value);
  if (Array.isArray(value)) return `[${value.map(responsesJson).join(',')}]`;
  if (value !== null && typeof value === 'object')
    return `{${Object.entries(value)
      .map(([k, v]) => `${JSON.stringify(k)}:${responsesJson(v)}`)
      .join(',')}}`;
  return JSON.stringify(value);
}

const hex = () => randomUUID().replaceAll('-', '');

/** The request's `id` (vLLM: its `request_id` verbatim, else `resp_<32 hex>`). */
export const responseIdOf = (requestId: string | undefined) => requestId ?? `resp_${hex()}`;

/** What the response object echoes of its request, resolved as vLLM's sampling params are. */
export interface ResponseEcho {
  id: string;
  createdAt: number;
  model: string;
  req: ResponsesRequest;
  toolChoice: ToolChoice;
  /** The resolved output budget (the request's, capped by what the context leaves). */
  maxOutputTokens: number;
}

export interface ResponsesUsage {
  input: number;
  cached: number;
  output: number;
  reasoning: number;
}

export type ResponseStatus = 'in_progress' | 'completed' | 'incomplete';

function usageObject(u: ResponsesUsage): Json {
  return {
    input_tokens: u.input,
    input_tokens_details: { cached_tokens: u.cached, input_tokens_per_turn: [], cached_tokens_per_turn: [] },
    output_tokens: u.output,
    output_tokens_details: { reasoning_tokens: u.reasoning, tool_output_tokens: 0, output_tokens_per_turn: [], tool_output_tokens_per_turn: [] },
    total_tokens: u.input + u.output,
  };
}

/** vLLM's `ResponsesResponse.from_request`: every field, in order. */
export function responseObject(echo: ResponseEcho, output: Json[], status: ResponseStatus, usage: ResponsesUsage | null): Json {
  const { req } = echo;
  const tools = (req.tools ?? []).map((t) => ({
    name: t.name,
    parameters: t.parameters ?? null,
    strict: t.strict ?? null,
    type: t.type,
    description: t.description ?? null,
  }));
  return {
    id: echo.id,
    created_at: echo.createdAt,
    incomplete_details: status === 'incomplete' ? { reason: 'max_output_tokens' } : null,
    instructions: req.instructions ?? null,
    metadata: req.metadata ?? null,
    model: echo.model,
    object: 'response',
    output,
    parallel_tool_calls: req.parallel_tool_calls ?? true,
    temperature: new PyFloat(req.temperature ?? 1),
    tool_choice: echo.toolChoice,
    tools,
    top_p: new PyFloat(req.top_p ?? 1),
    background: false,
    max_output_tokens: echo.maxOutputTokens,
    max_tool_calls: req.max_tool_calls ?? null,
    previous_response_id: req.previous_response_id ?? null,
    prompt: null,
    reasoning: req.reasoning ?? null,
    service_tier: req.service_tier ?? 'auto',
    status,
    text: req.text ?? null,
    top_logprobs: null,
    truncation: req.truncation ?? 'disabled',
    usage: usage ? usageObject(usage) : null,
    user: req.user ?? null,
    presence_penalty: new PyFloat(req.presence_penalty ?? 0),
    frequency_penalty: new PyFloat(req.frequency_penalty ?? 0),
    kv_transfer_params: null,
    ec_transfer_params: null,
    input_messages: null,
    output_messages: null,
  };
}

const textPart = (text: string, logprobs: unknown[] | null) => ({ annotations: [], text, type: 'output_text', logprobs });
const messageItem = (id: string, content: Json[], status: string) => ({ id, content, role: 'assistant', status, type: 'message' });
const reasoningItem = (id: string, content: Json[] | null, status: string | null) => ({
  id,
  summary: [],
  type: 'reasoning',
  content,
  encrypted_content: null,
  status,
});
const callItem = (id: string, args: string, callId: string, name: string, status: string) => ({
  id,
  arguments: args,
  call_id: callId,
  name,
  type: 'function_call',
  namespace: null,
  status,
});

/** vLLM's `build_response_output_items`: reasoning, then the message, then the function calls (ids `rs_`, `msg_`, `fc_`). */
export function outputItems(deltas: readonly ChunkDelta[]): Json[] {
  const folded = foldChatDeltas(deltas);
  const reasoning = folded.reasoning ?? folded.reasoningContent;
  const items: Json[] = [];
  if (reasoning) items.push(reasoningItem(`rs_${hex()}`, [{ text: reasoning, type: 'reasoning_text' }], null));
  if (folded.content || folded.toolCalls.length === 0)
    items.push(messageItem(`msg_${hex()}`, folded.content ? [textPart(folded.content, null)] : [], 'completed'));
  for (const call of folded.toolCalls)
    items.push(callItem(`fc_${hex()}`, call.arguments, typeof call.id === 'string' ? call.id : `call_${hex()}`, call.name, 'completed'));
  return items;
}

/** The assistant texts of a response's output (what `previous_response_id` carries into the next turn). */
export function outputTexts(output: readonly Json[]): string[] {
  return output
    .filter((item) => item.type === 'message')
    .flatMap((item) => (item.content as Json[]).map((part) => part.text))
    .filter((text): text is string => typeof text === 'string');
}

type Open =
  | { kind: 'message'; id: string; text: string }
  | { kind: 'reasoning'; id: string; text: string }
  | { kind: 'call'; id: string; index: number; callId: string; name: string; args: string };

/**
 * vLLM's `SimpleStreamingEventProcessor`: one item open at a time (a message, a reasoning item or a function call);
 * a change of kind, or a new tool-call index, closes it first; `output_index` counts the closed items.
 */
export class ResponsesStream {
  private sequence = 0;
  private outputIndex = 0;
  private open: Open | null = null;

  constructor(private readonly echo: ResponseEcho) {}

  /** An event's fields go in OpenAI's declaration order, which for every event type is alphabetical. */
  private event(type: string, fields: Json): string {
    const all: Json = { ...fields, sequence_number: this.sequence++, type };
    const ordered = Object.fromEntries(
      Object.keys(all)
        .sort()
        .map((k) => [k, all[k]]),
    );
    return `event: ${type}\ndata: ${responsesJson(ordered)}\n\n`;
  }

  /** `response.created` and `response.in_progress`. */
  opening(): string {
    const response = responseObject(this.echo, [], 'in_progress', null);
    return this.event('response.created', { response }) + this.event('response.in_progress', { response });
  }

  /** The events of one chunk's delta: its reasoning, then its content, then its tool calls. */
  delta(delta: ChunkDelta): string {
    let out = '';
    const reasoning = reasoningOf(delta);
    if (reasoning) out += this.text('reasoning', reasoning);
    if (typeof delta.content === 'string' && delta.content) out += this.text('message', delta.content);
    for (const call of (Array.isArray(delta.tool_calls) ? delta.tool_calls : []) as Json[]) out += this.toolCall(call);
    return out;
  }

  private text(kind: 'message' | 'reasoning', text: string): string {
    let out = '';
    if (this.open?.kind !== kind) {
      out += this.close();
      const id = hex();
      this.open = { kind, id, text: '' };
      const ids = { content_index: 0, item_id: id, output_index: this.outputIndex };
      if (kind === 'message') {
        out += this.event('response.output_item.added', { item: messageItem(id, [], 'in_progress'), output_index: this.outputIndex });
        out += this.event('response.content_part.added', { ...ids, part: textPart('', []) });
      } else {
        out += this.event('response.output_item.added', { item: reasoningItem(id, null, 'in_progress'), output_index: this.outputIndex });
        out += this.event('response.reasoning_part.added', { ...ids, part: { text: '', type: 'reasoning_text' } });
      }
    }
    const open = this.open as Open & { kind: typeof kind };
    open.text += text;
    if (kind === 'message')
      return `${out}${this.event('response.output_text.delta', { content_index: 0, delta: text, item_id: open.id, logprobs: [], output_index: this.outputIndex })}`;
    return `${out}${this.event('response.reasoning_text.delta', { content_index: 0, delta: text, item_id: open.id, output_index: this.outputIndex })}`;
  }

  private toolCall(call: Json): string {
    const fn = (call.function ?? {}) as Json;
    const index = Number(call.index ?? 0);
    let out = '';
    if (this.open?.kind !== 'call' || this.open.index !== index) {
      out += this.close();
      const name = typeof fn.name === 'string' ? fn.name : '';
      this.open = { kind: 'call', id: hex(), index, callId: `call_${hex()}`, name, args: '' };
      out += this.event('response.output_item.added', {
        item: callItem(this.open.id, '', this.open.callId, name, 'in_progress'),
        output_index: this.outputIndex,
      });
    }
    const args = typeof fn.arguments === 'string' ? fn.arguments : '';
    if (!args) return out;
    this.open.args += args;
    return `${out}${this.event('response.function_call_arguments.delta', { delta: args, item_id: this.open.id, output_index: this.outputIndex })}`;
  }

  /** The open item's closing events (none when nothing is open). */
  private close(): string {
    const open = this.open;
    if (!open) return '';
    this.open = null;
    const output_index = this.outputIndex++;
    const ids = { content_index: 0, item_id: open.id, output_index };
    if (open.kind === 'message') {
      const part = textPart(open.text, null);
      return (
        this.event('response.output_text.done', { content_index: 0, item_id: open.id, logprobs: [], output_index, text: open.text }) +
        this.event('response.content_part.done', { ...ids, part }) +
        this.event('response.output_item.done', { item: { ...messageItem(open.id, [part], 'completed'), summary: [] }, output_index })
      );
    }
    if (open.kind === 'reasoning') {
      const part = { text: open.text, type: 'reasoning_text' };
      return (
        this.event('response.reasoning_text.done', { ...ids, text: open.text }) +
        this.event('response.reasoning_part.done', { ...ids, part }) +
        this.event('response.output_item.done', { item: reasoningItem(open.id, [part], 'completed'), output_index })
      );
    }
    const done = open.args
      ? this.event('response.function_call_arguments.done', { arguments: open.args, item_id: open.id, name: open.name, output_index })
      : '';
    return done + this.event('response.output_item.done', { item: callItem(open.id, open.args, open.callId, open.name, 'completed'), output_index });
  }

  /** Closes the open item, then `response.completed` with the final response. */
  completed(response: Json): string {
    return this.close() + this.event('response.completed', { response });
  }
}
