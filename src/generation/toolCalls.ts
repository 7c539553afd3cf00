import { badRequest } from '../wire/errors.js';
import type { ModelTokenizer } from '../tokenizer/index.js';
import { sampleJsonText, SampleTooLarge, UnsupportedSchema } from './jsonSchemaSample.js';
import type { PlannedChunk } from './chunk.js';

/** The tools a chat request offers and how it lets the model use them. */
export interface ToolOffer {
  tools: { name: string; parameters: unknown }[];
  /** `auto` calls at `--tool-call-rate`; `required` and a named tool always call. */
  choice: 'auto' | 'required' | { name: string };
}

/** `--tool-call-rate` when not given: a coin flip, so an agent loop against mocker both calls tools and ends. */
export const DEFAULT_TOOL_CALL_RATE = 0.5;

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v);

/**
 * The request's tool offer, checked as vLLM's `ChatCompletionRequest` checks it; null when no call may be made
 * (no tools, or `tool_choice: "none"`). `tool_choice` defaults to `auto` when tools are given.
 */
export function toolOffer(req: { tools?: unknown[] | null; tool_choice?: unknown }): ToolOffer | null {
  const choice = req.tool_choice ?? null;
  const tools = req.tools ?? null;
  if (choice !== null && choice !== 'none' && tools === null) throw badRequest('When using `tool_choice`, `tools` must be set.', 'tool_choice');
  if (tools === null || tools.length === 0 || choice === 'none') return null;
  const functions = tools.map((tool, i) => {
    const fn = isObject(tool) && tool.type === 'function' && isObject(tool.function) ? tool.function : null;
    if (!fn || typeof fn.name !== 'string') throw badRequest(`tools[${i}] must be {"type":"function","function":{"name":…,"parameters":…}}`, 'tools');
    return { name: fn.name, parameters: fn.parameters ?? { type: 'object', properties: {} } };
  });
  if (choice === null || choice === 'auto' || choice === 'required') return { tools: functions, choice: choice ?? 'auto' };
  const named =
    isObject(choice) && choice.type === 'function' && isObject(choice.function) && typeof choice.function.name === 'string' ? choice.function.name : null;
  if (named === null)
    throw badRequest(
      `Invalid value for \`tool_choice\`: ${JSON.stringify(choice)} (expected "none", "auto", "required" or {"type":"function","function":{"name":…}}).`,
      'tool_choice',
    );
  if (!functions.some((f) => f.name === named))
    throw badRequest('The tool specified in `tool_choice` does not match any of the specified `tools`', 'tool_choice');
  return { tools: functions, choice: { name: named } };
}

/** A tool call the model emits: its tokens, and the chunks vLLM's Hermes parser turns them into. */
export interface PlannedToolCall {
  tokenIds: number[];
  /** Chunk ends count from the call's first token. */
  chunks: PlannedChunk[];
  finishReason: 'tool_calls' | 'stop';
}

/**
 * Characters a drawn output (a call's arguments, a structured answer) may take per token it has room for: sampled
 * words and JSON punctuation take 2 to 4 characters a token, so a sample stopped past this many would not have
 * fitted anyway.
 */
const OUTPUT_CHARS_PER_TOKEN = 8;
/** And at most this many in all, whatever the room (256 KiB of arguments is no real call; it bounds the work). */
const MAX_OUTPUT_CHARS = 1 << 18;

/** The characters a drawn output of at most `maxTokens` tokens may take: what bounds the work of drawing it. */
export const outputCharBudget = (maxTokens: number): number => Math.max(0, Math.min(maxTokens * OUTPUT_CHARS_PER_TOKEN, MAX_OUTPUT_CHARS));

/**
 * Whether this answer is a tool call (`auto`: with probability `rate`), and which call: a tool of the offer
 * with arguments drawn from its `parameters` schema, written as Qwen3 / Hermes models write it
 * (`<tool_call>\n{"name": …, "arguments": …}\n</tool_call>`) and tokenized. `rand` is the answer's seeded stream.
 *
 * Null as well when the call would take more than `maxTokens` tokens: the caller then answers as a model that ran
 * out of tokens (finish_reason "length"). A schema whose values are huge (`"minLength": 1e9`) ends there, its
 * sample stopped at a bound derived from `maxTokens`, rather than in a 400: vLLM accepts such a schema and its model
 * writes until max_tokens, so a request vLLM serves is served, and no schema costs more than the bound.
 */
export async function planToolCall(
  offer: ToolOffer,
  rate: number,
  rand: () => number,
  tokenizer: ModelTokenizer,
  maxTokens: number,
): Promise<PlannedToolCall | null> {
  if (offer.choice === 'auto' && !(rand() < rate)) return null;
  const choice = offer.choice;
  const tool = typeof choice === 'object' ? offer.tools.find((t) => t.name === choice.name)! : offer.tools[Math.floor(rand() * offer.tools.length)];
  let args: string;
  const sample = (schema: unknown) => sampleJsonText(schema, rand, outputCharBudget(maxTokens));
  try {
    args = sample(tool.parameters);
  } catch (err) {
    if (err instanceof SampleTooLarge) return null;
    if (!(err instanceof UnsupportedSchema)) throw err;
    // `auto`: vLLM's model writes its call unconstrained and never reads the schema; only a required or named
    // call is guided by it (and refused when it cannot be).
    if (choice !== 'auto') throw badRequest(`The parameters of tool ${JSON.stringify(tool.name)}: ${err.message}`, 'tools');
    args = sample({ type: 'object' });
  }
  const head = `<tool_call>\n{"name": ${JSON.stringify(tool.name)}, "arguments": `;
  const text = `${head}${args}}\n</tool_call>`;
  const tokenIds = await tokenizer.encode(text, false);
  if (tokenIds.length > maxTokens) return null;
  const id = `chatcmpl-tool-${Array.from({ length: 32 }, () => Math.floor(rand() * 16).toString(16)).join('')}`;
  // Where each token's text ends in `text`.
  const ends: number[] = [];
  const stream = tokenizer.decodeStream(false);
  let at = 0;
  for (const token of tokenIds) {
    at += ((await stream.step(token)) ?? '').length;
    ends.push(at);
  }
  const argsFrom = head.length;
  const argsTo = argsFrom + args.length;
  const fragment = (from: number, to: number) => text.slice(Math.max(from, argsFrom), Math.min(to, argsTo));
  // vLLM streams the call's id, type and name first, then its arguments as they come; `content` is "" for a named call.
  const first = ends.findIndex((end) => end >= argsFrom) + 1;
  const named = typeof choice === 'object' ? { content: '' } : {};
  const chunks: PlannedChunk[] = [
    {
      end: first,
      delta: { ...named, tool_calls: [{ index: 0, id, type: 'function', function: { name: tool.name, arguments: fragment(0, ends[first - 1]) } }] },
    },
  ];
  for (let i = first; i < tokenIds.length; i++) {
    const piece = fragment(ends[i - 1], ends[i]);
    if (piece === '') chunks[chunks.length - 1].end = i + 1;
    else chunks.push({ end: i + 1, delta: { tool_calls: [{ index: 0, function: { arguments: piece } }] } });
  }
  return { tokenIds, chunks, finishReason: typeof choice === 'object' ? 'stop' : 'tool_calls' };
}
