import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { forwardExchange } from '../capture/forward.js';
import { UpstreamPool } from '../capture/upstreamHttp.js';
import { RecorderThread } from '../capture/recorderThread.js';
import { listeningServer, OWN_HEALTH_PATH } from '../wire/drain.js';
import { errorJson } from '../wire/errors.js';
import { answerHealthy, readBody, sendJson, sendTooLarge } from '../wire/http.js';
import { admitted, classOf, decodedPath, DEFAULT_API_KEY_SCOPE, UNAUTHORIZED_BODY, type ApiKeyPolicy, type ClassifiedRoute } from '../wire/access.js';
import { SERVE_ROUTES } from '../http/routes.js';
import { serverTls, upstreamTls, type TlsFiles } from '../wire/tls.js';
import { CaptureStore } from '../store/captureStore.js';
import { loadModelFiles, maxModelLenOf, ModelNotFoundError } from '../tokenizer/index.js';
import { describeEngine, runColumns, UpstreamEngine } from '../capture/upstreamEngine.js';
import type { Running } from './serve.js';
import { RecordingSink } from './shutdown.js';

export interface CaptureOptions {
  upstream: string;
  captures: string;
  host: string;
  port: number;
  model?: string;
  label?: string;
  upstreamTimeoutMs: number;
  maxBodyBytes: number;
  redactHeaders: string[];
  /** Store token ids and timing only: no text, request body or response bytes. */
  redactBodies?: boolean;
  /** --api-key and --api-key-scope (default: no key). */
  access?: ApiKeyPolicy;
  /** --ssl-keyfile and the rest: HTTPS (default: plain HTTP). */
  tls?: TlsFiles;
  /** --upstream-ca-certs: the CAs an https: upstream's certificate is checked against. Default: Node's. */
  upstreamCaCerts?: string;
  /** The tokenizer's files themselves (`rerun`: the golden run's), instead of finding them from --model or the upstream. */
  tokenizer?: { name: string; files: Map<string, Buffer> };
  /** No startup line nor periodic counts (`rerun` prints its own progress). */
  quiet?: boolean;
}

/**
 * Every route of the capture proxy, with its access class (access.ts), by path (any method): what `serve` keeps
 * public stays public through it; mocker's own routes (`/mocker/*`: runtime control, KV pulls) are never
 * forwarded, whatever the upstream (a 404 from the proxy itself, but for its own health check, which it
 * answers); everything else is forwarded as the API's.
 */
export const CAPTURE_ROUTES: readonly ClassifiedRoute[] = [
  ...[
    ...new Set(
      Object.entries(SERVE_ROUTES)
        .filter(([path, r]) => r.class === 'public' && !path.startsWith('/mocker/'))
        .map(([path]) => path),
    ),
  ].map((path) => ({ method: '*', path, class: 'public' as const })),
  { method: 'GET', path: OWN_HEALTH_PATH, class: 'public' },
  { method: '*', path: '/mocker/*', class: 'control' },
  { method: '*', path: '/*', class: 'key' },
];

const STATS_INTERVAL_MS = 10_000;

/** The tokenizer stored with the run (its files only), and whether it stands in for the engine's own until that is named. */
interface CaptureTokenizer {
  model: { name: string; files: Map<string, Buffer> };
  standIn: boolean;
}

/**
 * The tokenizer's files only: the recorder's worker builds the tokenizer itself. Built here, it would be garbage
 * once the run started, and its native destructor, run when a collection finds it, held this event loop, every
 * client's stream, for 70-150 ms (measured on 2026-11-28); building one takes 0.8 s.
 */
function captureTokenizer(opts: CaptureOptions, upstream: UpstreamEngine): CaptureTokenizer {
  const identity = upstream.identity;
  if (opts.tokenizer !== undefined) return { model: opts.tokenizer, standIn: false };
  if (opts.model !== undefined) return { model: loadModelFiles(opts.model), standIn: false };
  let found: CaptureTokenizer;
  try {
    // The bundled tokenizer stands in for the engine's own, which may be found once the engine answers.
    found = { model: loadModelFiles(identity.modelRoot), standIn: identity.modelRoot === undefined };
  } catch (err) {
    if (!(err instanceof ModelNotFoundError)) throw err;
    console.warn(`mocker capture: ${err.message}; using the bundled tokenizer (pass --model to choose)`);
    found = { model: loadModelFiles(), standIn: false };
  }
  if (identity.kind === 'unknown') console.warn(`mocker capture: using the bundled tokenizer until ${upstream.url.origin} answers and names its model`);
  return found;
}

/** The capture run, started in the file; the proxy's own connection only starts it. */
function startRun(opts: CaptureOptions, upstream: UpstreamEngine, model: CaptureTokenizer['model']): number {
  const identity = upstream.identity;
  const store = CaptureStore.open(opts.captures);
  try {
    return store.startRun(
      {
        kind: 'capture',
        upstream: upstream.url.href,
        label: opts.label,
        ...runColumns(identity),
        maxModelLen: identity.maxModelLen ?? maxModelLenOf(model.files),
        tokenizerName: model.name,
      },
      model.files,
    );
  } finally {
    // Recording (parsing, token ids, the writes) runs in a worker thread on its own connection, off the event
    // loop that streams every client's bytes.
    store.close();
  }
}

