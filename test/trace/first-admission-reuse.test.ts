/**
 * Prefix reuse reported as vLLM and Dynamo report it: a preempted request that comes back finds its own earlier KV,
 * which is not prefix sharing. vLLM keeps those lookups apart (`PrefixCacheStats.record(num_tokens, num_hits,
 * preempted)` in vllm/v1/metrics/stats.py adds a previously preempted request to `preempted_queries` /
 * `preempted_hits`, a new one to `queries` / `hits`), and its Prometheus logger counts only the latter
 * (`PrometheusStatLogger.record` in vllm/v1/metrics/loggers.py: `counter_prefix_cache_queries.inc(
 * scheduler_stats.prefix_cache_stats.queries)`, likewise hits). Dynamo's replay collector keeps each request's
 * most reuse over its admissions (`prefix_cache_reused_ratio`) and, apart, what its first admission found
 * (`first_admission_prefix_cache_reused_ratio`, lib/mocker/src/replay/collector.rs `on_admit`).
 *
 * The hand-computed case, blocks of 16 tokens, 7 KV blocks, vLLM's scheduler:
 * - A: 64 prompt tokens (blocks a0 a1 a2 a3), 20 output tokens, first;
 * - B: 48 prompt tokens whose first 32 are A's (a0 a1, then b2), 20 output tokens, right after.
 * A is admitted into an empty cache: reuses 0. B's first admission finds a0 a1: 32 tokens. Running, A holds 5
 * blocks and B 2 of its own (b2 and its first output block) — all 7. A needs a 6th block before B a 5th (it started
 * first), so B, the newest, is preempted once; its own blocks go back to the cache, the last freed (its output
 * block) evicted first for A. B comes back after A finishes and finds a0 a1 b2: 48 tokens (its output block is gone).
 * So: reused at most 0 + 48 = 48, at first admission 0 + 32 = 32, of 112 input tokens; vLLM's counters: queries
 * 64 + 48 = 112 (first admissions only), hits 0 + 32 = 32, one preemption.
 */
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import parsePrometheusTextFormat from 'parse-prometheus-text-format';
import { afterAll, describe, expect, it } from 'vitest';
import { reportPages } from '../support/chromiumPage.js';
import { mockerProcesses, runMockerToExit } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';
import { MODEL } from '../support/vllmUpstream.js';

const FIXTURES = join(import.meta.dirname, '..', 'fixtures', 'traces');
const ENGINE = { block_size: 16, num_gpu_blocks: 7 };
const ids = (from: number, n: number) => Array.from({ length: n }, (_, i) => from + i);
const PROMPT_A = [...ids(1000, 32), ...ids(2000, 32)];
const PROMPT_B = [...ids(1000, 32), ...ids(3000, 16)];

interface Report extends Record<string, number> {}

async function traceReport(dir: string, name: string, trace: string, engineArgs: object, extra: string[] = []): Promise<{ report: Report; table: string }> {
  const out = join(dir, `${name}.json`);
  const run = await runMockerToExit(['trace', trace, '--extra-engine-args', JSON.stringify(engineArgs), '--report-json', out, '--no-progress', ...extra]);
  expect(run.code, run.stderr).toBe(0);
  return { report: JSON.parse(readFileSync(out, 'utf8')) as Report, table: run.stdout };
}

