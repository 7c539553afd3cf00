/**
 * A KV events consumer written from vllm-wire-reference.md §5 alone (the way vLLM's example subscriber and
 * Dynamo's listener read the stream): real ZMQ SUB and DEALER sockets, msgpack decoded by the library.
 */
import { Decoder } from '@msgpack/msgpack';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { Dealer, Subscriber } from 'zeromq';

export interface Batch {
  topic: string;
  seq: bigint;
  /** The decoded `[ts, events, dp_rank]`. */
  payload: unknown[];
  raw: Buffer;
}

const decoder = new Decoder({ useBigInt64: true });
export const decodePayload = (raw: Buffer) => decoder.decode(raw) as unknown[];

/** The lowest port the kernel hands to a listen on port 0 (Linux: ip_local_port_range; elsewhere IANA's 49152). */
function ephemeralLow(): number {
  try {
    return Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]) || 49152;
  } catch {
    return 49152;
  }
}

/** Listens on `port` of every interface (as a server binding `*` does): the server, or null when the port is taken. */
function tryListen(port: number): Promise<import('node:net').Server | null> {
  return new Promise((resolve) => {
    const s = createServer();
    s.once('error', () => resolve(null));
    s.listen(port, () => resolve(s));
  });
}

const closed = (s: import('node:net').Server) => new Promise((resolve) => s.close(resolve));

/**
 * Ports nobody listens on right now, drawn below the kernel's ephemeral range: a port freed here from that range
 * could be handed to any listen on port 0 (another server the same test starts) before its own server binds it.
 */
export async function freePorts(count: number): Promise<number[]> {
  const high = ephemeralLow();
  const low = high > 11000 ? 10000 : 1024;
  const ports: number[] = [];
  for (let attempt = 0; ports.length < count && attempt < 1000; attempt++) {
    const port = low + Math.floor(Math.random() * (high - low));
    if (ports.includes(port)) continue;
    const server = await tryListen(port);
    if (server === null) continue;
    await closed(server);
    ports.push(port);
  }
  if (ports.length < count) throw new Error(`no ${count} free ports between ${low} and ${high}`);
  return ports;
}

/**
 * The first of `length` consecutive free ports: for a server that opens port + r for each rank r (data parallel
 * KV events), where separate free ports could have a neighbour that is taken.
 */
export async function freePortRun(length: number): Promise<number> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const [base] = await freePorts(1);
    // The whole run below the ephemeral range, as each port freePorts gives.
    if (base + length > ephemeralLow()) continue;
    const held = await Promise.all(Array.from({ length }, (_, i) => tryListen(base + i)));
    await Promise.all(held.map((s) => s && closed(s)));
    if (held.every((s) => s !== null)) return base;
  }
  throw new Error(`no ${length} consecutive free ports`);
}

export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** A SUB socket collecting every batch it receives. */
export class EventSubscriber {
  readonly batches: Batch[] = [];
  private readonly socket = new Subscriber();

  /** Connects and waits long enough for the subscription to reach the publisher (ZMQ's slow joiner). */
  static async connect(endpoint: string, topic = ''): Promise<EventSubscriber> {
    const s = new EventSubscriber();
    s.socket.connect(endpoint);
    s.socket.subscribe(topic);
    void s.read();
    await sleep(300);
    return s;
  }

  private async read(): Promise<void> {
    try {
      for await (const [topic, seq, raw] of this.socket) {
        this.batches.push({ topic: topic.toString('utf8'), seq: seq.readBigUInt64BE(), payload: decodePayload(raw), raw });
      }
    } catch {
      // closed
    }
  }

  /** Waits until no batch has arrived for `quietMs`. */
  async settle(quietMs = 250): Promise<Batch[]> {
    let seen = -1;
    while (seen !== this.batches.length) {
      seen = this.batches.length;
      await sleep(quietMs);
    }
    return this.batches;
  }

  close(): void {
    this.socket.close();
  }
}

/** Asks the replay ROUTER for every batch from `startSeq`: `[seq, payload]` messages until the `-1` sentinel. */
export async function replay(endpoint: string, startSeq: bigint): Promise<{ batches: { seq: bigint; payload: unknown[] }[]; sentinel: Buffer[] }> {
  const dealer = new Dealer({ receiveTimeout: 5000 });
  dealer.connect(endpoint);
  try {
    const start = Buffer.alloc(8);
    start.writeBigUInt64BE(startSeq);
    await dealer.send([Buffer.alloc(0), start]);
    const batches: { seq: bigint; payload: unknown[] }[] = [];
    for (;;) {
      const frames = await dealer.receive();
      const [, seq, payload] = frames;
      if (payload.length === 0) return { batches, sentinel: frames };
      batches.push({ seq: seq.readBigUInt64BE(), payload: decodePayload(payload) });
    }
  } finally {
    dealer.close();
  }
}

type Tagged = [string, ...unknown[]];

/**
 * A router's block index fed by events (array layout), refusing invalid ones: a Removed for an unknown
 * hash, a Stored whose parent it does not hold, a token count that is not blocks × block size.
 */
export class BlockIndex {
  readonly blocks = new Set<bigint>();
  readonly invalid: string[] = [];
  readonly counts = { BlockStored: 0, BlockRemoved: 0, AllBlocksCleared: 0 };

  apply(events: unknown[]): void {
    for (const event of events as Tagged[]) {
      const [type] = event;
      if (type === 'BlockStored') {
        const [, hashes, parent, tokenIds, blockSize] = event as [string, bigint[], bigint | null, number[], number];
        this.counts.BlockStored++;
        if (parent !== null && !this.blocks.has(BigInt(parent))) this.invalid.push(`Stored with unknown parent ${parent}`);
        if (tokenIds.length !== hashes.length * blockSize) this.invalid.push(`Stored with ${tokenIds.length} tokens for ${hashes.length} blocks`);
        for (const h of hashes) this.blocks.add(BigInt(h));
      } else if (type === 'BlockRemoved') {
        const [, hashes] = event as [string, bigint[]];
        this.counts.BlockRemoved++;
        for (const h of hashes) if (!this.blocks.delete(BigInt(h))) this.invalid.push(`Removed unknown ${h}`);
      } else if (type === 'AllBlocksCleared') {
        this.counts.AllBlocksCleared++;
        this.blocks.clear();
      } else this.invalid.push(`unknown event ${String(type)}`);
    }
  }
}
