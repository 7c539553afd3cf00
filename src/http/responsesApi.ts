import type { ServerResponse } from 'node:http';
import { RESPONSE_ALREADY_SENT } from '@hono/node-server/utils/response';
import type { Context, Hono } from 'hono';
import { reasoningOf } from '../api/renderCommon.js';
import { outputItems, outputTexts, responseIdOf, responseObject, responsesJson, ResponsesStream, type ResponseEcho } from '../api/renderResponses.js';
import { translateResponsesRequest, type PreviousTurn } from '../api/responsesRequest.js';
import type { ChunkDelta } from '../store/generation.js';
import type { ModelTokenizer } from '../tokenizer/index.js';
import { ApiError } from '../wire/errors.js';
import { abortOnClose, sendJson } from '../wire/http.js';
import { arrivalOf } from '../wire/drain.js';
import type { CapturedAnswer, CapturedAs, EngineRun, ReplayableEndpoint } from './engineRun.js';
import { requestShape } from '../generation/shape.js';
import { readApiJson } from './requestBody.js';
import { ResponseStore } from './responsesStore.js';
import { on } from './routes.js';
import type { Env, Json } from './serveConfig.js';

/**
 * OpenAI's Responses API as vLLM serves it (`POST /v1/responses`, `GET /v1/responses/{id}`, `POST
 * /v1/responses/{id}/cancel`): the request is translated into a chat-completions body and run by the chat path
 * (same prompts, resolver, engine, KV cache and metrics), the engine's tokens rendered as a response object or
 * its event stream. Responses are kept only with `--enable-responses-api-store` (vLLM's
 * VLLM_ENABLE_RESPONSES_API_STORE), in memory.
 */

const SSE_HEADERS = { 'content-type': 'text/event-stream; charset=utf-8' };

/** vLLM's Responses refusal of a prompt the context cannot hold (its own words, param `input`), from the chat path's. */
function promptTooLong(err: ApiError, maxModelLen: number): ApiError | null {
  const match = /^This model's maximum context length is \d+ tokens\. However, your request has (\d+) input tokens\./.exec(err.message);
  if (!match) return null;
  return new ApiError(
    400,
    `The engine prompt length ${match[1]} exceeds the max_model_len ${maxModelLen}. Please reduce prompt.`,
    'invalid_request_error',
    'input',
  );
}

export interface ResponsesDeps {
  /** Answers from the Responses API's own captures (their bytes) or chat's, else runs the engine. */
  runChat: ReplayableEndpoint;
  tokenizer: ModelTokenizer;
  maxModelLen: number;
  storeEnabled: boolean;
}

