import { randomUUID } from 'node:crypto';
import type { IncomingMessage, OutgoingHttpHeaders, ServerResponse } from 'node:http';
import type { HttpBindings } from '@hono/node-server';
import { RESPONSE_ALREADY_SENT } from '@hono/node-server/utils/response';
import { Hono, type Context } from 'hono';
import { forwardExchange, generationEndpoint, hideTokenIds, upstreamFailure, type ExchangeSink, type ForwardConfig } from '../capture/forward.js';
import { EngineRejection, type Engine, type EngineStream, type LoraAdapter, type TokenEvent } from '../engine/index.js';
import type { ChoicePlan, EndpointKind, OutputParams } from '../generation/plan.js';
import { OutputBudget, type OutputResolver, type Resolution } from '../generation/resolver.js';
import type { MockerMetrics } from '../metrics/mockerMetrics.js';
import { BACKEND_METRICS_PATHS, type MetricsSource, type MissingMetrics } from '../metrics/backendMetrics.js';
import { KV_PULL_PATH, kvPullRequest, prefillResponseParams, pullRemoteKv, type PrefillEndpoint } from '../pd/kvTransfer.js';
import { requestShape } from '../generation/shape.js';
import { structuredOutput, type StructuredOutput } from '../generation/structured.js';
import { toolOffer } from '../generation/toolCalls.js';
import { arrivalOf, OWN_HEALTH_PATH } from '../wire/drain.js';
import { declaredBodyLimit } from './bodyLimit.js';
import type { PoolingKind, StoredExchange } from '../store/captureStore.js';
import { ChatMessageError, TooManyTokens, type ModelTokenizer } from '../tokenizer/index.js';
import { ApiError, badRequest, errorJson, modelNotFound } from '../wire/errors.js';
import { loadLoraRequest, unloadLoraRequest, type LoraAdapters } from './loraAdapters.js';
import { DONE_EVENT, includesUsage, restamp, type RenderContext } from '../api/render.js';
import { PlanRenderer } from '../api/planRenderer.js';
import { renderCapturedStream } from './verbatimStream.js';
import { poolingEndpoints, type PoolingLatency } from './poolingEndpoints.js';
import { answerPooled, type PooledRequest } from './pooledReplay.js';
import { tgiEndpoints, type RunCompletion } from './tgi.js';
import { breaksMidstream, FAULT_HEADER, faultResponse, INJECTED_HEADER, midstreamError, StreamBreaker } from './faults.js';
import { mockerConfigRoutes, type RuntimeSettings } from './mockerConfig.js';
import { admitted, UNAUTHORIZED_BODY, type ApiKeyPolicy, type ClassifiedRoute, type RouteClass } from '../wire/access.js';
import { startupGate } from './startup.js';
import { LoopSlice } from '../util/loopSlice.js';
import {
  chatRequest,
  checkRequestChatTemplate,
  checkRequestFields,
  checkSampling,
  completionRequest,
  detokenizeRequest,
  parseBody,
  tokenizeRequest,
  type ChatRequest,
  type CompletionRequest,
  type KvTransferParams,
} from '../api/schemas.js';

export interface ServeAppConfig {
  engine: Engine;
  resolver: OutputResolver;
  tokenizer: ModelTokenizer;
  /** Names accepted in `model`; the first is the default. */
  servedModels: string[];
  /** `root` of /v1/models (the --model path or id). */
  modelRoot: string;
  maxModelLen: number;
  /** `/version`'s body. */
  versionJson: string;
  /** The upstream for `--on-miss passthrough|record`, and the recorder for `record`. */
  forward?: { config: ForwardConfig; sink?: ExchangeSink };
  maxBodyBytes: number;
  /** vLLM's --enable-prompt-tokens-details: usage reports the prefix-cache hits. */
  promptTokensDetails: boolean;
  /** `GET /metrics` (Prometheus text). */
  metrics?: { text(): Promise<string>; readonly contentType: string };
  /** Other systems' expositions of the same engine (`/vllm/metrics`, `/dcgm1/metrics`…), by path. */
  backendMetrics?: Record<string, MetricsSource | MissingMetrics>;
  /** The mocker's own counters (capture hits and misses, upstream errors, captures written). */
  mockerMetrics?: MockerMetrics;
  /** vLLM's --api-key (`/v1/*` needs `Authorization: Bearer <key>`), and --api-key-scope. */
  access: ApiKeyPolicy;
  /**
   * --enable-control-routes (or VLLM_SERVER_DEV_MODE=1): the routes that change the server at run time
   * (`/mocker/config`, `/reset_prefix_cache`) exist. LoRA loading has its own switch, vLLM's (below).
   */
  controlRoutes?: boolean;
  /** vLLM's --enable-request-id-headers: responses carry `X-Request-Id`. */
  requestIdHeaders?: boolean;
  /** vLLM's --enable-server-load-tracking: `/load` counts requests in flight (else it reads 0). */
  serverLoadTracking?: boolean;
  /** Prefill/decode disaggregation: vLLM's NIXL `kv_transfer_params` protocol, the pull as an HTTP call. */
  pd: PdConfig;
  /** The effective settings, shown as they are by `GET /mocker/engine` beside the live state. */
  settings: EffectiveSettings;
  /** vLLM's --trust-request-chat-template: a `chat_template` in the request is used (rendered in a worker), not refused. */
  trustRequestChatTemplate?: boolean;
  /**
   * Embeddings and reranking (AIPerf's mock server's endpoints): the vector size and their own latency; under `--timing
   * captured`, how long a captured answer takes.
   */
  pooling: { embeddingDimensions: number; latency: PoolingLatency; capturedDuration?: (capturedMs: number) => number };
  /** LoRA adapters served by name (--enable-lora, --lora-modules). */
  lora?: LoraAdapters;
  /** VLLM_ALLOW_RUNTIME_LORA_UPDATING: the load and unload routes exist. */
  loraRuntimeUpdating?: boolean;
  /** Failure injection and latency knobs, shown and changed at run time by `/mocker/config`. */
  runtime?: RuntimeSettings;
  /** --startup-time: until this performance.now() time, `/health` and the API answer 503. */
  readyAtMs?: number;
}

