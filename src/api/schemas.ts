import { z } from 'zod';
import { ApiError, badRequest } from '../wire/errors.js';
import { carriesChatTemplate } from '../tokenizer/index.js';

const int = z.number().int();
/** Token ids, checked in one pass: a per-element schema costs tens of ms on an 8k-token prompt. */
const tokenIds = z.custom<number[]>((v) => Array.isArray(v) && v.every((t) => Number.isInteger(t)), 'expected an array of integer token ids');
const nullish = <T extends z.ZodType>(schema: T) => schema.nullish();
/** pydantic's float: any JSON number, inf included (a JSON 1e999), so that _verify_args' own messages answer it. */
const float = z.custom<number>((v) => typeof v === 'number', 'expected a number');

/**
 * vLLM's NIXL-connector `kv_transfer_params` (vllm-wire-reference.md §7). Unknown keys pass through
 * untouched (other connectors add their own).
 */
const kvTransferParams = z.looseObject({
  do_remote_decode: z.boolean().nullish(),
  do_remote_prefill: z.boolean().nullish(),
  remote_engine_id: z.string().nullish(),
  remote_request_id: z.string().nullish(),
  remote_block_ids: z.array(z.number()).nullish(),
  remote_host: z.string().nullish(),
  remote_port: z.number().int().nullish(),
  tp_size: z.number().int().nullish(),
});
export type KvTransferParams = z.infer<typeof kvTransferParams>;

const streamOptions = z.looseObject({
  include_usage: nullish(z.boolean()),
  continuous_usage_stats: nullish(z.boolean()),
});

/** Fields shared by completions and chat completions (vLLM's sampling and extra params). */
const common = {
  model: nullish(z.string()),
  max_tokens: nullish(int),
  n: nullish(int),
  stream: nullish(z.boolean()),
  stream_options: nullish(streamOptions),
  stop: nullish(z.union([z.string(), z.array(z.string())])),
  stop_token_ids: nullish(z.array(int)),
  include_stop_str_in_output: nullish(z.boolean()),
  ignore_eos: nullish(z.boolean()),
  min_tokens: nullish(int),
  seed: nullish(int),
  temperature: nullish(float),
  top_p: nullish(float),
  top_k: nullish(int),
  min_p: nullish(float),
  presence_penalty: nullish(float),
  frequency_penalty: nullish(float),
  repetition_penalty: nullish(float),
  skip_special_tokens: nullish(z.boolean()),
  return_token_ids: nullish(z.boolean()),
  add_special_tokens: nullish(z.boolean()),
  request_id: nullish(z.string()),
  user: nullish(z.string()),
  kv_transfer_params: nullish(kvTransferParams),
};

export const completionRequest = z.looseObject({
  ...common,
  prompt: z.union([z.string(), tokenIds, z.array(z.string()), z.array(tokenIds)]),
  echo: nullish(z.boolean()),
  suffix: nullish(z.string()),
});

const message = z.looseObject({
  role: z.string(),
  // Parts are read as vLLM reads them (src/tokenizer/chatMessages.ts): strings, typed parts, shorthand media parts.
  content: z.union([z.string(), z.array(z.union([z.string(), z.looseObject({})])), z.null()]).optional(),
});

export const chatRequest = z.looseObject({
  ...common,
  messages: z.array(message),
  max_completion_tokens: nullish(int),
  tools: nullish(z.array(z.looseObject({ type: z.string() }))),
  tool_choice: z.unknown().optional(),
  reasoning_effort: nullish(z.enum(['low', 'medium', 'high'])),
  add_generation_prompt: nullish(z.boolean()),
  continue_final_message: nullish(z.boolean()),
  chat_template: nullish(z.string()),
  chat_template_kwargs: nullish(z.record(z.string(), z.unknown())),
  documents: nullish(z.array(z.unknown())),
  logprobs: nullish(z.boolean()),
});

