import { Counter, Registry } from 'prom-client';
import type { EngineObserver, FinishedRequest, PassStats } from '../engine/index.js';
import { toPrometheusClientText } from './exposition.js';
import { passGauge, PassHistogram, type GaugeSeries, type HistogramSeries } from './passSeries.js';

// SGLang's default buckets (test/fixtures/prometheus/sglang-metrics.md §3, §4).
const QUEUE_TIME_BUCKETS = [
  0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000,
  2500, 3000,
];
const TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400];
const ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0];
const E2E_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400];
/** SGLang's `--decode-log-interval` default: its decode stats are logged every this many decode batches. */
const DECODE_LOG_INTERVAL = 40;

export interface SglangMetricsConfig {
  modelName: string;
  ranks: number;
  /** Tokens per KV page (the block size): token counts of the pool are whole pages. */
  pageSize: number;
}

/** A rank's scheduler gauges, written by every pass. */
interface RankGauges {
  running: GaugeSeries;
  queue: GaugeSeries;
  usedTokens: GaugeSeries;
  tokenUsage: GaugeSeries;
  genThroughput: GaugeSeries;
  cacheHitRate: GaugeSeries;
  retracted: GaugeSeries;
}

/** Per rank, what SGLang's scheduler keeps between its stats logs. */
interface RankLog {
  cacheHitRate: number;
  genThroughput: number;
  decodeBatches: number;
  decodeTokensSinceLog: number;
  lastDecodeLogMs: number;
}

/**
 * SGLang's Prometheus metrics (test/fixtures/prometheus/sglang-metrics.md): the scheduler's gauges per data-parallel
 * rank and the tokenizer manager's counters and latency histograms for the whole server, with SGLang's names, help
 * texts, labels and buckets, printed as its multiprocess prometheus_client prints them.
 *
 * SGLang writes its scheduler gauges after each prefill batch, every 40th decode batch and every 30 s while idle;
 * mocker writes them after every pass, so they always equal the engine's state (`/mocker/engine`). The values
 * follow SGLang's definitions:
 * - running/queued: the rank's running and waiting requests;
 * - used tokens/token usage: the pool's pages held by requests (active blocks, not the radix cache's evictable
 *   ones) times the page size, over the whole pool — SGLang's `max_total_num_tokens - (available + evictable)`;
 * - cache hit rate: of the last pass that admitted prefills, cached / (cached + new tokens rounded up to whole
 *   pages); the pass's admissions are rounded together (exact for one admission, SGLang rounds each), and a chunked
 *   prompt counts whole at its admission (SGLang counts each chunk when it runs). Every 40th decode pass sets it
 *   to 0, as SGLang's decode log does;
 * - generation throughput: every 40th decode pass, the decode tokens since the previous one over the wall time
 *   since then; 0 once the rank is idle (SGLang: at its idle log, within 30 s);
 * - retracted requests: those retracted by the pass.
 * The tokenizer's metrics are recorded as SGLang records a streaming request's (one output per token): TTFT and
 * ITL per pass, tokens and e2e at the finish. Cached tokens count at admission (SGLang: at the finish), and the
 * queue time at the finish (SGLang: at the first forward); an aborted request counts as finished (SGLang: only
 * once running).
 */
export class SglangMetrics implements EngineObserver {
  readonly registry = new Registry();
  private readonly schedulerLabels: (rank: number) => Record<string, string>;
  private readonly tokenizerLabels: { model_name: string };
  private readonly pid = String(process.pid);
  private readonly pageSize: number;
  private readonly logs: RankLog[];
  private readonly gauges: RankGauges[];
  private readonly queueTime;
  private readonly promptTokens;
  private readonly generationTokens;
  private readonly cachedTokens;
  private readonly requests;
  private readonly abortedRequests;
  private readonly ttft: HistogramSeries;
  private readonly interTokenLatency: HistogramSeries;
  private readonly e2e;