export function responsesRoutes(app: Hono<Env>, deps: ResponsesDeps): void {
  const store = new ResponseStore();

  /** Runs the chat body; vLLM caps `max_output_tokens` by what the context leaves instead of refusing it. */
  async function start(chat: Json, captured: CapturedAs, arrivalMs: number, signal: AbortSignal): Promise<EngineRun | CapturedAnswer> {
    try {
      return await deps.runChat(chat, captured, arrivalMs, signal);
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      if (err.param === 'max_tokens' && chat.max_tokens !== undefined) {
        const { max_tokens: _cap, ...uncapped } = chat;
        return start(uncapped, captured, arrivalMs, signal);
      }
      throw promptTooLong(err, deps.maxModelLen) ?? err;
    }
  }

  /**
   * Walks the engine's output, handing each planned chunk's chat delta to `onDelta` as its tokens come out;
   * `hideReasoning` (vLLM's `include_reasoning: false`): the reasoning is generated and counted, not shown.
   */
  async function drive(
    run: EngineRun,
    hideReasoning: boolean,
    onDelta: (delta: ChunkDelta) => void,
  ): Promise<{ deltas: ChunkDelta[]; reasoningTokens: number }> {
    const decoder = deps.tokenizer.decodeStream(true);
    const { chunks, tokenIds } = run.plan;
    const deltas: ChunkDelta[] = [];
    let reasoningTokens = 0;
    let next = 0;
    for await (const batch of run.events) {
      for (const { emitted } of batch) {
        while (next < chunks.length && chunks[next].end <= emitted) {
          const start = next === 0 ? 0 : chunks[next - 1].end;
          let delta = chunks[next].delta;
          if (!delta) {
            let content = '';
            for (let i = start; i < chunks[next].end; i++) content += (await decoder.step(tokenIds[i])) ?? '';
            delta = { content };
          }
          if (reasoningOf(delta) !== null) {
            reasoningTokens += chunks[next].end - start;
            if (hideReasoning) {
              const { reasoning: _r, reasoning_content: _rc, ...shown } = delta;
              delta = shown;
            }
          }
          deltas.push(delta);
          onDelta(delta);
          next++;
        }
      }
    }
    return { deltas, reasoningTokens };
  }

  async function create(c: Context<Env>) {
    const res: ServerResponse = c.env.outgoing;
    const arrivalMs = arrivalOf(c.env.incoming) ?? performance.now();
    const abort = abortOnClose(res);
    const { body } = await readApiJson(c);
    const previousTurn = (id: string): PreviousTurn => {
      const { response, messages } = store.get(id);
      return { messages, outputTexts: outputTexts(response.output as Json[]) };
    };
    const { req, chat, messages, toolChoice } = translateResponsesRequest(body, previousTurn, deps.storeEnabled);
    const run = await start(chat, { endpoint: 'responses', shape: requestShape('responses', body) }, arrivalMs, abort.signal);
    // A capture of this very request: its bytes as the engine sent them, a whole answer under a new id (as chat's);
    // nothing stored.
    if ('verbatim' in run) {
      await run.verbatim(res, responseIdOf(req.request_id));
      return RESPONSE_ALREADY_SENT;
    }
    const echo: ResponseEcho = {
      id: responseIdOf(req.request_id),
      createdAt: Math.floor(Date.now() / 1000),
      model: run.model,
      req,
      toolChoice,
      maxOutputTokens: Math.min(req.max_output_tokens ?? Number.POSITIVE_INFINITY, deps.maxModelLen - run.promptIds.length),
    };
    const stream = req.stream === true ? new ResponsesStream(echo) : null;
    if (stream) {
      res.writeHead(200, SSE_HEADERS);
      res.write(stream.opening());
    }
    const { deltas, reasoningTokens } = await drive(run, req.include_reasoning === false, (delta) => {
      const events = stream?.delta(delta);
      if (events && !abort.signal.aborted) res.write(events);
    });
    if (abort.signal.aborted) return RESPONSE_ALREADY_SENT;
    const usage = { input: run.promptIds.length, cached: run.events.cachedPromptTokens, output: run.plan.tokenIds.length, reasoning: reasoningTokens };
    const response = responseObject(echo, outputItems(deltas), run.plan.finishReason === 'length' ? 'incomplete' : 'completed', usage);
    if (deps.storeEnabled && req.store !== false) store.set(echo.id, { response, messages });
    if (stream) res.end(stream.completed(response));
    else sendJson(res, 200, responsesJson(response));
    return RESPONSE_ALREADY_SENT;
  }

  // `on` registers handlers without their path's type: the parameter is there whenever the route matched.
  const stored = (c: Context<Env>) => store.get(c.req.param('response_id') ?? '');
  on(app, '/v1/responses', create);
  on(app, '/v1/responses/:response_id', (c) => c.body(responsesJson(stored(c).response), 200, { 'content-type': 'application/json' }));
  on(app, '/v1/responses/:response_id/cancel', (c) => {
    const { response } = stored(c);
    // Only a background response can be cancelled, and mocker answers none in the background.
    if (response.status !== 'queued' && response.status !== 'in_progress')
      throw new ApiError(400, 'Cannot cancel a synchronous response.', 'invalid_request_error', 'response_id');
    return c.body(responsesJson(response), 200, { 'content-type': 'application/json' });
  });
}
