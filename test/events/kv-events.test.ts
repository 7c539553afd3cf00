/**
 * KV events as vLLM publishes them (vllm-wire-reference.md §5–§6), read by a consumer written from the
 * reference: real ZMQ SUB/DEALER sockets, msgpack decoded by @msgpack/msgpack, hashes checked against the
 * Python-computed fixtures.
 */
import { readFileSync } from 'node:fs';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { EngineCore, zeroTiming, type VllmKvEvent } from '../../src/engine/index.js';
import type { BlockHashAlgo } from '../../src/engine/index.js';
import { dynamoKvEventsConfigs, offsetEndpoint, parseKvEventsConfig } from '../../src/events/config.js';
import { serveInProcess, type Running, type ServeOptions } from '../support/inProcess.js';
import { BlockIndex, EventSubscriber, freePortRun, replay, sleep } from '../support/kvEventsClient.js';
import { prng } from '../support/prng.js';
import { MODEL } from '../support/vllmUpstream.js';
import { VLLM_SCHEDULER_DEFAULTS } from '../support/schedulerDefaults.js';

interface FixtureRow {
  algo: BlockHashAlgo;
  seed: string;
  block_size: number;
  token_ids: number[];
  blocks: { hex: string; event_u64: string }[];
}
const FIXTURES = readFileSync(new URL('../fixtures/kv-hashes/vllm-block-hashes.jsonl', import.meta.url), 'utf8')
  .trim()
  .split('\n')
  .map((l) => JSON.parse(l) as FixtureRow);
/** Qwen3's vocabulary (151,643 + 26 added tokens): larger ids are refused over HTTP (as vLLM does), so those rows run on the core only. */
const IN_VOCAB = (row: FixtureRow) => row.token_ids.every((t) => t < 151_669);

let running: Running[] = [];
let subscribers: EventSubscriber[] = [];
afterEach(async () => {
  subscribers.forEach((s) => s.close());
  subscribers = [];
  await Promise.all(running.map((r) => r.close()));
  running = [];
});

async function serveWithEvents(options: Partial<ServeOptions> & { format?: 'array' | 'map'; topic?: string; replay?: boolean } = {}) {
  const { format = 'array', topic = '', replay: withReplay = true, ...rest } = options;
  // Rank r publishes on port + r and replays on replay port + r: one run of free ports for both.
  const ranks = rest.engine?.dataParallelSize ?? 1;
  const pubPort = await freePortRun(2 * ranks);
  const replayPort = pubPort + ranks;
  const server = await serveInProcess({
    mode: 'simulate',
    captures: ':memory:',
    timing: 'none',
    kvEvents: [
      { endpoint: `tcp://*:${pubPort}`, replayEndpoint: withReplay ? `tcp://*:${replayPort}` : null, topic, bufferSteps: 10_000, hwm: 100_000, format },
    ],
    ...rest,
  });
  running.push(server);
  const sub = await EventSubscriber.connect(`tcp://127.0.0.1:${pubPort}`, topic);
  subscribers.push(sub);
  return { server, url: `http://127.0.0.1:${server.port}`, sub, pubPort, replayPort };
}

async function complete(url: string, prompt: number[], maxTokens: number, headers: Record<string, string> = {}): Promise<Response> {
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: MODEL, prompt, max_tokens: maxTokens, ignore_eos: true }),
  });
  await res.text();
  return res;
}

const storedEvents = (payloads: unknown[][]) =>
  payloads.flatMap((p) => (p[1] as unknown[][]).filter((e) => e[0] === 'BlockStored')) as [
    string,
    (number | bigint)[],
    number | bigint | null,
    number[],
    number,
  ][];

