import type { ServerResponse } from 'node:http';
import { z } from 'zod';
import type { ChoicePlan } from '../generation/plan.js';
import type { ModelTokenizer } from '../tokenizer/index.js';
import { parseBody } from '../api/schemas.js';
import { abortOnClose } from '../wire/http.js';
import type { EngineRun, RunEndpoint } from './engineRun.js';

/**
 * Hugging Face TGI's `/generate` and `/generate_stream`, and AIPerf's mock server's `/v1/custom-multimodal`, answered by
 * the completions path: each request is translated into a completion body, planned and run by the same
 * resolver and engine as `/v1/completions` (so it queues, shares the KV cache and counts in the metrics), and
 * the engine's token events are rendered in the endpoint's own shape.
 */

type Json = Record<string, unknown>;

/** TGI's default `max_new_tokens` (its GenerateParameters default). */
const TGI_DEFAULT_MAX_NEW_TOKENS = 100;
/** A completion's default `max_tokens` (vLLM's, and what the multimodal endpoint runs with when none is given). */
const COMPLETION_DEFAULT_MAX_TOKENS = 16;

const int = z.number().int();

const tgiRequest = z.looseObject({
  inputs: z.string(),
  parameters: z
    .looseObject({
      max_new_tokens: int.min(1).nullish(),
      stop: z.array(z.string()).nullish(),
      seed: int.nullish(),
      details: z.boolean().nullish(),
      return_full_text: z.boolean().nullish(),
    })
    .nullish(),
});

const multimodalRequest = z.looseObject({
  modality_bundle: z.looseObject({
    text_fragments: z.array(z.string()),
    visual_assets: z.looseObject({ images: z.array(z.unknown()).nullish(), videos: z.array(z.unknown()).nullish() }).nullish(),
    audio_streams: z.array(z.unknown()).nullish(),
  }),
  inference_params: z.looseObject({ model_id: z.string().nullish(), max_tokens: int.min(1).nullish() }).nullish(),
});

/** TGI's finish reasons from the plan's (vLLM's) finish. */
function tgiFinishReason(plan: ChoicePlan): 'length' | 'stop_sequence' | 'eos_token' {
  if (plan.finishReason === 'length') return 'length';
  return typeof plan.stopReason === 'string' ? 'stop_sequence' : 'eos_token';
}

interface TgiToken {
  id: number;
  text: string;
  /** mocker computes no log-probabilities: TGI's field is not optional, so it reads 0. */
  logprob: number;
  special: boolean;
}

export function tgiEndpoints(runCompletion: RunEndpoint, tokenizer: ModelTokenizer) {
  const eos = new Set(tokenizer.eosTokenIds);

  /** Runs one request to the end, calling `onToken` for each token as the engine emits it. */
  async function drive(run: EngineRun, signal: AbortSignal, onToken?: (token: TgiToken, index: number) => Promise<void>): Promise<TgiToken[]> {
    const decoder = tokenizer.decodeStream(false);
    const tokens: TgiToken[] = [];
    for await (const batch of run.events) {
      for (const { emitted } of batch) {
        while (tokens.length < emitted) {
          const id = run.plan.tokenIds[tokens.length];
          const token = { id, text: (await decoder.step(id)) ?? '', logprob: 0, special: eos.has(id) };
          tokens.push(token);
          if (onToken && !signal.aborted) await onToken(token, tokens.length);
        }
      }
    }
    return tokens;
  }

  /** The TGI request as a completion body (stop strings and seed carry over; the default model answers). */
  function completionBody(body: Json): { completion: Json; details: boolean; prefix: string } {
    const req = parseBody(tgiRequest, body);
    const params = req.parameters ?? {};
    return {
      completion: {
        prompt: req.inputs,
        max_tokens: params.max_new_tokens ?? TGI_DEFAULT_MAX_NEW_TOKENS,
        ...(params.stop ? { stop: params.stop } : {}),
        ...(params.seed !== undefined && params.seed !== null ? { seed: params.seed } : {}),
      },
      details: params.details === true,
      prefix: params.return_full_text ? req.inputs : '',
    };
  }

  /** `POST /generate`: `{generated_text}`, and TGI's `details` when asked for. */
  async function generate(res: ServerResponse, body: Json, arrivalMs: number): Promise<void> {
    const { completion, details, prefix } = completionBody(body);
    const abort = abortOnClose(res);
    const run = await runCompletion(completion, arrivalMs, abort.signal);
    const tokens = await drive(run, abort.signal);
    if (abort.signal.aborted) return;
    const text = prefix + (await tokenizer.decode(run.plan.tokenIds, true));
    const answer = {
      generated_text: text,
      ...(details
        ? { details: { finish_reason: tgiFinishReason(run.plan), generated_tokens: tokens.length, seed: completion.seed ?? null, prefill: [], tokens } }
        : {}),
    };
    const json = JSON.stringify(answer);
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(json) }).end(json);
  }

  /** `POST /generate_stream`: one SSE event per token (TGI's `data:` without a space), the text and details on the last. */
  async function generateStream(res: ServerResponse, body: Json, arrivalMs: number): Promise<void> {
    const { completion, details, prefix } = completionBody(body);
    const abort = abortOnClose(res);
    const run = await runCompletion(completion, arrivalMs, abort.signal);
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
    res.flushHeaders();
    const total = run.plan.tokenIds.length;
    await drive(run, abort.signal, async (token, index) => {
      const last = index === total;
      const event = {
        index,
        token,
        top_tokens: null,
        generated_text: last ? prefix + (await tokenizer.decode(run.plan.tokenIds, true)) : null,
        details: last && details ? { finish_reason: tgiFinishReason(run.plan), generated_tokens: total, seed: completion.seed ?? null } : null,
      };
      if (!abort.signal.aborted) res.write(`data:${JSON.stringify(event)}\n\n`);
    });
    if (!abort.signal.aborted) res.end();
  }

  /** `POST /v1/custom-multimodal`: AIPerf's mock server's answer shape, the text generated from the joined text fragments. */
  async function customMultimodal(res: ServerResponse, body: Json, arrivalMs: number): Promise<void> {
    const req = parseBody(multimodalRequest, body);
    const abort = abortOnClose(res);
    const run = await runCompletion(
      {
        model: req.inference_params?.model_id ?? null,
        prompt: req.modality_bundle.text_fragments.join(' '),
        max_tokens: req.inference_params?.max_tokens ?? COMPLETION_DEFAULT_MAX_TOKENS,
      },
      arrivalMs,
      abort.signal,
    );
    const tokens = await drive(run, abort.signal);
    if (abort.signal.aborted) return;
    const text = await tokenizer.decode(run.plan.tokenIds, true);
    const input = run.promptIds.length;
    const json = JSON.stringify({
      text,
      completion: { generated_text: text, metadata: { tokens_used: { input, output: tokens.length, total: input + tokens.length } } },
    });
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(json) }).end(json);
  }

  return { generate, generateStream, customMultimodal };
}
