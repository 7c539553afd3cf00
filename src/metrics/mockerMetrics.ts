import { Counter, type Registry } from 'prom-client';
import type { CaptureLookup } from '../generation/resolver.js';

const MISS_REASONS = ['no_match', 'too_short'] as const;
/** How the upstream failed a forwarded exchange: `mocker_upstream_errors_total`'s reasons (capture/forward.ts classifies). */
const FAILURES = ['unreachable', 'timeout', 'broken_stream', 'error_status'] as const;
export type UpstreamFailure = (typeof FAILURES)[number];
/** Why a KV pull from a prefill engine failed: the failure counter's reasons (pd/kvTransfer.ts reports them). */
const PULL_FAILURES = ['incomplete_params', 'peer_not_allowed', 'unknown_blocks', 'unreachable'] as const;
export type PullFailure = (typeof PULL_FAILURES)[number];

/** The mocker's own metrics, beside vLLM's on `/metrics` (prefix `mocker_`: Prometheus reserves colons for recording rules; vLLM's `vllm:` names are vLLM's own). */
export class MockerMetrics {
  private readonly hits;
  private readonly prefixHits;
  private readonly misses;
  private readonly written;
  private readonly upstreamErrors;
  private readonly kvPulls;
  private readonly kvPullFailures;
  private readonly injected;
  private readonly labels;

  /** `faultTypes`: the types of injected failures, each counted from 0. */
  constructor(registry: Registry, modelName: string, faultTypes: readonly string[] = []) {
    const registers = [registry];
    this.labels = { model_name: modelName };
    this.hits = new Counter({
      name: 'mocker_capture_hits_total',
      help: 'Requests answered from a capture of the same prompt.',
      labelNames: ['model_name'],
      registers,
    });
    this.prefixHits = new Counter({
      name: 'mocker_capture_prefix_hits_total',
      help: 'Requests answered from a capture of another prompt sharing a long enough prefix with theirs (--match prefix).',
      labelNames: ['model_name'],
      registers,
    });
    this.misses = new Counter({
      name: 'mocker_capture_misses_total',
      help: 'Requests no capture could answer, by reason: no_match (no capture of this prompt), too_short (the capture ended by length before max_tokens).',
      labelNames: ['model_name', 'reason'],
      registers,
    });
    this.written = new Counter({
      name: 'mocker_captures_written_total',
      help: 'Exchanges recorded into the capture file (--on-miss record).',
      labelNames: ['model_name'],
      registers,
    });
    this.upstreamErrors = new Counter({
      name: 'mocker_upstream_errors_total',
      help: 'Forwarded requests the upstream failed, by reason: unreachable, timeout, broken_stream, error_status.',
      labelNames: ['model_name', 'reason'],
      registers,
    });
    this.kvPulls = new Counter({
      name: 'mocker_kv_pulls_total',
      help: "Decode requests whose prompt KV was pulled from a prefill engine's hold.",
      labelNames: ['model_name'],
      registers,
    });
    this.kvPullFailures = new Counter({
      name: 'mocker_kv_pull_failures_total',
      help: 'Decode requests whose KV pull failed and that recomputed the prompt locally, by reason: incomplete_params, peer_not_allowed, unknown_blocks, unreachable.',
      labelNames: ['model_name', 'reason'],
      registers,
    });
    this.injected = new Counter({
      name: 'mocker_injected_errors_total',
      help: 'Generation requests failed on purpose (--error-rate, --fail-first, X-Mocker-Error), by error type.',
      labelNames: ['model_name', 'type'],
      registers,
    });
    for (const type of faultTypes) this.injected.labels({ ...this.labels, type }).inc(0);
    this.kvPulls.labels(this.labels).inc(0);
    for (const reason of PULL_FAILURES) this.kvPullFailures.labels({ ...this.labels, reason }).inc(0);
    this.hits.labels(this.labels).inc(0);
    this.prefixHits.labels(this.labels).inc(0);
    this.written.labels(this.labels).inc(0);
    for (const reason of MISS_REASONS) this.misses.labels({ ...this.labels, reason }).inc(0);
    for (const reason of FAILURES) this.upstreamErrors.labels({ ...this.labels, reason }).inc(0);
  }

  captureLookup(lookup: CaptureLookup): void {
    if (lookup === 'hit') this.hits.labels(this.labels).inc();
    else if (lookup === 'prefix_hit') this.prefixHits.labels(this.labels).inc();
    else if (lookup !== null) this.misses.labels({ ...this.labels, reason: lookup }).inc();
  }

  /** A forwarded exchange ended: counted when the upstream failed it (null: it did not). */
  forwarded(failure: UpstreamFailure | null): void {
    if (failure) this.upstreamErrors.labels({ ...this.labels, reason: failure }).inc();
  }

  kvPull(outcome: { ok: true } | { ok: false; reason: PullFailure }): void {
    if (outcome.ok) this.kvPulls.labels(this.labels).inc();
    else this.kvPullFailures.labels({ ...this.labels, reason: outcome.reason }).inc();
  }

  injectedError(type: string): void {
    this.injected.labels({ ...this.labels, type }).inc();
  }

  captureWritten(): void {
    this.written.labels(this.labels).inc();
  }
}
