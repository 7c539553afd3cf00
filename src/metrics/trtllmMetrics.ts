import { Counter, Histogram, Registry } from 'prom-client';
import type { EngineObserver, FinishedRequest, PassStats } from '../engine/index.js';
import { toPrometheusClientText } from './exposition.js';
import { passGauge } from './passSeries.js';

// TensorRT-LLM's default buckets (test/fixtures/prometheus/backend-metrics.md §1).
const LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0];
const TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0];
const TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
const PREFILL_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0];

export interface TrtllmMetricsConfig {
  modelName: string;
  ranks: number;
  /** Tokens per KV block (`trtllm_kv_cache_tokens_per_block`). */
  blockSize: number;
}

/** The last iteration stats of one rank (TensorRT-LLM's executor reports one set for the whole engine: summed). */
interface RankIteration {
  running: number;
  waiting: number;
  activeBlocks: number;
  totalBlocks: number;
}

/**
 * TensorRT-LLM's `trtllm-serve` Prometheus metrics (`tensorrt_llm/metrics/collector.py`, `MetricsCollector` with
 * the labels `model_name` and `engine_type="trtllm"`), printed as prometheus_client prints them. Per-request metrics
 * are recorded when a request finishes, as `log_request_metrics_dict` does (a series exists from its first write,
 * zero values but the queue time's are skipped); the iteration metrics (`log_iteration_stats`, with `enable_iter_perf_stats`) after
 * every engine pass, summed over the data-parallel ranks. Differences: the finished_reason is mocker's
 * (`stop`, `length`, `abort`), and cached prompt tokens count when the prefix cache supplies them (TensorRT-LLM: at
 * the finish, per request).
 */
export class TrtllmMetrics implements EngineObserver {
  readonly registry = new Registry();
  private readonly labels: { model_name: string; engine_type: string };
  private readonly iterations: RankIteration[];
  private readonly success;
  private readonly e2e;
  private readonly ttft;
  private readonly tpot;
  private readonly queueTime;
  private readonly prefillTime;
  private readonly decodeTime;
  private readonly inferenceTime;
  private readonly promptTokens;
  private readonly generationTokens;
  private readonly cachedTokens;
  private readonly hitRate;
  private readonly utilization;
  private readonly running;
  private readonly waiting;
  private readonly completed;
  private readonly maxBlocks;
  private readonly freeBlocks;
  private readonly usedBlocks;
  private readonly reusedBlocks;
  private readonly missedBlocks;
  private readonly blockSize: number;

  constructor(config: TrtllmMetricsConfig) {
    const registers = [this.registry];
    this.blockSize = config.blockSize;
    this.labels = { model_name: config.modelName, engine_type: 'trtllm' };
    this.iterations = Array.from({ length: config.ranks }, () => ({ running: 0, waiting: 0, activeBlocks: 0, totalBlocks: 0 }));
    const labelNames = Object.keys(this.labels);
    const histogram = (name: string, help: string, buckets: number[]) => new Histogram({ name: `trtllm_${name}`, help, buckets, labelNames, registers });
    // One series each, written by every pass.
    const gauge = (name: string, help: string) => passGauge({ name: `trtllm_${name}`, help, labelNames, registers }).series(this.labels);
    const counter = (name: string, help: string) => new Counter({ name: `trtllm_${name}`, help, labelNames, registers });

    this.success = new Counter({
      name: 'trtllm_request_success_total',
      help: 'Count of successfully processed requests.',
      labelNames: [...labelNames, 'finished_reason'],
      registers,
    });
    this.e2e = histogram('e2e_request_latency_seconds', 'Histogram of end to end request latency in seconds.', LATENCY_BUCKETS);
    this.ttft = histogram('time_to_first_token_seconds', 'Histogram of time to first token in seconds.', TTFT_BUCKETS);
    this.tpot = histogram('time_per_output_token_seconds', 'Histogram of time per output token in seconds.', TPOT_BUCKETS);
    this.queueTime = histogram('request_queue_time_seconds', 'Histogram of time spent in WAITING phase for request.', LATENCY_BUCKETS);
    this.prefillTime = histogram(
      'request_prefill_time_seconds',
      'Histogram of prefill (context) phase duration in seconds (first_token_time - first_scheduled_time).',
      PREFILL_BUCKETS,
    );
    this.decodeTime = histogram(
      'request_decode_time_seconds',
      'Histogram of decode (generation) phase duration in seconds (last_token_time - first_token_time).',
      LATENCY_BUCKETS,
    );
    this.inferenceTime = histogram(
      'request_inference_time_seconds',
      'Histogram of total inference duration in seconds (last_token_time - first_scheduled_time).',
      LATENCY_BUCKETS,
    );
    this.promptTokens = counter('prompt_tokens_total', 'Cumulative number of prompt (input) tokens processed.');
    this.generationTokens = counter('generation_tokens_total', 'Cumulative number of generation (output) tokens produced.');
    this.cachedTokens = counter(
      'prompt_cached_tokens_total',
      'Process-lifetime total prompt tokens served from KV cache. Resets only when the serving process restarts, not when the KV cache is flushed or evicted.',
    );
    // TensorRT-LLM creates this series up front.
    this.cachedTokens.labels(this.labels).inc(0);
    this.hitRate = gauge('kv_cache_hit_rate', 'KV cache hit rate');
    this.utilization = gauge('kv_cache_utilization', 'KV cache utilization');
    this.running = gauge('num_requests_running', 'Number of active requests');
    this.waiting = gauge('num_requests_waiting', 'Number of queued requests');
    this.completed = counter('num_requests_completed_total', 'Total number of completed requests across iterations');
    this.maxBlocks = gauge('kv_cache_max_blocks', 'Maximum number of KV cache blocks');
    this.freeBlocks = gauge('kv_cache_free_blocks', 'Number of free KV cache blocks');
    this.usedBlocks = gauge('kv_cache_used_blocks', 'Number of used KV cache blocks');
    this.reusedBlocks = counter('kv_cache_reused_blocks_total', 'Cumulative number of KV cache blocks reused (cache hits)');
    this.missedBlocks = counter('kv_cache_missed_blocks_total', 'Cumulative number of KV cache blocks missed (cache misses)');
    gauge('kv_cache_tokens_per_block', 'Number of tokens per KV cache block').set(config.blockSize);
  }

