/**
 * LoRA adapters as vLLM serves them: `--enable-lora`, `--lora-modules`, `--max-loras`, the runtime load and unload
 * routes (VLLM_ALLOW_RUNTIME_LORA_UPDATING), LoRA model cards, requests by adapter name, the adapter's name in the
 * block hashes (vLLM's extra keys) and KV events, and `vllm:lora_requests_info`. Shapes and messages from vLLM's
 * serving_models.py, lora/api_router.py, kv_cache_utils.py, block_pool.py and v1/metrics/loggers.py.
 */
import { createHash } from 'node:crypto';
import OpenAI from 'openai';
import parsePrometheusTextFormat from 'parse-prometheus-text-format';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EngineCore, zeroTiming, type CoreRequest, type SchedulerConfig } from '../../src/engine/index.js';
import { EventSubscriber, freePorts, sleep } from '../support/kvEventsClient.js';
import { runMockerToExit, startMockerProcess, type MockerProcess } from '../support/mockerProcess.js';
import { VLLM_SCHEDULER_DEFAULTS } from '../support/schedulerDefaults.js';

const BASE = 'Qwen/Qwen3-0.6B';
const ADAPTER_A = { name: 'a', id: 1 };
const ADAPTER_B = { name: 'b', id: 2 };

describe('max_loras in the vLLM-flavour scheduler (vLLM scheduler.py: a request whose adapter would exceed it waits)', () => {
  const core = (overrides: Partial<SchedulerConfig>) =>
    new EngineCore({
      numGpuBlocks: 1024,
      blockSize: 16,
      ...VLLM_SCHEDULER_DEFAULTS,
      timing: zeroTiming(false),
      seed: 1,
      ...overrides,
    });
  const prompt = Array.from({ length: 40 }, (_, i) => 100 + i);
  const request = (id: string, lora?: CoreRequest['lora']): CoreRequest => ({ id, promptTokenIds: prompt, maxOutputTokens: 3, lora });

  it('max_loras 1: the second adapter waits, keeping its place, while the first adapter and the base model go past it', () => {
    const engine = core({ maxLoras: 1 });
    engine.add(request('a1', ADAPTER_A));
    engine.add(request('b1', ADAPTER_B));
    engine.add(request('a2', ADAPTER_A));
    engine.add(request('base'));
    engine.add(request('b2', ADAPTER_B));
    engine.executePass(0);
    expect(engine.runningIds()).toEqual(['a1', 'a2', 'base']);
    expect(engine.waitingIds()).toEqual(['b1', 'b2']);
    expect(engine.engineStats()).toMatchObject({ runningLoraAdapters: ['a'], waitingLoraAdapters: ['b'] });
    // Three tokens each: a1, a2 and base finish in the third pass; b's requests only then come in, together.
    engine.executePass(1000);
    expect(engine.waitingIds()).toEqual(['b1', 'b2']);
    engine.executePass(2000);
    expect(engine.runningIds()).toEqual([]);
    const pass = engine.executePass(3000);
    expect(pass.admitted.map((a) => a.id)).toEqual(['b1', 'b2']);
    expect(engine.engineStats()).toMatchObject({ runningLoraAdapters: ['b'], waitingLoraAdapters: [] });
  });

  it('max_loras 2: both adapters run in the first pass', () => {
    const engine = core({ maxLoras: 2 });
    engine.add(request('a1', ADAPTER_A));
    engine.add(request('b1', ADAPTER_B));
    engine.executePass(0);
    expect(engine.runningIds()).toEqual(['a1', 'b1']);
  });

  it('the same tokens under another adapter, or none, never hit the blocks an adapter cached', () => {
    const engine = core({ maxLoras: 4 });
    const cachedTokens = (id: string, lora?: CoreRequest['lora']) => {
      engine.add(request(id, lora));
      const admitted = engine.executePass(0).admitted.find((a) => a.id === id)!.cachedTokens;
      while (!engine.isIdle) engine.executePass(0);
      return admitted;
    };
    expect(cachedTokens('a1', ADAPTER_A)).toBe(0);
    expect(cachedTokens('b1', ADAPTER_B)).toBe(0);
    expect(cachedTokens('base1')).toBe(0);
    // 40 prompt tokens in blocks of 16: two whole blocks hit the second time (at most 39 tokens can).
    expect(cachedTokens('a2', ADAPTER_A)).toBe(32);
    expect(cachedTokens('base2')).toBe(32);
  });

  it('refuses a max_loras below 1', () => {
    expect(() => core({ maxLoras: 0 })).toThrow(/max_loras must be an integer >= 1/);
  });
});

