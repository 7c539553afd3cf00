import { Worker } from 'node:worker_threads';
import type { CaptureStore, Outcome } from '../store/captureStore.js';
import type { ExchangeSink, RawExchange } from './forward.js';
import type { UpstreamTls } from '../wire/tls.js';

/** What the worker is started with (its `workerData`). */
export interface RecordWorkerInit {
  /** The capture file; the worker opens its own connection to it. */
  captures: string;
  runId: number;
  upstream: string;
  /** How the upstream's certificate is checked (`--upstream-ca-certs`). */
  upstreamTls?: UpstreamTls;
  redacted: string[];
  /** `--redact-bodies`: store token ids and timing, no text, request body or response bytes. */
  redactBodies?: boolean;
  /** The run's tokenizer came from another capture file (`rerun`'s golden): untrusted, checked and its templates sandboxed. */
  tokenizerFromCapture?: boolean;
}

/**
 * A `RawExchange` as posted to the worker: the parsed request is parsed again there (cheaper than cloning it
 * here), bodies and event tables travel as transferred typed arrays.
 */
export interface WireExchange extends Omit<RawExchange, 'request' | 'requestBody' | 'responseBody' | 'eventEnds' | 'eventTimes'> {
  /** `request` was a JSON object (the worker parses `requestBody` again). */
  hasRequest: boolean;
  requestBody: Uint8Array;
  responseBody: Uint8Array;
  eventEnds: Uint32Array;
  eventTimes: Float64Array;
}

/** What was learnt of the run's upstream after the run started. */
export type RunUpdate = Parameters<CaptureStore['updateRun']>[1];

export type ToWorker =
  | { type: 'exchange'; id: number; exchange: WireExchange }
  | { type: 'counts'; id: number }
  | { type: 'updateRun'; id: number; update: RunUpdate }
  | { type: 'setTokenizer'; id: number; name: string; files: [string, Uint8Array][] }
  | { type: 'close' };

export type FromWorker = { type: 'ready' } | { type: 'reply'; id: number; ok: true; value?: unknown } | { type: 'reply'; id: number; ok: false; error: string };

interface Pending {
  resolve(value: unknown): void;
  reject(err: Error): void;
  settled: Promise<unknown>;
}

/**
 * Starts the worker: the compiled `recordWorker.js` next to this module (`node dist/…`, needs nothing else), or,
 * when this module runs from its TypeScript source (vitest, tsx), `recordWorker.ts` through tsx. Node 20 does
 * not apply loader hooks registered with `--import` to a worker's entry point (not even inherited ones), so
 * that worker is a small bootstrap that imports the source with tsx's `tsImport`.
 */
