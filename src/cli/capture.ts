import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { forwardExchange, type ExchangeSink } from '../capture/forward.js';
import { RecorderThread } from '../capture/recorderThread.js';
import { errorJson } from '../http/errors.js';
import { CaptureStore } from '../store/captureStore.js';
import { loadTokenizer, ModelNotFoundError, type ModelTokenizer } from '../tokenizer/index.js';
import { describeEngine, runColumns, UpstreamEngine } from '../capture/upstreamEngine.js';
import type { Running } from './serve.js';

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
}

const STATS_INTERVAL_MS = 10_000;

function readBody(req: IncomingMessage, limit: number): Promise<Buffer | null> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size > limit) return resolve(null);
      chunks.push(chunk);
    });
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

/** `mocker capture`: a transparent proxy that records every generation into the capture file. */
export async function startCapture(opts: CaptureOptions): Promise<Running> {
  const upstream = await UpstreamEngine.identify(new URL(opts.upstream));
  const identity = upstream.identity;
  if (identity.kind === 'unknown') console.warn(`mocker capture: ${upstream.url.origin} does not answer yet; its kind is asked again when it first answers`);
  let tokenizer: ModelTokenizer;
  /** The bundled tokenizer stands in for the engine's own, which may be found once the engine answers. */
  let standIn = false;
  if (opts.model !== undefined) tokenizer = loadTokenizer(opts.model);
  else {
    try {
      tokenizer = loadTokenizer(identity.modelRoot);
      standIn = identity.modelRoot === undefined;
    } catch (err) {
      if (!(err instanceof ModelNotFoundError)) throw err;
      console.warn(`mocker capture: ${err.message}; using the bundled tokenizer (pass --model to choose)`);
      tokenizer = loadTokenizer();
    }
    if (identity.kind === 'unknown') console.warn(`mocker capture: using the bundled tokenizer until ${upstream.url.origin} answers and names its model`);
  }
  const store = CaptureStore.open(opts.captures);
  const runId = store.startRun(
    {
      kind: 'capture',
      upstream: upstream.url.href,
      label: opts.label,
      ...runColumns(identity),
      maxModelLen: identity.maxModelLen ?? tokenizer.maxModelLen,
      tokenizerName: tokenizer.name,
    },
    tokenizer.files,
  );
  // The proxy's own connection only starts the run: recording (parsing, token ids, the writes) runs in a
  // worker thread on its own connection, off the event loop that streams every client's bytes.
  store.close();
  const recorder = await RecorderThread.start({
    captures: opts.captures,
    runId,
    upstream: upstream.url.href,
    redacted: opts.redactHeaders.map((h) => h.toLowerCase()),
    eosTokenIds: tokenizer.eosTokenIds,
  });
  upstream.onIdentified((later) => {
    console.log(`mocker capture: ${upstream.url.origin} answers now: ${describeEngine(later)}`);
    const failed = (what: string) => (err: unknown) => console.error(`mocker capture: could not store ${what}: ${(err as Error).message}`);
    recorder.updateRun(runColumns(later)).catch(failed("the engine's identity"));
    if (!standIn || later.modelRoot === undefined) return;
    try {
      const own = loadTokenizer(later.modelRoot);
      recorder.setTokenizer(own.name, own.files, own.eosTokenIds).then(() => console.log(`mocker capture: tokenizer ${own.name} from now on`), failed('the tokenizer'));
    } catch (err) {
      console.warn(`mocker capture: ${(err as Error).message}; keeping the bundled tokenizer (pass --model to choose)`);
    }
  });
  let recorded = 0;
  const sink: ExchangeSink = async (raw) => {
    await recorder.sink(raw);
    recorded++;
  };

  /** Exchanges being proxied: close() waits for them (the ones it cuts off are stored as aborted). */
  const inFlight = new Set<Promise<void>>();
  let closing = false;
  const server = http.createServer((req: IncomingMessage, res: ServerResponse) => {
    readBody(req, opts.maxBodyBytes).then(
      (body) => {
        if (body === null) {
          const json = errorJson(413, `Request body is larger than ${opts.maxBodyBytes} bytes.`, 'Request Entity Too Large');
          res.writeHead(413, { 'content-type': 'application/json', connection: 'close' }).end(json);
          return;
        }
        if (closing || res.destroyed) return void res.destroy();
        const exchange = forwardExchange({ upstream, timeoutMs: opts.upstreamTimeoutMs }, req, body, res, sink).catch((err: unknown) => {
          console.error(`mocker capture: ${req.method} ${req.url}: ${(err as Error).message}`);
          res.destroy();
        });
        inFlight.add(exchange);
        void exchange.then(() => inFlight.delete(exchange));
      },
      () => res.destroy(),
    );
  });
  server.keepAliveTimeout = 65_000;
  try {
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(opts.port, opts.host, () => {
        server.off('error', reject);
        resolve();
      });
    });
  } catch (err) {
    await recorder.close();
    throw err;
  }
  const port = (server.address() as AddressInfo).port;
  console.log(`mocker capture: proxying http://${opts.host}:${port} -> ${upstream.url.href} (${describeEngine(identity)}), recording into ${opts.captures} (run ${runId}, tokenizer ${tokenizer.name})`);
  let lastLogged = 0;
  const stats = setInterval(() => {
    if (recorded === lastLogged) return;
    const n = (lastLogged = recorded);
    recorder.counts().then(
      (c) => console.log(`mocker capture: ${n} exchanges this run; file holds ${c.complete} complete, ${c.failed} failed, ${c.aborted} aborted`),
      (err: unknown) => console.error(`mocker capture: could not count the captures: ${(err as Error).message}`),
    );
  }, STATS_INTERVAL_MS);
  stats.unref();
  return {
    port,
    close: async () => {
      clearInterval(stats);
      closing = true;
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      server.closeAllConnections();
      await closed;
      // The exchanges cut off here end (as aborted) once stored; then the recorder closes its file.
      while (inFlight.size > 0) await Promise.all(inFlight);
      await recorder.close();
    },
  };
}
