import type { Socket } from 'node:net';
import type { ExchangeSink } from '../capture/forward.js';
import { toWire } from '../capture/recorderThread.js';
import { UpstreamEngine } from '../capture/upstreamEngine.js';
import { UpstreamPool } from '../capture/upstreamHttp.js';
import { Drain } from '../wire/drain.js';
import { serverTls } from '../wire/tls.js';
import { captureHandler, ExchangesInFlight } from './captureHandler.js';
import type { ForwarderInit, FromForwarder, ToForwarder } from './captureForwarders.js';

/**
 * A forwarding process of `mocker capture --threads N` (captureForwarders.ts): it serves the connections the proxy
 * hands it, as the proxy serves its own, and sends each exchange to the proxy's recorder. Signals are the proxy's
 * to act on (a terminal's Ctrl-C reaches the whole process group): this process drains when the proxy says so,
 * and exits at once if the proxy is gone (nothing it forwarded could be recorded).
 */

const send = (message: FromForwarder) => process.send?.(message);

function serve(init: ForwarderInit) {
  const upstream = UpstreamEngine.known(new URL(init.upstream), init.identity, init.upstreamTls);
  upstream.onIdentified((identity) => send({ type: 'identified', identity }));
  const stored = new Map<number, (error: string | null) => void>();
  let nextId = 1;
  // Counted, and its failures named with the file, where it is stored (the proxy's RecordingSink).
  const record: ExchangeSink = (raw) =>
    raw.endpoint === null
      ? Promise.resolve()
      : new Promise<void>((resolve, reject) => {
          const id = nextId++;
          stored.set(id, (error) => (error === null ? resolve() : reject(new Error(error))));
          send({ type: 'exchange', id, exchange: toWire(raw) });
        });
  const drain = new Drain();
  const server = drain.handedServer(serverTls(init.tls));
  const pool = new UpstreamPool(upstream.url, init.upstreamTimeoutMs, upstream.tls);
  const inFlight = new ExchangesInFlight();
  drain.handle(server, captureHandler(init, upstream, pool, record, inFlight));
  let drained = false;
  process.on('message', (message: ToForwarder, socket: Socket | undefined) => {
    if (message.type !== 'connection' || !socket) return;
    // Past the drain's cut-off nothing would ever close it.
    if (drained) return void socket.destroy();
    server.emit('connection', socket);
    socket.resume();
  });
  return { drain, stored, upstream, pool, inFlight, markDrained: () => (drained = true) };
}

if (process.send) {
  for (const signal of ['SIGINT', 'SIGTERM'] as const) process.on(signal, () => undefined);
  process.on('disconnect', () => process.exit(1));
  let running: ReturnType<typeof serve> | null = null;
  process.on('message', (message: ToForwarder) => {
    if (message.type === 'init') {
      running = serve(message.init);
      send({ type: 'ready' });
    } else if (message.type === 'stored') {
      running?.stored.get(message.id)?.(message.error);
      running?.stored.delete(message.id);
    } else if (message.type === 'identity') running?.upstream.learn(message.identity);
    else if (message.type === 'drain' && running) {
      const { drain, pool, inFlight, markDrained } = running;
      void (async () => {
        const result = await drain.drain(message.graceMs);
        markDrained();
        // Each exchange, the ones the drain cut off too, ends once the proxy has stored it.
        await inFlight.settled();
        pool.close();
        send({ type: 'drained', result });
        process.removeAllListeners('disconnect');
        process.disconnect();
        // A connection the drain could not close (none should be left) does not keep this process alive for long.
        setTimeout(() => process.exit(0), 5_000).unref();
      })();
    }
  });
}
