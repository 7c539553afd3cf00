/**
 * Real servers as trace workers (`mocker trace --target`): the KV event decoder against vLLM's wire
 * (vllm-wire-reference §5, hand-written msgpack bytes and mocker's own encoder), then HttpTargetWorker against
 * two spawned `mocker serve` processes that publish KV events over real ZMQ sockets.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import type { VllmKvEvent } from '../../src/engine/index.js';
import { decodeKvEventBatch, KvEventDecodeError } from '../../src/events/decoding.js';
import { encodeKvEventBatch } from '../../src/events/encoding.js';
import { connectTargets, type HttpTargetWorker } from '../../src/trace/httpTarget.js';
import { DEFAULT_KV_ROUTER_CONFIG, KvRouter } from '../../src/trace/kvRouter.js';
import type { OnlineSink } from '../../src/trace/online.js';
import { freePorts } from '../support/kvEventsClient.js';
import { listenOnLoopback } from '../support/loopback.js';
import { runMockerToExit, startMockerProcess, type MockerProcess } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';
import { MODEL } from '../support/vllmUpstream.js';

const hex = (text: string) => Buffer.from(text.replace(/#.*$/gm, '').replace(/\s+/g, ''), 'hex');

describe('decodeKvEventBatch', () => {
  it('reads the live vLLM 0.26 example of the reference (named-field map layout), written byte by byte', () => {
    const tokens = [151644, 872, 198, 9707, 11, 1879, 0, 127, 128, 65535, 65536, 151645, 13, 100, 2000, 30000];
    const payload = hex(`
      93                                        # [ts, events, dp_rank]
      cb 41daa8dbe0359fe7                       # float64 1789095808.8378847
      91 8b                                     # one event: a map of 11 fields
      a4 74797065 ab 426c6f636b53746f726564     # type: "BlockStored"
      ac 626c6f636b5f686173686573 91 cf dab89baa7b5857c0   # block_hashes: [uint64 15760518052499183552]
      b1 706172656e745f626c6f636b5f68617368 c0  # parent_block_hash: nil
      a9 746f6b656e5f696473 dc 0010             # token_ids: array16 of 16
        ce 0002505c cd 0368 cc c6 cd 25eb 0b cd 0757 00 7f cc 80 cd ffff ce 00010000 ce 0002505d 0d 64 cd 07d0 cd 7530
      aa 626c6f636b5f73697a65 10                # block_size: 16
      a7 6c6f72615f6964 c0                      # lora_id: nil
      a6 6d656469756d a3 475055                 # medium: "GPU"
      a9 6c6f72615f6e616d65 c0                  # lora_name: nil
      aa 65787472615f6b657973 91 c0             # extra_keys: [nil]
      a9 67726f75705f696478 00                  # group_idx: 0
      b2 6b765f63616368655f737065635f6b696e64 ae 66756c6c5f617474656e74696f6e   # kv_cache_spec_kind: "full_attention"
      00                                        # dp_rank 0
    `);
    expect(decodeKvEventBatch(payload)).toEqual({
      tsSeconds: 1789095808.8378847,
      events: [{ type: 'BlockStored', blockHashes: [15760518052499183552n], parentBlockHash: null, tokenIds: tokens, blockSize: 16 }],
      dataParallelRank: 0,
    });
  });

  it('reads v0.9 tagged arrays in a two-element batch: negative and digest hashes in u64 form; another medium is not the device cache', () => {
    const payload = hex(`
      92 cb 3ff8000000000000                    # [1.5, events] (no dp_rank)
      94
      96 ab 426c6f636b53746f726564 92 05 ff c0 94 01020304 02 c0   # ["BlockStored", [5, -1], nil, [1,2,3,4], 2, nil]
      92 ac 426c6f636b52656d6f766564 91 c4 20   # ["BlockRemoved", [bin 32]]
        000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f
      97 ab 426c6f636b53746f726564 91 07 c0 92 0506 02 c0 a3 435055   # ≈0.10.2 layout, medium "CPU"
      91 b0 416c6c426c6f636b73436c6561726564    # ["AllBlocksCleared"]
    `);
    expect(decodeKvEventBatch(payload)).toEqual({
      tsSeconds: 1.5,
      events: [
        { type: 'BlockStored', blockHashes: [5n, 2n ** 64n - 1n], parentBlockHash: null, tokenIds: [1, 2, 3, 4], blockSize: 2 },
        // int.from_bytes(digest, "big") & (2**64 - 1): the digest's last 8 bytes.
        { type: 'BlockRemoved', blockHashes: [0x18191a1b1c1d1e1fn] },
        { type: 'AllBlocksCleared' },
      ],
      dataParallelRank: null,
    });
  });

  const events: VllmKvEvent[] = [
    { type: 'BlockStored', blockHashes: [7n, 0xffff_ffff_ffff_fff0n, 0x1_0000_0000n], parentBlockHash: null, tokenIds: [1, 2, 3, 4, 5, 6], blockSize: 2 },
    { type: 'BlockStored', blockHashes: [12345678901234567890n], parentBlockHash: 0x1_0000_0000n, tokenIds: [151_000, 9], blockSize: 2 },
    { type: 'BlockRemoved', blockHashes: [7n, 12345678901234567890n] },
    { type: 'AllBlocksCleared' },
  ];
  it.each(['array', 'map'] as const)('gives back what mocker publishes in the %s layout', (format) => {
    expect(decodeKvEventBatch(encodeKvEventBatch(1234.25, events, 3, format))).toEqual({ tsSeconds: 1234.25, events, dataParallelRank: 3 });
  });

  it('refuses what is not a batch, saying what was wrong', () => {
    expect(() => decodeKvEventBatch(hex('c1'))).toThrow(KvEventDecodeError);
    expect(() => decodeKvEventBatch(hex('93 a1 78 90 00'))).toThrow(/timestamp must be a number/);
    expect(() => decodeKvEventBatch(hex('92 01 91 93 ab 426c6f636b53746f726564 a1 78 c0'))).toThrow(/block_hashes must be an array/);
  });
});

interface Recorded {
  admitted: number[];
  tokens: number[];
  sink: OnlineSink;
}

function recorder(): Recorded {
  const admitted: number[] = [];
  const tokens: number[] = [];
  return { admitted, tokens, sink: { admitted: (n) => admitted.push(n), tokens: (n) => tokens.push(n) } };
}

const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);
/** Ordinary Qwen3 token ids, different for each `offset`. */
const tokens = (n: number, offset: number) => Array.from({ length: n }, (_, i) => 1000 + offset * 500 + i);

