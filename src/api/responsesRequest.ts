import { z } from 'zod';
import { badRequest } from '../wire/errors.js';
import { parseBody, withoutNulls } from './schemas.js';

/**
 * OpenAI's Responses request (vLLM's `ResponsesRequest`) translated into the chat-completions body that the chat
 * path runs: vLLM builds the same chat messages (`construct_input_messages`) and renders them with the chat
 * template. Pure: the previous turn, when there is one, is handed in.
 */

type Json = Record<string, unknown>;

const nullish = <T extends z.ZodType>(schema: T) => schema.nullish();
const num = z.number();
const int = z.number().int();

const functionTool = z.looseObject({
  type: z.string(),
  name: z.string().optional(),
  description: nullish(z.string()),
  parameters: nullish(z.record(z.string(), z.unknown())),
  strict: nullish(z.boolean()),
});

const namedToolChoice = z.looseObject({ type: z.literal('function'), name: z.string() });

/** OpenAI's `ResponseIncludable` values; vLLM acts on the logprobs one only. */
const INCLUDABLE = [
  'file_search_call.results',
  'web_search_call.results',
  'web_search_call.action.sources',
  'message.input_image.image_url',
  'computer_call_output.output.image_url',
  'code_interpreter_call.outputs',
  'reasoning.encrypted_content',
  'message.output_text.logprobs',
] as const;

export const responsesRequest = z.looseObject({
  input: z.union([z.string(), z.array(z.looseObject({}))]),
  include: nullish(z.array(z.enum(INCLUDABLE))),
  top_logprobs: nullish(int.min(0)),
  instructions: nullish(z.string()),
  model: nullish(z.string()),
  max_output_tokens: nullish(int.min(1)),
  previous_response_id: nullish(z.string()),
  previous_input_messages: nullish(z.array(z.unknown())),
  prompt: nullish(z.unknown()),
  background: nullish(z.boolean()),
  store: nullish(z.boolean()),
  stream: nullish(z.boolean()),
  temperature: nullish(num),
  top_p: nullish(num),
  top_k: nullish(int),
  presence_penalty: nullish(num.min(-2).max(2)),
  frequency_penalty: nullish(num.min(-2).max(2)),
  seed: nullish(int),
  stop: nullish(z.union([z.string(), z.array(z.string())])),
  reasoning: nullish(z.looseObject({ effort: nullish(z.enum(['none', 'minimal', 'low', 'medium', 'high', 'xhigh'])) })),
  include_reasoning: z.boolean().optional(),
  text: nullish(z.looseObject({ format: nullish(z.looseObject({ type: z.enum(['text', 'json_object', 'json_schema']) })) })),
  tools: nullish(z.array(functionTool)),
  tool_choice: z.union([z.enum(['auto', 'none', 'required']), namedToolChoice]).optional(),
  parallel_tool_calls: nullish(z.boolean()),
  max_tool_calls: nullish(int),
  metadata: nullish(z.record(z.string(), z.unknown())),
  user: nullish(z.string()),
  service_tier: nullish(z.enum(['auto', 'default', 'flex', 'scale', 'priority'])),
  truncation: nullish(z.enum(['auto', 'disabled'])),
  request_id: z.string().optional(),
  chat_template_kwargs: nullish(z.record(z.string(), z.unknown())),
});

export type ResponsesRequest = z.infer<typeof responsesRequest>;
export type ToolChoice = NonNullable<ResponsesRequest['tool_choice']>;

/** What a stored response gives the next turn (`previous_response_id`): its input messages and its answer's texts. */
export interface PreviousTurn {
  messages: Json[];
  outputTexts: string[];
}

/** The request checked and translated: the chat body to run, the messages to store, the tool choice to echo. */
export interface TranslatedRequest {
  req: ResponsesRequest;
  chat: Json;
  messages: Json[];
  toolChoice: ToolChoice;
}

