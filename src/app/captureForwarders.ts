import { fork, type ChildProcess } from 'node:child_process';
import type { Socket } from 'node:net';
import { fileURLToPath } from 'node:url';
import type { EngineIdentity } from '../capture/upstreamEngine.js';
import type { WireExchange } from '../capture/recorderThread.js';
import type { DrainResult } from '../wire/drain.js';
import type { TlsFiles, UpstreamTls } from '../wire/tls.js';
import type { ProxyLimits } from './captureHandler.js';
import { totalStop } from './shutdown.js';

/**
 * `mocker capture --threads N`: N event loops forward the clients' streams, this process's and those of N − 1
 * forwarding processes (captureForwarder.ts). Node 20's worker threads cannot share a listening socket, so they are
 * processes; this one alone accepts, and deals each new connection round-robin before any of its bytes are read
 * (`pauseOnConnect`): a connection stays with the process it was given to. Every exchange is recorded by this
 * process's one recorder thread; a forwarding process sends it over its IPC channel when it ends.
 */

/** What a forwarding process is started with. */
export interface ForwarderInit extends ProxyLimits {
  upstream: string;
  identity: EngineIdentity;
  upstreamTls: UpstreamTls;
  upstreamTimeoutMs: number;
  tls?: TlsFiles;
}

export type ToForwarder =
  | { type: 'init'; init: ForwarderInit }
  /** Sent with the connection's socket. */
  | { type: 'connection' }
  | { type: 'identity'; identity: EngineIdentity }
  | { type: 'stored'; id: number; error: string | null }
  | { type: 'drain'; graceMs: number };

export type FromForwarder =
  | { type: 'ready' }
  | { type: 'exchange'; id: number; exchange: WireExchange }
  | { type: 'identified'; identity: EngineIdentity }
  | { type: 'drained'; result: DrainResult };

/** How long a forwarding process may take to start before the proxy gives up on it. */
const START_TIMEOUT_MS = 30_000;
/** How long a drained forwarding process may take to exit. */
const EXIT_TIMEOUT_MS = 5_000;

/**
 * The compiled `captureForwarder.js` beside this module (`node dist/…`), or, from the TypeScript source (vitest,
 * tsx), `captureForwarder.ts` run through tsx.
 */
