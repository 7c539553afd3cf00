/**
 * AIPerf's mock server's other metrics endpoints of `mocker serve` (`/vllm/metrics` … `/dcgm2/metrics`), each read with a real
 * Prometheus text-format parser from the built CLI. The expected names are the ones each project's source gives
 * (test/fixtures/prometheus/backend-metrics.md); the counts and token totals are worked out from the requests sent.
 */
import parsePrometheusTextFormat from 'parse-prometheus-text-format';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runMockerToExit, startMockerProcess, type MockerProcess } from '../support/mockerProcess.js';
import { MODEL } from '../support/vllmUpstream.js';

type Families = ReturnType<typeof parsePrometheusTextFormat>;

// At least what AIPerf's mock server exposes per backend (ai-dynamo/aiperf tests/aiperf_mock_server/metrics.py), in
// each project's own spelling.
const NAMES: Record<string, string[]> = {
  '/vllm/metrics': [
    'vllm:e2e_request_latency_seconds',
    'vllm:time_to_first_token_seconds',
    'vllm:inter_token_latency_seconds',
    'vllm:prompt_tokens_total',
    'vllm:generation_tokens_total',
    'vllm:request_queue_time_seconds',
    'vllm:request_success_total',
    'vllm:num_requests_running',
    'vllm:num_requests_waiting',
    'vllm:kv_cache_usage_perc',
    'vllm:num_preemptions_total',
    'vllm:prefix_cache_hits_total',
    'vllm:prefix_cache_queries_total',
    'vllm:iteration_tokens_total',
  ],
  '/sglang/metrics': [
    'sglang:gen_throughput',
    'sglang:num_queue_reqs',
    'sglang:num_running_reqs',
    'sglang:cache_hit_rate',
    'sglang:num_used_tokens',
    'sglang:token_usage',
    'sglang:queue_time_seconds',
    'sglang:e2e_request_latency_seconds',
    'sglang:time_to_first_token_seconds',
    'sglang:prompt_tokens_total',
    'sglang:generation_tokens_total',
    'sglang:num_requests_total',
  ],
  '/trtllm/metrics': [
    'trtllm_request_success_total',
    'trtllm_e2e_request_latency_seconds',
    'trtllm_time_to_first_token_seconds',
    'trtllm_time_per_output_token_seconds',
    'trtllm_request_queue_time_seconds',
    'trtllm_request_prefill_time_seconds',
    'trtllm_request_decode_time_seconds',
    'trtllm_request_inference_time_seconds',
    'trtllm_prompt_tokens_total',
    'trtllm_generation_tokens_total',
    'trtllm_prompt_cached_tokens_total',
    'trtllm_kv_cache_hit_rate',
    'trtllm_kv_cache_utilization',
    'trtllm_num_requests_running',
    'trtllm_num_requests_waiting',
    'trtllm_num_requests_completed_total',
    'trtllm_kv_cache_max_blocks',
    'trtllm_kv_cache_free_blocks',
    'trtllm_kv_cache_used_blocks',
    'trtllm_kv_cache_tokens_per_block',
  ],
  '/dynamo_frontend/metrics': [
    'dynamo_frontend_requests_total',
    'dynamo_frontend_inflight_requests',
    'dynamo_frontend_queued_requests',
    'dynamo_frontend_disconnected_clients',
    'dynamo_frontend_request_duration_seconds',
    'dynamo_frontend_input_sequence_tokens',
    'dynamo_frontend_output_sequence_tokens',
    'dynamo_frontend_output_tokens_total',
    'dynamo_frontend_time_to_first_token_seconds',
    'dynamo_frontend_inter_token_latency_seconds',
    'dynamo_frontend_model_total_kv_blocks',
    'dynamo_frontend_model_max_num_seqs',
    'dynamo_frontend_model_max_num_batched_tokens',
    'dynamo_frontend_model_context_length',
    'dynamo_frontend_model_kv_cache_block_size',
  ],
};
const COMPONENT_NAMES = [
  'dynamo_component_requests_total',
  'dynamo_component_inflight_requests',
  'dynamo_component_request_duration_seconds',
  'dynamo_component_kvstats_active_blocks',
  'dynamo_component_kvstats_total_blocks',
  'dynamo_component_kvstats_gpu_cache_usage_percent',
  'dynamo_component_kvstats_gpu_prefix_cache_hit_rate',
];
NAMES['/dynamo_component/prefill/metrics'] = COMPONENT_NAMES;
NAMES['/dynamo_component/decode/metrics'] = COMPONENT_NAMES;
const DCGM_NAMES = [
  'DCGM_FI_DEV_GPU_UTIL',
  'DCGM_FI_DEV_POWER_USAGE',
  'DCGM_FI_DEV_POWER_MGMT_LIMIT',
  'DCGM_FI_DEV_FB_USED',
  'DCGM_FI_DEV_FB_TOTAL',
  'DCGM_FI_DEV_FB_FREE',
  'DCGM_FI_DEV_GPU_TEMP',
  'DCGM_FI_DEV_MEMORY_TEMP',
  'DCGM_FI_DEV_SM_CLOCK',
  'DCGM_FI_DEV_MEM_CLOCK',
  'DCGM_FI_DEV_MEM_COPY_UTIL',
  'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION',
  'DCGM_FI_DEV_XID_ERRORS',
  'DCGM_FI_DEV_POWER_VIOLATION',
  'DCGM_FI_DEV_THERMAL_VIOLATION',
  'DCGM_FI_PROF_GR_ENGINE_ACTIVE',
];
const DCGM_LABELS = ['gpu', 'UUID', 'pci_bus_id', 'device', 'modelName', 'Hostname'];

