import { Counter, Gauge, Registry } from 'prom-client';
import type { EngineObserver, FinishedRequest, PassStats } from '../engine/index.js';
import { passCounter, passGauge, PassHistogram, type CounterSeries, type GaugeSeries, type HistogramSeries } from './passSeries.js';

/** Dynamo's `round_to_sig_figs`. */
function roundToSigFigs(value: number, sigFigs: number): number {
  if (value === 0) return 0;
  const scale = 10 ** (sigFigs - 1 - Math.floor(Math.log10(Math.abs(value))));
  return Math.round(value * scale) / scale;
}

/** Dynamo's `generate_log_buckets`: 0, then `count - 1` log-spaced bounds from `min` to `max` at 2 significant figures. */
export function dynamoLogBuckets(min: number, max: number, count: number): number[] {
  const out = [0];
  for (let i = 1; i < count; i++) out.push(roundToSigFigs(Math.exp(Math.log(min) + ((Math.log(max) - Math.log(min)) * i) / (count - 1)), 2));
  return out.filter((b, i) => i === 0 || b !== out[i - 1]);
}

/** The Rust prometheus crate's default histogram buckets (the work handler's duration histogram sets none). */
const RUST_DEFAULT_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
/** The namespace, and the endpoint every Dynamo vLLM worker serves (`dynamo.<component>.generate`). */
const NAMESPACE = 'dynamo';
const ENDPOINT = 'generate';

/** prom-client's text as the Rust prometheus crate prints it: no blank line between families. */
async function rustText(registry: Registry): Promise<string> {
  return (await registry.metrics()).replace(/\n\n+/g, '\n');
}

export interface DynamoFrontendConfig {
  modelName: string;
  maxModelLen: number;
  blockSize: number;
  /** KV blocks of the worker (all its ranks). */
  totalKvBlocks: number;
  /** Null: no limit (Dynamo then leaves the gauge unset). */
  maxNumSeqs: number | null;
  maxNumBatchedTokens: number | null;
}

/** Requests the engine has but that have not produced a token yet, by the events the engine sends. */
class FirstTokenWait {
  waiting = 0;
  arrived(n: number): void {
    this.waiting += n;
  }
  /** How many left the wait in this pass. */
  passed(stats: PassStats): number {
    this.waiting -= stats.timesToFirstTokenS.length;
    return stats.timesToFirstTokenS.length;
  }
  /** True when the request left without ever producing a token. */
  finishedBeforeFirstToken(r: FinishedRequest): boolean {
    if (r.generationTokens > 0) return false;
    this.waiting--;
    return true;
  }
}

/**
 * Dynamo's frontend metrics (`lib/llm/src/http/service/metrics.rs`, names from `prometheus_names.rs`
 * `frontend_service`), as if a Dynamo frontend stood in front of this engine: printed as the Rust prometheus crate
 * prints them, with Dynamo's default buckets. The engine sees engine requests, not HTTP ones: a request with
 * `n` choices counts `n` times, and `dynamo_frontend_requests_total` carries `model`, `status` and `error_type`
 * (an aborted request: `error`/`cancelled`) but not `endpoint` and `request_type`, which the engine does not know.
 */
export class DynamoFrontendMetrics implements EngineObserver {
  readonly registry = new Registry();
  private readonly labels: { model: string };
  private readonly wait = new FirstTokenWait();
  private inflight = 0;
  private readonly requests;
  private readonly inflightGauge: GaugeSeries;
  private readonly queued: GaugeSeries;
  private readonly disconnected;
  private disconnects = 0;
  private readonly duration;
  private readonly inputTokens;
  private readonly outputTokens;
  private readonly outputTokensTotal: CounterSeries;
  private readonly ttft: HistogramSeries;
  private readonly itl: HistogramSeries;

