import http, { type IncomingMessage, type RequestListener, type Server, type ServerResponse } from 'node:http';
import https from 'node:https';
import type net from 'node:net';
import type { TLSSocket } from 'node:tls';
import type { ServerTls } from './tls.js';
import { errorJson } from './errors.js';

/**
 * The health check every long-running command (`serve`, `capture`, `pd-proxy`) answers itself, never forwards:
 * 200 while this process takes requests, whatever is behind it (the container image's HEALTHCHECK asks it). A
 * capture proxy's `/health` is its upstream's (forwarded like any route), so it cannot say whether the proxy serves.
 */
export const OWN_HEALTH_PATH = '/mocker/health';

/** Health checks: vLLM's `/health` and `/ping` (a bodiless 503 when its engine is dead), the PD proxy's `/healthcheck`, mocker's own. */
const HEALTH_PATHS = new Set(['/health', '/ping', '/healthcheck', OWN_HEALTH_PATH]);

/** What a drain did with the requests in flight when it began. */
export interface DrainResult {
  /** Finished within the grace period. */
  finished: number;
  /** Still running at its end: their connections were closed. */
  aborted: number;
}

/**
 * The servers of one command and the requests they are answering, for a graceful stop: once draining, new
 * requests (on new or kept-alive connections) get a 503 — `/health` with no body, as vLLM's for an engine that
 * cannot serve, so a load balancer takes the instance out — while those in flight run to their end or to the
 * grace period's; then the listeners close and whatever is left is cut off.
 */
export class Drain {
  private draining = false;
  private readonly servers: Server[] = [];
  private readonly active = new Set<ServerResponse>();
  private idle: (() => void) | null = null;
  /** Each server's request handler, and the requests that came before it was set. */
  private readonly handlers = new Map<Server, RequestListener>();
  private readonly waiting = new Map<Server, (() => void)[]>();

  /** A server (https with `tls`) whose requests, while not draining, go to the handler `handle` sets (they wait for it). */
  server(tls?: ServerTls): Server {
    const admit = (req: IncomingMessage, res: ServerResponse) => this.admit(server, req, res);
    // An https.Server serves requests as an http.Server does (the same events and methods); its type is tls.Server's.
    const server: Server = tls
      ? (https.createServer({ ...tls.options, noDelay: true }, admit) as unknown as Server)
      : http.createServer({ noDelay: true }, admit);
    if (tls?.optionalClientCert) {
      // --ssl-cert-reqs 1: no certificate is fine, one that does not check out is not (Python's CERT_OPTIONAL).
      server.on('secureConnection', (socket: TLSSocket) => {
        if (!socket.authorized && Object.keys(socket.getPeerCertificate()).length > 0) socket.destroy();
      });
    }
    // Idle keep-alive connections outlive the usual 60 s idle timeout of load balancers in front.
    server.keepAliveTimeout = 65_000;
    this.servers.push(server);
    return server;
  }

  /**
   * A server another listener hands its connections to (`server.emit('connection', socket)`, `capture`'s
   * round-robin): it tracks them as a listening one does (request timeouts, closing them at the drain's end).
   */
  handedServer(tls?: ServerTls): Server {
    const server = this.server(tls);
    // Node starts tracking an http.Server's connections when it is told it listens.
    server.emit('listening');
    return server;
  }

  /** Routes `server`'s requests to `handler` from now on (those that came before it waited for it). */
  handle(server: Server, handler: RequestListener): void {
    this.handlers.set(server, handler);
    for (const run of this.waiting.get(server) ?? []) run();
    this.waiting.delete(server);
  }

  private admit(server: Server, req: IncomingMessage, res: ServerResponse): void {
    arrivals.set(req, performance.now());
    if (this.draining) return refuse(req, res);
    this.active.add(res);
    res.once('close', () => {
      this.active.delete(res);
      if (this.active.size === 0) this.idle?.();
    });
    const run = () => void (this.handlers.get(server) as RequestListener)(req, res);
    if (this.handlers.has(server)) return run();
    // A server listens first (a taken port fails before anything is written); its handler follows once ready.
    this.waiting.set(server, [...(this.waiting.get(server) ?? []), run]);
  }

  /**
   * Stops taking requests, waits up to `graceMs` for those in flight, then closes the listeners and every
   * connection (cutting off what is left). Closing without a drain is `drain(0)`.
   */
  async drain(graceMs: number): Promise<DrainResult> {
    this.draining = true;
    const started = this.active.size;
    if (started > 0 && graceMs > 0) {
      let timer: NodeJS.Timeout | undefined;
      await new Promise<void>((resolve) => {
        this.idle = resolve;
        timer = setTimeout(resolve, graceMs);
      });
      clearTimeout(timer);
      this.idle = null;
    }
    const aborted = this.active.size;
    await Promise.all(
      this.servers.map(
        (server) =>
          new Promise<void>((resolve) => {
            // A handed server (`handedServer`) does not listen: its close only stops tracking connections.
            server.close(() => resolve());
            server.closeAllConnections();
          }),
      ),
    );
    return { finished: started - aborted, aborted };
  }
}

const arrivals = new WeakMap<IncomingMessage, number>();

/**
 * When Node handed `req` over (its head parsed), on `performance.now()`'s clock: what a replay's captured
 * times count from, as close as the server gets to when the client sent it (handler setup comes later).
 */
export function arrivalOf(req: IncomingMessage): number | undefined {
  return arrivals.get(req);
}

function refuse(req: IncomingMessage, res: ServerResponse): void {
  const path = (req.url ?? '/').split('?')[0];
  // The client is told to reconnect (to another instance): this one is going away.
  const headers = { connection: 'close' };
  if (HEALTH_PATHS.has(path)) return void res.writeHead(503, headers).end();
  const body = errorJson(503, 'The server is shutting down.', 'ServiceUnavailableError');
  res.writeHead(503, { ...headers, 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) }).end(body);
}

/** A `Drain` with one server (https with `tls`) listening on `host:port` (handler to be set with `drain.handle`). */
export async function listeningServer(host: string, port: number, tls?: ServerTls): Promise<{ drain: Drain; server: Server }> {
  const drain = new Drain();
  const server = drain.server(tls);
  await listen(server, host, port);
  return { drain, server };
}

/** Listens on `host:port`; a port that cannot be had is an error naming it. */
export async function listen(server: net.Server, host: string, port: number): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    const failed = (err: NodeJS.ErrnoException) => {
      const reason = err.code === 'EADDRINUSE' ? 'is already in use' : err.code === 'EACCES' ? 'needs privileges' : `cannot be listened on (${err.message})`;
      reject(new Error(`port ${port} on ${host} ${reason}`));
    };
    server.once('error', failed);
    server.listen(port, host, () => {
      server.off('error', failed);
      resolve();
    });
  });
}