function forkForwarder(): ChildProcess {
  const fromSource = /\.ts(\?|#|$)/.test(import.meta.url);
  const entry = fileURLToPath(new URL(fromSource ? './captureForwarder.ts' : './captureForwarder.js', import.meta.url));
  return fork(entry, [], { serialization: 'advanced', execArgv: fromSource ? ['--import', 'tsx'] : [], stdio: 'inherit' });
}

/**
 * The exchange with arrays of its own: deserialized from an IPC message they are views into the channel's read
 * buffer, which moving them to the recorder thread would detach.
 */
function ownArrays(exchange: WireExchange): WireExchange {
  return {
    ...exchange,
    requestBody: new Uint8Array(exchange.requestBody),
    responseBody: new Uint8Array(exchange.responseBody),
    eventEnds: new Uint32Array(exchange.eventEnds),
    eventTimes: new Float64Array(exchange.eventTimes),
  };
}

interface Forwarder {
  child: ChildProcess;
  /** Dealt connections while it runs; dropped from the deal when it exits. */
  serving: boolean;
  drained: Promise<DrainResult> | null;
}

export class CaptureForwarders {
  private turn = 0;

  private constructor(private readonly forwarders: Forwarder[]) {}

  /**
   * Starts `count` forwarding processes; resolves once each is ready for connections. `store` records an exchange
   * one of them forwarded; `identified` hears what the upstream turned out to be when one of them found out.
   */
  static async start(
    count: number,
    init: ForwarderInit,
    store: (exchange: WireExchange) => Promise<void>,
    identified: (identity: EngineIdentity) => void,
  ): Promise<CaptureForwarders> {
    const forwarders = Array.from({ length: count }, (): Forwarder => ({ child: forkForwarder(), serving: false, drained: null }));
    const group = new CaptureForwarders(forwarders);
    try {
      await Promise.all(forwarders.map((f, i) => group.ready(f, i + 1, init, store, identified)));
    } catch (err) {
      for (const f of forwarders) f.child.kill('SIGKILL');
      throw err;
    }
    return group;
  }

  private ready(
    f: Forwarder,
    index: number,
    init: ForwarderInit,
    store: (exchange: WireExchange) => Promise<void>,
    identified: (identity: EngineIdentity) => void,
  ): Promise<void> {
    const { child } = f;
    const reply = (message: ToForwarder) => {
      if (child.connected) child.send(message);
    };
    // A send to a process that has just died fails with EPIPE before its exit is seen: said, never fatal here.
    child.on('error', (err) => console.error(`mocker capture: forwarding process ${index}: ${err.message}`));
    child.on('message', (message: FromForwarder) => {
      if (message.type === 'exchange')
        store(ownArrays(message.exchange)).then(
          () => reply({ type: 'stored', id: message.id, error: null }),
          (err: unknown) => reply({ type: 'stored', id: message.id, error: err instanceof Error ? err.message : String(err) }),
        );
      else if (message.type === 'identified') identified(message.identity);
    });
    child.once('exit', (code, signal) => {
      if (f.serving && f.drained === null)
        console.error(`mocker capture: forwarding process ${index} exited (${signal ?? `code ${code}`}); its connections were cut off`);
      f.serving = false;
    });
    child.send({ type: 'init', init } satisfies ToForwarder);
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`forwarding process ${index} did not start within ${START_TIMEOUT_MS / 1000} s`)), START_TIMEOUT_MS);
      const failed = (code: number | null) => {
        clearTimeout(timer);
        reject(new Error(`forwarding process ${index} exited with code ${code} before it was ready`));
      };
      child.once('exit', failed);
      child.on('message', (message: FromForwarder) => {
        if (message.type !== 'ready') return;
        clearTimeout(timer);
        child.off('exit', failed);
        f.serving = true;
        resolve();
      });
    });
  }

  /**
   * Deals a new (paused) connection: to the next forwarding process in turn, handed over with its socket (true), or
   * to this process when it is this one's turn or that process is gone (false: the caller serves it).
   */
  deal(socket: Socket): boolean {
    const slot = this.turn++ % (this.forwarders.length + 1);
    const f = slot === 0 ? undefined : this.forwarders[slot - 1];
    // Not to one that is draining: its drain's cut-off may have passed, and this process answers 503 as well.
    if (!f?.serving || f.drained !== null || !f.child.connected) return false;
    f.child.send({ type: 'connection' } satisfies ToForwarder, socket);
    return true;
  }

  /** Tells every forwarding process what the upstream is (one of them, or this process, found out). */
  tellIdentity(identity: EngineIdentity): void {
    for (const { child } of this.forwarders) if (child.connected) child.send({ type: 'identity', identity } satisfies ToForwarder);
  }

  /**
   * Each process drains as the proxy does (`graceMs`), waits for its exchanges to be stored and exits (killed if it
   * has not within EXIT_TIMEOUT_MS of its drain); their drains, summed.
   */
  async drain(graceMs: number): Promise<DrainResult> {
    const results = await Promise.all(
      this.forwarders.map((f) => {
        f.drained ??= new Promise<DrainResult>((resolve) => {
          const { child } = f;
          let result: DrainResult = { finished: 0, aborted: 0 };
          if (child.exitCode !== null || child.signalCode !== null) return resolve(result);
          child.once('exit', () => resolve(result));
          if (!child.connected) return void child.kill('SIGKILL');
          child.on('message', (message: FromForwarder) => {
            if (message.type !== 'drained') return;
            result = message.result;
            setTimeout(() => child.kill('SIGKILL'), EXIT_TIMEOUT_MS).unref();
          });
          child.send({ type: 'drain', graceMs } satisfies ToForwarder);
        });
        return f.drained;
      }),
    );
    return totalStop(results);
  }
}