// --- The built CLI, as a user starts it ----------------------------------------------------------------------

const jsonPost = (url: string, body: unknown) => fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
const sha256 = (bytes: Buffer) => createHash('sha256').update(bytes).digest();

/**
 * vLLM's block hash by hand (vllm-wire-reference.md §6, sha256_cbor): sha256 of the canonical CBOR array
 * `[parent (bstr 32), [16 token ids], extra]`, token ids below 24 (one byte each), extra `("name",)` or None.
 */
function blockDigest(parent: Buffer, tokens: number[], lora: string | null): Buffer {
  expect(tokens.length).toBe(16);
  expect(tokens.every((t) => t < 24)).toBe(true);
  const extra = lora === null ? 'f6' : '81' + (0x60 + lora.length).toString(16) + Buffer.from(lora, 'ascii').toString('hex');
  return sha256(Buffer.from('83' + '5820' + parent.toString('hex') + '90' + Buffer.from(tokens).toString('hex') + extra, 'hex'));
}
/** NONE_HASH with PYTHONHASHSEED=0: sha256 of the CBOR text "0". */
const NONE_HASH = sha256(Buffer.from('6130', 'hex'));
/** maybe_convert_block_hash: the digest's low 64 bits, unsigned. */
const eventHash = (digest: Buffer) => digest.readBigUInt64BE(24);

const children: MockerProcess[] = [];
afterAll(async () => {
  await Promise.all(children.map((c) => c.stop()));
});

