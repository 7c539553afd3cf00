import { RESPONSE_ALREADY_SENT } from '@hono/node-server/utils/response';
import { Hono, type Context } from 'hono';
import type { PoolingKind } from '../store/captureStore.js';
import { answerPooled, type PooledRequest } from './pooledReplay.js';
import { poolingEndpoints } from './poolingEndpoints.js';
import type { Prompts } from './prompts.js';
import { forwardMiss, readApiJson, requestIdFor } from './requestBody.js';
import { on } from './routes.js';
import type { Env, ServeAppConfig } from './serveConfig.js';
import { capturedHeaders } from './streaming.js';

/**
 * AIPerf's mock server's embeddings and ranking endpoints beside vLLM's: a capture of the same route, model and
 * inputs answers first (see pooledReplay.ts), else the synthetic answer (or the upstream, on a forwarded miss).
 */
export function poolingRoutes(config: ServeAppConfig, prompts: Prompts): Hono<Env> {
  const app = new Hono<Env>();
  const resolveModel = (requested: string | null | undefined) => prompts.resolveModel(requested);
  const pooling = poolingEndpoints({
    ...config.pooling,
    resolveModel,
    encode: (text, addSpecialTokens) => prompts.encodePrompt(text, addSpecialTokens),
    checkTokenIds: (ids) => prompts.checkTokenIds(ids),
    checkInputLength: (tokens) => prompts.checkPromptLength(tokens, 'pooling'),
  });
  const pooledReplay = { ...config.pooling, resolver: config.resolver, resolveModel, mockerMetrics: config.mockerMetrics, capturedHeaders };
  const poolingRoute = (kind: PoolingKind, synthetic: PooledRequest['synthetic']) => async (c: Context<Env>) => {
    const { bytes, body } = await readApiJson(c);
    const forward = () => forwardMiss(config, c.env.incoming, bytes, c.env.outgoing);
    await answerPooled(pooledReplay, c.env.outgoing, { url: c.req.path, kind, body, requestId: requestIdFor(c, body ?? {}), synthetic, forward });
    return RESPONSE_ALREADY_SENT;
  };
  on(app, '/v1/embeddings', poolingRoute('embeddings', pooling.embeddings));
  on(app, '/v1/ranking', poolingRoute('rerank', pooling.nimRanking));
  on(app, '/rerank', poolingRoute('rerank', pooling.teiRerank));
  on(app, '/v2/rerank', poolingRoute('rerank', pooling.cohereRerank));
  // vLLM answers /v1/rerank as /v2/rerank (one handler): so does the synthetic answer.
  on(app, '/v1/rerank', poolingRoute('rerank', pooling.cohereRerank));
  return app;
}