  constructor(config: DynamoFrontendConfig) {
    const registers = [this.registry];
    this.labels = { model: config.modelName };
    const labelNames = ['model'];
    const name = (suffix: string) => `dynamo_frontend_${suffix}`;
    const histogram = (suffix: string, help: string, buckets: number[]) => new PassHistogram({ name: name(suffix), help, buckets, labelNames, registers });
    const gauge = (suffix: string, help: string) => passGauge({ name: name(suffix), help, labelNames, registers });

    this.requests = new Counter({
      name: name('requests_total'),
      help: 'Total number of LLM requests processed',
      labelNames: ['error_type', 'model', 'status'],
      registers,
    });
    this.inflightGauge = gauge('inflight_requests', 'Number of inflight requests').series(this.labels);
    this.queued = gauge('queued_requests', 'Number of requests in HTTP processing queue').series(this.labels);
    this.disconnected = new Gauge({ name: name('disconnected_clients'), help: 'Number of disconnected clients', registers });
    this.duration = histogram('request_duration_seconds', 'Duration of LLM requests', dynamoLogBuckets(1, 512, 10));
    this.inputTokens = histogram('input_sequence_tokens', 'Input sequence length in tokens', dynamoLogBuckets(50, 128000, 12));
    this.outputTokens = histogram('output_sequence_tokens', 'Output sequence length in tokens', dynamoLogBuckets(50, 32000, 10));
    this.outputTokensTotal = passCounter({
      name: name('output_tokens_total'),
      help: 'Total number of output tokens generated (updates in real-time)',
      labelNames,
      registers,
    }).series(this.labels);
    this.ttft = histogram('time_to_first_token_seconds', 'Time to first token in seconds', dynamoLogBuckets(0.001, 480, 18)).series(this.labels);
    this.itl = histogram('inter_token_latency_seconds', 'Inter-token latency in seconds', dynamoLogBuckets(0.001, 2, 13)).series(this.labels);
    // The worker's runtime config and model card, as the frontend learns them when the worker registers.
    const model = this.labels;
    gauge('model_total_kv_blocks', 'Total KV cache blocks available for a worker serving the model').series(model).set(config.totalKvBlocks);
    const maxNumSeqs = gauge('model_max_num_seqs', 'Maximum number of sequences for a worker serving the model');
    if (config.maxNumSeqs !== null) maxNumSeqs.series(model).set(config.maxNumSeqs);
    const maxNumBatchedTokens = gauge('model_max_num_batched_tokens', 'Maximum number of batched tokens for a worker serving the model');
    if (config.maxNumBatchedTokens !== null) maxNumBatchedTokens.series(model).set(config.maxNumBatchedTokens);
    gauge('model_context_length', 'Maximum context length in tokens for a worker serving the model').series(model).set(config.maxModelLen);
    gauge('model_kv_cache_block_size', 'KV cache block size in tokens for a worker serving the model').series(model).set(config.blockSize);
  }

  onRequest(_rank: number, n: number): void {
    this.inflight += n;
    this.wait.arrived(n);
    this.inflightGauge.set(this.inflight);
    this.queued.set(this.wait.waiting);
  }

  onPass(_rank: number, stats: PassStats): void {
    if (this.wait.passed(stats) > 0) this.queued.set(this.wait.waiting);
    for (const s of stats.timesToFirstTokenS) this.ttft.observe(s);
    for (const s of stats.interTokenLatenciesS) this.itl.observe(s);
    if (stats.generationTokens > 0) this.outputTokensTotal.inc(stats.generationTokens);
  }

  onFinished(_rank: number, r: FinishedRequest): void {
    const l = this.labels;
    this.inflight--;
    if (this.wait.finishedBeforeFirstToken(r)) this.queued.set(this.wait.waiting);
    this.inflightGauge.set(this.inflight);
    const aborted = r.finishReason === 'abort';
    if (aborted) this.disconnected.set(++this.disconnects);
    // Labels in the Rust crate's (alphabetical) order.
    this.requests.labels({ error_type: aborted ? 'cancelled' : '', ...l, status: aborted ? 'error' : 'success' }).inc();
    this.duration.series(l).observe(r.e2eS);
    this.inputTokens.series(l).observe(r.promptTokens);
    this.outputTokens.series(l).observe(r.generationTokens);
  }

  async text(): Promise<string> {
    return rustText(this.registry);
  }

  get contentType(): string {
    return this.registry.contentType;
  }
}

export interface DynamoComponentConfig {
  modelName: string;
  ranks: number;
  /** Dynamo's component name: `prefill` for a prefill worker, `backend` for a decode or aggregated one. */
  component: 'prefill' | 'backend';
  /**
   * What one handled request spans: `request`, the engine request from arrival to finish (the worker's own
   * requests); `prefill`, from arrival to the first token (an aggregated engine seen as its prefill worker).
   */
  span: 'request' | 'prefill';
}

/**
 * A Dynamo worker's component metrics: the work handler's (`lib/runtime/src/pipeline/network/ingress/push_handler.rs`,
 * `work_handler` names) and the KV stats a vLLM worker publishes (`lib/llm/src/kv_router/publisher.rs`,
 * `kvstats` names), with the labels Dynamo's metrics hierarchy adds (`dynamo_namespace`, `dynamo_component`,
 * and `dynamo_endpoint` on endpoint metrics) and the worker's `model` label; printed as the Rust prometheus crate
 * prints them. The KV stats sum the worker's data-parallel ranks; the prefix cache hit rate is that of the last
 * pass that looked the prefix cache up.
 */