export type CompletionRequest = z.infer<typeof completionRequest>;
export type ChatRequest = z.infer<typeof chatRequest>;

/** Body validation failure, reported as vLLM reports pydantic's RequestValidationError. */
function validationError(error: z.ZodError): ApiError {
  const issues = error.issues.map((i) => `${i.path.length ? i.path.join('.') : 'body'}: ${i.message}`);
  const n = issues.length;
  return new ApiError(400, `${n} validation error${n === 1 ? '' : 's'}:\n  ${issues.join('\n  ')}`, 'Bad Request');
}

export function parseBody<T extends z.ZodType>(schema: T, body: unknown): z.infer<T> {
  if (body === null || typeof body !== 'object' || Array.isArray(body)) {
    throw new ApiError(400, 'The request body must be a JSON object.', 'Bad Request');
  }
  const result = schema.safeParse(body);
  if (!result.success) throw validationError(result.error);
  return result.data;
}

/** vLLM's bound on `n` (its `VLLM_MAX_N_SEQUENCES` environment variable, same default). */
const MAX_N_SEQUENCES = Number(process.env.VLLM_MAX_N_SEQUENCES ?? 16384);
/** vLLM's `_SAMPLING_EPS`: a temperature below it is greedy sampling. */
const SAMPLING_EPS = 1e-5;

/** A float as Python's `str` prints it in vLLM's messages (pydantic turns a JSON `2` into `2.0`). */
function pyFloat(x: number): string {
  if (!Number.isFinite(x)) return Number.isNaN(x) ? 'nan' : x > 0 ? 'inf' : '-inf';
  return Number.isInteger(x) && Math.abs(x) < 1e16 ? x.toFixed(1) : String(x);
}

/** The checks of vLLM's request models (pydantic validators), made before the model and the prompt are looked at. */
export function checkRequestFields(req: CompletionRequest | ChatRequest): void {
  // vLLM's validator tests `data.get("stream_options")`: an empty object is falsy in Python and passes.
  if (req.stream_options && Object.keys(req.stream_options).length > 0 && req.stream !== true)
    throw badRequest('Stream options can only be defined when `stream=True`.', 'stream_options');
  if ('suffix' in req && req.suffix != null) throw badRequest('suffix is not currently supported', 'suffix');
  if ('continue_final_message' in req && req.continue_final_message && req.add_generation_prompt) {
    throw badRequest('Cannot set both `continue_final_message` and `add_generation_prompt` to True.');
  }
}

/**
 * The value checks of `SamplingParams._verify_args` (messages as vLLM's sampling_params.py words them), which
 * vLLM makes once the prompt is rendered and its length checked (`to_sampling_params`).
 */