describe('block hashes in events equal the Python fixtures', () => {
  it('the engine core stores every fixture row (both algorithms, every seed and block size) with its event_u64 values', () => {
    expect(FIXTURES.length).toBeGreaterThanOrEqual(60);
    for (const row of FIXTURES) {
      const core = new EngineCore({
        numGpuBlocks: 64,
        blockSize: row.block_size,
        ...VLLM_SCHEDULER_DEFAULTS,
        maxNumSeqs: null,
        maxNumBatchedTokens: null,
        timing: zeroTiming(false),
        seed: 1,
        kvEvents: { algo: row.algo, hashSeed: row.seed },
      });
      core.add({ id: 'r', promptTokenIds: row.token_ids, maxOutputTokens: 1 });
      const events: VllmKvEvent[] = [];
      for (let t = 0; !core.isIdle; t++) {
        core.executePass(t);
        events.push(...core.takeKvEvents());
      }
      const stored = events.filter((e) => e.type === 'BlockStored');
      const label = `${row.algo} seed ${row.seed} block ${row.block_size} (${row.token_ids.length} tokens)`;
      expect(
        stored.flatMap((e) => e.blockHashes.map(String)),
        label,
      ).toEqual(row.blocks.map((b) => b.event_u64));
      const fullTokens = row.blocks.length * row.block_size;
      expect(
        stored.flatMap((e) => e.tokenIds),
        label,
      ).toEqual(row.token_ids.slice(0, fullTokens));
      if (stored.length > 0) expect(stored[0].parentBlockHash, label).toBeNull();
    }
  });

  it('a decode request announces the blocks it pulls when their KV lands, not before; nobody hits them in flight', () => {
    const row = FIXTURES.find((r) => r.algo === 'sha256_cbor' && r.block_size === 16 && r.blocks.length >= 2)!;
    const decodeCore = () =>
      new EngineCore({
        numGpuBlocks: 64,
        blockSize: 16,
        ...VLLM_SCHEDULER_DEFAULTS,
        maxNumSeqs: null,
        maxNumBatchedTokens: null,
        timing: zeroTiming(false),
        seed: 1,
        kvEvents: { algo: row.algo, hashSeed: row.seed },
        kvTransfer: { bytesPerToken: 1_000_000, bandwidthGBps: 1 },
      });
    const stored = (events: VllmKvEvent[]) => events.filter((e) => e.type === 'BlockStored').flatMap((e) => e.blockHashes.map(String));
    // 1 ms per prompt token: the KV lands at t = prompt length.
    const landsAt = row.token_ids.length;
    const core = decodeCore();
    core.add({ id: 'd', promptTokenIds: row.token_ids, maxOutputTokens: 1, remotePrefill: true });
    core.executePass(0);
    expect(core.view('d')?.status).toBe('waiting_for_remote_kvs');
    expect(stored(core.takeKvEvents())).toEqual([]);
    core.executePass(landsAt);
    expect(stored(core.takeKvEvents())).toEqual(row.blocks.map((b) => b.event_u64));

    // The same prompt computed here while the KV is still in flight finds nothing cached.
    const racing = decodeCore();
    racing.add({ id: 'd', promptTokenIds: row.token_ids, maxOutputTokens: 1, remotePrefill: true });
    racing.executePass(0);
    racing.add({ id: 'local', promptTokenIds: row.token_ids, maxOutputTokens: 1 });
    expect(racing.executePass(1).admitted).toEqual([{ id: 'local', cachedTokens: 0 }]);
    // Its blocks are stored by the local computation; the landing then adds no second BlockStored.
    expect(stored(racing.takeKvEvents())).toEqual(row.blocks.map((b) => b.event_u64));
    for (let t = 2; !racing.isIdle; t += landsAt) racing.executePass(t);
    expect(stored(racing.takeKvEvents())).toEqual([]);
    expect(racing.engineStats().activeBlocks).toBe(0);
  });

  const combos = [
    ...['0', '42', 'vllm-none-hash'].flatMap((seed) => [16, 64].map((blockSize) => ({ algo: 'sha256_cbor' as const, seed, blockSize }))),
    { algo: 'sha256' as const, seed: '0', blockSize: 16 },
  ];
  it.each(combos)(
    'a request with the fixture token ids publishes BlockStored with event_u64 ($algo, seed $seed, block $blockSize)',
    async ({ algo, seed, blockSize }) => {
      const rows = FIXTURES.filter((r) => r.algo === algo && r.seed === seed && r.block_size === blockSize && r.blocks.length > 0 && IN_VOCAB(r));
      expect(rows.length).toBeGreaterThan(0);
      const { url, sub } = await serveWithEvents({ prefixCachingHashAlgo: algo, hashSeed: seed, engine: { blockSize } });
      for (const row of rows) {
        const before = sub.batches.length;
        // max_tokens 1: the only full blocks are the prompt's.
        expect((await complete(url, row.token_ids, 1)).status).toBe(200);
        await sub.settle(100);
        const stored = storedEvents(sub.batches.slice(before).map((b) => b.payload));
        expect(stored.flatMap((e) => e[1].map(String))).toEqual(row.blocks.map((b) => b.event_u64));
        expect(stored[0][2]).toBeNull();
        expect(stored.flatMap((e) => e[3])).toEqual(row.token_ids.slice(0, row.blocks.length * blockSize));
        expect(stored.every((e) => e[4] === blockSize)).toBe(true);
      }
    },
  );
});

