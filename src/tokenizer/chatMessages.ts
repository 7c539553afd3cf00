/**
 * A chat request's messages as vLLM's chat preprocessing hands them to the template (`chat_utils.py`
 * `parse_chat_messages`): content null is no parts, a string one text part; in the "string" content format the
 * texts are joined by newlines, in the "openai" one (a template that loops over content, contentFormat.ts) they
 * stay a list of `{"type":"text","text":…}`; each message keeps only the fields vLLM passes on; tool-call
 * arguments become objects.
 */
import type { ContentFormat } from './contentFormat.js';

type Json = Record<string, unknown>;

/** A message vLLM would refuse before templating (answered as a 400 with this message). */
export class ChatMessageError extends Error {}

/** Part types whose value is text, and the field that holds it. */
const TEXT_PARTS: Record<string, string> = {
  text: 'text',
  input_text: 'text',
  output_text: 'text',
  refusal: 'refusal',
  thinking: 'thinking',
  // A deferred tool's name, expanded by the template (vLLM passes it through as text in the string format).
  tool_reference: 'name',
};
/** Text parts vLLM skips (with a warning) when their text is missing. */
const SKIPPED_WHEN_EMPTY = new Set(['text', 'refusal']);
/** Media part types vLLM takes from a multimodal model; mocker serves text-only models. */
const MEDIA_PARTS = ['image_url', 'input_image', 'image_pil', 'image_embeds', 'audio_url', 'input_audio', 'audio_embeds', 'video_url', 'prompt_embeds'];
/** A part without `type` is a media part when it carries one of these fields (vLLM's shorthand forms). */
const MEDIA_SHORTHANDS = ['image_url', 'image_pil', 'image_embeds', 'audio_embeds', 'prompt_embeds', 'audio_url', 'input_audio', 'video_url'];

/** A content part as the template sees it in the "openai" format; undefined for a text part vLLM skips. */
function templatePart(part: unknown, model: string): Json | undefined {
  if (typeof part === 'string') return { type: 'text', text: part };
  if (!part || typeof part !== 'object' || Array.isArray(part))
    throw new ChatMessageError('Invalid content part: expected a string or an object with a `type` field.');
  const fields = part as Json;
  let type = fields.type;
  if (type === undefined || type === null) {
    type = MEDIA_SHORTHANDS.find((key) => key in fields);
    if (type === undefined) throw new ChatMessageError("Missing 'type' field in multimodal part.");
  }
  if (typeof type !== 'string') throw new ChatMessageError("Invalid 'type' field in multimodal part.");
  if (MEDIA_PARTS.includes(type)) {
    // vLLM 0.9–0.11 words it "<model> is not a multimodal model None"; the part's type is named here too.
    throw new ChatMessageError(`${model} is not a multimodal model: content part type '${type}' is not supported (mocker serves text-only models).`);
  }
  const field = TEXT_PARTS[type];
  if (field === undefined) {
    const supported = [...Object.keys(TEXT_PARTS), ...MEDIA_PARTS].sort().join(', ');
    throw new ChatMessageError(`Unsupported chat content part type: '${type}'. Supported types: ${supported}.`);
  }
  const text = fields[field];
  if ((text === undefined || text === null) && SKIPPED_WHEN_EMPTY.has(type)) return undefined;
  if (typeof text !== 'string') throw new ChatMessageError(`Content part of type '${type}' has no string '${field}'.`);
  return type === 'tool_reference' ? { type, name: text } : { type: 'text', text };
}

/** The part's text in the "string" format (a tool reference's is its name). */
const partText = (part: Json): string => (part.type === 'tool_reference' ? part.name : part.text) as string;

function templateContent(content: unknown, role: unknown, format: ContentFormat, model: string): string | Json[] {
  if (content !== undefined && content !== null && typeof content !== 'string' && !Array.isArray(content)) {
    throw new ChatMessageError('Message content must be a string, a list of content parts, or null.');
  }
  let parts: Json[] = [];
  if (typeof content === 'string') parts = [{ type: 'text', text: content }];
  else if (Array.isArray(content)) parts = content.map((part) => templatePart(part, model)).filter((part) => part !== undefined);
  // A tool result of text parts only is one string even for a template of parts (clients send tool results as parts).
  if (format === 'string' || (role === 'tool' && parts.every((part) => part.type === 'text'))) return parts.map(partText).join('\n');
  return parts;
}

/**
 * Arguments as tool-use templates iterate them: a JSON string parsed (one that is not JSON becomes `{}`), an
 * object or array kept, anything else `{}`.
 */
function templateArguments(args: unknown): unknown {
  if (typeof args === 'string') {
    try {
      return JSON.parse(args);
    } catch {
      return {};
    }
  }
  return args !== null && typeof args === 'object' ? args : {};
}

function templateToolCall(call: unknown): unknown {
  if (!call || typeof call !== 'object') return call;
  const fn = (call as Json).function;
  if (!fn || typeof fn !== 'object') return call;
  return { ...(call as Json), function: { ...(fn as Json), arguments: templateArguments((fn as Json).arguments) } };
}

/** One request message as the template sees it in vLLM. `model` names the model in the refusal of media parts. */
function conversationMessage(raw: unknown, format: ContentFormat, model: string): Json {
  if (!raw || typeof raw !== 'object' || Array.isArray(raw)) throw new ChatMessageError('Each message must be an object with a `role`.');
  const message = raw as Json;
  const role = message.role;
  const out: Json = { role, content: templateContent(message.content, role, format, model) };
  if (role === 'assistant') {
    const calls = message.tool_calls;
    if (calls !== undefined && calls !== null && !Array.isArray(calls)) throw new ChatMessageError("An assistant message's `tool_calls` must be a list.");
    // An empty list is dropped: templates keep to their plain assistant path.
    if (Array.isArray(calls) && calls.length > 0) out.tool_calls = calls.map(templateToolCall);
    // An incoming `reasoning_content` is read as `reasoning` (vllm-wire-reference §9); templates get both names.
    const reasoning = message.reasoning ?? message.reasoning_content;
    if (reasoning !== undefined && reasoning !== null) {
      out.reasoning = reasoning;
      out.reasoning_content = reasoning;
    }
  } else if (role === 'tool' && 'tool_call_id' in message) {
    out.tool_call_id = message.tool_call_id;
  }
  if (typeof message.name === 'string') out.name = message.name;
  if (typeof message.task === 'string') out.task = message.task;
  if (role === 'developer') out.tools = message.tools ?? null;
  return out;
}

/** The request's messages as vLLM passes them to a template of `format` (throws `ChatMessageError` for one it refuses). */
export function conversationMessages(messages: readonly unknown[], format: ContentFormat, model: string): Json[] {
  return messages.map((message) => conversationMessage(message, format, model));
}
