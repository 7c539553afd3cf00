/**
 * `mocker serve --engine-type sglang`'s `GET /metrics` against SGLang's own exposition, as read from SGLang's source
 * in test/fixtures/prometheus/sglang-metrics.md (the oracle: its tables are parsed here), scraped from the built CLI
 * and read with a Prometheus text parser. The values are checked against what the answers and `/mocker/engine` say.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import parsePrometheusTextFormat from 'parse-prometheus-text-format';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mockerProcesses } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';
import { MODEL } from '../support/vllmUpstream.js';

type Families = ReturnType<typeof parsePrometheusTextFormat>;
type Family = Families[number];

interface OracleMetric {
  name: string;
  type: 'GAUGE' | 'COUNTER' | 'HISTOGRAM';
  help: string;
  /** §3: the scheduler's (per rank); §4: the tokenizer manager's (per server). */
  collector: 'scheduler' | 'tokenizer';
  /** A gauge in prometheus_client's multiprocess mode `all`: one series per process, with a `pid` label. */
  perProcess: boolean;
  buckets: number[];
}

/** The rows of the oracle's §3 and §4 tables: `| \`name\` | type | \`help\` | mode or buckets |`. */
function readOracle(): OracleMetric[] {
  const doc = readFileSync(new URL('../fixtures/prometheus/sglang-metrics.md', import.meta.url), 'utf8');
  const out: OracleMetric[] = [];
  for (const [section, collector] of [
    ['## §3 ', 'scheduler'],
    ['## §4 ', 'tokenizer'],
  ] as const) {
    const body = doc.slice(doc.indexOf(section)).split('\n## ')[0];
    for (const row of body.split('\n').filter((l) => l.startsWith('| `sglang:'))) {
      const [name, type, help, last] = row.split(' | ').map((cell) => cell.replace(/^\| /, '').trim());
      const histogram = type === 'histogram';
      out.push({
        name: name.replaceAll('`', ''),
        type: type.toUpperCase() as OracleMetric['type'],
        help: /`([^`]*)`/.exec(help)![1],
        collector,
        perProcess: last.startsWith('all'),
        buckets: histogram
          ? last
              .replace(/\s*\|$/, '')
              .split(', ')
              .map(Number)
          : [],
      });
    }
  }
  return out;
}

const ORACLE = readOracle();
/** Ordinary Qwen3 token ids. */
const prompt = (first: number) => Array.from({ length: 150 }, (_, i) => first + i);
const MAX_TOKENS = 5;

// The servers' working directory: no capture file there, every answer is random.
const dir = mkdtempSync(join(testTmpdir(), 'sglang-metrics-'));
const mockers = mockerProcesses();
afterAll(async () => {
  await mockers.stopAll();
  rmSync(dir, { recursive: true, force: true });
});

/** `serve` with these flags: its URL and process id. */
const serve = async (args: string[]) => {
  const p = await mockers.start(['serve', ...args], { cwd: dir });
  return { url: p.url, pid: p.child.pid! };
};

async function scrape(url: string): Promise<{ families: Families; text: string }> {
  const text = await (await fetch(`${url}/metrics`)).text();
  return { families: parsePrometheusTextFormat(text), text };
}

interface RankState {
  rank: number;
  running: number;
  waiting: number;
  activeBlocks: number;
  totalBlocks: number;
  blockSize: number;
  passes: number;
}
const engineState = async (url: string) => (await (await fetch(`${url}/mocker/engine`)).json()) as { ranks: RankState[]; config: Record<string, unknown> };

const family = (families: Families, name: string): Family => {
  const f = families.find((x) => x.name === name);
  if (!f) throw new Error(`no ${name} in /metrics`);
  return f;
};
const value = (families: Families, name: string, labels: Record<string, string> = {}) => {
  const sample = family(families, name).metrics.find((m) => Object.entries(labels).every(([k, v]) => m.labels?.[k] === v));
  if (!sample) throw new Error(`no ${name} series with ${JSON.stringify(labels)}`);
  return Number(sample.value);
};

/**
 * A histogram's series, read from the text itself (the parser folds labelled histograms together): per label set,
 * the lines in order, its `le` bounds and its `_count`.
 */
function histogramSeries(text: string, name: string): { labels: Record<string, string>; lines: string[]; bounds: number[]; count: number }[] {
  const labelsOf = (line: string) => Object.fromEntries([...line.matchAll(/([a-z_]+)="([^"]*)"/g)].map(([, k, v]) => [k, v]));
  const series = new Map<string, { labels: Record<string, string>; lines: string[]; bounds: number[]; count: number }>();
  for (const line of text.split('\n').filter((l) => l.startsWith(`${name}_`))) {
    const { le, ...labels } = labelsOf(line);
    const key = JSON.stringify(labels);
    const s = series.get(key) ?? { labels, lines: [], bounds: [], count: NaN };
    series.set(key, s);
    s.lines.push(line.slice(name.length, line.indexOf('{')));
    if (le !== undefined) s.bounds.push(le === '+Inf' ? Infinity : Number(le));
    if (line.startsWith(`${name}_count{`)) s.count = Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return [...series.values()];
}

/** The label sets of a family's series (histograms: without `le`). */
function labelSets(families: Families, text: string, metric: OracleMetric): Record<string, string>[] {
  if (metric.type === 'HISTOGRAM') return histogramSeries(text, metric.name).map((s) => s.labels);
  return family(families, metric.name).metrics.map((m) => m.labels ?? {});
}

const byRank = (sets: Record<string, string>[]) => [...sets].sort((a, b) => (a.dp_rank ?? '').localeCompare(b.dp_rank ?? ''));

/** SGLang's cache hit rate of a prefill batch: cached / (cached + new tokens rounded up to whole pages) (oracle §3). */
const sglangHitRate = (cached: number, promptTokens: number, pageSize: number) => cached / (cached + Math.ceil((promptTokens - cached) / pageSize) * pageSize);

describe('the oracle', () => {
  it("lists the metrics the issue asks for, SGLang's histograms with their buckets", () => {
    const names = ORACLE.map((m) => m.name);
    for (const name of [
      'num_running_reqs',
      'num_queue_reqs',
      'token_usage',
      'cache_hit_rate',
      'time_to_first_token_seconds',
      'inter_token_latency_seconds',
      'e2e_request_latency_seconds',
      'prompt_tokens_total',
      'generation_tokens_total',
    ]) {
      expect(names).toContain(`sglang:${name}`);
    }
    for (const m of ORACLE.filter((x) => x.type === 'HISTOGRAM'))
      expect(m.buckets.every((b) => Number.isFinite(b)) && m.buckets.length > 10, m.name).toBe(true);
  });
});

describe('serve --engine-type sglang: /metrics in SGLang names', () => {
  let url: string;
  let pid: number;
  let client: OpenAI;
  const answers: { prompt: number; completion: number; cached: number }[] = [];

  beforeAll(async () => {
    ({ url, pid } = await serve(['--engine-type', 'sglang', '--timing', 'none', '--enable-prompt-tokens-details']));
    client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0 });
  });

  const complete = async (ids: number[]) => {
    const answer = await client.completions.create({ model: MODEL, prompt: ids, max_tokens: MAX_TOKENS });
    const usage = answer.usage!;
    answers.push({ prompt: usage.prompt_tokens, completion: usage.completion_tokens, cached: usage.prompt_tokens_details!.cached_tokens! });
    return answers.at(-1)!;
  };

  it("follows a repeated prompt's cache hit: cached_tokens_total appears with it, cache_hit_rate is SGLang's rate of that prefill", async () => {
    const first = await complete(prompt(1000));
    expect(first.cached).toBe(0);
    let { families } = await scrape(url);
    // SGLang increments cached_tokens_total only by a positive count: no series before the first hit.
    expect(families.some((f) => f.name === 'sglang:cached_tokens_total')).toBe(false);
    expect(value(families, 'sglang:cache_hit_rate')).toBe(0);

    const repeated = await complete(prompt(1000));
    expect(repeated.cached).toBeGreaterThan(0);
    const pageSize = (await engineState(url)).config.sglang_page_size as number;
    ({ families } = await scrape(url));
    expect(value(families, 'sglang:cached_tokens_total')).toBe(repeated.cached);
    expect(value(families, 'sglang:cache_hit_rate')).toBeCloseTo(sglangHitRate(repeated.cached, repeated.prompt, pageSize), 12);
  });

  it("counts what the answers report, gauges equal /mocker/engine at rest, histograms with SGLang's buckets; no vLLM names", async () => {
    await complete(prompt(3000));
    // A streamed answer: SGLang's tokenizer sees each token as it goes out.
    const stream = await client.completions.create({
      model: MODEL,
      prompt: prompt(5000),
      max_tokens: MAX_TOKENS,
      stream: true,
      stream_options: { include_usage: true },
    });
    for await (const chunk of stream) {
      if (chunk.usage)
        answers.push({
          prompt: chunk.usage.prompt_tokens,
          completion: chunk.usage.completion_tokens,
          cached: chunk.usage.prompt_tokens_details?.cached_tokens ?? 0,
        });
    }
    expect(answers).toHaveLength(4);
    const sum = (key: 'prompt' | 'completion' | 'cached') => answers.reduce((s, a) => s + a[key], 0);

    const { families, text } = await scrape(url);
    const [rank] = (await engineState(url)).ranks;
    expect(families.filter((f) => f.name.startsWith('vllm:'))).toEqual([]);

    const scheduler = { engine_type: 'unified', model_name: MODEL, pp_rank: '0', tp_rank: '0' };
    for (const metric of ORACLE) {
      // A family appears with its first series: nothing aborted, so no num_aborted_requests_total.
      if (metric.name === 'sglang:num_aborted_requests_total') {
        expect(families.some((f) => f.name === metric.name)).toBe(false);
        continue;
      }
      expect(family(families, metric.name), metric.name).toMatchObject({ type: metric.type, help: metric.help });
      const expected = metric.collector === 'tokenizer' ? { model_name: MODEL } : metric.perProcess ? { ...scheduler, pid: String(pid) } : scheduler;
      expect(labelSets(families, text, metric), metric.name).toEqual([expected]);
      if (metric.type === 'HISTOGRAM') {
        const [series] = histogramSeries(text, metric.name);
        expect(series.bounds, metric.name).toEqual([...metric.buckets, Infinity]);
        // prometheus_client's multiprocess merge: the sum, the buckets, then the count; no _created.
        expect(series.lines, metric.name).toEqual(['_sum', ...series.bounds.map(() => '_bucket'), '_count']);
      }
    }
    expect(text).not.toMatch(/_created/);

    expect(value(families, 'sglang:prompt_tokens_total')).toBe(sum('prompt'));
    expect(value(families, 'sglang:generation_tokens_total')).toBe(sum('completion'));
    expect(value(families, 'sglang:cached_tokens_total')).toBe(sum('cached'));
    expect(value(families, 'sglang:num_requests_total')).toBe(answers.length);
    const count = (name: string) => histogramSeries(text, name)[0].count;
    expect(count('sglang:time_to_first_token_seconds')).toBe(answers.length);
    // One observation per token after the first (SGLang's ITL counts tokens).
    expect(count('sglang:inter_token_latency_seconds')).toBe(sum('completion') - answers.length);
    expect(count('sglang:e2e_request_latency_seconds')).toBe(answers.length);
    expect(count('sglang:queue_time_seconds')).toBe(answers.length);

    expect(value(families, 'sglang:num_running_reqs')).toBe(rank.running);
    expect(value(families, 'sglang:num_queue_reqs')).toBe(rank.waiting);
    expect(value(families, 'sglang:num_used_tokens')).toBe(rank.activeBlocks * rank.blockSize);
    expect(value(families, 'sglang:token_usage')).toBe(rank.activeBlocks / rank.totalBlocks);
    // Idle: no generation; nothing was retracted.
    expect(value(families, 'sglang:gen_throughput')).toBe(0);
    expect(value(families, 'sglang:num_retracted_reqs')).toBe(0);
    expect(families.filter((f) => f.name.startsWith('mocker_')).length).toBeGreaterThan(0);
  });
});

describe('serve (vLLM, the default) for contrast', () => {
  it('speaks vLLM names and no SGLang ones', async () => {
    const { url } = await serve(['--timing', 'none']);
    const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0 });
    await client.completions.create({ model: MODEL, prompt: prompt(1000), max_tokens: MAX_TOKENS });
    const { families } = await scrape(url);
    expect(families.filter((f) => f.name.startsWith('sglang:'))).toEqual([]);
    expect(value(families, 'vllm:prompt_tokens_total')).toBe(150);
    expect(family(families, 'vllm:num_requests_running').type).toBe('GAUGE');
  });
});

describe('serve --engine-type sglang with two data-parallel ranks, under load', () => {
  it('labels scheduler series with dp_rank, their gauges equal each rank of /mocker/engine mid-run, aborts count', async () => {
    // Slow passes and a small pool (4 pages of 64 per rank): rank 0 runs one of its two requests and queues the other.
    const { url, pid } = await serve([
      '--engine-type',
      'sglang',
      '--timing',
      'fixed',
      '--forward-time-ms',
      '50',
      '--data-parallel-size',
      '2',
      '--num-gpu-blocks-override',
      '4',
    ]);
    const controller = new AbortController();
    const responses = [
      [0, 1000],
      [0, 2000],
      [1, 3000],
    ].map(([rank, first]) =>
      fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-data-parallel-rank': String(rank) },
        body: JSON.stringify({ model: MODEL, prompt: prompt(first), max_tokens: 100, stream: true }),
        signal: controller.signal,
      }),
    );
    // The queued request may answer only once admitted: its response is left to the abort.
    const queued = responses[1].catch(() => undefined);
    // The first request of each rank is running once its first token is out.
    const running = await Promise.all([responses[0], responses[2]]);
    const readers = running.map((res) => res.body!.getReader());
    await Promise.all(readers.map((r) => r.read()));

    // Read between two identical engine snapshots, the scrape saw the same state.
    let settled: { families: Families; ranks: RankState[] } | null = null;
    for (let attempt = 0; attempt < 20 && !settled; attempt++) {
      const before = await engineState(url);
      const { families } = await scrape(url);
      const after = await engineState(url);
      if (JSON.stringify(before.ranks) === JSON.stringify(after.ranks)) settled = { families, ranks: after.ranks };
    }
    expect(settled).not.toBeNull();
    const { families, ranks } = settled!;
    expect(ranks.map((r) => [r.running, r.waiting])).toEqual([
      [1, 1],
      [1, 0],
    ]);
    for (const r of ranks) {
      const l = { dp_rank: String(r.rank) };
      expect(r.activeBlocks).toBeGreaterThan(0);
      expect(value(families, 'sglang:num_running_reqs', l)).toBe(r.running);
      expect(value(families, 'sglang:num_queue_reqs', l)).toBe(r.waiting);
      expect(value(families, 'sglang:num_used_tokens', l)).toBe(r.activeBlocks * r.blockSize);
      expect(value(families, 'sglang:token_usage', l)).toBe(r.activeBlocks / r.totalBlocks);
    }

    controller.abort();
    await Promise.all([queued, ...readers.map((r) => r.closed.catch(() => undefined))]);
    for (let i = 0; i < 100 && (await engineState(url)).ranks.some((r) => r.running + r.waiting > 0); i++) await new Promise((r) => setTimeout(r, 50));

    const { families: after, text } = await scrape(url);
    expect(value(after, 'sglang:num_aborted_requests_total')).toBe(3);
    expect(value(after, 'sglang:num_requests_total')).toBe(3);
    const scheduler = { engine_type: 'unified', model_name: MODEL, pp_rank: '0', tp_rank: '0' };
    for (const metric of ORACLE.filter((m) => m.collector === 'scheduler')) {
      const expected = [0, 1].map((rank) => ({ ...scheduler, dp_rank: String(rank), ...(metric.perProcess ? { pid: String(pid) } : {}) }));
      expect(byRank(labelSets(after, text, metric)), metric.name).toEqual(expected);
    }
    for (const metric of ORACLE.filter((m) => m.collector === 'tokenizer' && m.name !== 'sglang:cached_tokens_total')) {
      expect(labelSets(after, text, metric), metric.name).toEqual([{ model_name: MODEL }]);
    }
    const final = await engineState(url);
    for (const r of final.ranks)
      expect(value(after, 'sglang:num_running_reqs', { dp_rank: String(r.rank) }) + value(after, 'sglang:num_queue_reqs', { dp_rank: String(r.rank) })).toBe(0);
  });
});
