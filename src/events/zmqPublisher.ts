import { Publisher, Router } from 'zeromq';
import type { VllmKvEvent } from '../engine/index.js';
import type { KvEventsConfig } from './config.js';
import { encodeKvEventBatch } from './encoding.js';

/**
 * One rank's publisher: a `KvEventsConfig` whose endpoints are already offset for the rank (`hwm`: messages
 * queued per subscriber before PUB drops; `replayEndpoint` null: no replay, no buffer).
 */
export interface ZmqPublisherOptions extends KvEventsConfig {
  dpRank: number;
}

/** The replay stream's end marker: seq -1 as a signed 64-bit big-endian integer. */
const END_OF_REPLAY = Buffer.alloc(8, 0xff);

/** vLLM ZmqEventPublisher: binds when the endpoint is a wildcard or local transport, else connects. */
const binds = (endpoint: string) => ['*', '::', 'ipc://', 'inproc://'].some((marker) => endpoint.includes(marker));

function seqBytes(seq: bigint): Buffer {
  const bytes = Buffer.allocUnsafe(8);
  bytes.writeBigUInt64BE(seq);
  return bytes;
}

/** Serializes a socket's sends: zeromq.js allows one send in flight per socket. */
class SendQueue {
  private readonly queue: Buffer[][] = [];
  private sending = false;

  constructor(
    private readonly socket: Publisher | Router,
    private readonly onError: (err: unknown) => void,
  ) {}

  push(message: Buffer[]): void {
    this.queue.push(message);
    if (!this.sending) void this.pump();
  }

  private async pump(): Promise<void> {
    this.sending = true;
    try {
      for (let message = this.queue.shift(); message; message = this.queue.shift()) {
        try {
          await this.socket.send(message);
        } catch (err) {
          if (this.socket.closed) return;
          this.onError(err);
        }
      }
    } finally {
      this.sending = false;
    }
  }
}

/**
 * One rank's KV event stream, as vLLM's ZmqEventPublisher: PUB frames `[topic, seq (u64 BE), payload]`
 * with seq from 0, the last `bufferSteps` batches kept for the ROUTER replay socket
 * (`[id, "", start_seq]` → `[id, "", seq, payload]`… then `[id, "", -1, ""]`).
 */
export class ZmqKvEventPublisher {
  private readonly pub: Publisher;
  private readonly router: Router | null;
  private readonly pubQueue: SendQueue;
  private readonly routerQueue: SendQueue | null;
  /** The last `bufferSteps` batches, a ring: `ringStart` is the oldest. */
  private readonly ring: { seq: bigint; payload: Buffer }[] = [];
  private ringStart = 0;
  private nextSeq = 0n;
  private readonly topic: Buffer;

  private constructor(private readonly options: ZmqPublisherOptions) {
    const log = (err: unknown) => console.error(`mocker: KV events (rank ${options.dpRank}): ${err instanceof Error ? err.message : String(err)}`);
    this.pub = new Publisher({ sendHighWaterMark: options.hwm, linger: 0 });
    this.pubQueue = new SendQueue(this.pub, log);
    this.router = options.replayEndpoint ? new Router({ linger: 0 }) : null;
    this.routerQueue = this.router ? new SendQueue(this.router, log) : null;
    this.topic = Buffer.from(options.topic, 'utf8');
  }

  static async open(options: ZmqPublisherOptions): Promise<ZmqKvEventPublisher> {
    const publisher = new ZmqKvEventPublisher(options);
    try {
      if (binds(options.endpoint)) await publisher.pub.bind(options.endpoint);
      else publisher.pub.connect(options.endpoint);
      if (publisher.router && options.replayEndpoint) await publisher.router.bind(options.replayEndpoint);
    } catch (err) {
      publisher.close();
      const what = err instanceof Error ? err.message : String(err);
      throw new Error(`KV events: cannot open ${options.endpoint}${options.replayEndpoint ? ` / ${options.replayEndpoint}` : ''}: ${what}`);
    }
    void publisher.serveReplays();
    return publisher;
  }

  publish(events: readonly VllmKvEvent[], tsSeconds: number): void {
    const seq = this.nextSeq++;
    const payload = encodeKvEventBatch(tsSeconds, events, this.options.dpRank, this.options.format);
    if (this.router && this.options.bufferSteps > 0) {
      if (this.ring.length < this.options.bufferSteps) this.ring.push({ seq, payload });
      else {
        this.ring[this.ringStart] = { seq, payload };
        this.ringStart = (this.ringStart + 1) % this.ring.length;
      }
    }
    this.pubQueue.push([this.topic, seqBytes(seq), payload]);
  }

  private async serveReplays(): Promise<void> {
    if (!this.router) return;
    try {
      for await (const frames of this.router) {
        const [identity, , start] = frames;
        // Malformed requests are ignored, as vLLM does (it logs and waits for the next one).
        if (frames.length < 3 || start.length !== 8) continue;
        const startSeq = start.readBigUInt64BE();
        for (let i = 0; i < this.ring.length; i++) {
          const { seq, payload } = this.ring[(this.ringStart + i) % this.ring.length];
          if (seq >= startSeq) this.routerQueue!.push([identity, Buffer.alloc(0), seqBytes(seq), payload]);
        }
        this.routerQueue!.push([identity, Buffer.alloc(0), END_OF_REPLAY, Buffer.alloc(0)]);
      }
    } catch (err) {
      if (!this.router.closed) console.error(`mocker: KV event replay socket: ${err instanceof Error ? err.message : String(err)}`);
    }
  }

  close(): void {
    this.pub.close();
    this.router?.close();
  }
}
