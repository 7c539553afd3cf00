import { RESPONSE_ALREADY_SENT } from '@hono/node-server/utils/response';
import { Hono } from 'hono';
import { parseBody } from '../api/schemas.js';
import { KV_PULL_PATH, kvPullRequest } from '../pd/kvTransfer.js';
import { OWN_HEALTH_PATH } from '../wire/drain.js';
import { ApiError, badRequest } from '../wire/errors.js';
import { answerHealthy } from '../wire/http.js';
import type { ServerLoad } from './middleware.js';
import { mockerConfigRoutes } from './mockerConfig.js';
import { readJson } from './requestBody.js';
import { NOT_FOUND_BODY, on } from './routes.js';
import type { Env, ServeAppConfig } from './serveConfig.js';

/** Health, version and the server's description: what a load balancer or a user asks before the API. */
function statusRoutes(app: Hono<Env>, config: ServeAppConfig, load: ServerLoad): void {
  on(app, '/health', (c) => c.body(null, 200));
  on(app, OWN_HEALTH_PATH, (c) => {
    answerHealthy(c.env.outgoing);
    return RESPONSE_ALREADY_SENT;
  });
  on(app, '/ping', (c) => c.body(null, 200));
  on(app, '/version', (c) => c.body(config.versionJson, 200, { 'content-type': 'application/json' }));
  on(app, '/', (c) =>
    c.json({
      message: 'mocker: a vLLM-compatible engine simulator',
      version: (JSON.parse(config.versionJson) as { version: string }).version,
      model: config.servedModels[0],
    }),
  );
  on(app, '/load', (c) => c.json({ server_load: load.inFlight }));
}

/** `/metrics` (vLLM's exposition) and the other systems' expositions of the same engine, by path. */
function metricsRoutes(app: Hono<Env>, config: ServeAppConfig): void {
  on(app, '/metrics', async (c) => {
    if (!config.metrics) return c.body(NOT_FOUND_BODY, 404, { 'content-type': 'application/json' });
    config.engine.flushStatistics();
    return c.body(await config.metrics.text(), 200, { 'content-type': config.metrics.contentType });
  });
  for (const [path, source] of Object.entries(config.backendMetrics ?? {})) {
    on(app, path, async (c) => {
      if ('notFound' in source) return c.body(JSON.stringify({ detail: `Not Found: ${source.notFound}` }), 404, { 'content-type': 'application/json' });
      config.engine.flushStatistics();
      return c.body(await source.text(), 200, { 'content-type': source.contentType });
    });
  }
}

/** A decode engine's pull of the KV blocks a prefill answer named: frees the hold (PD engines only). */
function kvPullRoute(app: Hono<Env>, config: ServeAppConfig): void {
  on(app, KV_PULL_PATH, async (c) => {
    const req = parseBody(kvPullRequest, (await readJson(c)).body);
    if (req.remote_engine_id !== config.pd.endpoint().engineId || !config.engine.releaseKvHold(req.remote_request_id)) {
      throw new ApiError(
        404,
        `No KV blocks held for request ${JSON.stringify(req.remote_request_id.slice(0, 100))} of this engine (unknown, already pulled, or expired).`,
        'NotFoundError',
      );
    }
    return c.json({ released: true });
  });
}

/** vLLM's dev-mode `/reset_prefix_cache` (a control route). */
function resetPrefixCacheRoute(app: Hono<Env>, config: ServeAppConfig): void {
  on(app, '/reset_prefix_cache', (c) => {
    const resetRunning = c.req.query('reset_running_requests');
    if (resetRunning !== undefined && !['true', 'false'].includes(resetRunning.toLowerCase())) {
      throw badRequest(`reset_running_requests must be true or false, got "${resetRunning}".`, 'reset_running_requests');
    }
    // As newer vLLM: a reset that blocks still held by requests prevent is a 409, not a silent 200.
    if (!config.engine.resetPrefixCache(resetRunning?.toLowerCase() === 'true')) {
      throw new ApiError(
        409,
        'Prefix cache reset failed: running requests still hold KV cache blocks (retry when idle, or pass ?reset_running_requests=true).',
        'Conflict',
      );
    }
    return c.body(null, 200);
  });
}

/**
 * The routes beside the API: health, version, load, metrics, mocker's own (`/mocker/engine`, `/mocker/kv-blocks`,
 * `/mocker/config`, the KV pull) and the control routes, each only where the configuration enables it.
 */
export function adminRoutes(config: ServeAppConfig, load: ServerLoad): Hono<Env> {
  const app = new Hono<Env>();
  statusRoutes(app, config, load);
  metricsRoutes(app, config);
  if (config.runtime && config.controlRoutes) app.route('/mocker/config', mockerConfigRoutes(config.runtime));
  on(app, '/mocker/engine', (c) => c.json({ ...config.engine.state(), config: config.settings }));
  // Event hashes as decimal strings: they are u64 and a JSON number would round them.
  on(app, '/mocker/kv-blocks', (c) =>
    c.json({ ranks: config.engine.cachedBlockEventHashes().map((hashes, rank) => ({ rank, block_hashes: hashes.map(String) })) }),
  );
  if (config.pd.role !== 'agg') kvPullRoute(app, config);
  if (config.controlRoutes) resetPrefixCacheRoute(app, config);
  return app;
}
