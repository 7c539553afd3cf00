/**
 * A chat request's messages as vLLM's chat preprocessing hands them to the template (`chat_utils.py`
 * `parse_chat_messages`, "string" content format): content null → "", a list of parts → its texts joined by
 * newlines; each message keeps only the fields vLLM passes on; tool-call arguments become objects.
 */

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

/** A content part's text; undefined for a text part vLLM skips. */
function partText(part: unknown, model: string): string | undefined {
  if (typeof part === 'string') return part;
  if (!part || typeof part !== 'object' || Array.isArray(part)) throw new ChatMessageError('Invalid content part: expected a string or an object with a `type` field.');
  const fields = part as Json;
  let type = fields.type;
  if (type === undefined || type === null) {
    type = MEDIA_SHORTHANDS.find((key) => key in fields);
    if (type === undefined) throw new ChatMessageError("Missing 'type' field in multimodal part.");
  }
  if (typeof type !== 'string') throw new ChatMessageError("Invalid 'type' field in multimodal part.");
  if (MEDIA_PARTS.includes(type)) {
    throw new ChatMessageError(`Content part type '${type}' is not supported: the model ${model} takes text only (mocker serves no image, audio or video input).`);
  }
  const field = TEXT_PARTS[type];
  if (field === undefined) {
    const supported = [...Object.keys(TEXT_PARTS), ...MEDIA_PARTS].sort().join(', ');
    throw new ChatMessageError(`Unsupported chat content part type: '${type}'. Supported types: ${supported}.`);
  }
  const text = fields[field];
  if (typeof text === 'string') return text;
  if ((text === undefined || text === null) && SKIPPED_WHEN_EMPTY.has(type)) return undefined;
  throw new ChatMessageError(`Content part of type '${type}' has no string '${field}'.`);
}

/** vLLM's "string" format: null is no parts, a string one text part; the texts joined by newlines. */
function contentText(content: unknown, model: string): string {
  if (content === undefined || content === null) return '';
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) throw new ChatMessageError('Message content must be a string, a list of content parts, or null.');
  return content
    .map((part) => partText(part, model))
    .filter((text) => text !== undefined)
    .join('\n');
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
function conversationMessage(raw: unknown, model: string): Json {
  if (!raw || typeof raw !== 'object' || Array.isArray(raw)) throw new ChatMessageError('Each message must be an object with a `role`.');
  const message = raw as Json;
  const role = message.role;
  const out: Json = { role, content: contentText(message.content, model) };
  if (role === 'assistant') {
    const calls = message.tool_calls;
    if (calls !== undefined && calls !== null && !Array.isArray(calls)) throw new ChatMessageError('An assistant message\'s `tool_calls` must be a list.');
    // An empty list is dropped: templates keep to their plain assistant path.
    if (Array.isArray(calls) && calls.length > 0) out.tool_calls = calls.map(templateToolCall);
    // vLLM 0.11 read `reasoning_content`; later releases read `reasoning` and set both for the template.
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

/** The request's messages as vLLM passes them to the chat template (throws `ChatMessageError` for one it refuses). */
export function conversationMessages(messages: readonly unknown[], model: string): Json[] {
  return messages.map((message) => conversationMessage(message, model));
}