export function checkSampling(req: CompletionRequest | ChatRequest): void {
  const n = req.n ?? 1;
  if (n < 1) throw badRequest(`n must be at least 1, got ${n}.`, 'n');
  if (n > MAX_N_SEQUENCES)
    throw badRequest(`n must be at most ${MAX_N_SEQUENCES}, got ${n}. To increase this limit, set the VLLM_MAX_N_SEQUENCES environment variable.`, 'n');
  for (const penalty of ['presence_penalty', 'frequency_penalty'] as const) {
    const value = req[penalty];
    if (value != null && !(value >= -2 && value <= 2)) throw badRequest(`${penalty} must be in [-2, 2], got ${pyFloat(value)}.`, penalty);
  }
  const repetition = req.repetition_penalty;
  if (repetition != null && !Number.isFinite(repetition))
    throw badRequest(`repetition_penalty must be a finite number, got ${pyFloat(repetition)}.`, 'repetition_penalty');
  if (repetition != null && repetition <= 0)
    throw badRequest(`repetition_penalty must be greater than zero, got ${pyFloat(repetition)}.`, 'repetition_penalty');
  const temperature = req.temperature;
  if (temperature != null && !Number.isFinite(temperature))
    throw badRequest(`temperature must be a finite number, got ${pyFloat(temperature)}.`, 'temperature');
  if (temperature != null && temperature < 0) throw badRequest(`temperature must be non-negative, got ${pyFloat(temperature)}.`, 'temperature');
  if (req.top_p != null && !(req.top_p > 0 && req.top_p <= 1)) throw badRequest(`top_p must be in (0, 1], got ${pyFloat(req.top_p)}.`, 'top_p');
  // -1 is still accepted as "disabled"; 0 is the documented spelling.
  if (req.top_k != null && req.top_k < -1) throw badRequest(`top_k must be 0 (disable), or at least 1, got ${req.top_k}.`, 'top_k');
  if (req.min_p != null && !(req.min_p >= 0 && req.min_p <= 1)) throw badRequest(`min_p must be in [0, 1], got ${pyFloat(req.min_p)}.`, 'min_p');
  const maxTokens: number | null | undefined =
    'max_completion_tokens' in req && typeof req.max_completion_tokens === 'number' ? req.max_completion_tokens : req.max_tokens;
  if (maxTokens !== undefined && maxTokens !== null && maxTokens < 1 && !('echo' in req && req.echo)) {
    throw badRequest(`max_tokens must be at least 1, got ${maxTokens}.`, 'max_tokens');
  }
  if (req.min_tokens != null && req.min_tokens < 0) throw badRequest(`min_tokens must be greater than or equal to 0, got ${req.min_tokens}.`, 'min_tokens');
  if (req.min_tokens != null && maxTokens != null && req.min_tokens > maxTokens) {
    throw badRequest(`min_tokens must be less than or equal to max_tokens=${maxTokens}, got ${req.min_tokens}.`, 'min_tokens');
  }
  if (req.seed != null && Math.abs(req.seed) > Number.MAX_SAFE_INTEGER) throw badRequest('seed is out of range.', 'seed');
  if (req.stop_token_ids?.some((id) => id < 0)) throw badRequest('stop_token_ids must be non-negative.', 'stop_token_ids');
  const stops = req.stop == null ? [] : typeof req.stop === 'string' ? [req.stop] : req.stop;
  if (stops.some((s) => s === '')) throw badRequest('stop cannot contain an empty string.', 'stop');
  // Zero temperature is greedy sampling: every choice would be the same.
  if (temperature != null && temperature < SAMPLING_EPS && n > 1) throw badRequest(`n must be 1 when using greedy sampling, got ${n}.`, 'n');
}

/** vLLM's `_validate_chat_template`: a template in the request (or in its kwargs) needs `--trust-request-chat-template`. */
export function checkRequestChatTemplate(
  req: { chat_template?: string | null; chat_template_kwargs?: Record<string, unknown> | null },
  trusted: boolean,
): void {
  if (trusted) return;
  if (carriesChatTemplate(req)) {
    throw badRequest('Chat template is passed with request, but --trust-request-chat-template is not set. Refused request with untrusted chat template.');
  }
}

/** `POST /tokenize`: vLLM's completion form (`prompt`) or chat form (`messages`). */
export const tokenizeRequest = z.looseObject({
  model: nullish(z.string()),
  prompt: z.string().optional(),
  messages: z.array(message).optional(),
  add_special_tokens: nullish(z.boolean()),
  add_generation_prompt: nullish(z.boolean()),
  continue_final_message: nullish(z.boolean()),
  return_token_strs: nullish(z.boolean()),
  chat_template: nullish(z.string()),
  chat_template_kwargs: nullish(z.record(z.string(), z.unknown())),
  tools: nullish(z.array(z.looseObject({ type: z.string() }))),
});

/** `POST /detokenize`. */
export const detokenizeRequest = z.looseObject({ model: nullish(z.string()), tokens: tokenIds });

/** An object's entries whose value is set (a translated request leaves the rest to the target's own defaults). */
export function withoutNulls(entries: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(entries).filter(([, v]) => v !== undefined && v !== null));
}