/**
 * What this server was started with, keys spelled as vLLM's and Dynamo's arguments (`enable_prefix_caching`,
 * `num_gpu_blocks`…): plain data built by the CLI, so a user can check what the flags amounted to.
 */
export type EffectiveSettings = Record<string, string | number | boolean | null | string[]>;

export interface PdConfig {
  /**
   * prefill: every request answers with exactly one token (Dynamo's prefill worker). agg: not configured for
   * PD, `kv_transfer_params` are ignored (vLLM without a KV connector): nothing held, nothing pulled.
   */
  role: 'agg' | 'prefill' | 'decode';
  /** The prefill engines a pull may go to (`peerKey`s): the deployment's own, or --kv-transfer-allowed-hosts. */
  peers: ReadonlySet<string>;
  /** This engine as a prefill engine names itself to decode engines (its port is known once listening). */
  endpoint: () => PrefillEndpoint;
  /** How long a decode engine waits for a prefill engine's answer to a pull before recomputing. */
  pullTimeoutMs: number;
}

type Env = { Bindings: HttpBindings };
type Json = Record<string, unknown>;

/**
 * Every route `serve` may register, with its methods and its access class (access.ts): registering one that is
 * not here fails `createServeApp`. Which exist depends on the configuration (control routes when enabled, the KV
 * pull on a PD engine); the others answer 404, and a known path asked with another method FastAPI's 405.
 */
export const SERVE_ROUTES: Record<string, { methods: string[]; class: RouteClass }> = {
  '/health': { methods: ['GET'], class: 'public' },
  // An engine takes requests when vLLM's /health says so: the same answer (503 while starting up or draining).
  [OWN_HEALTH_PATH]: { methods: ['GET'], class: 'public' },
  '/ping': { methods: ['GET', 'POST'], class: 'public' },
  '/version': { methods: ['GET'], class: 'public' },
  '/metrics': { methods: ['GET'], class: 'public' },
  ...Object.fromEntries(BACKEND_METRICS_PATHS.map((path) => [path, { methods: ['GET'], class: 'public' as const }])),
  '/v1/completions': { methods: ['POST'], class: 'key' },
  '/v1/chat/completions': { methods: ['POST'], class: 'key' },
  '/v1/models': { methods: ['GET'], class: 'key' },
  '/v1/embeddings': { methods: ['POST'], class: 'key' },
  '/v1/ranking': { methods: ['POST'], class: 'key' },
  '/v1/rerank': { methods: ['POST'], class: 'key' },
  '/v1/custom-multimodal': { methods: ['POST'], class: 'key' },
  '/rerank': { methods: ['POST'], class: 'key' },
  '/v2/rerank': { methods: ['POST'], class: 'key' },
  '/generate': { methods: ['POST'], class: 'key' },
  '/generate_stream': { methods: ['POST'], class: 'key' },
  '/tokenize': { methods: ['POST'], class: 'key' },
  '/detokenize': { methods: ['POST'], class: 'key' },
  '/load': { methods: ['GET'], class: 'key' },
  '/': { methods: ['GET'], class: 'key' },
  '/mocker/engine': { methods: ['GET'], class: 'key' },
  '/mocker/kv-blocks': { methods: ['GET'], class: 'key' },
  // The decode engines of a PD deployment call it, so it cannot be off by default; it frees only the hold its
  // random id names, which only the client that got the prefill answer (and whom it gives it to) knows.
  [KV_PULL_PATH]: { methods: ['POST'], class: 'key' },
  '/mocker/config': { methods: ['GET', 'POST'], class: 'control' },
  '/reset_prefix_cache': { methods: ['POST'], class: 'control' },
  // Only with VLLM_ALLOW_RUNTIME_LORA_UPDATING, as vLLM.
  '/v1/load_lora_adapter': { methods: ['POST'], class: 'control' },
  '/v1/unload_lora_adapter': { methods: ['POST'], class: 'control' },
};

/** The routes `app` registered (its middleware left out), each with its class; throws on one `SERVE_ROUTES` does not classify. */
export function serveRoutes(app: { routes: readonly { method: string; path: string }[] }): ClassifiedRoute[] {
  return app.routes
    .filter((r) => !(r.method === 'ALL' && r.path === '/*'))
    .map((r) => {
      const entry = SERVE_ROUTES[r.path];
      if (!entry?.methods.includes(r.method))
        throw new Error(`serve registers ${r.method} ${r.path}, which SERVE_ROUTES does not classify (public, key or control)`);
      return { method: r.method, path: r.path, class: entry.class };
    });
}

const NOT_FOUND_BODY = '{"detail":"Not Found"}';
const SSE_HEADERS: OutgoingHttpHeaders = { 'content-type': 'text/event-stream; charset=utf-8' };
/** Captured response headers that describe the transfer, not the content: regenerated per response. */
const TRANSFER_HEADERS = new Set(['date', 'content-length', 'transfer-encoding', 'connection', 'keep-alive', 'x-request-id']);

function jsonResponse(res: ServerResponse, status: number, body: string): void {
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) }).end(body);
}

