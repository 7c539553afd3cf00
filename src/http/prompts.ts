import type { LoraAdapter } from '../engine/index.js';
import type { EndpointKind, OutputParams } from '../generation/plan.js';
import { OutputBudget } from '../generation/resolver.js';
import { structuredOutput, type StructuredOutput } from '../generation/structured.js';
import { toolOffer } from '../generation/toolCalls.js';
import { ChatMessageError, TooManyTokens } from '../tokenizer/index.js';
import { LoopSlice } from '../util/loopSlice.js';
import { ApiError, badRequest, modelNotFound } from '../wire/errors.js';
import { includesUsage } from '../api/render.js';
import {
  chatRequest,
  checkRequestChatTemplate,
  checkRequestFields,
  checkSampling,
  completionRequest,
  parseBody,
  type ChatRequest,
  type CompletionRequest,
  type KvTransferParams,
} from '../api/schemas.js';
import type { StreamBreaker } from './faults.js';
import type { Json, ServeAppConfig } from './serveConfig.js';

export interface Prepared {
  kind: EndpointKind;
  body: Json;
  model: string;
  /** One prompt, or a batched completion's several (vLLM runs one engine request per prompt). */
  prompts: number[][];
  /** Per prompt (a chat's default max_tokens depends on its prompt's length). */
  params: OutputParams[];
  stream: boolean;
  includeUsage: boolean;
  returnTokenIds: boolean;
  dataParallelRank: number | undefined;
  kvTransfer: KvTransferParams | null;
  /** The adapter `model` names (none: a base model). */
  lora: LoraAdapter | undefined;
  /** An injected mid-stream failure: breaks the engine streams after some tokens. */
  breaker?: StreamBreaker;
}

/** vLLM's `X-data-parallel-rank` request header. */
function dataParallelRank(header: string | undefined): number | undefined {
  if (header === undefined) return undefined;
  if (!/^\s*\d+\s*$/.test(header)) throw badRequest(`Invalid X-data-parallel-rank header: ${JSON.stringify(header)} is not a non-negative integer.`);
  return Number(header);
}

/**
 * A request checked and tokenized as vLLM does before its engine sees it: the model it names, its prompts (a
 * chat's rendered by the chat template), each prompt's output parameters, and the limits of the context.
 */
export class Prompts {
  private readonly kvCacheTokens: number;
  private readonly kvCacheText: string;

  constructor(private readonly config: ServeAppConfig) {
    // Fixed: read once, not per request.
    const kvCache = config.engine.state().ranks[0];
    this.kvCacheTokens = kvCache.totalBlocks * kvCache.blockSize;
    this.kvCacheText = `the KV cache holds (${kvCache.totalBlocks} blocks of ${kvCache.blockSize} tokens)`;
  }

  resolveModel(requested: string | null | undefined): string {
    if (requested === undefined || requested === null) return this.config.servedModels[0];
    if (!this.config.servedModels.includes(requested) && !this.config.lora?.resolve(requested)) throw modelNotFound(requested);
    return requested;
  }

  /**
   * vLLM's refusal of a prompt the context cannot hold (serving_engine `_validate_input`). A generation keeps a
   * token for its output (at most max_model_len - 1 prompt tokens). /tokenize and the pooling routes generate
   * nothing and may fill the context: vLLM 0.11's /tokenize had no limit, its 2026 renderer caps it at
   * max_model_len (`TokenizeCompletionRequest.build_tok_params`), which is what keeps one request from tokenizing
   * megabytes here; its pooling routes say it in their own words.
   */
  checkPromptLength(promptLen: number, use: 'generation' | 'tokenize' | 'pooling'): void {
    const limit = this.config.maxModelLen;
    if (promptLen < limit || (use !== 'generation' && promptLen === limit)) return;
    if (use === 'pooling') {
      throw badRequest(
        `This model's maximum context length is ${limit} tokens. However, you requested ${promptLen} tokens in the input for embedding generation. Please reduce the length of the input.`,
      );
    }
    throw badRequest(
      `This model's maximum context length is ${limit} tokens. However, your request has ${promptLen} input tokens. Please reduce the length of the input messages.`,
    );
  }

  private checkLength(promptLen: number, maxTokens: number | null): void {
    const limit = this.config.maxModelLen;
    this.checkPromptLength(promptLen, 'generation');
    if (maxTokens !== null && promptLen + maxTokens > limit) {
      throw badRequest(
        `'max_tokens' or 'max_completion_tokens' is too large: ${maxTokens}. This model's maximum context length is ${limit} tokens and your request has ${promptLen} input tokens (${maxTokens} > ${limit} - ${promptLen}).`,
        'max_tokens',
      );
    }
  }