describe('HttpTargetWorker against two mocker serve processes publishing KV events', () => {
  let dir: string;
  let servers: MockerProcess[] = [];
  let workers: HttpTargetWorker[] = [];
  let pubPorts: number[];

  beforeAll(async () => {
    dir = mkdtempSync(join(testTmpdir(), 'mocker-trace-target-'));
    pubPorts = await freePorts(2);
    servers = await Promise.all(
      pubPorts.map((port) =>
        startMockerProcess(['serve', '--timing', 'none', '--block-size', '16', '--enable-prompt-tokens-details', '--zmq-kv-events-ports', String(port)], 0, {
          cwd: dir,
        }),
      ),
    );
    workers = await connectTargets(
      servers.map((s, i) => ({ url: `http://127.0.0.1:${s.port}`, kvEvents: `tcp://127.0.0.1:${pubPorts[i]}` })),
      { routerBlockSize: 16, stallTimeoutMs: null },
    );
  });

  afterAll(async () => {
    await Promise.all(workers.map((w) => w.close()));
    await Promise.all(servers.map((s) => s.stop()));
    rmSync(dir, { recursive: true, force: true });
  });

  it('streams the tokens asked for, reports cached prompt tokens, and the KV events place each prompt on the server that served it', async () => {
    const router = new KvRouter({ workers: 2, blockSize: 16, config: DEFAULT_KV_ROUTER_CONFIG, maxNumBatchedTokens: null, seed: 0 });
    workers.forEach((w, i) => w.onKvEvents((events) => router.applyKvEvents(i, events)));
    expect(workers.map((w) => w.name)).toEqual(servers.map((s) => `http://127.0.0.1:${s.port}`));

    // 70 tokens: 4 full blocks of 16.
    const a = tokens(70, 0);
    const first = recorder();
    const answer = await workers[0].send({ uuid: 'a1', prompt: a, maxTokens: 5 }, first.sink);
    expect(answer.error).toBeNull();
    expect(sum(first.tokens)).toBe(5);
    // At the headers, then the usage chunk's cached_tokens: nothing was cached.
    expect(first.admitted).toEqual([0, 0]);
    await vi.waitFor(() => expect(router.overlaps(a)).toEqual([4, 0]), { timeout: 5000, interval: 50 });

    // Again: vLLM computes at least the last prompt token, so the 4 full blocks (64 tokens) are the hit.
    const again = recorder();
    expect((await workers[0].send({ uuid: 'a2', prompt: a, maxTokens: 3 }, again.sink)).error).toBeNull();
    expect(again.admitted).toEqual([0, 64]);
    expect(sum(again.tokens)).toBe(3);

    // 40 tokens on the other server: 2 full blocks there, nothing of it on the first.
    const b = tokens(40, 1);
    expect((await workers[1].send({ uuid: 'b1', prompt: b, maxTokens: 2 }, recorder().sink)).error).toBeNull();
    await vi.waitFor(() => expect(router.overlaps(b)).toEqual([0, 2]), { timeout: 5000, interval: 50 });
    expect(router.overlaps(a)).toEqual([4, 0]);
  });

  it("samples each server's cache metrics: idle usage 0, prefix queries and hits in prompt tokens", async () => {
    // From the first test: server 0 was asked 70 + 70 prompt tokens and hit 64; server 1 was asked 40.
    await vi.waitFor(
      () => {
        expect(workers[0].sample()).toEqual({ activeBlocks: 0, totalBlocks: 1000, prefixCacheQueries: 140, prefixCacheHits: 64 });
        expect(workers[1].sample()).toEqual({ activeBlocks: 0, totalBlocks: 1000, prefixCacheQueries: 40, prefixCacheHits: 0 });
      },
      { timeout: 5000, interval: 100 },
    );
  });

  it("answers an HTTP error with its status and the server's message, without throwing", async () => {
    // Far beyond Qwen3's vocabulary: vLLM refuses such a prompt with a 400.
    const answer = await workers[0].send({ uuid: 'bad', prompt: [9_999_999], maxTokens: 1 }, recorder().sink);
    expect(answer.error).toMatch(/^HTTP 400: \S/);
  });
});