describe('first-admission prefix reuse apart from preempted requests re-finding their own KV', () => {
  const dir = mkdtempSync(join(testTmpdir(), 'mocker-first-admission-'));
  const mockers = mockerProcesses();
  const pages = reportPages('mocker-first-admission-html-');
  afterAll(async () => {
    await mockers.stopAll();
    await pages.close();
  });

  it('mocker trace: the hand-computed case reports both figures and their token counts (JSON and table)', async () => {
    const trace = join(dir, 'preempted.jsonl');
    writeFileSync(
      trace,
      [
        { timestamp: 0, input_length: 64, output_length: 20, hash_ids: [0, 1, 2, 3] },
        { timestamp: 15, input_length: 48, output_length: 20, hash_ids: [0, 1, 4] },
      ]
        .map((row) => JSON.stringify(row))
        .join('\n'),
    );
    const html = join(dir, 'preempted.html');
    const { report, table } = await traceReport(dir, 'preempted', trace, ENGINE, ['--trace-block-size', '16', '--report-html', html]);
    expect(report.total_input_tokens).toBe(112);
    expect(report.total_reused_input_tokens).toBe(48);
    expect(report.total_first_admission_reused_input_tokens).toBe(32);
    expect(report.prefix_cache_reused_ratio).toBeCloseTo(48 / 112, 12);
    expect(report.first_admission_prefix_cache_reused_ratio).toBeCloseTo(32 / 112, 12);
    // Dynamo's labels, two decimals.
    expect(table).toContain('Prefix Cache Reused Ratio: 0.43');
    expect(table).toContain('First Admission Prefix Cache Reused Ratio: 0.29');

    // The HTML report, in Chromium: both in the summary, and per worker.
    const { page, errors } = await pages.open('preempted', readFileSync(html, 'utf8'));
    expect(await page.locator('td[data-key="first_admission_prefix_cache_reused_ratio"]').textContent()).toBe('28.6 %');
    expect(await page.locator('td[data-key="prefix_cache_reused_ratio"]').textContent()).toBe('42.9 %');
    const rows = await page.locator('table.reuse tr').evaluateAll((trs) => trs.map((tr) => [...tr.children].map((cell) => cell.textContent)));
    expect(rows).toEqual([
      ['worker', 'input tokens', 'reused at first admission', 'reused at most'],
      ['worker-0', '112', '28.6 %', '42.9 %'],
    ]);
    expect(errors).toEqual([]);
  });

  it("mocker serve: vLLM's prefix-cache counters on /metrics count first admissions only", async () => {
    const server = await mockers.start(['serve', '--block-size', '16', '--num-gpu-blocks-override', '7']);
    const complete = (prompt: number[]) =>
      fetch(`${server.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, prompt, max_tokens: 20, ignore_eos: true }),
      }).then(async (res) => {
        expect(res.status).toBe(200);
        return (await res.json()) as { usage: { completion_tokens: number } };
      });
    const a = complete(PROMPT_A);
    // B after A's first pass has begun: it is the newer of the two.
    await new Promise((resolve) => setTimeout(resolve, 5));
    const answers = await Promise.all([a, complete(PROMPT_B)]);
    expect(answers.map((x) => x.usage.completion_tokens)).toEqual([20, 20]);

    const families = parsePrometheusTextFormat(await (await fetch(`${server.url}/metrics`)).text());
    const total = (name: string) => families.find((f) => f.name === name)!.metrics.reduce((sum, m) => sum + Number(m.value), 0);
    expect(total('vllm:num_preemptions_total')).toBe(1);
    expect(total('vllm:prefix_cache_queries_total')).toBe(112);
    expect(total('vllm:prefix_cache_hits_total')).toBe(32);
  });

  it("the first 1,000 rows of Mooncake's conversation trace at block 64: both flavours reuse the same tokens on first admission", async () => {
    const trace = join(FIXTURES, 'conversation_trace_1000.jsonl');
    const vllm = await traceReport(dir, 'vllm', trace, { block_size: 64, engine_type: 'vllm' });
    const sglang = await traceReport(dir, 'sglang', trace, { block_size: 64, engine_type: 'sglang' });
    // Measured independently by logging every admission's cached tokens in both cores (the trace).
    for (const { report } of [vllm, sglang]) {
      expect(report.completed_requests).toBe(1000);
      expect(report.total_first_admission_reused_input_tokens).toBe(614_464);
      expect(report.first_admission_prefix_cache_reused_ratio).toBeCloseTo(614_464 / report.total_input_tokens, 12);
    }
    // The max-over-admissions figure is what differs: vLLM's preempted requests re-find their own KV.
    expect(vllm.report.prefix_cache_reused_ratio).toBeGreaterThan(5 * vllm.report.first_admission_prefix_cache_reused_ratio);
    expect(sglang.report.prefix_cache_reused_ratio).toBeCloseTo(sglang.report.first_admission_prefix_cache_reused_ratio, 12);
  });
});