/** Once the upstream answers and names itself: its identity stored, and its own tokenizer where the bundled one stood in. */
function followIdentity(opts: CaptureOptions, upstream: UpstreamEngine, thread: RecorderThread, standIn: boolean): void {
  upstream.onIdentified((later) => {
    if (!opts.quiet) console.log(`mocker capture: ${upstream.url.origin} answers now: ${describeEngine(later)}`);
    const failed = (what: string) => (err: unknown) => console.error(`mocker capture: could not store ${what} in ${opts.captures}: ${(err as Error).message}`);
    thread.updateRun(runColumns(later)).catch(failed("the engine's identity"));
    if (!standIn || later.modelRoot === undefined) return;
    try {
      const own = loadModelFiles(later.modelRoot);
      thread
        .setTokenizer(own.name, own.files)
        .then(() => opts.quiet || console.log(`mocker capture: tokenizer ${own.name} from now on`), failed('the tokenizer'));
    } catch (err) {
      console.warn(`mocker capture: ${(err as Error).message}; keeping the bundled tokenizer (pass --model to choose)`);
    }
  });
}

/** The proxy's request handler: its own health, the access check, the body limit, then the exchange forwarded and recorded. */
function captureHandler(opts: CaptureOptions, upstream: UpstreamEngine, connections: UpstreamPool, sink: RecordingSink['sink']) {
  const access = opts.access ?? { scope: DEFAULT_API_KEY_SCOPE };
  return (req: IncomingMessage, res: ServerResponse) => {
    const path = decodedPath(req.url ?? '/');
    if (path === null)
      return void sendJson(res, 400, errorJson(400, `Invalid request path ${JSON.stringify((req.url ?? '').slice(0, 200))}: it does not percent-decode.`));
    // The proxy's own health, not its upstream's (whose /health is forwarded): it takes requests. Never forwarded.
    if (path === OWN_HEALTH_PATH) return void (req.method === 'GET' ? answerHealthy(res) : sendJson(res, 405, '{"detail":"Method Not Allowed"}'));
    // Every path matches the catch-all.
    const routeClass = classOf(CAPTURE_ROUTES, path)!;
    // The capture has no control routes to enable: the upstream's are not this proxy's to expose.
    if (routeClass === 'control') return void sendJson(res, 404, '{"detail":"Not Found"}');
    if (!admitted(access, routeClass, req.method ?? 'GET', path, req.headers.authorization)) return void sendJson(res, 401, UNAUTHORIZED_BODY);
    readBody(req, opts.maxBodyBytes).then(
      (body) => {
        if (body === null) return sendTooLarge(res, opts.maxBodyBytes);
        if (res.destroyed) return;
        forwardExchange({ upstream, connections }, req, body, res, sink).catch((err: unknown) => {
          console.error(`mocker capture: ${req.method} ${req.url}: ${(err as Error).message}`);
          res.destroy();
        });
      },
      () => res.destroy(),
    );
  };
}

/** Every STATS_INTERVAL_MS with new exchanges: what this run recorded and what the file holds. */
function logCounts(opts: CaptureOptions, thread: RecorderThread, recording: RecordingSink): NodeJS.Timeout {
  let lastLogged = 0;
  const timer = setInterval(() => {
    const n = recording.recorded.exchanges;
    if (n === lastLogged) return;
    lastLogged = n;
    thread.counts().then(
      (c) => console.log(`mocker capture: ${n} exchanges this run; file holds ${c.complete} complete, ${c.failed} failed, ${c.aborted} aborted`),
      (err: unknown) => console.error(`mocker capture: could not count the captures in ${opts.captures}: ${(err as Error).message}`),
    );
  }, STATS_INTERVAL_MS);
  timer.unref();
  return timer;
}

/**
 * `mocker capture`: a transparent proxy that records every generation into the capture file. It listens before
 * it touches the file (a taken port leaves nothing behind); requests that come meanwhile wait for it.
 */
export async function startCapture(opts: CaptureOptions): Promise<Running> {
  const tls = serverTls(opts.tls);
  const { drain, server } = await listeningServer(opts.host, opts.port, tls);
  const port = (server.address() as AddressInfo).port;
  let recorder: RecorderThread | undefined;
  try {
    const upstream = await UpstreamEngine.identify(new URL(opts.upstream), upstreamTls(opts.upstreamCaCerts));
    const identity = upstream.identity;
    if (identity.kind === 'unknown') console.warn(`mocker capture: ${upstream.url.origin} does not answer yet; its kind is asked again when it first answers`);
    const { model, standIn } = captureTokenizer(opts, upstream);
    const runId = startRun(opts, upstream, model);
    const thread = await RecorderThread.start({
      captures: opts.captures,
      runId,
      upstream: upstream.url.href,
      upstreamTls: upstream.tls,
      redacted: opts.redactHeaders.map((h) => h.toLowerCase()),
      redactBodies: opts.redactBodies,
      tokenizerFromCapture: opts.tokenizer !== undefined,
    });
    recorder = thread;
    followIdentity(opts, upstream, thread, standIn);
    const recording = new RecordingSink(thread.sink, opts.captures);
    const connections = new UpstreamPool(upstream.url, opts.upstreamTimeoutMs, upstream.tls);
    drain.handle(server, captureHandler(opts, upstream, connections, recording.sink));
    if (!opts.quiet)
      console.log(
        `mocker capture: proxying ${tls ? 'https' : 'http'}://${opts.host}:${port} -> ${upstream.url.href} (${describeEngine(identity)}), recording into ${opts.captures} (run ${runId}, tokenizer ${model.name})`,
      );
    const stats = opts.quiet ? undefined : logCounts(opts, thread, recording);
    return {
      port,
      close: async (graceMs = 0) => {
        clearInterval(stats);
        const drained = await drain.drain(graceMs);
        // The exchanges cut off end (as aborted) once stored; then the recorder checkpoints and closes the file.
        await recording.settled();
        connections.close();
        await thread.close();
        return { ...drained, recorded: recording.recorded };
      },
    };
  } catch (err) {
    await drain.drain(0);
    await recorder?.close();
    throw err;
  }
}
