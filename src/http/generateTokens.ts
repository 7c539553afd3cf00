import type { ServerResponse } from 'node:http';
import {
  generateTokensChunk,
  generateTokensId,
  generateTokensRequest,
  generateTokensResponse,
  generateTokensUsageChunk,
  type GenerateTokensContext,
  type GenerateTokensRequest,
} from '../api/generateTokens.js';
import { DONE_EVENT } from '../api/render.js';
import { abortOnClose } from '../wire/http.js';
import { requestShape } from '../generation/shape.js';
import type { EngineRun, ReplayableEndpoint } from './engineRun.js';

const SSE_HEADERS = { 'content-type': 'text/event-stream; charset=utf-8' };

/**
 * vLLM's `POST /inference/v1/generate` run by the completions path (the token ids as the prompt), so it queues,
 * shares the KV cache and counts in the metrics as `/v1/completions` does; answered with the engine's output ids.
 */
export function generateTokensEndpoint(runCompletion: ReplayableEndpoint, maxModelLen: number) {
  /** Streams one chunk per engine output that added ids, the last carrying the finish reason. */
  async function stream(res: ServerResponse, run: EngineRun, ctx: GenerateTokensContext, req: GenerateTokensRequest, signal: AbortSignal) {
    res.writeHead(200, SSE_HEADERS);
    res.flushHeaders();
    const { tokenIds, finishReason } = run.plan;
    let sent = 0;
    for await (const batch of run.events) {
      for (const { emitted } of batch) {
        if (emitted <= sent || signal.aborted) continue;
        const finish = emitted === tokenIds.length ? finishReason : null;
        res.write(generateTokensChunk(ctx, tokenIds.slice(sent, emitted), finish, req.continuousUsage ? emitted : null));
        sent = emitted;
      }
    }
    if (signal.aborted) return;
    if (req.includeUsage) res.write(generateTokensUsageChunk(ctx, sent));
    res.end(DONE_EVENT);
  }

  /** `requestId`: X-Request-Id, else the body's `request_id`, else a fresh uuid. */
  return async (res: ServerResponse, body: unknown, requestId: string, arrivalMs: number) => {
    const req = generateTokensRequest(body, maxModelLen);
    const abort = abortOnClose(res);
    const captured = { endpoint: 'generate' as const, shape: requestShape('generate', body as Record<string, unknown>) };
    const run = await runCompletion(req.completion, captured, arrivalMs, abort.signal);
    if ('verbatim' in run) return run.verbatim(res, generateTokensId(requestId));
    const ctx: GenerateTokensContext = {
      id: generateTokensId(requestId),
      model: run.model,
      created: run.ctx.created,
      promptTokens: run.promptIds.length,
    };
    if (req.stream) return stream(res, run, ctx, req, abort.signal);
    for await (const _ of run.events); // the answer is whole once the engine is done
    if (abort.signal.aborted) return;
    const json = generateTokensResponse(ctx, run.plan.tokenIds, run.plan.finishReason || 'stop');
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(json) }).end(json);
  };
}
