import { randomUUID } from 'node:crypto';
import { log } from '../util/log.js';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { RESPONSE_ALREADY_SENT } from '@hono/node-server/utils/response';
import { Hono, type Context } from 'hono';
import type { EndpointKind } from '../generation/plan.js';
import type { Resolution } from '../generation/resolver.js';
import { requestShape } from '../generation/shape.js';
import { pullRemoteKv } from '../pd/kvTransfer.js';
import { includesUsage, responseId, type RenderContext } from '../api/render.js';
import type { KvTransferParams } from '../api/schemas.js';
import { LoopSlice } from '../util/loopSlice.js';
import { arrivalOf } from '../wire/drain.js';
import { ApiError } from '../wire/errors.js';
import { abortOnClose } from '../wire/http.js';
import { breaksMidstream, FAULT_HEADER, faultResponse, INJECTED_HEADER, midstreamError, StreamBreaker } from './faults.js';
import type { Prompts } from './prompts.js';
import { forwardMiss, readApiJson, requestIdFor } from './requestBody.js';
import { on } from './routes.js';
import type { Env, Json, ServeAppConfig } from './serveConfig.js';
import type { EngineResponses } from './streaming.js';
import { responsesRoutes } from './responsesApi.js';
import { tgiEndpoints } from './tgi.js';
import { anthropicEndpoints } from './anthropic.js';
import type { CapturedAs, EngineRun, ReplayableEndpoint, RunEndpoint } from './engineRun.js';
import { generateTokensEndpoint } from './generateTokens.js';

/** What the generation routes share: the server's configuration, the request checks and the engine's answers. */
export interface GenerationDeps {
  config: ServeAppConfig;
  prompts: Prompts;
  responses: EngineResponses;
}

/** A decode request's pull from its prefill engine; on failure the prompt is recomputed here (vLLM's default policy). */
async function pullKv(config: ServeAppConfig, params: KvTransferParams): Promise<boolean> {
  const outcome = await pullRemoteKv(
    params,
    config.pd.peers,
    config.pd.pullTimeoutMs,
    config.access.key === undefined ? undefined : `Bearer ${config.access.key}`,
  );
  config.mockerMetrics?.kvPull(outcome);
  if (!outcome.ok) log('warning', `mocker: KV pull failed (${outcome.reason}): ${outcome.detail}; recomputing the prompt locally`);
  return outcome.ok;
}