describe('the ZMQ stream', () => {
  it('frames every batch as [topic, seq u64 BE, msgpack [ts float64, events, dp_rank]] with the array layout', async () => {
    const { url, sub } = await serveWithEvents({ topic: 'kv-events', engine: { blockSize: 16 } });
    const before = Date.now() / 1000;
    await complete(
      url,
      Array.from({ length: 40 }, (_, i) => 1000 + i),
      1,
    );
    const [batch] = await sub.settle();
    expect(batch.topic).toBe('kv-events');
    expect(batch.seq).toBe(0n);
    // fixarray(3), then float64 (0xcb): msgspec writes Python floats as float64.
    expect([batch.raw[0], batch.raw[1]]).toEqual([0x93, 0xcb]);
    const [ts, events, rank] = batch.payload as [number, unknown[][], number];
    expect(ts).toBeGreaterThanOrEqual(before - 1);
    expect(ts).toBeLessThanOrEqual(Date.now() / 1000 + 1);
    expect(rank).toBe(0);
    // ≈v0.10.2 tagged array: tag, block_hashes, parent, token_ids, block_size, lora_id, medium.
    expect(events).toHaveLength(1);
    const [tag, hashes, parent, tokens, blockSize, loraId, medium] = events[0];
    expect({ tag, n: (hashes as unknown[]).length, parent, tokens: (tokens as number[]).length, blockSize, loraId, medium, fields: events[0].length }).toEqual({
      tag: 'BlockStored',
      n: 2,
      parent: null,
      tokens: 32,
      blockSize: 16,
      loraId: null,
      medium: 'GPU',
      fields: 7,
    });
  });

  it('--kv-events-format map: named fields as vLLM PR #42892 (the live 0.26 example)', async () => {
    const { url, sub } = await serveWithEvents({ format: 'map', engine: { blockSize: 16 } });
    await complete(
      url,
      Array.from({ length: 17 }, (_, i) => 2000 + i),
      1,
    );
    const [batch] = await sub.settle();
    const [, events] = batch.payload as [number, Record<string, unknown>[]];
    expect(Object.keys(events[0])).toEqual([
      'type',
      'block_hashes',
      'parent_block_hash',
      'token_ids',
      'block_size',
      'lora_id',
      'medium',
      'lora_name',
      'extra_keys',
      'group_idx',
      'kv_cache_spec_kind',
    ]);
    expect(events[0]).toMatchObject({
      type: 'BlockStored',
      parent_block_hash: null,
      block_size: 16,
      lora_id: null,
      medium: 'GPU',
      lora_name: null,
      extra_keys: [null],
      group_idx: 0,
      kv_cache_spec_kind: 'full_attention',
    });
    expect(events[0].token_ids).toEqual(Array.from({ length: 16 }, (_, i) => 2000 + i));
  });

  it('data-parallel rank r publishes on port + r with dp_rank r', async () => {
    const { url, sub, pubPort } = await serveWithEvents({ engine: { blockSize: 16, dataParallelSize: 2 } });
    const rank1 = await EventSubscriber.connect(`tcp://127.0.0.1:${pubPort + 1}`);
    subscribers.push(rank1);
    await complete(
      url,
      Array.from({ length: 16 }, (_, i) => 3000 + i),
      1,
      { 'X-data-parallel-rank': '1' },
    );
    const batches = await rank1.settle();
    expect(batches.map((b) => [b.seq, b.payload[2]])).toEqual([[0n, 1]]);
    expect(sub.batches).toHaveLength(0);
  });

  it('a subscriber sees consecutive seqs; after reconnecting, replay returns the missed batches and the -1 sentinel; the index ends equal to the cache', async () => {
    // A small cache (48 blocks of 16) under shared-prefix traffic: stores, hits, evictions and a reset.
    const { url, sub, pubPort, replayPort } = await serveWithEvents({ engine: { blockSize: 16, numGpuBlocks: 48, maxNumSeqs: 4 }, enableControlRoutes: true });
    const random = prng(11).next;
    const prefixes = Array.from({ length: 3 }, (_, p) => Array.from({ length: 64 }, (_, i) => 100 + p * 1000 + i));
    const workload = async (requests: number) => {
      for (let i = 0; i < requests; i += 4) {
        await Promise.all(
          Array.from({ length: 4 }, () => {
            const prefix = prefixes[Math.floor(random() * prefixes.length)].slice(0, 16 * (1 + Math.floor(random() * 4)));
            const suffix = Array.from({ length: 5 + Math.floor(random() * 40) }, () => 5000 + Math.floor(random() * 5000));
            return complete(url, prefix.concat(suffix), 8 + Math.floor(random() * 24));
          }),
        );
      }
    };
    await workload(24);
    const first = await sub.settle();
    expect(first.length).toBeGreaterThan(10);
    expect(first.map((b) => b.seq)).toEqual(first.map((_, i) => BigInt(i)));
    sub.close();

    // Missed while disconnected: more traffic, a prefix-cache reset when idle, more traffic.
    await workload(12);
    expect((await fetch(`${url}/reset_prefix_cache`, { method: 'POST' })).status).toBe(200);
    await workload(12);
    const late = await EventSubscriber.connect(`tcp://127.0.0.1:${pubPort}`);
    subscribers.push(late);
    const missedFrom = first[first.length - 1].seq + 1n;
    const { batches: missed, sentinel } = await replay(`tcp://127.0.0.1:${replayPort}`, missedFrom);
    expect(missed.length).toBeGreaterThan(10);
    expect(missed.map((b) => b.seq)).toEqual(missed.map((_, i) => missedFrom + BigInt(i)));
    expect(sentinel.map((f) => f.toString('hex'))).toEqual(['', 'ffffffffffffffff', '']);
    // Nothing published since the replay was taken: the live socket is silent.
    expect(await late.settle()).toHaveLength(0);

    const index = new BlockIndex();
    for (const b of [...first, ...missed]) index.apply(b.payload[1] as unknown[]);
    expect(index.invalid).toEqual([]);
    expect(index.counts.BlockRemoved).toBeGreaterThan(0);
    expect(index.counts.AllBlocksCleared).toBe(1);
    const cache = (await (await fetch(`${url}/mocker/kv-blocks`)).json()) as { ranks: { block_hashes: string[] }[] };
    expect([...index.blocks].map(String).sort()).toEqual([...cache.ranks[0].block_hashes].sort());
    expect(index.blocks.size).toBeGreaterThan(0);
  });

  it('reset_prefix_cache: 409 while requests hold blocks, AllBlocksCleared with reset_running_requests=true', async () => {
    const { url, sub } = await serveWithEvents({ timing: 'fixed', forwardTimeMs: 20, engine: { blockSize: 16 }, enableControlRoutes: true });
    const inFlight = complete(
      url,
      Array.from({ length: 40 }, (_, i) => 7000 + i),
      30,
    );
    await sleep(150);
    const refused = await fetch(`${url}/reset_prefix_cache`, { method: 'POST' });
    expect(refused.status).toBe(409);
    expect(((await refused.json()) as { error: { message: string } }).error.message).toMatch(/running requests/);
    expect((await fetch(`${url}/reset_prefix_cache?reset_running_requests=maybe`, { method: 'POST' })).status).toBe(400);
    expect((await fetch(`${url}/reset_prefix_cache?reset_running_requests=true`, { method: 'POST' })).status).toBe(200);
    // The preempted request recomputes and still completes.
    expect((await inFlight).status).toBe(200);
    const tags = (await sub.settle()).flatMap((b) => (b.payload[1] as unknown[][]).map((e) => e[0]));
    expect(tags).toContain('AllBlocksCleared');
    const index = new BlockIndex();
    for (const b of sub.batches) index.apply(b.payload[1] as unknown[]);
    expect(index.invalid).toEqual([]);
  });
});

