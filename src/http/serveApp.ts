import { RESPONSE_ALREADY_SENT } from '@hono/node-server/utils/response';
import { log } from '../util/log.js';
import { Hono, type ErrorHandler } from 'hono';
import { DONE_EVENT } from '../api/render.js';
import { ApiError } from '../wire/errors.js';
import { adminRoutes } from './adminRoutes.js';
import { generationRoutes } from './generationRoutes.js';
import { loraRoutes } from './loraRoutes.js';
import { useServeMiddleware, type ServerLoad } from './middleware.js';
import { modelRoutes } from './modelRoutes.js';
import { poolingRoutes } from './poolingRoutes.js';
import { Prompts } from './prompts.js';
import { serveRoutes, unmatched } from './routes.js';
import type { Env, ServeAppConfig } from './serveConfig.js';
import { EngineResponses } from './streaming.js';

/** An error a route threw, answered in vLLM's format: as the response's body, or mid-stream as its last event. */
const answerError: ErrorHandler<Env> = (err, c) => {
  const res = c.env.outgoing;
  // A client that left mid-upload is ordinary: nobody to answer, nothing to report.
  if (c.env.incoming.destroyed && (err as NodeJS.ErrnoException).code === 'ECONNRESET') return RESPONSE_ALREADY_SENT;
  const apiError = err instanceof ApiError ? err : new ApiError(500, `Internal error: ${err.message}`, 'InternalServerError');
  if (!(err instanceof ApiError)) log('error', `mocker serve: unexpected error: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
  if (res.headersSent) {
    // Mid-stream: vLLM's in-stream error event, then [DONE].
    if (!res.writableEnded) res.end(apiError.streamEvent() + DONE_EVENT);
    return RESPONSE_ALREADY_SENT;
  }
  return c.body(apiError.body(), apiError.status as 400, { 'content-type': 'application/json' });
};

/**
 * The vLLM-compatible server of `mocker serve`: validation and tokenization, then one `Engine` for timing
 * and an `OutputResolver` for content. It never looks inside either. Its routes come in families, each its own
 * sub-app; the middleware every request passes is registered first.
 */
export function createServeApp(config: ServeAppConfig): Hono<Env> {
  const app = new Hono<Env>();
  const load: ServerLoad = { inFlight: 0 };
  useServeMiddleware(app, config, load);
  const prompts = new Prompts(config);
  app.route('/', generationRoutes({ config, prompts, responses: new EngineResponses(config) }));
  app.route('/', poolingRoutes(config, prompts));
  app.route('/', modelRoutes(config, prompts));
  app.route('/', adminRoutes(config, load));
  if (config.loraRuntimeUpdating && config.lora) app.route('/', loraRoutes(config.lora));
  app.notFound(unmatched(app));
  app.onError(answerError);
  // Every route classified, or no server.
  serveRoutes(app);
  return app;
}