describe('HttpTargetWorker against servers that are not vLLM', () => {
  it('gives an unreachable server a connection error answer; finding its model fails naming the URL', async () => {
    const [port] = await freePorts(1);
    const url = `http://127.0.0.1:${port}`;
    const [worker] = await connectTargets([{ url }], { model: MODEL, routerBlockSize: 16, stallTimeoutMs: null });
    try {
      const answer = await worker.send({ uuid: 'x', prompt: [1, 2, 3], maxTokens: 2 }, recorder().sink);
      expect(answer.error).toMatch(/ECONNREFUSED/);
    } finally {
      await worker.close();
    }
    await expect(connectTargets([{ url }], { routerBlockSize: 16, stallTimeoutMs: null })).rejects.toThrow(`cannot reach ${url}/v1/models`);
  });

  it('drops a field the server refuses (400 naming it) once and for all; counts a token per text chunk without ids; reports an error event', async () => {
    const bodies: Record<string, unknown>[] = [];
    // An OpenAI-style server: strict about unknown fields, no token ids, no cached-token details.
    const server = http.createServer((req, res) => {
      // It has no /metrics (the worker scrapes them).
      if (req.method !== 'POST') return void res.writeHead(404).end();
      let raw = '';
      req.on('data', (d: Buffer) => (raw += d.toString()));
      req.on('end', () => {
        const body = JSON.parse(raw) as Record<string, unknown>;
        bodies.push(body);
        if ('return_token_ids' in body) {
          res
            .writeHead(400, { 'content-type': 'application/json' })
            .end(JSON.stringify({ error: { message: 'Unrecognized request argument supplied: return_token_ids', type: 'invalid_request_error' } }));
          return;
        }
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        const event = (obj: unknown) => res.write(`data: ${JSON.stringify(obj)}\n\n`);
        if ((body.prompt as number[])[0] === 666) event({ error: { message: 'the engine died', code: 500 } });
        else {
          event({ choices: [{ index: 0, text: 'Hel' }] });
          event({ choices: [{ index: 0, text: '' }] });
          event({ choices: [{ index: 0, text: 'lo' }] });
          event({ choices: [], usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 } });
        }
        res.end('data: [DONE]\n\n');
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const warn = vi.spyOn(console, 'warn').mockImplementation(() => undefined);
    const [worker] = await connectTargets([{ url }], { model: 'gpt-x', routerBlockSize: 16, stallTimeoutMs: null });
    try {
      const seen = recorder();
      expect(await worker.send({ uuid: 'r1', prompt: [1, 2, 3], maxTokens: 2 }, seen.sink)).toEqual({ error: null });
      expect(seen.tokens).toEqual([1, 1]);
      expect(seen.admitted).toEqual([0]);
      expect(bodies.map((b) => 'return_token_ids' in b)).toEqual([true, false]);
      expect(bodies[1]).toEqual({ model: 'gpt-x', prompt: [1, 2, 3], max_tokens: 2, stream: true, stream_options: { include_usage: true }, ignore_eos: true });

      expect((await worker.send({ uuid: 'r2', prompt: [4], maxTokens: 1 }, recorder().sink)).error).toBeNull();
      expect(bodies).toHaveLength(3);
      expect('return_token_ids' in bodies[2]).toBe(false);
      expect(warn).toHaveBeenCalledTimes(1);

      const broken = await worker.send({ uuid: 'r3', prompt: [666], maxTokens: 1 }, recorder().sink);
      expect(broken.error).toMatch(/the engine died/);
    } finally {
      warn.mockRestore();
      await worker.close();
      await new Promise((resolve) => server.close(resolve));
    }
  });
});

describe('mocker trace --target against servers that answer badly', () => {
  const workload = ['--model', 'm', '--input-tokens', '8', '--output-tokens', '2', '--request-count', '5', '--arrival-interval-ms', '0', '--no-progress'];

  /** Runs the built CLI's trace against a server that answers every POST with `answer`; the run's directory is removed. */
  async function traceAgainst(answer: (res: http.ServerResponse) => void, extra: string[] = []) {
    const server = http.createServer((req, res) => {
      if (req.method !== 'POST') return void res.writeHead(404).end();
      req.resume().on('end', () => answer(res));
    });
    const upstream = await listenOnLoopback(server);
    const dir = mkdtempSync(join(testTmpdir(), 'trace-bad-target-'));
    try {
      return await runMockerToExit(['trace', '--target', upstream.url, ...workload, '--report-json', dir, ...extra], { cwd: dir });
    } finally {
      await upstream.close();
      rmSync(dir, { recursive: true, force: true });
    }
  }

  it('a server answering 200 with a body that is not an event stream: every request failed, said why, exit 1', async () => {
    const { code, stderr } = await traceAgainst((res) => res.writeHead(200, { 'content-type': 'text/html' }).end('<html>maintenance</html>'));
    expect(stderr).toMatch(/5 request\(s\) failed: .*answered 200 without a server-sent event: "<html>maintenance<\/html>"/);
    expect(stderr).toContain('none of the 5 request(s) completed');
    expect(code).toBe(1);
  });

  it('a server that stalls after its headers: each request is given up after --request-timeout, the run ends, exit 1', async () => {
    const { code, stderr } = await traceAgainst(
      (res) => res.writeHead(200, { 'content-type': 'text/event-stream' }).flushHeaders(),
      ['--request-timeout', '1'],
    );
    expect(stderr).toMatch(/5 request\(s\) failed: .*nothing received for 1 s/);
    expect(code).toBe(1);
  });
});
