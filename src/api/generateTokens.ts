import { z } from 'zod';
import { badRequest } from '../wire/errors.js';
import { parseBody } from './schemas.js';

/**
 * vLLM's token-in/token-out `POST /inference/v1/generate` (`scale_out/token_in_token_out`): the request's
 * `token_ids` are the prompt as is (no template, no tokenizer) and its `sampling_params` vLLM's SamplingParams;
 * the answer carries the engine's output ids and no text. Field order and nulls as vLLM's pydantic models dump them.
 */

type Json = Record<string, unknown>;

/** The SamplingParams keys that decide the output, carried to the completions request under the same names. */
const SAMPLING_KEYS = [
  'n',
  'temperature',
  'top_p',
  'top_k',
  'min_p',
  'seed',
  'stop',
  'stop_token_ids',
  'include_stop_str_in_output',
  'ignore_eos',
  'max_tokens',
  'min_tokens',
  'presence_penalty',
  'frequency_penalty',
  'repetition_penalty',
  'skip_special_tokens',
  'logprobs',
  'prompt_logprobs',
] as const;

const generateRequest = z.looseObject({
  request_id: z.string().nullish(),
  token_ids: z
    .array(z.number().int())
    .min(1, 'List should have at least 1 item after validation, not 0')
    // pydantic reports a field validator's ValueError this way.
    .refine((ids) => ids.every((t) => t >= 0), 'Value error, token_ids must not contain negative values'),
  sampling_params: z.looseObject({}),
  model: z.string().nullish(),
  stream: z.boolean().nullish(),
  stream_options: z.looseObject({ include_usage: z.boolean().nullish(), continuous_usage_stats: z.boolean().nullish() }).nullish(),
  kv_transfer_params: z.looseObject({}).nullish(),
});

export interface GenerateTokensRequest {
  /** The equivalent `/v1/completions` body: the token ids as its prompt, the sampling params as its fields. */
  completion: Json;
  stream: boolean;
  includeUsage: boolean;
  continuousUsage: boolean;
}

/**
 * Checks a generate body as vLLM's GenerateRequest does and translates it. `maxModelLen`: with no
 * `max_tokens`, vLLM lets the output fill the context (not SamplingParams' 16).
 */
export function generateTokensRequest(body: unknown, maxModelLen: number): GenerateTokensRequest {
  const req = parseBody(generateRequest, body);
  const sampling = req.sampling_params;
  if (typeof sampling.n === 'number' && sampling.n > 1)
    throw badRequest('mocker answers /inference/v1/generate with one sequence: n > 1 is not supported.', 'n');
  const completion: Json = { prompt: req.token_ids, model: req.model ?? null, stream: req.stream === true };
  for (const key of SAMPLING_KEYS) if (sampling[key] !== undefined) completion[key] = sampling[key];
  const room = maxModelLen - req.token_ids.length;
  // A prompt the context cannot hold is refused by the prompt-length check, not by a non-positive default.
  if (completion.max_tokens === undefined || completion.max_tokens === null) {
    if (room > 0) completion.max_tokens = room;
    else delete completion.max_tokens;
  }
  if (req.stream_options) completion.stream_options = req.stream_options;
  if (req.kv_transfer_params) completion.kv_transfer_params = req.kv_transfer_params;
  return {
    completion,
    stream: req.stream === true,
    includeUsage: req.stream_options?.include_usage === true,
    continuousUsage: req.stream_options?.continuous_usage_stats === true,
  };
}

/** The effective request id vLLM answers with (`generate-tokens-` + X-Request-Id, else the body's, else a uuid). */
export const generateTokensId = (requestId: string): string => `generate-tokens-${requestId}`;

/** What one rendered answer needs. */
export interface GenerateTokensContext {
  id: string;
  model: string;
  created: number;
  promptTokens: number;
}

const choice = (ids: readonly number[], finish: string | null) =>
  `{"index":0,"logprobs":null,"finish_reason":${JSON.stringify(finish)},"token_ids":${JSON.stringify(ids)},"routed_experts":null,"sampling_mask":null}`;

const usage = (promptTokens: number, completionTokens: number) =>
  `"prompt_tokens":${promptTokens},"total_tokens":${promptTokens + completionTokens},"completion_tokens":${completionTokens}`;

/** The non-streamed GenerateResponse (`model_dump()`: every field, nulls included). */
export function generateTokensResponse(ctx: GenerateTokensContext, ids: readonly number[], finish: string): string {
  return `{"request_id":${JSON.stringify(ctx.id)},"model":${JSON.stringify(ctx.model)},"created":${ctx.created},"choices":[${choice(ids, finish)}],"usage":{${usage(ctx.promptTokens, ids.length)},"prompt_tokens_details":null},"prompt_logprobs":null,"kv_transfer_params":null,"ec_transfer_params":null}`;
}

/**
 * One streamed chunk: the ids one engine output added. `emitted`: the output tokens so far, for
 * `continuous_usage_stats` (null: no per-chunk usage).
 */
export function generateTokensChunk(ctx: GenerateTokensContext, ids: readonly number[], finish: string | null, emitted: number | null): string {
  const chunkUsage = emitted === null ? 'null' : `{${usage(ctx.promptTokens, emitted)}}`;
  return `data: {"request_id":${JSON.stringify(ctx.id)},"choices":[${choice(ids, finish)}],"usage":${chunkUsage}}\n\n`;
}

/** The `stream_options.include_usage` chunk (dumped without nulls). */
export function generateTokensUsageChunk(ctx: GenerateTokensContext, completionTokens: number): string {
  return `data: {"request_id":${JSON.stringify(ctx.id)},"choices":[],"usage":{${usage(ctx.promptTokens, completionTokens)}}}\n\n`;
}