function capturedHeaders(ex: StoredExchange): OutgoingHttpHeaders {
  const out: OutgoingHttpHeaders = {};
  for (const [k, v] of Object.entries(ex.responseHeaders)) if (!TRANSFER_HEADERS.has(k)) out[k] = v;
  return out;
}

function requestIdFor(c: Context<Env>, body: Json): string {
  const header = c.req.header('x-request-id');
  if (header) return header;
  if (typeof body.request_id === 'string' && body.request_id) return body.request_id;
  return randomUUID().replaceAll('-', '');
}

interface Prepared {
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

/** Several engine streams' token events as they come, each with the index of its stream (vLLM's merge_async_iterators). */
async function* mergeStreams(streams: EngineStream[]): AsyncGenerator<[number, TokenEvent[]]> {
  if (streams.length === 1) {
    for await (const batch of streams[0]) yield [0, batch];
    return;
  }
  const ready: [number, TokenEvent[]][] = [];
  let open = streams.length;
  let failure: unknown = null;
  let wake: (() => void) | null = null;
  const notify = () => {
    const w = wake;
    wake = null;
    w?.();
  };
  streams.forEach((stream, i) => {
    void (async () => {
      for await (const batch of stream) {
        ready.push([i, batch]);
        notify();
      }
    })()
      .catch((err: unknown) => (failure ??= err))
      .finally(() => {
        open--;
        notify();
      });
  });
  let next = 0;
  while (open > 0 || next < ready.length) {
    if (failure) throw failure;
    if (next === ready.length) {
      ready.length = next = 0;
      await new Promise<void>((resolve) => (wake = resolve));
      continue;
    }
    yield ready[next++];
  }
  if (failure) throw failure;
}

/**
 * The vLLM-compatible server of `mocker serve`: validation and tokenization, then one `Engine` for timing
 * and an `OutputResolver` for content. It never looks inside either.
 */
// biome-ignore lint/complexity/noExcessiveLinesPerFunction: over 120 lines until it is split (issue 37, in progress)
export function createServeApp(config: ServeAppConfig): Hono<Env> {
  const { tokenizer, engine, resolver } = config;
  const app = new Hono<Env>();

  const resolveModel = (requested: string | null | undefined): string => {
    if (requested === undefined || requested === null) return config.servedModels[0];
    if (!config.servedModels.includes(requested) && !config.lora?.resolve(requested)) throw modelNotFound(requested);
    return requested;
  };

  /**
   * vLLM's refusal of a prompt the context cannot hold (serving_engine `_validate_input`). A generation keeps a
   * token for its output (at most max_model_len - 1 prompt tokens). /tokenize and the pooling routes generate
   * nothing and may fill the context: vLLM 0.11's /tokenize had no limit, its 2026 renderer caps it at
   * max_model_len (`TokenizeCompletionRequest.build_tok_params`), which is what keeps one request from tokenizing
   * megabytes here; its pooling routes say it in their own words.
   */
  const checkPromptLength = (promptLen: number, use: 'generation' | 'tokenize' | 'pooling'): void => {
    const limit = config.maxModelLen;
    if (promptLen < limit || (use !== 'generation' && promptLen === limit)) return;
    if (use === 'pooling') {
      throw badRequest(
        `This model's maximum context length is ${limit} tokens. However, you requested ${promptLen} tokens in the input for embedding generation. Please reduce the length of the input.`,
      );
    }
    throw badRequest(
      `This model's maximum context length is ${limit} tokens. However, your request has ${promptLen} input tokens. Please reduce the length of the input messages.`,
    );
  };

  const checkLength = (promptLen: number, maxTokens: number | null): void => {
    const limit = config.maxModelLen;
    checkPromptLength(promptLen, 'generation');
    if (maxTokens !== null && promptLen + maxTokens > limit) {
      throw badRequest(
        `'max_tokens' or 'max_completion_tokens' is too large: ${maxTokens}. This model's maximum context length is ${limit} tokens and your request has ${promptLen} input tokens (${maxTokens} > ${limit} - ${promptLen}).`,
        'max_tokens',
      );
    }
  };

  const outputParams = (kind: EndpointKind, req: CompletionRequest | ChatRequest, promptLen: number, structured: StructuredOutput | null): OutputParams => {
    const asked = kind === 'chat' ? ((req as ChatRequest).max_completion_tokens ?? req.max_tokens) : req.max_tokens;
    // A prefill engine computes the prompt and samples one token, whatever was asked.
    const requested = config.pd.role === 'prefill' ? 1 : asked;
    const maxTokens = requested ?? (kind === 'chat' ? config.maxModelLen - promptLen : 16);
    checkLength(promptLen, requested ?? null);
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
  };

  const checkTokenIds = (ids: number[]): void => {
    const vocab = tokenizer.vocabSize;
    const bad = ids.find((id) => id < 0 || id >= vocab);
    if (bad !== undefined) throw badRequest(`Token id ${bad} is out of vocabulary`, 'prompt');
  };

  /** A chat request's prompt text as vLLM renders it; a template sent with the request renders in a worker thread. */
  async function renderChatPrompt(chat: ChatRequest): Promise<string> {
    checkRequestChatTemplate(chat, config.trustRequestChatTemplate === true);
    try {
      return await tokenizer.renderChatGuarded(chat);
    } catch (err) {
      // A message vLLM refuses before any template is its own 400, worded as vLLM words it.
      if (err instanceof ChatMessageError) throw badRequest(err.message);
      throw badRequest(`Chat template error: ${(err as Error).message}`);
    }
  }

  /** A prompt's ids; one far beyond the context length is refused before all of it is tokenized. */
  async function encodePrompt(text: string, addSpecialTokens: boolean): Promise<number[]> {
    try {
      return await tokenizer.encodeBounded(text, addSpecialTokens, config.maxModelLen);
    } catch (err) {
      if (!(err instanceof TooManyTokens)) throw err;
      const limit = config.maxModelLen;
      throw badRequest(
        `This model's maximum context length is ${limit} tokens. However, your request has more than ${limit} input tokens (${err.tokens} in its first ${err.chars} characters). Please reduce the length of the input messages.`,
      );
    }
  }

  /** The output tokens one request may plan: what the KV cache of a rank holds (fixed: read once, not per request). */
  const kvCache = engine.state().ranks[0];
  const kvCacheTokens = kvCache.totalBlocks * kvCache.blockSize;
  const kvCacheText = `the KV cache holds (${kvCache.totalBlocks} blocks of ${kvCache.blockSize} tokens)`;
  const outputBudget = (): OutputBudget => new OutputBudget(kvCacheTokens, kvCacheText);

  /** `slice`: a batch's prompts are tokenized and checked a slice of the event loop's time at a time. */
  async function prepare(kind: EndpointKind, body: Json, rankHeader: string | undefined, slice = new LoopSlice()): Promise<Prepared> {
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
    const model = resolveModel(req.model);
    const prompts: number[][] = [];
    if (kind === 'chat') prompts.push(await encodePrompt(await renderChatPrompt(req as ChatRequest), req.add_special_tokens ?? false));
    else {
      const prompt = (req as CompletionRequest).prompt;
      // A list of strings or of token-id lists is a batch: one choice block per prompt.
      const batch: (string | number[])[] =
        Array.isArray(prompt) && prompt.length > 0 && typeof prompt[0] !== 'number' ? (prompt as (string | number[])[]) : [prompt as string | number[]];
      // Every choice plans at least one token: a batch whose choices alone outgrow the budget is refused untokenized.
      outputBudget().check(batch.length * (req.n ?? 1));
      for (const item of batch) {
        if (typeof item !== 'string') checkTokenIds(item);
        prompts.push(typeof item === 'string' ? await encodePrompt(item, req.add_special_tokens ?? true) : item);
        await slice.pause();
      }
    }
    if (prompts.some((ids) => ids.length === 0)) throw badRequest('The decoder prompt cannot be empty', 'prompt');
    // The context-length checks, then the sampling values: vLLM's order (preprocessing, then to_sampling_params).
    const params: OutputParams[] = [];
    for (const ids of prompts) {
      params.push(outputParams(kind, req, ids.length, structured));
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
      includeUsage: includesUsage(stream, req.stream_options),
      returnTokenIds: req.return_token_ids === true,
      dataParallelRank: dataParallelRank(rankHeader),
      kvTransfer: config.pd.role === 'agg' ? null : (req.kv_transfer_params ?? null),
      lora: config.lora?.resolve(model),
    };
  }

  /** Submits one prompt's plans; `part` numbers the prompts of a batch (vLLM's engine request `<id>-<i>`), null alone. */
  const runEngine = (
    ctx: RenderContext,
    p: Prepared,
    part: number | null,
    plans: ChoicePlan[],
    arrivalMs: number,
    signal: AbortSignal,
    remotePrefill = false,
  ) => {
    const params = p.params[part ?? 0];
    try {
      const stream = engine.submit(
        {
          requestId: part === null ? ctx.id : `${ctx.id}-${part}`,
          arrivalMs,
          promptTokenIds: ctx.promptTokenIds,
          sequences: plans.map((plan) => ({ outputTokenIds: plan.tokenIds, capturedTimesMs: plan.capturedTimesMs, finishReason: plan.finishReason })),
          dataParallelRank: p.dataParallelRank,
          maxTokensParam: params.maxTokensRequested ? params.maxTokens : null,
          // Named by a random id: a decode engine (or the proxy) that was told it frees the blocks, nobody else.
          holdKv: part === null && p.kvTransfer?.do_remote_decode === true ? randomUUID() : undefined,
          remotePrefill,
          lora: p.lora,
        },
        signal,
      );
      return p.breaker ? p.breaker.watch(stream) : stream;
    } catch (err) {
      if (err instanceof EngineRejection) throw badRequest(err.message);
      throw err;
    }
  };

  /**
   * Renders plans through the engine in vLLM's format: `plans[i]` answers the i-th prompt (one, or a batched
   * completion's several), its choice j is the response's choice i * n + j (vLLM's numbering), and usage sums them.
   */
  async function serveRendered(
    res: ServerResponse,
    ctx: RenderContext,
    p: Prepared,
    plansByPrompt: ChoicePlan[][],
    arrivalMs: number,
    abort: AbortController,
    remotePrefill: boolean,
    slice = new LoopSlice(),
  ): Promise<void> {
    const signal = abort.signal;
    const batched = plansByPrompt.length > 1;
    const renderer = new PlanRenderer(ctx, p.prompts, plansByPrompt, tokenizer, p.params[0].skipSpecialTokens, p.stream);
    // A batch's prompts each get a signal of their own, all aborted with the request's: an AbortSignal's listeners
    // are added in time linear in their number, so 10,000 on one signal took 0.85 s.
    const promptSignals = batched ? plansByPrompt.map(() => new AbortController()) : null;
    if (promptSignals) signal.addEventListener('abort', () => promptSignals.forEach((c) => c.abort()), { once: true });
    const streams: EngineStream[] = [];
    try {
      for (const [i, prompt] of plansByPrompt.entries()) {
        streams.push(
          runEngine({ ...ctx, promptTokenIds: p.prompts[i] }, p, batched ? i : null, prompt, arrivalMs, promptSignals?.[i].signal ?? signal, remotePrefill),
        );
        if (batched) await slice.pause();
      }
    } catch (err) {
      abort.abort(); // the prompts already submitted leave the engine
      throw err;
    }
    // vLLM's prompt_tokens_details: the first prompt's engine output to arrive when streaming, the last prompt's otherwise.
    let cachedFrom = streams.length - 1;

    if (p.stream) res.writeHead(200, SSE_HEADERS);
    let started = false;
    for await (const [prompt, batch] of mergeStreams(streams)) {
      if (!started && p.stream) cachedFrom = prompt;
      let out = started ? '' : renderer.opening();
      started = true;
      for (const { sequence, emitted } of batch) out += await renderer.advance(renderer.choiceOf(prompt, sequence), emitted);
      if (out && !signal.aborted) res.write(out);
    }
    const hold = batched ? null : streams[0].kvHold;
    // vLLM hands the blocks to a remote decode only after a length-capped finish, in a non-streamed answer.
    if (hold && !signal.aborted && !p.stream && renderer.plans[0].finishReason === 'length') {
      ctx.kvTransferParams = prefillResponseParams(
        config.pd.endpoint(),
        hold.holdId,
        Array.from({ length: hold.blocks }, () => nextBlockId++),
      );
      // An answer its client never got whole names blocks no decode engine will pull: freed at once, not after the timeout.
      res.once('close', () => void (res.writableFinished || engine.releaseKvHold(hold.holdId)));
    } else if (hold) engine.releaseKvHold(hold.holdId);
    if (signal.aborted) return;
    const cachedTokens = config.promptTokensDetails ? streams[cachedFrom].cachedPromptTokens : null;
    if (p.stream) res.end(renderer.streamEnd(p.includeUsage, cachedTokens));
    else jsonResponse(res, 200, renderer.body(cachedTokens));
  }

  /** Serves a capture's own bytes (same request shape), released as the engine emits their tokens. */
  async function serveVerbatim(
    res: ServerResponse,
    ctx: RenderContext,
    p: Prepared,
    ex: StoredExchange,
    plans: ChoicePlan[],
    arrivalMs: number,
    signal: AbortSignal,
    remotePrefill: boolean,
  ): Promise<void> {
    const hide = ex.injected.includes('return_token_ids') && !p.returnTokenIds;
    const events = runEngine(ctx, p, null, plans, arrivalMs, signal, remotePrefill);
    const headers = capturedHeaders(ex);
    if (!ex.stream) {
      for await (const batch of events) void batch;
      if (signal.aborted) return;
      const stamped = restamp(ex.responseBody.toString('utf8'), ctx.id, ctx.created);
      const body = hide ? hideTokenIds(stamped) : stamped;
      res.writeHead(ex.status ?? 200, { ...headers, 'content-length': Buffer.byteLength(body) }).end(body);
      return;
    }
    res.writeHead(ex.status ?? 200, headers);
    // The headers go at once: with the first events when the engine releases them within this turn (one write).
    const flushHeaders = setImmediate(() => res.flushHeaders());
    const stream = renderCapturedStream(ex, hide, ctx.id, ctx.created);
    let emitted = 0;
    let next = 0;
    const perSequence = plans.map(() => 0);
    try {
      for await (const batch of events) {
        for (const { sequence, emitted: n } of batch) {
          emitted += n - perSequence[sequence];
          perSequence[sequence] = n;
        }
        // The stream's last events (usage, [DONE]) follow the last token, as captured.
        const from = next;
        while (next < stream.events && ex.eventTokens[next] <= emitted && emitted > 0) next++;
        if (next > from && !signal.aborted) {
          clearImmediate(flushHeaders);
          res.write(stream.slice(from, next));
        }
      }
    } finally {
      clearImmediate(flushHeaders);
    }
    if (signal.aborted) return;
    res.end(stream.slice(next, stream.events));
  }

  const readJson = async (c: Context<Env>): Promise<{ bytes: Buffer; body: Json }> => {
    const bytes = Buffer.from(await c.req.arrayBuffer());
    try {
      return { bytes, body: JSON.parse(bytes.toString('utf8')) as Json };
    } catch (err) {
      throw new ApiError(400, `Invalid JSON body: ${(err as Error).message}`, 'Bad Request');
    }
  };

  /** vLLM's `validate_json_request` on its API routes: any other media type is a 400 before the body is read. */
  const readApiJson = (c: Context<Env>): ReturnType<typeof readJson> => {
    const mediaType = (c.req.header('content-type') ?? '').toLowerCase().split(';')[0];
    if (mediaType !== 'application/json')
      throw new ApiError(400, "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed", 'Bad Request');
    return readJson(c);
  };

  /** Block ids named in `remote_block_ids`: opaque to the decode side, distinct while held. */
  let nextBlockId = 1;

  /** A decode request's pull from its prefill engine; on failure the prompt is recomputed here (vLLM's default policy). */
  const pullKv = async (params: KvTransferParams): Promise<boolean> => {
    const outcome = await pullRemoteKv(
      params,
      config.pd.peers,
      config.pd.pullTimeoutMs,
      config.access.key === undefined ? undefined : `Bearer ${config.access.key}`,
    );
    config.mockerMetrics?.kvPull(outcome);
    if (!outcome.ok) console.warn(`mocker: KV pull failed (${outcome.reason}): ${outcome.detail}; recomputing the prompt locally`);
    return outcome.ok;
  };

  /** A miss `--on-miss passthrough|record` sends to the upstream (and records). */
  const forwardMiss = async (reqNode: IncomingMessage, bodyBytes: Buffer, res: ServerResponse): Promise<void> => {
    if (!config.forward) throw new ApiError(500, 'on-miss forwarding needs --upstream', 'InternalServerError');
    const record = config.forward.sink;
    await forwardExchange(config.forward.config, reqNode, bodyBytes, res, async (raw) => {
      config.mockerMetrics?.forwarded(upstreamFailure(raw));
      if (!record) return;
      await record(raw);
      config.mockerMetrics?.captureWritten();
    });
  };

  const generate = (kind: EndpointKind) => async (c: Context<Env>) => {
    const res = c.env.outgoing;
    const reqNode: IncomingMessage = c.env.incoming;
    const arrivalMs = arrivalOf(reqNode) ?? performance.now();
    // Drawn in arrival order (reproducible by seed), answered once the request is known valid.
    const fault = config.runtime?.faults.draw(c.req.header(FAULT_HEADER)) ?? null;
    // Watched from the start: a client can leave while its prompt is tokenized, looked up or its KV pulled.
    const abort = new AbortController();
    res.on('close', () => {
      if (!res.writableFinished) abort.abort();
    });
    const { bytes: bodyBytes, body } = await readApiJson(c);
    // A batch of 10,000 prompts is prepared, planned and submitted in slices: the loop turns meanwhile.
    const slice = new LoopSlice();
    const p = await prepare(kind, body, c.req.header('x-data-parallel-rank'), slice);
    if (fault && !breaksMidstream(fault)) {
      config.mockerMetrics?.injectedError(fault);
      const answer = faultResponse(fault, {
        model: p.model,
        maxModelLen: config.maxModelLen,
        promptTokens: p.prompts[0].length,
        authorization: c.req.header('authorization'),
      });
      return c.body(answer.body, answer.status as 400, { 'content-type': 'application/json', [INJECTED_HEADER]: fault, ...answer.headers });
    }
    const shape = requestShape(kind, body);
    const budget = outputBudget();
    const resolutions: Resolution[] = [];
    for (const [i, promptIds] of p.prompts.entries()) {
      const resolution = await resolver.resolve(p.params[i], p.model, promptIds, shape, budget);
      config.mockerMetrics?.captureLookup(resolution.lookup);
      if (resolution.type === 'error') throw resolution.error;
      resolutions.push(resolution);
      await slice.pause();
    }
    const batched = p.prompts.length > 1;
    // The upstream answers a batch whole when one of its prompts is to be forwarded.
    if (resolutions.some((r) => r.type === 'forward')) {
      await forwardMiss(reqNode, bodyBytes, res);
      return RESPONSE_ALREADY_SENT;
    }
    const planned = resolutions as Extract<Resolution, { type: 'plans' }>[];
    if (fault && breaksMidstream(fault)) {
      const tokens = planned.reduce((n, r) => n + r.plans.reduce((m, plan) => m + plan.tokenIds.length, 0), 0);
      const afterTokens = Math.min(config.runtime!.faults.settings.midstreamAfterTokens, tokens - 1);
      res.setHeader(INJECTED_HEADER, fault);
      p.breaker = new StreamBreaker(afterTokens, () => {
        config.mockerMetrics?.injectedError(fault);
        abort.abort(); // the engine request leaves, its blocks freed
        if (fault === 'midstream') return midstreamError();
        res.socket?.destroySoon();
        return null;
      });
    }
    const remotePrefill = !batched && p.kvTransfer?.do_remote_prefill === true && (await pullKv(p.kvTransfer));
    const id = `${kind === 'chat' ? 'chatcmpl' : 'cmpl'}-${requestIdFor(c, body)}`;
    const ctx: RenderContext = {
      kind,
      id,
      created: Math.floor(Date.now() / 1000),
      model: p.model,
      returnTokenIds: p.returnTokenIds,
      promptTokenIds: p.prompts[0],
    };
    // Captured bytes carry token ids only when the engine returned them, and never fresh kv_transfer_params.
    const capture = batched ? null : planned[0].verbatim;
    const verbatim = capture && (!p.returnTokenIds || capture.tokenSource === 'engine') && !p.kvTransfer?.do_remote_decode ? capture : null;
    if (verbatim) await serveVerbatim(res, ctx, p, verbatim, planned[0].plans, arrivalMs, abort.signal, remotePrefill);
    else
      await serveRendered(
        res,
        ctx,
        p,
        planned.map((r) => r.plans),
        arrivalMs,
        abort,
        remotePrefill,
        slice,
      );
    return RESPONSE_ALREADY_SENT;
  };

  /** The completion path for endpoints that render the engine's tokens in their own shape (TGI, multimodal). */
  const runCompletion: RunCompletion = async (completionBody, arrivalMs, signal) => {
    const p = await prepare('completion', completionBody, undefined);
    const resolution = await resolver.resolve(p.params[0], p.model, p.prompts[0], requestShape('completion', completionBody), outputBudget());
    config.mockerMetrics?.captureLookup(resolution.lookup);
    if (resolution.type === 'error') throw resolution.error;
    if (resolution.type === 'forward')
      throw new ApiError(501, 'This endpoint is answered from captures or random tokens only: it is not forwarded to the upstream.', 'NotImplementedError');
    const ctx: RenderContext = {
      kind: 'completion',
      id: `cmpl-${randomUUID().replaceAll('-', '')}`,
      created: Math.floor(Date.now() / 1000),
      model: p.model,
      returnTokenIds: false,
      promptTokenIds: p.prompts[0],
    };
    return { model: p.model, promptIds: p.prompts[0], plan: resolution.plans[0], events: runEngine(ctx, p, null, resolution.plans, arrivalMs, signal) };
  };

  if (config.readyAtMs !== undefined) app.use('*', startupGate(config.readyAtMs));
  let inFlight = 0;
  /** The paths registered (read once routes are: at the first request). */
  let registered: Set<string> | undefined;
  app.use('*', async (c, next) => {
    const path = c.req.path;
    const entry = SERVE_ROUTES[path];
    registered ??= new Set(app.routes.map((r) => r.path));
    // A control route that is off is absent, key or not.
    if (entry?.class === 'control' && !registered.has(path)) return c.body(NOT_FOUND_BODY, 404, { 'content-type': 'application/json' });
    // Unknown paths are the API's: under /v1 (or with --api-key-scope all) they too need the key, as vLLM's.
    if (!admitted(config.access, entry?.class ?? 'key', c.req.method, path, c.req.header('authorization'))) {
      return c.body(UNAUTHORIZED_BODY, 401, { 'content-type': 'application/json' });
    }
    if (config.requestIdHeaders) c.env.outgoing.setHeader('x-request-id', c.req.header('x-request-id') ?? randomUUID().replaceAll('-', ''));
    const counted = config.serverLoadTracking === true && generationEndpoint(c.req.method, c.req.path) !== null;
    if (!counted) return next();
    inFlight++;
    try {
      await next();
    } finally {
      inFlight--;
    }
  });

  app.use(
    '*',
    declaredBodyLimit({
      maxSize: config.maxBodyBytes,
      onError: (c) =>
        c.body(errorJson(413, `Request body is larger than ${config.maxBodyBytes} bytes.`, 'Request Entity Too Large'), 413, {
          'content-type': 'application/json',
        }),
    }),
  );

  app.post('/v1/completions', generate('completion'));
  app.post('/v1/chat/completions', generate('chat'));
  app.get('/health', (c) => c.body(null, 200));
  app.get(OWN_HEALTH_PATH, (c) => c.body(null, 200));
  // AIPerf's mock server's endpoints beside vLLM's.
  const pooling = poolingEndpoints({
    ...config.pooling,
    resolveModel,
    encode: encodePrompt,
    checkTokenIds,
    checkInputLength: (tokens) => checkPromptLength(tokens, 'pooling'),
  });
  // A capture of the same route, model and inputs answers first (see pooledReplay.ts).
  const pooledReplay = { ...config.pooling, resolver, resolveModel, mockerMetrics: config.mockerMetrics, capturedHeaders };
  const poolingRoute = (kind: PoolingKind, synthetic: PooledRequest['synthetic']) => async (c: Context<Env>) => {
    const { bytes, body } = await readApiJson(c);
    const forward = () => forwardMiss(c.env.incoming, bytes, c.env.outgoing);
    await answerPooled(pooledReplay, c.env.outgoing, { url: c.req.path, kind, body, requestId: requestIdFor(c, body ?? {}), synthetic, forward });
    return RESPONSE_ALREADY_SENT;
  };
  app.post('/v1/embeddings', poolingRoute('embeddings', pooling.embeddings));
  app.post('/v1/ranking', poolingRoute('rerank', pooling.nimRanking));
  app.post('/rerank', poolingRoute('rerank', pooling.teiRerank));
  app.post('/v2/rerank', poolingRoute('rerank', pooling.cohereRerank));
  // vLLM answers /v1/rerank as /v2/rerank (one handler): so does the synthetic answer.
  app.post('/v1/rerank', poolingRoute('rerank', pooling.cohereRerank));
  const tgi = tgiEndpoints(runCompletion, tokenizer);
  const tgiRoute = (serve: (res: ServerResponse, body: Json, arrivalMs: number) => Promise<void>) => async (c: Context<Env>) => {
    const arrivalMs = arrivalOf(c.env.incoming) ?? performance.now();
    await serve(c.env.outgoing, (await readApiJson(c)).body, arrivalMs);
    return RESPONSE_ALREADY_SENT;
  };
  app.post('/generate', tgiRoute(tgi.generate));
  app.post('/generate_stream', tgiRoute(tgi.generateStream));
  app.post('/v1/custom-multimodal', tgiRoute(tgi.customMultimodal));
  app.get('/', (c) =>
    c.json({
      message: 'mocker: a vLLM-compatible engine simulator',
      version: (JSON.parse(config.versionJson) as { version: string }).version,
      model: config.servedModels[0],
    }),
  );
  if (config.runtime && config.controlRoutes) app.route('/mocker/config', mockerConfigRoutes(config.runtime));
  app.get('/mocker/engine', (c) => c.json({ ...engine.state(), config: config.settings }));
  if (config.pd.role !== 'agg') {
    app.post(KV_PULL_PATH, async (c) => {
      const req = parseBody(kvPullRequest, (await readJson(c)).body);
      if (req.remote_engine_id !== config.pd.endpoint().engineId || !engine.releaseKvHold(req.remote_request_id)) {
        throw new ApiError(
          404,
          `No KV blocks held for request ${JSON.stringify(req.remote_request_id.slice(0, 100))} of this engine (unknown, already pulled, or expired).`,
          'NotFoundError',
        );
      }
      return c.json({ released: true });
    });
  }
  // Event hashes as decimal strings: they are u64 and a JSON number would round them.
  app.get('/mocker/kv-blocks', (c) => c.json({ ranks: engine.cachedBlockEventHashes().map((hashes, rank) => ({ rank, block_hashes: hashes.map(String) })) }));
  app.get('/load', (c) => c.json({ server_load: inFlight }));
  if (config.controlRoutes) {
    app.post('/reset_prefix_cache', (c) => {
      const resetRunning = c.req.query('reset_running_requests');
      if (resetRunning !== undefined && !['true', 'false'].includes(resetRunning.toLowerCase())) {
        throw badRequest(`reset_running_requests must be true or false, got "${resetRunning}".`, 'reset_running_requests');
      }
      // As newer vLLM: a reset that blocks still held by requests prevent is a 409, not a silent 200.
      if (!engine.resetPrefixCache(resetRunning?.toLowerCase() === 'true')) {
        throw new ApiError(
          409,
          'Prefix cache reset failed: running requests still hold KV cache blocks (retry when idle, or pass ?reset_running_requests=true).',
          'Conflict',
        );
      }
      return c.body(null, 200);
    });
  }
  app.post('/tokenize', async (c) => {
    const req = parseBody(tokenizeRequest, (await readApiJson(c)).body);
    resolveModel(req.model);
    if ((req.prompt === undefined) === (req.messages === undefined)) throw badRequest('Either `prompt` or `messages` must be given.');
    const text = req.messages !== undefined ? await renderChatPrompt(req as ChatRequest) : req.prompt!;
    const ids = await encodePrompt(text, req.add_special_tokens ?? req.messages === undefined);
    checkPromptLength(ids.length, 'tokenize');
    const tokenStrs = req.return_token_strs ? tokenizer.tokenStrings(ids) : null;
    return c.json({ count: ids.length, max_model_len: config.maxModelLen, tokens: ids, token_strs: tokenStrs });
  });
  app.post('/detokenize', async (c) => {
    const req = parseBody(detokenizeRequest, (await readApiJson(c)).body);
    resolveModel(req.model);
    checkTokenIds(req.tokens);
    return c.json({ prompt: await tokenizer.decode(req.tokens, false) });
  });
  app.get('/metrics', async (c) => {
    if (!config.metrics) return c.body('{"detail":"Not Found"}', 404, { 'content-type': 'application/json' });
    config.engine.flushStatistics();
    return c.body(await config.metrics.text(), 200, { 'content-type': config.metrics.contentType });
  });
  for (const [path, source] of Object.entries(config.backendMetrics ?? {})) {
    app.get(path, async (c) => {
      if ('notFound' in source) return c.body(JSON.stringify({ detail: `Not Found: ${source.notFound}` }), 404, { 'content-type': 'application/json' });
      config.engine.flushStatistics();
      return c.body(await source.text(), 200, { 'content-type': source.contentType });
    });
  }
  app.on(['GET', 'POST'], '/ping', (c) => c.body(null, 200));
  if (config.loraRuntimeUpdating && config.lora) {
    const adapters = config.lora;
    // vLLM answers success as bare text: a Starlette Response with no content type.
    const untyped = (c: Context<Env>, text: string) => {
      c.env.outgoing.writeHead(200, { 'content-length': Buffer.byteLength(text) }).end(text);
      return RESPONSE_ALREADY_SENT;
    };
    app.post('/v1/load_lora_adapter', async (c) => {
      const req = parseBody(loadLoraRequest, (await readApiJson(c)).body);
      return untyped(c, adapters.load(req.lora_name, req.lora_path, undefined, req.load_inplace));
    });
    app.post('/v1/unload_lora_adapter', async (c) => untyped(c, adapters.unload(parseBody(unloadLoraRequest, (await readApiJson(c)).body).lora_name)));
  }
  app.get('/version', (c) => c.body(config.versionJson, 200, { 'content-type': 'application/json' }));
  app.get('/v1/models', (c) => {
    const created = Math.floor(Date.now() / 1000);
    const bases = config.servedModels.map((id) => ({
      id,
      root: config.modelRoot,
      parent: null as string | null,
      max_model_len: config.maxModelLen as number | null,
    }));
    const data = [...bases, ...(config.lora?.cards() ?? [])].map(({ id, root, parent, max_model_len }) => ({
      id,
      object: 'model',
      created,
      owned_by: 'vllm',
      root,
      parent,
      max_model_len,
      permission: [
        {
          id: `modelperm-${randomUUID().replaceAll('-', '')}`,
          object: 'model_permission',
          created,
          allow_create_engine: false,
          allow_sampling: true,
          allow_logprobs: true,
          allow_search_indices: false,
          allow_view: true,
          allow_fine_tuning: false,
          organization: '*',
          group: null,
          is_blocking: false,
        },
      ],
    }));
    return c.body(JSON.stringify({ object: 'list', data }), 200, { 'content-type': 'application/json' });
  });

  app.notFound((c) => {
    const allowed = app.routes.filter((r) => r.path === c.req.path && r.method !== 'ALL').map((r) => r.method);
    if (allowed.length > 0) return c.body('{"detail":"Method Not Allowed"}', 405, { 'content-type': 'application/json', allow: allowed.join(', ') });
    return c.body(NOT_FOUND_BODY, 404, { 'content-type': 'application/json' });
  });

  app.onError((err, c) => {
    const res = c.env.outgoing;
    // A client that left mid-upload is ordinary: nobody to answer, nothing to report.
    if (c.env.incoming.destroyed && (err as NodeJS.ErrnoException).code === 'ECONNRESET') return RESPONSE_ALREADY_SENT;
    const apiError = err instanceof ApiError ? err : new ApiError(500, `Internal error: ${err.message}`, 'InternalServerError');
    if (!(err instanceof ApiError)) console.error('mocker serve: unexpected error', err);
    if (res.headersSent) {
      // Mid-stream: vLLM's in-stream error event, then [DONE].
      if (!res.writableEnded) res.end(apiError.streamEvent() + DONE_EVENT);
      return RESPONSE_ALREADY_SENT;
    }
    return c.body(apiError.body(), apiError.status as 400, { 'content-type': 'application/json' });
  });

  // Every route classified, or no server.
  serveRoutes(app);
  return app;
}