  constructor(config: SglangMetricsConfig) {
    const registers = [this.registry];
    this.pageSize = config.pageSize;
    // A scheduler has a dp_rank label only under data parallelism.
    const dataParallel = config.ranks > 1;
    this.schedulerLabels = (rank) => ({
      engine_type: 'unified',
      model_name: config.modelName,
      pp_rank: '0',
      tp_rank: '0',
      ...(dataParallel ? { dp_rank: String(rank) } : {}),
    });
    this.tokenizerLabels = { model_name: config.modelName };
    const now = performance.now();
    this.logs = Array.from({ length: config.ranks }, () => ({
      cacheHitRate: 0,
      genThroughput: 0,
      decodeBatches: 0,
      decodeTokensSinceLog: 0,
      lastDecodeLogMs: now,
    }));

    const schedulerLabelNames = Object.keys(this.schedulerLabels(0));
    const gauge = (name: string, help: string, labelNames = schedulerLabelNames) => passGauge({ name, help, labelNames, registers });
    const counter = (name: string, help: string) => new Counter({ name, help, labelNames: ['model_name'], registers });
    const histogram = (name: string, help: string, buckets: number[], labelNames: string[]) =>
      new PassHistogram({ name, help, buckets, labelNames, registers });

    const running = gauge('sglang:num_running_reqs', 'The number of running requests.');
    const usedTokens = gauge('sglang:num_used_tokens', 'The number of used tokens.');
    const tokenUsage = gauge('sglang:token_usage', 'The token usage.');
    const genThroughput = gauge('sglang:gen_throughput', 'The generation throughput (token/s).');
    const queue = gauge('sglang:num_queue_reqs', 'The number of requests in the waiting queue.');
    const cacheHitRate = gauge('sglang:cache_hit_rate', 'The prefix cache hit rate.');
    // Created without a multiprocess mode in SGLang: one series per process, labelled with its pid.
    const retracted = gauge('sglang:num_retracted_reqs', 'The number of retracted requests.', [...schedulerLabelNames, 'pid']);
    this.gauges = Array.from({ length: config.ranks }, (_, rank) => {
      const l = this.schedulerLabels(rank);
      return {
        running: running.series(l),
        queue: queue.series(l),
        usedTokens: usedTokens.series(l),
        tokenUsage: tokenUsage.series(l),
        genThroughput: genThroughput.series(l),
        cacheHitRate: cacheHitRate.series(l),
        retracted: retracted.series({ ...l, pid: this.pid }),
      };
    });
    this.queueTime = histogram('sglang:queue_time_seconds', 'Histogram of queueing time in seconds.', QUEUE_TIME_BUCKETS, schedulerLabelNames);
    this.promptTokens = counter('sglang:prompt_tokens_total', 'Number of prefill tokens processed.');
    this.generationTokens = counter('sglang:generation_tokens_total', 'Number of generation tokens processed.');
    this.cachedTokens = counter('sglang:cached_tokens_total', 'Number of cached prompt tokens.');
    this.requests = counter('sglang:num_requests_total', 'Number of requests processed.');
    this.abortedRequests = counter('sglang:num_aborted_requests_total', 'Number of requests aborted.');
    this.ttft = histogram('sglang:time_to_first_token_seconds', 'Histogram of time to first token in seconds.', TTFT_BUCKETS, ['model_name']).series(
      this.tokenizerLabels,
    );
    this.interTokenLatency = histogram('sglang:inter_token_latency_seconds', 'Histogram of inter-token latency in seconds.', ITL_BUCKETS, [
      'model_name',
    ]).series(this.tokenizerLabels);
    this.e2e = histogram('sglang:e2e_request_latency_seconds', 'Histogram of End-to-end request latency in seconds', E2E_BUCKETS, ['model_name']);
  }

  onPass(rank: number, stats: PassStats): void {
    const log = this.logs[rank];
    if (stats.prefixCacheQueries > 0) {
      const newTokens = Math.ceil((stats.prefixCacheQueries - stats.prefixCacheHits) / this.pageSize) * this.pageSize;
      log.cacheHitRate = stats.prefixCacheHits / (stats.prefixCacheHits + newTokens);
    }
    // A decode batch: tokens for requests that already had their first one.
    const decodeTokens = stats.interTokenLatenciesS.length;
    if (decodeTokens > 0) {
      log.decodeBatches++;
      log.decodeTokensSinceLog += decodeTokens;
      if (log.decodeBatches % DECODE_LOG_INTERVAL === 0) {
        const now = performance.now();
        log.genThroughput = log.decodeTokensSinceLog / ((now - log.lastDecodeLogMs) / 1000);
        log.decodeTokensSinceLog = 0;
        log.lastDecodeLogMs = now;
        log.cacheHitRate = 0;
      }
    }
    if (stats.running === 0 && stats.waiting === 0) log.genThroughput = 0;
    const g = this.gauges[rank];
    g.running.set(stats.running);
    g.queue.set(stats.waiting);
    g.usedTokens.set(stats.activeBlocks * this.pageSize);
    g.tokenUsage.set(stats.totalBlocks > 0 ? stats.activeBlocks / stats.totalBlocks : 0);
    g.genThroughput.set(log.genThroughput);
    g.cacheHitRate.set(log.cacheHitRate);
    g.retracted.set(stats.preemptions);
    if (stats.prefixCacheHits > 0) this.cachedTokens.labels(this.tokenizerLabels).inc(stats.prefixCacheHits);
    for (const s of stats.timesToFirstTokenS) this.ttft.observe(s);
    for (const s of stats.interTokenLatenciesS) this.interTokenLatency.observe(s);
  }

  onFinished(rank: number, r: FinishedRequest): void {
    const l = this.tokenizerLabels;
    if (r.finishReason === 'abort') this.abortedRequests.labels(l).inc();
    this.promptTokens.labels(l).inc(r.promptTokens);
    this.generationTokens.labels(l).inc(r.generationTokens);
    this.requests.labels(l).inc();
    this.e2e.series(l).observe(r.e2eS);
    this.queueTime.series(this.schedulerLabels(rank)).observe(r.queueS);
  }

  /** The exposition as SGLang's multiprocess prometheus_client prints it. */
  async text(): Promise<string> {
    return toPrometheusClientText(multiprocessLayout(await this.registry.metrics()));
  }

  get contentType(): string {
    return this.registry.contentType;
  }
}

/**
 * prom-client's text laid out as prometheus_client's MultiProcessCollector merges its files: a family none of
 * whose series was written yet is absent, and each histogram series prints its `_sum` before its buckets.
 */
function multiprocessLayout(promClientText: string): string {
  const out: string[] = [];
  let header: string[] = [];
  let samples: string[] = [];
  let buckets: string[] = [];
  const flushFamily = () => {
    samples.push(...buckets);
    if (samples.length > 0) out.push(...header, ...samples);
    header = [];
    samples = [];
    buckets = [];
  };
  for (const line of promClientText.split('\n')) {
    if (line === '') continue;
    if (line.startsWith('# HELP ')) flushFamily();
    if (line.startsWith('#')) {
      header.push(line);
      continue;
    }
    const name = line.slice(0, line.search(/[{ ]/));
    if (name.endsWith('_bucket')) {
      buckets.push(line);
      continue;
    }
    // A series' `_sum` goes before the buckets prom-client printed ahead of it.
    samples.push(line, ...buckets);
    buckets = [];
  }
  flushFamily();
  return out.join('\n');
}
