import { z } from 'zod';
import { pythonJsonDumps } from '../wire/errors.js';
import { withoutNulls } from './schemas.js';

/**
 * Anthropic's Messages API request, read as vLLM reads it (its AnthropicMessagesRequest: a plain pydantic model, so
 * keys it does not know are ignored) and turned into the chat completions body vLLM runs in its place
 * (`AnthropicServingMessages.to_chat_completion_request`): the same chat template, tokenization and sampling follow.
 */

type Json = Record<string, unknown>;

const BLOCK_TYPES = ['text', 'image', 'tool_use', 'tool_result', 'tool_reference', 'thinking', 'redacted_thinking'] as const;

const block = z.looseObject({
  type: z.enum(BLOCK_TYPES),
  text: z.string().nullish(),
  source: z.record(z.string(), z.unknown()).nullish(),
  id: z.string().nullish(),
  tool_use_id: z.string().nullish(),
  name: z.string().nullish(),
  input: z.record(z.string(), z.unknown()).nullish(),
  content: z.union([z.string(), z.array(z.record(z.string(), z.unknown()))]).nullish(),
  thinking: z.string().nullish(),
});
type Block = z.infer<typeof block>;

const message = z.looseObject({
  role: z.enum(['user', 'assistant', 'system']),
  content: z.union([z.string(), z.array(block)]),
});
type Message = z.infer<typeof message>;

const toolChoice = z.looseObject({
  type: z.enum(['auto', 'any', 'tool', 'none']),
  name: z.string().nullish(),
  disable_parallel_tool_use: z.boolean().nullish(),
});

const tool = z.looseObject({
  name: z.string(),
  description: z.string().nullish(),
  input_schema: z.record(z.string(), z.unknown()),
  strict: z.boolean().nullish(),
  defer_loading: z.boolean().nullish(),
});

/** The fields `/v1/messages/count_tokens` reads (vLLM's AnthropicCountTokensRequest). */
const conversation = {
  model: z.string().min(1, 'Model is required'),
  messages: z.array(message),
  system: z.union([z.string(), z.array(block)]).nullish(),
  tool_choice: toolChoice.nullish(),
  tools: z.array(tool).nullish(),
  chat_template_kwargs: z.record(z.string(), z.unknown()).nullish(),
};

/** vLLM's check that a `tool` tool_choice names its tool. */
const toolChoiceNamed = (r: { tool_choice?: { type: string; name?: string | null } | null }) => r.tool_choice?.type !== 'tool' || !!r.tool_choice.name;
const TOOL_NAME_REQUIRED = { message: "tool_choice.name is required when type is 'tool'", path: ['tool_choice'] };

export const anthropicCountTokensRequest = z.looseObject(conversation).refine(toolChoiceNamed, TOOL_NAME_REQUIRED);

export const anthropicMessagesRequest = z
  .looseObject({
    ...conversation,
    max_tokens: z
      .number()
      .int()
      .refine((n) => n > 0, 'max_tokens must be positive'),
    stop_sequences: z.array(z.string()).nullish(),
    stream: z.boolean().nullish(),
    temperature: z.number().nullish(),
    top_p: z.number().nullish(),
    top_k: z.number().int().nullish(),
    output_config: z
      .looseObject({
        effort: z.enum(['low', 'medium', 'high', 'xhigh', 'max']).nullish(),
        format: z.looseObject({ type: z.literal('json_schema'), schema: z.record(z.string(), z.unknown()).nullish() }).nullish(),
      })
      .nullish(),
    kv_transfer_params: z.record(z.string(), z.unknown()).nullish(),
  })
  .refine(toolChoiceNamed, TOOL_NAME_REQUIRED);

export type AnthropicCountTokensRequest = z.infer<typeof anthropicCountTokensRequest>;
export type AnthropicMessagesRequest = z.infer<typeof anthropicMessagesRequest>;

/** Claude Code's attribution header: a per-request hash vLLM drops so that it does not defeat prefix caching. */
const BILLING_HEADER = 'x-anthropic-billing-header';

/** A text (or system) message's text: its text blocks joined with "", the billing header left out; null when none. */
function systemText(content: string | Block[]): string | null {
  if (typeof content === 'string') return content.startsWith(BILLING_HEADER) ? null : content;
  const parts = content.filter((b) => b.type === 'text' && b.text && !b.text.startsWith(BILLING_HEADER)).map((b) => b.text as string);
  return parts.length > 0 ? parts.join('') : null;
}

/**
 * The leading system message: the top-level `system` and the conversation's own system messages, merged into one
 * (vLLM merges them when the chat template refuses a system message past the first, as Qwen's do).
 */
function systemMessage(req: AnthropicCountTokensRequest): Json[] {
  const parts: string[] = [];
  if (req.system) {
    const text = systemText(req.system);
    if (text) parts.push(text);
  }
  for (const m of req.messages) {
    const text = m.role === 'system' ? systemText(m.content) : null;
    if (text) parts.push(text);
  }
  return parts.length > 0 ? [{ role: 'system', content: parts.join('') }] : [];
}

function imageUrl(source: Record<string, unknown> | null | undefined): string {
  if (source?.type === 'url') return String(source.url ?? '');
  return `data:${String(source?.media_type ?? 'image/jpeg')};base64,${String(source?.data ?? '')}`;
}