export class DynamoComponentMetrics implements EngineObserver {
  readonly registry = new Registry();
  private readonly endpointLabels: Record<string, string>;
  private readonly span: DynamoComponentConfig['span'];
  private readonly wait = new FirstTokenWait();
  private inflight = 0;
  private readonly blocks: { active: number; total: number }[];
  private readonly requests;
  private readonly inflightGauge;
  private readonly duration: HistogramSeries;
  private readonly activeBlocks: GaugeSeries;
  private readonly totalBlocks: GaugeSeries;
  private readonly usage: GaugeSeries;
  private readonly hitRate: GaugeSeries;

  constructor(config: DynamoComponentConfig) {
    const registers = [this.registry];
    this.span = config.span;
    this.blocks = Array.from({ length: config.ranks }, () => ({ active: 0, total: 0 }));
    // Labels in the Rust crate's (alphabetical) order.
    const componentLabels = { dynamo_component: config.component, dynamo_namespace: NAMESPACE };
    this.endpointLabels = { dynamo_component: config.component, dynamo_endpoint: ENDPOINT, dynamo_namespace: NAMESPACE, model: config.modelName };
    const endpointLabelNames = Object.keys(this.endpointLabels);
    // Dynamo creates these with the labels as constant labels: each series exists from the start.
    this.requests = new Counter({
      name: 'dynamo_component_requests_total',
      help: 'Total number of requests processed by work handler',
      labelNames: endpointLabelNames,
      registers,
    });
    this.inflightGauge = new Gauge({
      name: 'dynamo_component_inflight_requests',
      help: 'Number of requests currently being processed by work handler',
      labelNames: endpointLabelNames,
      registers,
    });
    const duration = new PassHistogram({
      name: 'dynamo_component_request_duration_seconds',
      help: 'Time spent processing requests by work handler',
      buckets: RUST_DEFAULT_BUCKETS,
      labelNames: endpointLabelNames,
      registers,
    });
    this.requests.labels(this.endpointLabels).inc(0);
    this.inflightGauge.labels(this.endpointLabels).set(0);
    duration.zero(this.endpointLabels);
    this.duration = duration.series(this.endpointLabels);
    const kvGauge = (suffix: string, help: string) => {
      const series = passGauge({ name: `dynamo_component_kvstats_${suffix}`, help, labelNames: Object.keys(componentLabels), registers }).series(
        componentLabels,
      );
      series.set(0);
      return series;
    };
    this.activeBlocks = kvGauge('active_blocks', 'Number of active KV cache blocks currently in use');
    this.totalBlocks = kvGauge('total_blocks', 'Total number of KV cache blocks available');
    this.usage = kvGauge('gpu_cache_usage_percent', 'GPU cache usage as a percentage (0.0-1.0)');
    this.hitRate = kvGauge('gpu_prefix_cache_hit_rate', 'GPU prefix cache hit rate as a percentage (0.0-1.0)');
  }

  onRequest(_rank: number, n: number): void {
    this.requests.labels(this.endpointLabels).inc(n);
    this.inflight += n;
    this.wait.arrived(n);
    this.inflightGauge.labels(this.endpointLabels).set(this.inflight);
  }

  onPass(rank: number, stats: PassStats): void {
    this.blocks[rank] = { active: stats.activeBlocks, total: stats.totalBlocks };
    const active = this.blocks.reduce((n, b) => n + b.active, 0);
    const total = this.blocks.reduce((n, b) => n + b.total, 0);
    this.activeBlocks.set(active);
    this.totalBlocks.set(total);
    this.usage.set(total > 0 ? active / total : 0);
    if (stats.prefixCacheQueries > 0) this.hitRate.set(stats.prefixCacheHits / stats.prefixCacheQueries);
    const prefilled = this.wait.passed(stats);
    if (this.span === 'prefill' && prefilled > 0) {
      for (const s of stats.timesToFirstTokenS) this.duration.observe(s);
      this.done(prefilled);
    }
  }

  onFinished(_rank: number, r: FinishedRequest): void {
    const beforeFirstToken = this.wait.finishedBeforeFirstToken(r);
    if (this.span === 'request' || beforeFirstToken) {
      this.duration.observe(r.e2eS);
      this.done(1);
    }
  }

  private done(n: number): void {
    this.inflight -= n;
    this.inflightGauge.labels(this.endpointLabels).set(this.inflight);
  }

  async text(): Promise<string> {
    return rustText(this.registry);
  }

  get contentType(): string {
    return this.registry.contentType;
  }
}