/** `/v1/completions` and `/v1/chat/completions`: prepared, resolved (capture, random or forwarded), run and answered. */
async function generate(deps: GenerationDeps, kind: EndpointKind, c: Context<Env>) {
  const { config } = deps;
  const res = c.env.outgoing;
  const reqNode: IncomingMessage = c.env.incoming;
  const arrivalMs = arrivalOf(reqNode) ?? performance.now();
  // Drawn in arrival order (reproducible by seed), answered once the request is known valid.
  const fault = config.runtime?.faults.draw(c.req.header(FAULT_HEADER)) ?? null;
  // Watched from the start: a client can leave while its prompt is tokenized, looked up or its KV pulled.
  const abort = abortOnClose(res);
  const { bytes: bodyBytes, body } = await readApiJson(c);
  // A batch of 10,000 prompts is prepared, planned and submitted in slices: the loop turns meanwhile.
  const slice = new LoopSlice();
  const p = await deps.prompts.prepare(kind, body, c.req.header('x-data-parallel-rank'), slice);
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
  const budget = deps.prompts.outputBudget();
  const resolutions: Resolution[] = [];
  for (const [i, promptIds] of p.prompts.entries()) {
    const resolution = await config.resolver.resolve(p.params[i], p.model, promptIds, shape, budget);
    config.mockerMetrics?.captureLookup(resolution.lookup);
    if (resolution.type === 'error') throw resolution.error;
    resolutions.push(resolution);
    await slice.pause();
  }
  const batched = p.prompts.length > 1;
  // The upstream answers a batch whole when one of its prompts is to be forwarded.
  if (resolutions.some((r) => r.type === 'forward')) {
    await forwardMiss(config, reqNode, bodyBytes, res);
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
  const remotePrefill = !batched && p.kvTransfer?.do_remote_prefill === true && (await pullKv(config, p.kvTransfer));
  // A capture's plans are rendered in its engine's own shape (what replay synthesizes looks like what it captured).
  const wire = planned[0].wire ?? config.wire;
  if (wire !== config.wire)
    p.includeUsage = includesUsage(wire, p.stream, (body as { stream_options?: { include_usage?: boolean | null } | null }).stream_options);
  const id = responseId(wire, kind, requestIdFor(c, body));
  const ctx: RenderContext = {
    kind,
    wire,
    id,
    created: Math.floor(Date.now() / 1000),
    model: p.model,
    returnTokenIds: p.returnTokenIds,
    promptTokenIds: p.prompts[0],
  };
  // Captured bytes carry token ids only when the engine returned them, and never fresh kv_transfer_params.
  const capture = batched ? null : planned[0].verbatim;
  const verbatim = capture && (!p.returnTokenIds || capture.tokenSource === 'engine') && !p.kvTransfer?.do_remote_decode ? capture : null;
  if (verbatim) await deps.responses.verbatim(res, ctx, p, verbatim, planned[0].plans, arrivalMs, abort.signal, remotePrefill);
  else
    await deps.responses.rendered(
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
}

/** A body prepared, resolved and ready to run (or serve from its capture), for the endpoints of runThrough and replayThrough. */
async function resolveThrough(deps: GenerationDeps, kind: EndpointKind, body: Json, captured?: CapturedAs) {
  const { config } = deps;
  const p = await deps.prompts.prepare(kind, body, undefined);
  const shape = captured?.shape ?? requestShape(kind, body);
  const resolution = await config.resolver.resolve(p.params[0], p.model, p.prompts[0], shape, deps.prompts.outputBudget(), captured?.endpoint);
  config.mockerMetrics?.captureLookup(resolution.lookup);
  if (resolution.type === 'error') throw resolution.error;
  if (resolution.type === 'forward')
    throw new ApiError(501, 'This endpoint is answered from captures or random tokens only: it is not forwarded to the upstream.', 'NotImplementedError');
  const ctx: RenderContext = {
    kind,
    // These endpoints render their own shapes from the events, not the chat or completions wire.
    wire: config.wire,
    // The body's request_id names it, as vLLM's _base_request_id (the Messages route puts the X-Request-Id header there).
    id: `${kind === 'chat' ? 'chatcmpl' : 'cmpl'}-${typeof body.request_id === 'string' && body.request_id ? body.request_id : randomUUID().replaceAll('-', '')}`,
    created: Math.floor(Date.now() / 1000),
    model: p.model,
    returnTokenIds: false,
    promptTokenIds: p.prompts[0],
  };
  return { p, resolution, ctx };
}

/** A resolved request submitted to the engine: its token events, for the endpoint to render. */
function engineRun(
  deps: GenerationDeps,
  { p, resolution, ctx }: Awaited<ReturnType<typeof resolveThrough>>,
  arrivalMs: number,
  signal: AbortSignal,
): EngineRun {
  return {
    model: p.model,
    promptIds: p.prompts[0],
    plan: resolution.plans[0],
    ctx,
    events: deps.responses.run(ctx, p, null, resolution.plans, arrivalMs, signal),
  };
}

/** The completions (or chat) path for endpoints that render the engine's tokens in their own shape (TGI, multimodal). */
function runThrough(deps: GenerationDeps, kind: EndpointKind): RunEndpoint {
  return async (body, arrivalMs, signal) => {
    return engineRun(deps, await resolveThrough(deps, kind, body), arrivalMs, signal);
  };
}

/**
 * The completions path for an endpoint whose own captures replay it (vLLM's generate): a capture of the same
 * request shape is served byte for byte (its ids restamped, released as the engine emits its tokens), else the
 * engine's tokens are the endpoint's to render.
 */
function replayThrough(deps: GenerationDeps, kind: EndpointKind): ReplayableEndpoint {
  return async (body, captured, arrivalMs, signal) => {
    const resolved = await resolveThrough(deps, kind, body, captured);
    const { p, resolution, ctx } = resolved;
    const capture = resolution.verbatim;
    if (capture && !p.kvTransfer?.do_remote_decode)
      return { verbatim: (res, id) => deps.responses.verbatim(res, { ...ctx, id }, p, capture, resolution.plans, arrivalMs, signal, false) };
    return engineRun(deps, resolved, arrivalMs, signal);
  };
}

/** The generation routes: vLLM's completions and chat completions, OpenAI's Responses, Anthropic's Messages, TGI's and AIPerf's multimodal beside them. */
export function generationRoutes(deps: GenerationDeps): Hono<Env> {
  const app = new Hono<Env>();
  on(app, '/v1/completions', (c) => generate(deps, 'completion', c));
  on(app, '/v1/chat/completions', (c) => generate(deps, 'chat', c));
  const tgi = tgiEndpoints(runThrough(deps, 'completion'), deps.config.tokenizer);
  // A route answered by a handler of the parsed JSON body (the endpoints that render their own shapes).
  const bodyRoute = (serve: (res: ServerResponse, body: Json, arrivalMs: number) => Promise<void>) => async (c: Context<Env>) => {
    const arrivalMs = arrivalOf(c.env.incoming) ?? performance.now();
    await serve(c.env.outgoing, (await readApiJson(c)).body, arrivalMs);
    return RESPONSE_ALREADY_SENT;
  };
  on(app, '/generate', bodyRoute(tgi.generate));
  on(app, '/generate_stream', bodyRoute(tgi.generateStream));
  on(app, '/v1/custom-multimodal', bodyRoute(tgi.customMultimodal));
  const anthropic = anthropicEndpoints(replayThrough(deps, 'chat'), deps.config, deps.prompts);
  on(app, '/v1/messages', bodyRoute(anthropic.messages));
  on(app, '/v1/messages/count_tokens', bodyRoute(anthropic.countTokens));
  const { config } = deps;
  responsesRoutes(app, {
    runChat: replayThrough(deps, 'chat'),
    tokenizer: config.tokenizer,
    maxModelLen: config.maxModelLen,
    storeEnabled: config.responsesStore,
  });
  const generateTokens = generateTokensEndpoint(replayThrough(deps, 'completion'), deps.config.maxModelLen);
  on(app, '/inference/v1/generate', async (c) => {
    const arrivalMs = arrivalOf(c.env.incoming) ?? performance.now();
    const { body } = await readApiJson(c);
    await generateTokens(c.env.outgoing, body, requestIdFor(c, body), arrivalMs);
    return RESPONSE_ALREADY_SENT;
  });
  return app;
}