/** A user's tool_result: a tool message (and the images it returned as a user message), placed before the user's own. */
function toolResultMessages(b: Block): Json[] {
  const callId = b.tool_use_id ?? '';
  if (typeof b.content === 'string' || !b.content) return [{ role: 'tool', tool_call_id: callId, content: b.content ?? '' }];
  const texts = b.content.filter((item) => item.type === 'text').map((item) => String(item.text ?? ''));
  const images = b.content.filter((item) => item.type === 'image').map((item) => imageUrl(item.source as Record<string, unknown>));
  const references = b.content
    .filter((item) => item.type === 'tool_reference' && (item.tool_name || item.name))
    .map((item) => ({ type: 'tool_reference', name: item.tool_name || item.name }));
  const out: Json[] = [{ role: 'tool', tool_call_id: callId, content: texts.join('\n') }];
  if (images.length > 0) out.push({ role: 'user', content: images.map((url) => ({ type: 'image_url', image_url: { url } })) });
  if (references.length > 0) out.push({ role: 'tool', tool_call_id: callId, content: references });
  return out;
}

/** A message with block content as chat messages: the tool results it carries first, then the message itself (if any). */
function blockMessages(m: Message & { content: Block[] }): Json[] {
  const before: Json[] = [];
  const parts: Json[] = [];
  const toolCalls: Json[] = [];
  const reasoning: string[] = [];
  for (const b of m.content) {
    if (b.type === 'text' && b.text) parts.push({ type: 'text', text: b.text });
    else if (b.type === 'image' && b.source) parts.push({ type: 'image_url', image_url: { url: imageUrl(b.source) } });
    else if (b.type === 'thinking' && typeof b.thinking === 'string') reasoning.push(b.thinking);
    else if (b.type === 'tool_use')
      toolCalls.push({
        id: b.id || `call_${Math.floor(Date.now() / 1000)}`,
        type: 'function',
        function: { name: b.name ?? '', arguments: pythonJsonDumps(b.input ?? {}, true) },
      });
    else if (b.type === 'tool_result' && m.role === 'user') before.push(...toolResultMessages(b));
    else if (b.type === 'tool_result')
      parts.push({ type: 'text', text: `Tool result: ${typeof b.content === 'string' ? b.content : b.content ? JSON.stringify(b.content) : ''}` });
  }
  const chat: Json = { role: m.role };
  if (reasoning.length > 0) chat.reasoning = reasoning.join('');
  if (toolCalls.length > 0) chat.tool_calls = toolCalls;
  if (parts.length === 1 && parts[0].type === 'text') chat.content = parts[0].text;
  else if (parts.length > 0) chat.content = parts;
  // A user message whose blocks were all tool results is not sent on its own.
  const empty = m.role === 'user' && !('content' in chat);
  return empty ? before : [...before, chat];
}

/** The conversation as chat messages (vLLM's `_convert_system_message` and `_convert_messages`). */
function chatMessages(req: AnthropicCountTokensRequest): Json[] {
  const out = systemMessage(req);
  for (const m of req.messages) {
    if (m.role === 'system') continue;
    if (typeof m.content === 'string') out.push({ role: m.role, content: m.content });
    else out.push(...blockMessages(m as Message & { content: Block[] }));
  }
  return out;
}

/** The chat body's tools and tool_choice (offered tools without a tool_choice: "auto", as vLLM). */
function toolFields(req: AnthropicCountTokensRequest): Json {
  const out: Json = {};
  const choice = req.tool_choice;
  if (choice) {
    out.parallel_tool_calls = !choice.disable_parallel_tool_use;
    const named = { type: 'function', function: { name: choice.name } };
    out.tool_choice = { auto: 'auto', any: 'required', none: 'none', tool: named }[choice.type];
  }
  if (req.tools) {
    out.tools = req.tools.map((t) => ({
      type: 'function',
      function: withoutNulls({
        name: t.name,
        description: t.description,
        parameters: 'type' in t.input_schema ? t.input_schema : { ...t.input_schema, type: 'object' },
        strict: t.strict,
        defer_loading: t.defer_loading,
      }),
    }));
    out.tool_choice ??= 'auto';
  }
  return out;
}

/** The chat completions body whose prompt `/v1/messages/count_tokens` counts. */
export function countTokensChatBody(req: AnthropicCountTokensRequest): Json {
  return withoutNulls({ model: req.model, messages: chatMessages(req), chat_template_kwargs: req.chat_template_kwargs, ...toolFields(req) });
}

/** The chat completions body vLLM runs for a Messages request. */
export function messagesChatBody(req: AnthropicMessagesRequest): Json {
  const format = req.output_config?.format;
  return withoutNulls({
    model: req.model,
    messages: chatMessages(req),
    max_tokens: req.max_tokens,
    max_completion_tokens: req.max_tokens,
    stop: req.stop_sequences,
    temperature: req.temperature,
    top_p: req.top_p,
    top_k: req.top_k,
    kv_transfer_params: req.kv_transfer_params,
    chat_template_kwargs: req.chat_template_kwargs,
    ...(req.stream ? { stream: true, stream_options: { include_usage: true, continuous_usage_stats: true } } : {}),
    response_format: format?.schema ? { type: format.type, json_schema: { schema: format.schema, name: format.type } } : null,
    reasoning_effort: req.output_config?.effort,
    ...toolFields(req),
  });
}