  onPass(rank: number, stats: PassStats): void {
    const l = this.labels;
    this.iterations[rank] = { running: stats.running, waiting: stats.waiting, activeBlocks: stats.activeBlocks, totalBlocks: stats.totalBlocks };
    const sum = (key: keyof RankIteration) => this.iterations.reduce((n, it) => n + it[key], 0);
    const used = sum('activeBlocks');
    const max = sum('totalBlocks');
    this.running.set(sum('running'));
    this.waiting.set(sum('waiting'));
    this.maxBlocks.set(max);
    this.usedBlocks.set(used);
    this.freeBlocks.set(max - used);
    if (max > 0) this.utilization.set(used / max);
    if (stats.prefixCacheQueries > 0) {
      // The executor counts whole blocks; the pass's tokens rounded to blocks.
      const reused = Math.floor(stats.prefixCacheHits / this.blockSize);
      const missed = Math.ceil((stats.prefixCacheQueries - stats.prefixCacheHits) / this.blockSize);
      this.hitRate.set(reused + missed > 0 ? reused / (reused + missed) : 0);
      if (reused > 0) this.reusedBlocks.labels(l).inc(reused);
      if (missed > 0) this.missedBlocks.labels(l).inc(missed);
    }
    if (stats.prefixCacheHits > 0) this.cachedTokens.labels(l).inc(stats.prefixCacheHits);
  }

  onFinished(_rank: number, r: FinishedRequest): void {
    const l = this.labels;
    this.success.labels({ ...l, finished_reason: r.finishReason }).inc();
    this.completed.labels(l).inc();
    // log_request_metrics_dict skips zero values, except the queue time's.
    const observe = (h: Histogram, value: number) => value > 0 && h.labels(l).observe(value);
    observe(this.e2e, r.e2eS);
    observe(this.ttft, r.queueS + r.prefillS);
    observe(this.tpot, r.meanTimePerOutputTokenS);
    this.queueTime.labels(l).observe(r.queueS);
    observe(this.prefillTime, r.prefillS);
    observe(this.decodeTime, r.decodeS);
    observe(this.inferenceTime, r.inferenceS);
    if (r.promptTokens > 0) this.promptTokens.labels(l).inc(r.promptTokens);
    if (r.generationTokens > 0) this.generationTokens.labels(l).inc(r.generationTokens);
  }

  /** The exposition as TensorRT-LLM's prometheus_client prints it. */
  async text(): Promise<string> {
    return toPrometheusClientText(await this.registry.metrics());
  }

  get contentType(): string {
    return this.registry.contentType;
  }
}
