import type http from 'node:http';
import type { AddressInfo } from 'node:net';

/** A test's own HTTP server (an upstream double, a hop in front of one) listening on loopback. */
export interface LoopbackServer {
  port: number;
  url: string;
  /** Cuts the connections still open (keep-alive clients, answers held on purpose), then closes. */
  close(): Promise<void>;
}

/** Listens with `server` on 127.0.0.1 (`port` 0: a free one). */
export async function listenOnLoopback(server: http.Server, port = 0): Promise<LoopbackServer> {
  await new Promise<void>((resolve) => server.listen(port, '127.0.0.1', resolve));
  const actual = (server.address() as AddressInfo).port;
  return {
    port: actual,
    url: `http://127.0.0.1:${actual}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
