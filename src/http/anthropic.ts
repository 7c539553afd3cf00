import { randomUUID } from 'node:crypto';
import { log } from '../util/log.js';
import type { ServerResponse } from 'node:http';
import { anthropicCountTokensRequest, anthropicMessagesRequest, countTokensChatBody, messagesChatBody } from '../api/anthropicRequest.js';
import { PlanRenderer } from '../api/planRenderer.js';
import { anthropicError, anthropicMessage, AnthropicStream, anthropicStreamError, countTokensBody } from '../api/renderAnthropic.js';
import { chatRequest, parseBody, type ChatRequest } from '../api/schemas.js';
import type { ChunkDelta } from '../store/generation.js';
import { ApiError } from '../wire/errors.js';
import { abortOnClose, sendJson } from '../wire/http.js';
import type { EngineRun, ReplayableEndpoint } from './engineRun.js';
import { requestShape } from '../generation/shape.js';
import type { Prompts } from './prompts.js';
import type { Json, ServeAppConfig } from './serveConfig.js';

/**
 * Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) as vLLM serves it: the request becomes a
 * chat completions body, run by the chat path (same prompts, resolver and engine), and the chat answer is rendered
 * in Anthropic's shape. The body's own validation failures answer in vLLM's OpenAI shape (its app-wide handler);
 * what fails past them answers `{"type":"error","error":{type,message}}` (vLLM's `translate_error_response`).
 */
/** `runChat` answers from the Messages API's own captures (their bytes) or chat's, else runs the engine. */
export function anthropicEndpoints(runChat: ReplayableEndpoint, config: ServeAppConfig, prompts: Prompts) {
  /** The chat deltas of the run, as the engine completes their tokens (`onDeltas` called for each batch). */
  async function drive(run: EngineRun, signal: AbortSignal, onDeltas: (deltas: ChunkDelta[]) => void): Promise<void> {
    // Chat's default skip_special_tokens: a Messages request cannot set it.
    const renderer = new PlanRenderer(run.ctx, [run.promptIds], [[run.plan]], config.tokenizer, true, true);
    for await (const batch of run.events) {
      for (const { emitted } of batch) {
        const deltas = await renderer.chatDeltas(0, emitted);
        if (!signal.aborted && deltas.length > 0) onDeltas(deltas);
      }
    }
  }

  const counts = (run: EngineRun) => ({
    promptTokens: run.promptIds.length,
    outputTokens: run.plan.tokenIds.length,
    cachedTokens: config.promptTokensDetails ? run.events.cachedPromptTokens : null,
  });

  async function answer(res: ServerResponse, body: Json, chat: Json, stream: boolean, arrivalMs: number): Promise<void> {
    const abort = abortOnClose(res);
    const run = await runChat(chat, { endpoint: 'messages', shape: requestShape('messages', body) }, arrivalMs, abort.signal);
    // A capture of this very request: its bytes as the engine sent them, a whole answer under a new id (as chat's).
    if ('verbatim' in run) return run.verbatim(res, `chatcmpl-${typeof chat.request_id === 'string' ? chat.request_id : randomUUID().replaceAll('-', '')}`);
    const { id } = run.ctx;
    if (!stream) {
      const deltas: ChunkDelta[] = [];
      await drive(run, abort.signal, (more) => deltas.push(...more));
      if (!abort.signal.aborted) sendJson(res, 200, anthropicMessage(id, run.model, run.plan, deltas, counts(run)));
      return;
    }
    const events = new AnthropicStream(id, run.model);
    res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8' });
    res.write(events.start(run.promptIds.length));
    try {
      await drive(run, abort.signal, (deltas) => res.write(deltas.map((d) => events.delta(d)).join('')));
    } catch (err) {
      if (!res.writableEnded) res.end(anthropicStreamError((err as Error).message));
      return;
    }
    if (!abort.signal.aborted) res.end(events.end(run.plan, counts(run)));
  }

  /** Errors past the body's validation, before any byte went out, in the Anthropic error shape. */
  async function translatingErrors(res: ServerResponse, serve: () => Promise<void>): Promise<void> {
    try {
      await serve();
    } catch (err) {
      if (res.headersSent) throw err;
      const apiError = err instanceof ApiError ? err : new ApiError(500, (err as Error).message, 'InternalServerError');
      if (!(err instanceof ApiError))
        log('error', `mocker serve: unexpected error in /v1/messages: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
      sendJson(res, apiError.status, anthropicError(apiError));
    }
  }

  /** `POST /v1/messages`. */
  async function messages(res: ServerResponse, body: Json, arrivalMs: number): Promise<void> {
    const req = parseBody(anthropicMessagesRequest, body);
    // The chat completion's id is vLLM's Messages id: its X-Request-Id when the request has one.
    const requestId = res.req.headers['x-request-id'];
    const chat = { ...messagesChatBody(req), ...(typeof requestId === 'string' && requestId ? { request_id: requestId } : {}) };
    await translatingErrors(res, () => answer(res, body, chat, req.stream === true, arrivalMs));
  }

  /** `POST /v1/messages/count_tokens`: the tokens of the prompt `/v1/messages` would run. */
  async function countTokens(res: ServerResponse, body: Json): Promise<void> {
    const req = parseBody(anthropicCountTokensRequest, body);
    await translatingErrors(res, async () => {
      const chat = parseBody(chatRequest, countTokensChatBody(req)) as ChatRequest;
      prompts.resolveModel(chat.model);
      const ids = await prompts.encodePrompt(await prompts.renderChatPrompt(chat), chat.add_special_tokens ?? false);
      sendJson(res, 200, countTokensBody(ids.length));
    });
  }

  return { messages, countTokens };
}