describe('--kv-events-config and the Dynamo port flags', () => {
  it("take vLLM's KVEventsConfig defaults (vllm-wire-reference §5)", () => {
    expect(parseKvEventsConfig('{"enable_kv_cache_events":true}', 'array')).toEqual({
      endpoint: 'tcp://*:5557',
      replayEndpoint: null,
      topic: '',
      bufferSteps: 10_000,
      hwm: 100_000,
      format: 'array',
    });
    expect(parseKvEventsConfig('{"enable_kv_cache_events":false,"publisher":"zmq"}', 'array')).toBeNull();
    expect(parseKvEventsConfig('{"enable_kv_cache_events":true,"publisher":"null"}', 'array')).toBeNull();
  });

  it('name the bad field', () => {
    expect(() => parseKvEventsConfig('{"enable_kv_cache_events":true,"buffer_step":5}', 'array')).toThrow(/buffer_step/);
    expect(() => parseKvEventsConfig('{"enable_kv_cache_events":true,"hwm":-1}', 'array')).toThrow(/"hwm"/);
    expect(() => parseKvEventsConfig('{enable', 'array')).toThrow(/not valid JSON/);
  });

  it('offset the port by the rank as vLLM offset_endpoint_port does (inproc gets _dp{r})', () => {
    expect(offsetEndpoint('tcp://*:5557', 0)).toBe('tcp://*:5557');
    expect(offsetEndpoint('tcp://*:5557', 3)).toBe('tcp://*:5560');
    expect(offsetEndpoint('tcp://[::1]:6000', 1)).toBe('tcp://[::1]:6001');
    expect(offsetEndpoint('inproc://kv', 2)).toBe('inproc://kv_dp2');
    expect(() => offsetEndpoint('ipc:///tmp/kv', 1)).toThrow(/tcp/);
  });

  it('want one Dynamo port per worker', () => {
    expect(dynamoKvEventsConfigs([5557, 5560], [5558, 5561], 2, 'array').map((c) => [c.endpoint, c.replayEndpoint, c.topic])).toEqual([
      ['tcp://*:5557', 'tcp://*:5558', ''],
      ['tcp://*:5560', 'tcp://*:5561', ''],
    ]);
    expect(() => dynamoKvEventsConfigs([5557], undefined, 2, 'array')).toThrow(/one per worker/);
  });
});