async function scrape(server: MockerProcess, path: string): Promise<{ status: number; text: string; families: Families }> {
  const res = await fetch(`http://127.0.0.1:${server.port}${path}`);
  const text = await res.text();
  return { status: res.status, text, families: res.status === 200 ? parsePrometheusTextFormat(text) : [] };
}

const family = (families: Families, name: string) => {
  const f = families.find((x) => x.name === name);
  if (!f) throw new Error(`no ${name}`);
  return f;
};
const value = (families: Families, name: string, labels: Record<string, string> = {}) =>
  Number(family(families, name).metrics.find((m) => Object.entries(labels).every(([k, v]) => m.labels?.[k] === v))?.value);
/** A histogram series' `_count` or `_sum`, read from the text (the parser folds labelled histograms into buckets). */
const histogramSample = (text: string, name: string) => {
  const line = text.split('\n').find((l) => l.startsWith(`${name}{`) || l.startsWith(`${name} `));
  if (!line) throw new Error(`no ${name}`);
  return Number(line.slice(line.lastIndexOf(' ') + 1));
};

describe('backend metrics of an aggregated server', () => {
  let server: MockerProcess;
  // 4 completions of known prompt lengths, each exactly MAX_TOKENS long.
  const prompts = [7, 8, 9, 10].map((n, i) => Array.from({ length: n }, (_, t) => 2000 + 100 * i + t));
  const MAX_TOKENS = 5;
  const PROMPT_TOKENS = 7 + 8 + 9 + 10;
  const GENERATED = 4 * MAX_TOKENS;

  beforeAll(async () => {
    server = await startMockerProcess(
      // A 60 s window and a tiny floor: the tokens of this test are the peak throughput, load 1 until they age out.
      [
        'serve',
        '--mode',
        'random',
        '--timing',
        'fixed',
        '--forward-time-ms',
        '2',
        '--dcgm-gpu-name',
        'a100',
        '--dcgm-num-gpus',
        '3',
        '--dcgm-hostname',
        'node-7',
        '--dcgm-window-sec',
        '60',
        '--dcgm-min-throughput',
        '0.01',
      ],
    );
  });
  afterAll(async () => {
    await server?.stop();
  });

  it('DCGM: every GPU idle (0 % utilisation) before any request, with the GPU model and count asked for', async () => {
    for (const path of ['/dcgm1/metrics', '/dcgm2/metrics']) {
      const { status, families } = await scrape(server, path);
      expect(status).toBe(200);
      for (const name of DCGM_NAMES) expect(family(families, name).metrics, `${path} ${name}`).toHaveLength(3);
      const util = family(families, 'DCGM_FI_DEV_GPU_UTIL');
      expect(util.type).toBe('GAUGE');
      expect(util.metrics.map((m) => m.labels?.gpu)).toEqual(['0', '1', '2']);
      for (const m of util.metrics) {
        expect(Object.keys(m.labels ?? {}).sort()).toEqual([...DCGM_LABELS].sort());
        expect(m.labels).toMatchObject({ modelName: 'NVIDIA A100-SXM4-40GB', Hostname: 'node-7', device: `nvidia${m.labels?.gpu}` });
        expect(Number(m.value)).toBe(0);
      }
      // A100 SXM4 40GB: 40 GB of framebuffer, a 400 W limit (NVIDIA's data sheet).
      expect(value(families, 'DCGM_FI_DEV_FB_TOTAL')).toBe(40 * 1024);
      expect(value(families, 'DCGM_FI_DEV_POWER_MGMT_LIMIT')).toBe(400);
      expect(family(families, 'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION').type).toBe('COUNTER');
    }
    // Two exporters: two sets of GPUs.
    const uuids = async (path: string) => family((await scrape(server, path)).families, 'DCGM_FI_DEV_GPU_UTIL').metrics.map((m) => m.labels?.UUID);
    expect(new Set([...(await uuids('/dcgm1/metrics')), ...(await uuids('/dcgm2/metrics'))]).size).toBe(6);
  });

  it("after N completions, each backend's request and token counters agree with N and the tokens sent and generated", async () => {
    for (const prompt of prompts) {
      const res = await fetch(`http://127.0.0.1:${server.port}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, prompt, max_tokens: MAX_TOKENS, ignore_eos: true }),
      });
      expect(res.status).toBe(200);
    }
    const n = prompts.length;
    const got: Record<string, { text: string; families: Families }> = {};
    for (const [path, names] of Object.entries(NAMES)) {
      const { status, text, families } = await scrape(server, path);
      expect(status, path).toBe(200);
      for (const name of names)
        expect(
          families.map((f) => f.name),
          `${path} has ${name}`,
        ).toContain(name);
      got[path] = { text, families };
    }

    const vllm = got['/vllm/metrics'].families;
    expect(value(vllm, 'vllm:request_success_total', { finished_reason: 'length' })).toBe(n);
    expect(value(vllm, 'vllm:prompt_tokens_total')).toBe(PROMPT_TOKENS);
    expect(value(vllm, 'vllm:generation_tokens_total')).toBe(GENERATED);
    // /vllm/metrics is vLLM's alone: mocker's own counters stay on /metrics.
    expect(vllm.some((f) => f.name.startsWith('mocker_'))).toBe(false);

    const sglang = got['/sglang/metrics'].families;
    expect(value(sglang, 'sglang:num_requests_total')).toBe(n);
    expect(value(sglang, 'sglang:prompt_tokens_total')).toBe(PROMPT_TOKENS);
    expect(value(sglang, 'sglang:generation_tokens_total')).toBe(GENERATED);

    const trtllm = got['/trtllm/metrics'].families;
    expect(value(trtllm, 'trtllm_request_success_total', { finished_reason: 'length', engine_type: 'trtllm', model_name: MODEL })).toBe(n);
    expect(value(trtllm, 'trtllm_prompt_tokens_total')).toBe(PROMPT_TOKENS);
    expect(value(trtllm, 'trtllm_generation_tokens_total')).toBe(GENERATED);
    expect(value(trtllm, 'trtllm_num_requests_completed_total')).toBe(n);
    expect(histogramSample(got['/trtllm/metrics'].text, 'trtllm_e2e_request_latency_seconds_count')).toBe(n);

    const frontend = got['/dynamo_frontend/metrics'];
    expect(value(frontend.families, 'dynamo_frontend_requests_total', { model: MODEL, status: 'success' })).toBe(n);
    expect(value(frontend.families, 'dynamo_frontend_output_tokens_total')).toBe(GENERATED);
    expect(value(frontend.families, 'dynamo_frontend_inflight_requests')).toBe(0);
    expect(histogramSample(frontend.text, 'dynamo_frontend_input_sequence_tokens_sum')).toBe(PROMPT_TOKENS);
    expect(histogramSample(frontend.text, 'dynamo_frontend_output_sequence_tokens_sum')).toBe(GENERATED);
    expect(histogramSample(frontend.text, 'dynamo_frontend_time_to_first_token_seconds_count')).toBe(n);
    expect(histogramSample(frontend.text, 'dynamo_frontend_inter_token_latency_seconds_count')).toBe(n * (MAX_TOKENS - 1));
    // Dynamo's generate_log_buckets(0.001, 480, 18), as AIPerf's mock server lists them from a real export.
    const ttftBuckets = Object.keys(family(frontend.families, 'dynamo_frontend_time_to_first_token_seconds').metrics[0].buckets ?? {})
      .map(Number)
      .filter(Number.isFinite)
      .sort((x, y) => x - y);
    expect(ttftBuckets.slice(0, 7)).toEqual([0, 0.0022, 0.0047, 0.01, 0.022, 0.047, 0.1]);

    // Aggregated: the same engine seen as its prefill worker and as its decode worker.
    for (const [path, component] of [
      ['/dynamo_component/prefill/metrics', 'prefill'],
      ['/dynamo_component/decode/metrics', 'backend'],
    ]) {
      const { families, text } = got[path];
      const labels = { dynamo_namespace: 'dynamo', dynamo_component: component, dynamo_endpoint: 'generate', model: MODEL };
      expect(value(families, 'dynamo_component_requests_total', labels), path).toBe(n);
      expect(value(families, 'dynamo_component_inflight_requests', labels), path).toBe(0);
      expect(histogramSample(text, 'dynamo_component_request_duration_seconds_count'), path).toBe(n);
      expect(value(families, 'dynamo_component_kvstats_total_blocks', { dynamo_namespace: 'dynamo', dynamo_component: component }), path).toBe(16384);
    }
  });

  it('DCGM: utilisation above 0 once tokens flowed within the window', async () => {
    const { families } = await scrape(server, '/dcgm1/metrics');
    for (const m of family(families, 'DCGM_FI_DEV_GPU_UTIL').metrics) expect(Number(m.value)).toBeGreaterThan(0);
    for (const m of family(families, 'DCGM_FI_DEV_POWER_USAGE').metrics) expect(Number(m.value)).toBeGreaterThan(50);
  });

  it('answers 405 to other methods on the metrics paths', async () => {
    const res = await fetch(`http://127.0.0.1:${server.port}/trtllm/metrics`, { method: 'POST' });
    expect(res.status).toBe(405);
  });
});

describe('DCGM seeds and defaults', () => {
  const servers: MockerProcess[] = [];
  beforeAll(async () => {
    for (let i = 0; i < 2; i++) servers.push(await startMockerProcess(['serve', '--mode', 'random', '--dcgm-seed', '5']));
  });
  afterAll(async () => {
    for (const s of servers) await s.stop();
  });

  it('two servers with the same --dcgm-seed give the same idle output; defaults: 2 H200 GPUs on localhost', async () => {
    const [a, b] = await Promise.all(servers.map((s) => scrape(s, '/dcgm1/metrics')));
    expect(a.text).toBe(b.text);
    const util = family(a.families, 'DCGM_FI_DEV_GPU_UTIL').metrics;
    expect(util).toHaveLength(2);
    for (const m of util) expect(m.labels).toMatchObject({ modelName: 'NVIDIA H200', Hostname: 'localhost' });
    // 141 GB of HBM3e (NVIDIA's H200 data sheet).
    expect(value(a.families, 'DCGM_FI_DEV_FB_TOTAL')).toBe(141 * 1024);
  });
});

describe('Dynamo component metrics of a disaggregated worker', () => {
  let server: MockerProcess;
  beforeAll(async () => {
    server = await startMockerProcess(['serve', '--mode', 'random', '--disaggregation-mode', 'prefill']);
  });
  afterAll(async () => {
    await server?.stop();
  });

  it("a prefill worker serves its own role's component metrics; the decode path says where to look", async () => {
    const prefill = await scrape(server, '/dynamo_component/prefill/metrics');
    expect(prefill.status).toBe(200);
    expect(family(prefill.families, 'dynamo_component_requests_total').metrics[0].labels).toMatchObject({ dynamo_component: 'prefill' });
    const decode = await scrape(server, '/dynamo_component/decode/metrics');
    expect(decode.status).toBe(404);
    expect(JSON.parse(decode.text).detail).toMatch(/prefill worker.*\/dynamo_component\/prefill\/metrics/);
  });
});

describe('--dcgm-* flags', () => {
  it.each([
    [['--dcgm-gpu-name', 'v100'], /--dcgm-gpu-name/],
    [['--dcgm-num-gpus', '9'], /--dcgm-num-gpus/],
    [['--dcgm-window-sec', '0.05'], /--dcgm-window-sec/],
    [['--dcgm-min-throughput', '0'], /--dcgm-min-throughput/],
  ])('refuses %j', async (flags, message) => {
    const { code, stderr } = await runMockerToExit(['serve', '--mode', 'random', ...flags]);
    expect(code).not.toBe(0);
    expect(stderr).toMatch(message);
  });
});
