import { Counter, Gauge, Registry } from 'prom-client';
import type { EngineObserver, FinishedRequest, PassStats } from '../engine/index.js';
import { toPrometheusClientText } from './exposition.js';
import { passCounter, passGauge, PassHistogram, type CounterSeries, type GaugeSeries, type HistogramSeries } from './passSeries.js';

/** vLLM's `build_1_2_5_buckets(max_model_len)`: 1, 2, 5, 10, 20, 50, … up to the limit. */
export function oneTwoFiveBuckets(max: number): number[] {
  const out: number[] = [];
  for (let exponent = 0; ; exponent++) {
    for (const m of [1, 2, 5]) {
      const value = m * 10 ** exponent;
      if (value > max) return out;
      out.push(value);
    }
  }
}

const TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0];
const TOKEN_LATENCY_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
const REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0];
const ITERATION_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384];
const FINISH_REASONS = ['stop', 'length', 'abort'] as const;

export interface MetricsConfig {
  modelName: string;
  ranks: number;
  maxModelLen: number;
  /** `vllm:cache_config_info` labels (CacheConfig fields). */
  cacheConfig: Record<string, string | number | boolean | null>;
  /** --show-hidden-metrics-for-version: also the deprecated gpu_cache_usage_perc. */
  showHidden: boolean;
  /** --max-loras when LoRA is enabled (--enable-lora): adds `vllm:lora_requests_info`. */
  maxLoras?: number;
}

/** One rank's series that every pass updates. */
interface RankSeries {
  running: GaugeSeries;
  waiting: GaugeSeries;
  kvUsage: GaugeSeries;
  gpuCacheUsage: GaugeSeries | null;
  prefixQueries: CounterSeries;
  prefixHits: CounterSeries;
  preemptions: CounterSeries;
  promptTokens: CounterSeries;
  generationTokens: CounterSeries;
  iterationTokens: HistogramSeries;
  ttft: HistogramSeries;
  timePerOutputToken: HistogramSeries;
  interTokenLatency: HistogramSeries;
}

/** Alphabetical, as prometheus_client prints them. */
const LABELS = ['engine', 'model_name'] as const;

/**
 * vLLM V1's Prometheus metrics (vllm-wire-reference §4, `PrometheusStatLogger`): same names, help texts, labels
 * and buckets, recorded when vLLM records them — per engine step (gauges, token counters, TTFT/ITL) and per
 * finished request — from the simulated engine's passes.
 */
export class VllmMetrics implements EngineObserver {
  readonly registry = new Registry();
  private readonly labels: (rank: number) => { engine: string; model_name: string };
  /** Per rank: the series each pass updates, taken once (see passSeries.ts). */
  private readonly perPass: RankSeries[];
  private readonly success;
  private readonly requestPromptTokens;
  private readonly requestGenerationTokens;
  private readonly paramsN;
  private readonly paramsMaxTokens;
  private readonly requestTimePerOutputToken;
  private readonly e2e;
  private readonly queueTime;
  private readonly inferenceTime;
  private readonly prefillTime;
  private readonly decodeTime;
  private readonly loraInfo;
  private readonly maxLoras;