/** vLLM's `check_tool_usage`: without tools, `auto` (the default) and `none` become `none`; the others are refused. */
function checkToolChoice(req: ResponsesRequest): ToolChoice {
  const choice = req.tool_choice ?? 'auto';
  const names = (req.tools ?? []).map((t) => t.name);
  if (typeof choice === 'object') {
    if (!names.includes(choice.name)) throw badRequest("Tool choice 'function' not found in 'tools' parameter.", 'tool_choice');
    return choice;
  }
  if (names.length > 0) return choice;
  if (choice === 'required') throw badRequest("Tool choice 'required' must be specified with 'tools' parameter.", 'tool_choice');
  return 'none';
}

/** The request checks vLLM makes before it builds the prompt (`_validate_create_responses_input` and the protocol's). */
function checkRequest(req: ResponsesRequest, storeEnabled: boolean): void {
  if (req.prompt !== undefined && req.prompt !== null) throw badRequest('prompt template is not supported', 'prompt');
  if (req.previous_input_messages && req.previous_response_id)
    throw badRequest('Only one of `previous_input_messages` and `previous_response_id` can be set.', 'previous_response_id');
  if (req.background && req.store === false) throw badRequest('background can only be used when `store` is true', 'background');
  if (req.background && !storeEnabled)
    throw badRequest(
      'This vLLM engine does not support `store=True` and therefore does not support the background mode. To enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server.',
      'background',
    );
  if (req.background) throw badRequest('background responses are not supported by mocker.', 'background');
  for (const tool of req.tools ?? [])
    if (tool.type !== 'function' || typeof tool.name !== 'string')
      throw badRequest(`Tool type ${JSON.stringify(tool.type)} is not supported by mocker: only function tools are.`, 'tools');
}

/** The text of an assistant message item: a string, or its first text part. */
function assistantText(content: unknown): string | null {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return null;
  const part = content.find((p) => typeof p === 'object' && p !== null && typeof (p as Json).text === 'string') as Json | undefined;
  return part ? (part.text as string) : null;
}

/** A reasoning item's text: its reasoning_text parts, else its summary. */
function reasoningText(item: Json): string {
  if (typeof item.encrypted_content === 'string') throw badRequest('Encrypted content is not supported.');
  const parts = (Array.isArray(item.content) && item.content.length > 0 ? item.content : Array.isArray(item.summary) ? item.summary : []) as Json[];
  return parts.map((p) => (typeof p.text === 'string' ? p.text : '')).join('');
}

/** One input item appended to `messages` as vLLM's `_construct_message_from_response_item` (and its merges) does. */
function appendItem(messages: Json[], item: Json): void {
  const last = messages.at(-1);
  const lastAssistant = last?.role === 'assistant' ? last : undefined;
  if (item.type === 'function_call') {
    const call = { id: item.call_id, type: 'function', function: { name: item.name, arguments: item.arguments } };
    if (lastAssistant) lastAssistant.tool_calls = [...((lastAssistant.tool_calls as unknown[]) ?? []), call];
    else messages.push({ role: 'assistant', content: null, tool_calls: [call] });
  } else if (item.type === 'function_call_output') {
    messages.push({ role: 'tool', content: item.output, tool_call_id: item.call_id });
  } else if (item.type === 'reasoning') {
    const reasoning = reasoningText(item);
    if (lastAssistant && lastAssistant.reasoning === undefined) lastAssistant.reasoning = reasoning;
    else messages.push({ role: 'assistant', reasoning });
  } else if (item.role === 'assistant') {
    const content = assistantText(item.content);
    if (lastAssistant && (lastAssistant.content === null || lastAssistant.content === undefined)) lastAssistant.content = content;
    else messages.push({ role: 'assistant', content });
  } else if (typeof item.role === 'string') {
    const { type: _type, ...message } = item;
    messages.push(message);
  } else {
    // vLLM hands such an item to the chat template as a message without a role; it resolves no stored items.
    throw badRequest(
      `Input items of type ${JSON.stringify(item.type)} are not supported: send the items themselves (with the AI SDK, providerOptions.openai.store: false).`,
      'input',
    );
  }
}

