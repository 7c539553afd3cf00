import net, { type AddressInfo } from 'node:net';
import { UpstreamPool } from '../capture/upstreamHttp.js';
import { RecorderThread } from '../capture/recorderThread.js';
import { Drain, listen } from '../wire/drain.js';
import type { ApiKeyPolicy } from '../wire/access.js';
import { serverTls, upstreamTls, type TlsFiles } from '../wire/tls.js';
import { CaptureStore } from '../store/captureStore.js';
import { loadModelFiles, maxModelLenOf, ModelNotFoundError } from '../tokenizer/index.js';
import { describeEngine, runColumns, UpstreamEngine, type EngineIdentity } from '../capture/upstreamEngine.js';
import type { Running } from './serve.js';
import { RecordingSink, totalStop } from './shutdown.js';
import { captureHandler, ExchangesInFlight } from './captureHandler.js';
import { CaptureForwarders } from './captureForwarders.js';

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
  /** --threads: event loops forwarding the clients' streams, this process's and forwarding processes' (default 1). */
  threads?: number;
}

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
function followIdentity(
  opts: CaptureOptions,
  upstream: UpstreamEngine,
  thread: RecorderThread,
  standIn: boolean,
  tell: (identity: EngineIdentity) => void,
): void {
  upstream.onIdentified((later) => {
    tell(later);
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

/** Every STATS_INTERVAL_MS with new exchanges: what this run recorded and what the file holds. */
function logCounts(opts: CaptureOptions, thread: RecorderThread, recorded: () => number): NodeJS.Timeout {
  let lastLogged = 0;
  const timer = setInterval(() => {
    const n = recorded();
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
 * it touches the file (a taken port leaves nothing behind); requests that come meanwhile wait for it. With
 * `threads` > 1, forwarding processes share its connections (captureForwarders.ts).
 */
export async function startCapture(opts: CaptureOptions): Promise<Running> {
  const tls = serverTls(opts.tls);
  const drain = new Drain();
  const server = drain.handedServer(tls);
  let forwarders: CaptureForwarders | null = null;
  // The one listening socket: each connection is dealt (to this process or a forwarding one) before a byte is read.
  const front = net.createServer({ pauseOnConnect: true, noDelay: true }, (socket) => {
    if (forwarders?.deal(socket)) return;
    server.emit('connection', socket);
    socket.resume();
  });
  // Not waited for: its callback waits for the connections handed to forwarding processes, which are their drains'.
  const stopListening = () => front.listening && front.close();
  await listen(front, opts.host, opts.port);
  const port = (front.address() as AddressInfo).port;
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
    const recording = new RecordingSink(thread.sink, opts.captures);
    // What the forwarding processes forwarded, counted as this process counts its own.
    const forwarded = new RecordingSink(thread.store, opts.captures);
    if ((opts.threads ?? 1) > 1)
      forwarders = await CaptureForwarders.start(
        opts.threads! - 1,
        {
          upstream: upstream.url.href,
          identity,
          upstreamTls: upstream.tls,
          upstreamTimeoutMs: opts.upstreamTimeoutMs,
          tls: opts.tls,
          maxBodyBytes: opts.maxBodyBytes,
          access: opts.access,
        },
        forwarded.sink,
        (found) => upstream.learn(found),
      );
    followIdentity(opts, upstream, thread, standIn, (found) => forwarders?.tellIdentity(found));
    const connections = new UpstreamPool(upstream.url, opts.upstreamTimeoutMs, upstream.tls);
    const inFlight = new ExchangesInFlight();
    drain.handle(server, captureHandler(opts, upstream, connections, recording.sink, inFlight));
    if (!opts.quiet)
      console.log(
        `mocker capture: proxying ${tls ? 'https' : 'http'}://${opts.host}:${port} -> ${upstream.url.href} (${describeEngine(identity)}), recording into ${opts.captures} (run ${runId}, tokenizer ${model.name}${forwarders ? `, forwarding on ${opts.threads} event loops: this process and ${opts.threads! - 1} more` : ''})`,
      );
    const stats = opts.quiet ? undefined : logCounts(opts, thread, () => recording.recorded.exchanges + forwarded.recorded.exchanges);
    return {
      port,
      close: async (graceMs = 0) => {
        clearInterval(stats);
        // The listener closes with this process's drain, not once the forwarding processes have exited.
        const [own, theirs] = await Promise.all([drain.drain(graceMs).finally(stopListening), forwarders?.drain(graceMs) ?? { finished: 0, aborted: 0 }]);
        // The exchanges cut off end (as aborted) once stored, this process's and the forwarding processes';
        // then the recorder checkpoints and closes the file.
        await inFlight.settled();
        await forwarded.settled();
        connections.close();
        await thread.close();
        return totalStop([
          { ...own, recorded: recording.recorded },
          { ...theirs, recorded: forwarded.recorded },
        ]);
      },
    };
  } catch (err) {
    await forwarders?.drain(0);
    await drain.drain(0);
    stopListening();
    await recorder?.close();
    throw err;
  }
}