  constructor(config: MetricsConfig) {
    const registers = [this.registry];
    this.labels = (rank) => ({ engine: String(rank), model_name: config.modelName });
    const gauge = (name: string, help: string) => passGauge({ name, help, labelNames: LABELS, registers });
    const counter = (name: string, help: string) => passCounter({ name: `${name}_total`, help, labelNames: LABELS, registers });
    const histogram = (name: string, help: string, buckets: number[]) => new PassHistogram({ name, help, buckets, labelNames: LABELS, registers });
    const tokenBuckets = oneTwoFiveBuckets(config.maxModelLen);

    const running = gauge('vllm:num_requests_running', 'Number of requests in model execution batches.');
    const waiting = gauge('vllm:num_requests_waiting', 'Number of requests waiting to be processed.');
    const kvUsage = gauge('vllm:kv_cache_usage_perc', 'KV-cache usage. 1 means 100 percent usage.');
    const gpuCacheUsage = config.showHidden ? gauge('vllm:gpu_cache_usage_perc', 'GPU KV-cache usage. 1 means 100 percent usage.') : null;
    const prefixQueries = counter('vllm:prefix_cache_queries', 'Prefix cache queries, in terms of number of queried tokens.');
    const prefixHits = counter('vllm:prefix_cache_hits', 'Prefix cache hits, in terms of number of cached tokens.');
    const preemptions = counter('vllm:num_preemptions', 'Cumulative number of preemption from the engine.');
    const promptTokens = counter('vllm:prompt_tokens', 'Number of prefill tokens processed.');
    const generationTokens = counter('vllm:generation_tokens', 'Number of generation tokens processed.');
    this.success = new Counter({
      name: 'vllm:request_success_total',
      help: 'Count of successfully processed requests.',
      labelNames: ['engine', 'finished_reason', 'model_name'],
      registers,
    });
    this.requestPromptTokens = histogram('vllm:request_prompt_tokens', 'Number of prefill tokens processed.', tokenBuckets);
    this.requestGenerationTokens = histogram('vllm:request_generation_tokens', 'Number of generation tokens processed.', tokenBuckets);
    const iterationTokens = histogram('vllm:iteration_tokens_total', 'Histogram of number of tokens per engine_step.', ITERATION_BUCKETS);
    this.paramsN = histogram('vllm:request_params_n', 'Histogram of the n request parameter.', [1, 2, 5, 10, 20]);
    this.paramsMaxTokens = histogram('vllm:request_params_max_tokens', 'Histogram of the max_tokens request parameter.', tokenBuckets);
    const ttft = histogram('vllm:time_to_first_token_seconds', 'Histogram of time to first token in seconds.', TTFT_BUCKETS);
    // Deprecated in vLLM 0.11 (the release mocker emulates) but still exposed there; hidden from 0.12.
    const timePerOutputToken = histogram(
      'vllm:time_per_output_token_seconds',
      'Histogram of time per output token in seconds.DEPRECATED: Use vllm:inter_token_latency_seconds instead.',
      TOKEN_LATENCY_BUCKETS,
    );
    const interTokenLatency = histogram('vllm:inter_token_latency_seconds', 'Histogram of inter-token latency in seconds.', TOKEN_LATENCY_BUCKETS);
    this.requestTimePerOutputToken = histogram(
      'vllm:request_time_per_output_token_seconds',
      'Histogram of time_per_output_token_seconds per request.',
      TOKEN_LATENCY_BUCKETS,
    );
    this.e2e = histogram('vllm:e2e_request_latency_seconds', 'Histogram of e2e request latency in seconds.', REQUEST_LATENCY_BUCKETS);
    this.queueTime = histogram('vllm:request_queue_time_seconds', 'Histogram of time spent in WAITING phase for request.', REQUEST_LATENCY_BUCKETS);
    this.inferenceTime = histogram('vllm:request_inference_time_seconds', 'Histogram of time spent in RUNNING phase for request.', REQUEST_LATENCY_BUCKETS);
    this.prefillTime = histogram('vllm:request_prefill_time_seconds', 'Histogram of time spent in PREFILL phase for request.', REQUEST_LATENCY_BUCKETS);
    this.decodeTime = histogram('vllm:request_decode_time_seconds', 'Histogram of time spent in DECODE phase for request.', REQUEST_LATENCY_BUCKETS);
    // Labelled by the adapters' names and set to the time at every step, never removed: like prometheus_client,
    // every label set ever seen stays a series, and a reader takes the newest value.
    this.loraInfo =
      config.maxLoras === undefined
        ? null
        : new Gauge({
            name: 'vllm:lora_requests_info',
            help: 'Running stats on lora requests.',
            labelNames: ['max_lora', 'running_lora_adapters', 'waiting_lora_adapters'],
            registers,
          });
    this.maxLoras = String(config.maxLoras);
    const infoLabels = [...Object.keys(config.cacheConfig), 'engine'].sort();
    const info = new Gauge({ name: 'vllm:cache_config_info', help: 'Information of the LLMEngine CacheConfig', labelNames: infoLabels, registers });

    this.perPass = [];
    for (let rank = 0; rank < config.ranks; rank++) {
      const l = this.labels(rank);
      // vLLM creates every series up front, so they read 0 before the first request.
      for (const h of [
        this.requestPromptTokens,
        this.requestGenerationTokens,
        iterationTokens,
        this.paramsN,
        this.paramsMaxTokens,
        ttft,
        timePerOutputToken,
        interTokenLatency,
        this.requestTimePerOutputToken,
        this.e2e,
        this.queueTime,
        this.inferenceTime,
        this.prefillTime,
        this.decodeTime,
      ])
        h.zero(l);
      const series: RankSeries = {
        running: running.series(l),
        waiting: waiting.series(l),
        kvUsage: kvUsage.series(l),
        gpuCacheUsage: gpuCacheUsage?.series(l) ?? null,
        prefixQueries: prefixQueries.series(l),
        prefixHits: prefixHits.series(l),
        preemptions: preemptions.series(l),
        promptTokens: promptTokens.series(l),
        generationTokens: generationTokens.series(l),
        iterationTokens: iterationTokens.series(l),
        ttft: ttft.series(l),
        timePerOutputToken: timePerOutputToken.series(l),
        interTokenLatency: interTokenLatency.series(l),
      };
      this.perPass.push(series);
      for (const g of [series.running, series.waiting, series.kvUsage, series.gpuCacheUsage]) g?.set(0);
      for (const c of [series.prefixQueries, series.prefixHits, series.preemptions, series.promptTokens, series.generationTokens]) c.inc(0);
      for (const reason of FINISH_REASONS) this.success.labels({ engine: l.engine, finished_reason: reason, model_name: l.model_name }).inc(0);
      const values: Record<string, string> = {
        ...Object.fromEntries(Object.entries(config.cacheConfig).map(([k, v]) => [k, String(v)])),
        engine: String(rank),
      };
      info.labels(Object.fromEntries(infoLabels.map((k) => [k, values[k]]))).set(1);
    }
  }