describe('mocker serve --enable-lora with VLLM_ALLOW_RUNTIME_LORA_UPDATING=true', () => {
  let url: string;
  let client: OpenAI;
  let events: EventSubscriber;

  beforeAll(async () => {
    const [pubPort] = await freePorts(1);
    const child = await startMockerProcess(
      [
        'serve',
        '--mode',
        'random',
        '--timing',
        'fixed',
        '--forward-time-ms',
        '20',
        '--block-size',
        '16',
        '--enable-prompt-tokens-details',
        '--enable-lora',
        '--max-loras',
        '1',
        '--lora-modules',
        'a=/adapters/a',
        '{"name":"b","path":"/adapters/b","base_model_name":"Qwen/Qwen3-0.6B"}',
        '--kv-events-config',
        JSON.stringify({ enable_kv_cache_events: true, publisher: 'zmq', endpoint: `tcp://*:${pubPort}` }),
        '--kv-events-format',
        'map',
      ],
      0,
      { env: { ...process.env, VLLM_ALLOW_RUNTIME_LORA_UPDATING: 'true', PYTHONHASHSEED: '0' } },
    );
    children.push(child);
    url = `http://127.0.0.1:${child.port}`;
    client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0 });
    events = await EventSubscriber.connect(`tcp://127.0.0.1:${pubPort}`);
    return () => events.close();
  }, 60_000);

  const modelIds = async () => (await client.models.list()).data.map((m) => m.id);

  it('lists the adapters of --lora-modules as vLLM LoRA cards: id = name, root = path, parent = base model, max_model_len null', async () => {
    const body = (await (await fetch(`${url}/v1/models`)).json()) as { data: Record<string, unknown>[] };
    expect(body.data.map((m) => m.id)).toEqual([BASE, 'a', 'b']);
    expect(body.data[1]).toMatchObject({ id: 'a', object: 'model', owned_by: 'vllm', root: '/adapters/a', parent: BASE, max_model_len: null });
    expect(body.data[2]).toMatchObject({ id: 'b', root: '/adapters/b', parent: BASE, max_model_len: null });
    expect((body.data[1].permission as { object: string }[])[0].object).toBe('model_permission');
  });

  it('load → listed → served by name → unload → 404 and gone from /v1/models', async () => {
    const loaded = await jsonPost(`${url}/v1/load_lora_adapter`, { lora_name: 'sql-lora', lora_path: '/adapters/sql' });
    expect(loaded.status).toBe(200);
    // vLLM: Response(status_code=200, content=...) — bare text, no content type.
    expect(loaded.headers.get('content-type')).toBeNull();
    expect(await loaded.text()).toBe("Success: LoRA adapter 'sql-lora' added successfully.");
    const card = (await client.models.list()).data.find((m) => m.id === 'sql-lora');
    expect(card).toMatchObject({ root: '/adapters/sql', parent: BASE, max_model_len: null });

    const chat = await client.chat.completions.create({ model: 'sql-lora', messages: [{ role: 'user', content: 'SELECT 1' }], max_tokens: 2 });
    expect(chat.model).toBe('sql-lora');
    expect(chat.usage?.completion_tokens).toBe(2);

    const unloaded = await jsonPost(`${url}/v1/unload_lora_adapter`, { lora_name: 'sql-lora' });
    expect(unloaded.status).toBe(200);
    expect(await unloaded.text()).toBe("Success: LoRA adapter 'sql-lora' removed successfully.");
    const gone = await client.chat.completions
      .create({ model: 'sql-lora', messages: [{ role: 'user', content: 'SELECT 1' }], max_tokens: 2 })
      .catch((e: unknown) => e);
    expect(gone).toBeInstanceOf(OpenAI.NotFoundError);
    expect((gone as InstanceType<typeof OpenAI.NotFoundError>).error).toEqual({
      message: 'The model `sql-lora` does not exist.',
      type: 'NotFoundError',
      param: 'model',
      code: 404,
    });
    expect(await modelIds()).toEqual([BASE, 'a', 'b']);
  });

  it("answers a second load, an unknown unload and missing fields with vLLM's errors", async () => {
    const twice = await jsonPost(`${url}/v1/load_lora_adapter`, { lora_name: 'a', lora_path: '/elsewhere' });
    expect(twice.status).toBe(400);
    expect(await twice.json()).toEqual({
      error: {
        message: "The lora adapter 'a' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.",
        type: 'InvalidUserInput',
        param: null,
        code: 400,
      },
    });
    const unknown = await jsonPost(`${url}/v1/unload_lora_adapter`, { lora_name: 'nope' });
    expect(unknown.status).toBe(404);
    expect(await unknown.json()).toEqual({ error: { message: "The lora adapter 'nope' cannot be found.", type: 'NotFoundError', param: null, code: 404 } });
    const empty = await jsonPost(`${url}/v1/load_lora_adapter`, { lora_name: '', lora_path: '' });
    expect(empty.status).toBe(400);
    expect(((await empty.json()) as { error: { message: string } }).error.message).toBe("Both 'lora_name' and 'lora_path' must be provided.");
    const missing = await jsonPost(`${url}/v1/load_lora_adapter`, { lora_name: 'x' });
    expect(missing.status).toBe(400);
    expect(JSON.stringify(await missing.json())).toContain('lora_path');
    // The refused second load replaced nothing.
    expect((await client.models.list()).data.find((m) => m.id === 'a')).toMatchObject({ root: '/adapters/a' });
  });

  it('hashes the same tokens differently under each adapter and the base model, as vLLM (extra keys = the LoRA name)', async () => {
    // 33 prompt tokens: two full blocks of 16 are stored.
    const prompt = Array.from({ length: 33 }, (_, i) => 1 + (i % 20));
    for (const model of ['a', 'b', BASE]) {
      const res = await jsonPost(`${url}/v1/completions`, { model, prompt, max_tokens: 1 });
      expect(res.status).toBe(200);
    }
    await events.settle();
    type Stored = {
      type: string;
      block_hashes: (number | bigint)[];
      token_ids: number[];
      lora_id: number | null;
      lora_name: string | null;
      extra_keys: unknown;
    };
    const stored = events.batches
      .flatMap((b) => b.payload[1] as Stored[])
      .filter((e) => e.type === 'BlockStored' && e.token_ids.length === 32 && e.token_ids.every((t, i) => t === prompt[i]));
    expect(stored.map((e) => e.lora_name)).toEqual(['a', 'b', null]);
    expect(stored.map((e) => e.lora_id)).toEqual([1, 2, null]);
    expect(stored.map((e) => e.extra_keys)).toEqual([
      [['a'], ['a']],
      [['b'], ['b']],
      [null, null],
    ]);
    for (const [i, lora] of (['a', 'b', null] as const).entries()) {
      const first = blockDigest(NONE_HASH, prompt.slice(0, 16), lora);
      const second = blockDigest(first, prompt.slice(16, 32), lora);
      expect(stored[i].block_hashes.map(BigInt), `model ${lora ?? 'base'}`).toEqual([eventHash(first), eventHash(second)]);
    }
    expect(new Set(stored.flatMap((e) => e.block_hashes.map(BigInt))).size).toBe(6);
  });

  it('hits the prefix cache for a repeat under the same adapter, never under another adapter or the base model', async () => {
    const messages: OpenAI.ChatCompletionMessageParam[] = [
      { role: 'user', content: 'A prompt long enough to fill a few blocks of sixteen tokens, repeated under several adapters.' },
    ];
    const cached = async (model: string) =>
      (await client.chat.completions.create({ model, messages, max_tokens: 1 })).usage?.prompt_tokens_details?.cached_tokens;
    const first = await client.chat.completions.create({ model: 'a', messages, max_tokens: 1 });
    const promptTokens = first.usage!.prompt_tokens;
    expect(first.usage?.prompt_tokens_details?.cached_tokens).toBe(0);
    const wholeBlocks = Math.floor((promptTokens - 1) / 16) * 16;
    expect(wholeBlocks).toBeGreaterThan(0);
    expect(await cached('a')).toBe(wholeBlocks);
    expect(await cached('b')).toBe(0);
    expect(await cached(BASE)).toBe(0);
    expect(await cached(BASE)).toBe(wholeBlocks);
  });

  it('shows running and waiting adapters and max_lora in vllm:lora_requests_info, set to the current time (max_loras 1: b waits for a)', async () => {
    const before = Date.now() / 1000;
    const long = (model: string) => client.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 30, stream: true });
    const streamA = await long('a');
    const readerA = streamA[Symbol.asyncIterator]();
    await readerA.next(); // a is running
    const doneB = (async () => {
      let n = 0;
      for await (const chunk of await long('b')) n += chunk.choices[0]?.delta.content === undefined ? 0 : 1;
      return n;
    })();
    type Sample = { labels: Record<string, string>; value: string };
    let seen: Sample | undefined;
    for (let poll = 0; poll < 100 && !seen; poll++) {
      const families = parsePrometheusTextFormat(await (await fetch(`${url}/metrics`)).text()) as {
        name: string;
        type: string;
        help: string;
        metrics: Sample[];
      }[];
      const info = families.find((f) => f.name === 'vllm:lora_requests_info');
      expect(info).toMatchObject({ type: 'GAUGE', help: 'Running stats on lora requests.' });
      seen = info!.metrics.find((m) => m.labels.running_lora_adapters === 'a' && m.labels.waiting_lora_adapters === 'b');
      if (!seen) await sleep(20);
    }
    expect(seen?.labels).toEqual({ max_lora: '1', running_lora_adapters: 'a', waiting_lora_adapters: 'b' });
    expect(Number(seen!.value)).toBeGreaterThanOrEqual(before - 1);
    expect(Number(seen!.value)).toBeLessThanOrEqual(Date.now() / 1000 + 1);
    while (!(await readerA.next()).done);
    expect(await doneB).toBeGreaterThan(0);
  });
});