  private outputParams(kind: EndpointKind, req: CompletionRequest | ChatRequest, promptLen: number, structured: StructuredOutput | null): OutputParams {
    const asked = kind === 'chat' ? ((req as ChatRequest).max_completion_tokens ?? req.max_tokens) : req.max_tokens;
    // A prefill engine computes the prompt and samples one token, whatever was asked.
    const requested = this.config.pd.role === 'prefill' ? 1 : asked;
    const maxTokens = requested ?? (kind === 'chat' ? this.config.maxModelLen - promptLen : 16);
    this.checkLength(promptLen, requested ?? null);
    return {
      kind,
      n: req.n ?? 1,
      maxTokens,
      maxTokensRequested: requested !== null && requested !== undefined,
      minTokens: req.min_tokens ?? 0,
      ignoreEos: req.ignore_eos ?? false,
      stop: req.stop === null || req.stop === undefined ? [] : typeof req.stop === 'string' ? [req.stop] : req.stop,
      stopTokenIds: req.stop_token_ids ?? [],
      includeStopStrInOutput: req.include_stop_str_in_output ?? false,
      skipSpecialTokens: req.skip_special_tokens ?? true,
      seed: req.seed ?? null,
      structured,
      ...(kind === 'chat' ? { reasoningEffort: (req as ChatRequest).reasoning_effort ?? null, tools: toolOffer(req as ChatRequest) } : {}),
    };
  }

  checkTokenIds(ids: number[]): void {
    const vocab = this.config.tokenizer.vocabSize;
    const bad = ids.find((id) => id < 0 || id >= vocab);
    if (bad !== undefined) throw badRequest(`Token id ${bad} is out of vocabulary`, 'prompt');
  }

  /** A chat request's prompt text as vLLM renders it; a template sent with the request renders in a worker thread. */
  async renderChatPrompt(chat: ChatRequest): Promise<string> {
    checkRequestChatTemplate(chat, this.config.trustRequestChatTemplate === true);
    try {
      return await this.config.tokenizer.renderChatGuarded(chat);
    } catch (err) {
      // A message vLLM refuses before any template is its own 400, worded as vLLM words it.
      if (err instanceof ChatMessageError) throw badRequest(err.message);
      throw badRequest(`Chat template error: ${(err as Error).message}`);
    }
  }

  /** A prompt's ids; one far beyond the context length is refused before all of it is tokenized. */
  async encodePrompt(text: string, addSpecialTokens: boolean): Promise<number[]> {
    try {
      return await this.config.tokenizer.encodeBounded(text, addSpecialTokens, this.config.maxModelLen);
    } catch (err) {
      if (!(err instanceof TooManyTokens)) throw err;
      const limit = this.config.maxModelLen;
      throw badRequest(
        `This model's maximum context length is ${limit} tokens. However, your request has more than ${limit} input tokens (${err.tokens} in its first ${err.chars} characters). Please reduce the length of the input messages.`,
      );
    }
  }

  /** The output tokens one request may plan: what the KV cache of a rank holds. */
  outputBudget(): OutputBudget {
    return new OutputBudget(this.kvCacheTokens, this.kvCacheText);
  }

  /** `slice`: a batch's prompts are tokenized and checked a slice of the event loop's time at a time. */
  async prepare(kind: EndpointKind, body: Json, rankHeader: string | undefined, slice = new LoopSlice()): Promise<Prepared> {
    const req = kind === 'chat' ? parseBody(chatRequest, body) : parseBody(completionRequest, body);
    checkRequestFields(req);
    // Read once for all the prompts of a batch (vLLM checks it with the request's fields, before any prompt).
    const structured = structuredOutput(req);
    if ('logprobs' in req && req.logprobs !== null && req.logprobs !== undefined && req.logprobs !== false) {
      throw new ApiError(
        400,
        'logprobs are only served verbatim from captures that recorded them; this request asks mocker to compute them.',
        'BadRequestError',
        'logprobs',
      );
    }
    if ('echo' in req && req.echo) throw new ApiError(400, 'echo is not supported by mocker.', 'BadRequestError', 'echo');
    const model = this.resolveModel(req.model);
    const prompts: number[][] = [];
    if (kind === 'chat') prompts.push(await this.encodePrompt(await this.renderChatPrompt(req as ChatRequest), req.add_special_tokens ?? false));
    else {
      const prompt = (req as CompletionRequest).prompt;
      // A list of strings or of token-id lists is a batch: one choice block per prompt.
      const batch: (string | number[])[] =
        Array.isArray(prompt) && prompt.length > 0 && typeof prompt[0] !== 'number' ? (prompt as (string | number[])[]) : [prompt as string | number[]];
      // Every choice plans at least one token: a batch whose choices alone outgrow the budget is refused untokenized.
      this.outputBudget().check(batch.length * (req.n ?? 1));
      for (const item of batch) {
        if (typeof item !== 'string') this.checkTokenIds(item);
        prompts.push(typeof item === 'string' ? await this.encodePrompt(item, req.add_special_tokens ?? true) : item);
        await slice.pause();
      }
    }
    if (prompts.some((ids) => ids.length === 0)) throw badRequest('The decoder prompt cannot be empty', 'prompt');
    // The context-length checks, then the sampling values: vLLM's order (preprocessing, then to_sampling_params).
    const params: OutputParams[] = [];
    for (const ids of prompts) {
      params.push(this.outputParams(kind, req, ids.length, structured));
      await slice.pause();
    }
    checkSampling(req);
    const stream = req.stream === true;
    return {
      kind,
      body,
      model,
      prompts,
      params,
      stream,
      includeUsage: includesUsage(this.config.wire, stream, req.stream_options),
      returnTokenIds: req.return_token_ids === true,
      dataParallelRank: dataParallelRank(rankHeader),
      kvTransfer: this.config.pd.role === 'agg' ? null : (req.kv_transfer_params ?? null),
      lora: this.config.lora?.resolve(model),
    };
  }
}