  onPass(rank: number, stats: PassStats): void {
    const s = this.perPass[rank];
    s.running.set(stats.running);
    s.waiting.set(stats.waiting);
    const usage = stats.totalBlocks > 0 ? stats.activeBlocks / stats.totalBlocks : 0;
    s.kvUsage.set(usage);
    s.gpuCacheUsage?.set(usage);
    s.prefixQueries.inc(stats.prefixCacheQueries);
    s.prefixHits.inc(stats.prefixCacheHits);
    s.preemptions.inc(stats.preemptions);
    s.promptTokens.inc(stats.promptTokens);
    s.generationTokens.inc(stats.generationTokens);
    if (stats.promptTokens + stats.generationTokens > 0) s.iterationTokens.observe(stats.promptTokens + stats.generationTokens);
    for (const t of stats.timesToFirstTokenS) s.ttft.observe(t);
    for (const t of stats.interTokenLatenciesS) {
      s.interTokenLatency.observe(t);
      s.timePerOutputToken.observe(t);
    }
    this.loraInfo
      ?.labels({
        max_lora: this.maxLoras,
        running_lora_adapters: (stats.runningLoraAdapters ?? []).join(','),
        waiting_lora_adapters: (stats.waitingLoraAdapters ?? []).join(','),
      })
      .setToCurrentTime();
  }

  onFinished(rank: number, r: FinishedRequest): void {
    const l = this.labels(rank);
    this.success.labels({ engine: l.engine, finished_reason: r.finishReason, model_name: l.model_name }).inc();
    this.e2e.series(l).observe(r.e2eS);
    this.queueTime.series(l).observe(r.queueS);
    this.prefillTime.series(l).observe(r.prefillS);
    this.inferenceTime.series(l).observe(r.inferenceS);
    this.decodeTime.series(l).observe(r.decodeS);
    this.requestPromptTokens.series(l).observe(r.promptTokens);
    this.requestGenerationTokens.series(l).observe(r.generationTokens);
    this.requestTimePerOutputToken.series(l).observe(r.meanTimePerOutputTokenS);
    if (r.maxTokensParam) this.paramsMaxTokens.series(l).observe(r.maxTokensParam);
  }

  onRequest(rank: number, n: number): void {
    this.paramsN.series(this.labels(rank)).observe(n);
  }

  /** The exposition as vLLM's prometheus_client prints it. */
  async text(): Promise<string> {
    return toPrometheusClientText(await this.registry.metrics());
  }

  get contentType(): string {
    return this.registry.contentType;
  }
}