describe('mocker serve without VLLM_ALLOW_RUNTIME_LORA_UPDATING', () => {
  it('has no load or unload route, and without --enable-lora no vllm:lora_requests_info', async () => {
    const env = { ...process.env };
    delete env.VLLM_ALLOW_RUNTIME_LORA_UPDATING;
    const child = await startMockerProcess(['serve', '--mode', 'random', '--timing', 'none'], 0, { env });
    children.push(child);
    const url = `http://127.0.0.1:${child.port}`;
    for (const route of ['/v1/load_lora_adapter', '/v1/unload_lora_adapter']) {
      const res = await jsonPost(`${url}${route}`, { lora_name: 'a', lora_path: '/a' });
      expect(res.status).toBe(404);
      expect(await res.json()).toEqual({ detail: 'Not Found' });
    }
    expect(await (await fetch(`${url}/metrics`)).text()).not.toContain('lora');
  }, 60_000);
});

describe('mocker serve refuses LoRA it cannot serve, at start', () => {
  it('--lora-modules without --enable-lora fails as vLLM does', async () => {
    const run = await runMockerToExit(['serve', '--mode', 'random', '--port', '0', '--host', '127.0.0.1', '--lora-modules', 'a=/x']);
    expect(run.code).not.toBe(0);
    expect(run.stderr).toContain('LoRA is not enabled. Use --enable-lora to enable LoRA.');
  }, 60_000);

  it('--enable-lora with --engine-type sglang names both', async () => {
    const run = await runMockerToExit(['serve', '--mode', 'random', '--port', '0', '--host', '127.0.0.1', '--engine-type', 'sglang', '--enable-lora']);
    expect(run.code).not.toBe(0);
    expect(run.stderr).toMatch(/--enable-lora.*--engine-type vllm/);
  }, 60_000);

  it('an unreadable --lora-modules entry is named', async () => {
    const run = await runMockerToExit(['serve', '--mode', 'random', '--enable-lora', '--lora-modules', '{"name":"a"}']);
    expect(run.code).not.toBe(0);
    expect(run.stderr).toContain('Invalid fields for --lora-modules: {"name":"a"}');
  }, 30_000);
});