describe('DYN_MOCKER_KV_CACHE_TRACE', () => {
  let server: Running;
  const lines: string[] = [];
  beforeAll(async () => {
    vi.stubEnv('DYN_MOCKER_KV_CACHE_TRACE', 'true');
    vi.spyOn(console, 'log').mockImplementation((line: unknown) => void lines.push(String(line)));
    server = await serveInProcess({ mode: 'simulate', captures: ':memory:', timing: 'none', engine: { blockSize: 16, numGpuBlocks: 8 } });
  });
  afterAll(async () => {
    await server.close();
    vi.restoreAllMocks();
    vi.unstubAllEnvs();
  });

  it('logs one structured line per store and eviction (engine-reference §3.7)', async () => {
    const url = `http://127.0.0.1:${server.port}`;
    // 3 requests of 3 full prompt blocks each on 8 blocks: the third must evict.
    for (let r = 0; r < 3; r++)
      await complete(
        url,
        Array.from({ length: 48 }, (_, i) => 100 * r + i + 1),
        1,
      );
    const trace = lines.filter((l) => l.startsWith('kv_cache_trace '));
    const fields = trace.map((l) => Object.fromEntries([...l.matchAll(/(\w+)=("[^"]*"|\S+)/g)].map((m) => [m[1], m[2].replace(/"/g, '')])));
    expect(fields.filter((f) => f.event === 'allocation').length).toBeGreaterThanOrEqual(3);
    expect(fields.filter((f) => f.event === 'eviction').length).toBeGreaterThan(0);
    for (const f of fields) {
      expect(Object.keys(f)).toEqual([
        'engine_type',
        'event',
        'timestamp_ms',
        'dp_rank',
        'block_size',
        'free_blocks',
        'active_blocks',
        'inactive_blocks',
        'total_blocks',
        'utilization',
      ]);
      expect(f).toMatchObject({ engine_type: 'vllm', dp_rank: '0', block_size: '16', total_blocks: '8' });
      expect(Number(f.free_blocks) + Number(f.active_blocks) + Number(f.inactive_blocks)).toBe(8);
      expect(Number(f.utilization)).toBeCloseTo((Number(f.active_blocks) + Number(f.inactive_blocks)) / 8, 4);
    }
  });
});