/** Whether the input ends with an unfinished assistant turn, which the model continues (vLLM: `continue_final_message`). */
function continuesFinal(input: ResponsesRequest['input']): boolean {
  if (typeof input === 'string') return false;
  const last = input.at(-1);
  const unfinished = last?.status === 'in_progress' || last?.status === 'incomplete';
  return unfinished && (last?.type === 'reasoning' || last?.role === 'assistant');
}

/** vLLM's `construct_input_messages`: instructions, the previous turn (minus its system messages), the input. */
function inputMessages(req: ResponsesRequest, previous: PreviousTurn | null): Json[] {
  const messages: Json[] = req.instructions ? [{ role: 'system', content: req.instructions }] : [];
  if (previous) {
    messages.push(...previous.messages.filter((m) => m.role !== 'system').map((m) => structuredClone(m)));
    messages.push(...previous.outputTexts.map((content) => ({ role: 'assistant', content })));
  }
  if (typeof req.input === 'string') messages.push({ role: 'user', content: req.input });
  else for (const item of req.input) appendItem(messages, structuredClone(item));
  return messages;
}

/** `text.format` as chat's `response_format`. */
function responseFormat(req: ResponsesRequest): Json | null {
  const format = req.text?.format;
  if (!format || format.type === 'text') return null;
  if (format.type === 'json_object') return { type: 'json_object' };
  const { type: _type, ...schema } = format;
  return { type: 'json_schema', json_schema: schema };
}

/** The chat template's kwargs: the request's, with `reasoning.effort` as `reasoning_effort` and `enable_thinking`. */
function templateKwargs(req: ResponsesRequest): Json | null {
  const effort = req.reasoning?.effort;
  if (effort === undefined || effort === null) return req.chat_template_kwargs ?? null;
  return { reasoning_effort: effort, enable_thinking: effort !== 'none', ...req.chat_template_kwargs };
}

/**
 * Parses and checks a Responses body and builds the chat-completions body vLLM's Responses path runs;
 * `previousTurn` looks up `previous_response_id` (and throws when it is not known).
 */
export function translateResponsesRequest(body: unknown, previousTurn: (id: string) => PreviousTurn, storeEnabled: boolean): TranslatedRequest {
  const req = parseBody(responsesRequest, body);
  checkRequest(req, storeEnabled);
  const toolChoice = checkToolChoice(req);
  // A client may hand the previous turn's messages in itself (vLLM's `previous_input_messages`), in place of an id.
  const given = req.previous_input_messages ? { messages: req.previous_input_messages as Json[], outputTexts: [] } : null;
  const messages = inputMessages(req, req.previous_response_id ? previousTurn(req.previous_response_id) : given);
  const tools = (req.tools ?? []).map(({ type, name, description, parameters, strict }) => ({
    type,
    function: withoutNulls({ name, description, parameters, strict }),
  }));
  const continues = continuesFinal(req.input);
  const effort = req.reasoning?.effort;
  const chat = withoutNulls({
    model: req.model,
    messages,
    ...(tools.length > 0
      ? { tools, tool_choice: typeof toolChoice === 'object' ? { type: 'function', function: { name: toolChoice.name } } : toolChoice }
      : {}),
    max_tokens: req.max_output_tokens,
    temperature: req.temperature,
    top_p: req.top_p,
    top_k: req.top_k,
    presence_penalty: req.presence_penalty,
    frequency_penalty: req.frequency_penalty,
    seed: req.seed,
    stop: req.stop,
    // The simulated thinking span's budget reads chat's effort (AIPerf's three levels).
    // Log-probabilities are asked as chat asks them (and refused there: random answers have none to give).
    logprobs: req.include?.includes('message.output_text.logprobs') ? true : undefined,
    top_logprobs: req.include?.includes('message.output_text.logprobs') ? req.top_logprobs : undefined,
    reasoning_effort: effort === 'low' || effort === 'medium' || effort === 'high' ? effort : undefined,
    chat_template_kwargs: templateKwargs(req),
    response_format: responseFormat(req),
    ...(continues ? { continue_final_message: true, add_generation_prompt: false } : {}),
  });
  return { req, chat, messages, toolChoice };
}
