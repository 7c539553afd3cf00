import type { ChunkDelta, Generation } from '../store/generation.js';
import { sseEvents } from './extract.js';

/**
 * What an engine answered on OpenAI Responses (`/v1/responses`) or Anthropic Messages (`/v1/messages`), read into
 * one chat-shaped choice: each text, reasoning or tool-call delta event becomes the chat delta it stands for
 * (`content`, `reasoning`, `tool_calls`), with its arrival time, so the readers of chat captures (fold, rerun,
 * show) see the same structured fields. Event names are read from each event's JSON `type` (vLLM sends an
 * `event:` line too, `transformers serve` does not). Neither API returns token ids: the choice has none, and
 * counts none (each event's bytes and arrival time are the exchange's own).
 */

type Json = Record<string, unknown>;

export interface ParsedAgentResponse {
  generation: Generation;
  usage: unknown;
  model: string | null;
  error: string | null;
}

/** A tool call's first delta, chat-shaped. */
const callStart = (index: number, id: unknown, name: unknown): ChunkDelta => ({
  tool_calls: [{ index, id, type: 'function', function: { name, arguments: '' } }],
});
const callArguments = (index: number, args: string): ChunkDelta => ({ tool_calls: [{ index, function: { arguments: args } }] });

/** Reads events of either API into chat deltas; the tool-call index counts calls in the order they open. */
class DeltaReader {
  readonly deltas: ChunkDelta[] = [];
  usage: unknown;
  model: string | null = null;
  error: string | null = null;
  finishReason: string | null = null;
  private readonly calls = new Map<unknown, number>();

  private callIndex(key: unknown): number {
    let index = this.calls.get(key);
    if (index === undefined) this.calls.set(key, (index = this.calls.size));
    return index;
  }

  private push(delta: ChunkDelta, text: unknown): void {
    if (typeof text === 'string' && text !== '') this.deltas.push(delta);
  }

  /** A Responses event (`response.*`); the response object of created/completed carries model and usage. */
  responses(e: Json): void {
    const response = e.response as Json | undefined;
    if (response) {
      if (typeof response.model === 'string') this.model = response.model;
      if (response.usage) this.usage = response.usage;
      if (e.type === 'response.completed' || e.type === 'response.incomplete') this.finishReason = String(response.status ?? e.type);
      if (e.type === 'response.failed') this.error ??= JSON.stringify((response.error as Json | undefined) ?? response);
    }
    const item = e.item as Json | undefined;
    switch (e.type) {
      case 'response.output_text.delta':
        return this.push({ content: e.delta }, e.delta);
      case 'response.reasoning_text.delta':
        return this.push({ reasoning: e.delta }, e.delta);
      case 'response.output_item.added':
        if (item?.type === 'function_call') this.deltas.push(callStart(this.callIndex(e.output_index), item.call_id, item.name));
        return;
      case 'response.function_call_arguments.delta':
        return this.push(callArguments(this.callIndex(e.output_index), String(e.delta)), e.delta);
      case 'error':
        this.error ??= String(e.message ?? JSON.stringify(e));
    }
  }

  /** An Anthropic Messages event. */
  messages(e: Json): void {
    const block = e.content_block as Json | undefined;
    const delta = (e.delta ?? {}) as Json;
    switch (e.type) {
      case 'message_start': {
        const message = (e.message ?? {}) as Json;
        if (typeof message.model === 'string') this.model = message.model;
        this.usage = message.usage;
        return;
      }
      case 'content_block_start':
        if (block?.type === 'tool_use') this.deltas.push(callStart(this.callIndex(e.index), block.id, block.name));
        return;
      case 'content_block_delta':
        if (delta.type === 'text_delta') this.push({ content: delta.text }, delta.text);
        else if (delta.type === 'thinking_delta') this.push({ reasoning: delta.thinking }, delta.thinking);
        else if (delta.type === 'input_json_delta') this.push(callArguments(this.callIndex(e.index), String(delta.partial_json)), delta.partial_json);
        return;
      case 'message_delta':
        if (e.usage) this.usage = { ...((this.usage ?? {}) as Json), ...(e.usage as Json) };
        if (typeof delta.stop_reason === 'string') this.finishReason = delta.stop_reason;
        return;
      case 'error':
        this.error ??= String((e.error as Json | undefined)?.message ?? JSON.stringify(e));
    }
  }

  /** A non-streamed Responses object: its output items in order. */
  responsesBody(body: Json): void {
    this.responses({ type: `response.${String(body.status ?? 'completed') === 'completed' ? 'completed' : 'incomplete'}`, response: body });
    for (const item of (body.output ?? []) as Json[]) {
      const parts = (item.content ?? []) as Json[];
      if (item.type === 'message') for (const part of parts) this.push({ content: part.text }, part.text);
      else if (item.type === 'reasoning') for (const part of parts) this.push({ reasoning: part.text }, part.text);
      else if (item.type === 'function_call') {
        const index = this.callIndex(item.id ?? item.call_id);
        this.deltas.push(callStart(index, item.call_id, item.name));
        this.push(callArguments(index, String(item.arguments ?? '')), item.arguments);
      }
    }
  }

  /** A non-streamed Anthropic message: its content blocks in order. */
  messagesBody(body: Json): void {
    if (typeof body.model === 'string') this.model = body.model;
    this.usage = body.usage;
    this.finishReason = typeof body.stop_reason === 'string' ? body.stop_reason : null;
    for (const [i, block] of ((body.content ?? []) as Json[]).entries()) {
      if (block.type === 'text') this.push({ content: block.text }, block.text);
      else if (block.type === 'thinking') this.push({ reasoning: block.thinking }, block.thinking);
      else if (block.type === 'tool_use') {
        this.deltas.push(callStart(this.callIndex(i), block.id, block.name));
        this.deltas.push(callArguments(this.callIndex(i), JSON.stringify(block.input ?? {})));
      }
    }
  }
}

const textOf = (deltas: readonly ChunkDelta[]) => deltas.map((d) => (typeof d.content === 'string' ? d.content : '')).join('');

/**
 * A Responses or Messages answer, streamed (SSE, with or without `event:` lines) or whole. A body that is an
 * event stream though the request did not ask for one (`transformers serve`) is read as the stream it is.
 */
export function parseAgentResponse(api: 'responses' | 'messages', stream: boolean, body: Buffer, eventEnds: readonly number[]): ParsedAgentResponse {
  const reader = new DeltaReader();
  const read = (e: Json) => (api === 'responses' ? reader.responses(e) : reader.messages(e));
  if (stream) {
    for (const { data } of sseEvents(body, eventEnds)) {
      if (data === '[DONE]') continue;
      try {
        read(JSON.parse(data) as Json);
      } catch {
        reader.error = `unparsable SSE event: ${data.slice(0, 200)}`;
      }
    }
  } else {
    try {
      const json = JSON.parse(body.toString('utf8')) as Json;
      if (api === 'responses') reader.responsesBody(json);
      else reader.messagesBody(json);
    } catch {
      reader.error = 'unparsable JSON response body';
    }
  }
  return {
    generation: {
      choiceIndex: 0,
      outputIds: [],
      tokenTimes: [],
      chunkTokens: reader.deltas.map(() => 0),
      chunkDeltas: reader.deltas,
      text: textOf(reader.deltas),
      finishReason: reader.finishReason,
      stopReason: null,
    },
    usage: reader.usage,
    model: reader.model,
    error: reader.error,
  };
}