function startWorker(workerData: RecordWorkerInit): Worker {
  const here = import.meta.url;
  if (!/\.ts(\?|#|$)/.test(here)) return new Worker(new URL('./recordWorker.js', here), { workerData });
  const tsx = import.meta.resolve('tsx/esm/api');
  const entry = new URL('./recordWorker.ts', here).href;
  const bootstrap = `import(${JSON.stringify(tsx)}).then((tsx) => tsx.tsImport(${JSON.stringify(entry)}, ${JSON.stringify(here)}));`;
  return new Worker(bootstrap, { eval: true, workerData });
}

/**
 * `buf` as bytes postMessage can transfer: `buf` itself when the caller gives it up (`take`) and it is the only
 * view of its ArrayBuffer (moved, no copy), else a copy in a fresh ArrayBuffer. A pooled Buffer (Node's small
 * allocations) shares its ArrayBuffer with unrelated ones: transferring that would detach them.
 */
function transferable(buf: Buffer, take: boolean): Uint8Array {
  if (take && buf.byteOffset === 0 && buf.byteLength === buf.buffer.byteLength) return buf;
  const copy = new Uint8Array(buf.byteLength);
  copy.set(buf);
  return copy;
}

/** A generation exchange as the recorder is posted it: bodies and event tables in typed arrays of their own. */
export function toWire(raw: RawExchange): WireExchange {
  const { request, requestBody, responseBody, eventEnds, eventTimes, ...rest } = raw;
  return {
    ...rest,
    hasRequest: request !== null,
    // The request body stays the caller's (a socket write may still hold it): always a copy.
    requestBody: transferable(requestBody, false),
    responseBody: transferable(responseBody, true),
    eventEnds: Uint32Array.from(eventEnds),
    eventTimes: Float64Array.from(eventTimes),
  };
}

/**
 * Records exchanges in a worker thread: response parsing, token-id derivation (the upstream's `/tokenize`
 * and the local tokenizer, for engines that send no ids) and the SQLite transaction all run there, on the
 * worker's own connection, never on the proxy's event loop. `sink` resolves once the worker has committed
 * the exchange (or failed to), so the client's response still ends only after its exchange is stored.
 */
export class RecorderThread {
  private worker: Worker | null = null;
  private readonly pending = new Map<number, Pending>();
  private nextId = 1;
  private closing: Promise<void> | null = null;
  private acceptingWork = true;

  private constructor(private readonly init: RecordWorkerInit) {}

  /** Starts the worker; resolves once it has opened the capture file. */
  static async start(init: RecordWorkerInit): Promise<RecorderThread> {
    const thread = new RecorderThread(init);
    await thread.spawn();
    return thread;
  }

  /** Hands an exchange to the worker; resolves once it is committed. Non-generation traffic is not recorded. */
  readonly sink: ExchangeSink = async (raw) => {
    if (raw.endpoint) await this.store(toWire(raw));
  };

  /** Hands over an exchange already in its posted form, its arrays its own (moved, not copied); resolves once it is committed. */
  readonly store = async (exchange: WireExchange): Promise<void> => {
    const transfer = [exchange.requestBody.buffer, exchange.responseBody.buffer, exchange.eventEnds.buffer, exchange.eventTimes.buffer] as ArrayBuffer[];
    await this.call((id) => ({ type: 'exchange', id, exchange }), transfer);
  };

  /** The capture file's exchanges by outcome (counted by the worker: no table scan on the proxy's loop). */
  async counts(): Promise<Record<Outcome, number>> {
    return (await this.call((id) => ({ type: 'counts', id }))) as Record<Outcome, number>;
  }

  /** Stores what was learnt of the run's upstream (on the worker's connection, like everything else). */
  async updateRun(update: RunUpdate): Promise<void> {
    await this.call((id) => ({ type: 'updateRun', id, update }));
  }

  /** Replaces the run's tokenizer, in the file and for the exchanges recorded from now on. */
  async setTokenizer(name: string, files: Map<string, Buffer>): Promise<void> {
    await this.call((id) => ({ type: 'setTokenizer', id, name, files: [...files].map(([file, data]) => [file, Uint8Array.from(data)]) }));
  }

  /** Waits for every exchange handed over so far to be stored, then closes the worker's connection and the worker. */
  close(): Promise<void> {
    this.closing ??= (async () => {
      // Exchanges the server's shutdown aborts reach the sink in the same turn or the next ones.
      await new Promise((resolve) => setImmediate(resolve));
      while (this.pending.size > 0) await Promise.all([...this.pending.values()].map((p) => p.settled));
      this.acceptingWork = false;
      const worker = this.worker;
      this.worker = null;
      if (!worker) return;
      worker.ref();
      const exited = new Promise<void>((resolve) => worker.once('exit', () => resolve()));
      worker.postMessage({ type: 'close' } satisfies ToWorker);
      const timer = setTimeout(() => void worker.terminate(), 10_000);
      await exited;
      clearTimeout(timer);
    })();
    return this.closing;
  }

  private call(message: (id: number) => ToWorker, transfer: ArrayBuffer[] = []): Promise<unknown> {
    if (!this.acceptingWork) return Promise.reject(new Error('the recorder is closed'));
    const worker = this.worker ?? this.respawn();
    const id = this.nextId++;
    let resolve!: Pending['resolve'];
    let reject!: Pending['reject'];
    const promise = new Promise<unknown>((res, rej) => ((resolve = res), (reject = rej)));
    this.pending.set(id, { resolve, reject, settled: promise.catch(() => undefined) });
    worker.ref();
    worker.postMessage(message(id), transfer);
    return promise;
  }

  private settle(id: number, settle: (p: Pending) => void): void {
    const entry = this.pending.get(id);
    if (!entry) return;
    this.pending.delete(id);
    settle(entry);
    if (this.pending.size === 0) this.worker?.unref();
  }

  /** A worker that died (it should not) is replaced on the next exchange; its pending calls fail. */
  private respawn(): Worker {
    console.error('mocker capture: restarting the recorder worker');
    void this.spawn().catch(() => undefined);
    return this.worker as Worker;
  }

  private spawn(): Promise<void> {
    const worker = startWorker(this.init);
    this.worker = worker;
    // Idle, the worker does not keep the process alive; with work pending it does (see call/settle).
    worker.unref();
    let failure: Error | null = null;
    return new Promise<void>((resolve, reject) => {
      worker.on('message', (msg: FromWorker) => {
        if (msg.type === 'ready') return resolve();
        if (msg.ok) this.settle(msg.id, (p) => p.resolve(msg.value));
        else this.settle(msg.id, (p) => p.reject(new Error(msg.error)));
      });
      worker.on('error', (err) => {
        failure = err;
        console.error(`mocker capture: recorder worker failed: ${err.stack ?? err.message}`);
      });
      worker.on('exit', (code) => {
        if (this.worker === worker) this.worker = null;
        const err = failure ?? new Error(`the recorder worker exited with code ${code}`);
        reject(err);
        for (const id of [...this.pending.keys()]) this.settle(id, (p) => p.reject(err));
      });
    });
  }
}
