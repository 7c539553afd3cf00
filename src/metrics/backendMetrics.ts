import type { EngineObserver } from '../engine/index.js';
import { DcgmTelemetry, type DcgmConfig } from './dcgm.js';
import { DynamoComponentMetrics, DynamoFrontendMetrics } from './dynamoMetrics.js';
import { SglangMetrics } from './sglangMetrics.js';
import { TrtllmMetrics } from './trtllmMetrics.js';
import { VllmMetrics, type MetricsConfig } from './vllmMetrics.js';

/** A Prometheus exposition served on a path. */
export interface MetricsSource {
  text(): Promise<string>;
  readonly contentType: string;
}

/** A path that exists on other servers but not on this one: answered 404 with this detail. */
export interface MissingMetrics {
  notFound: string;
}

/** AIPerf's mock server's metrics paths besides `/metrics`. */
export const BACKEND_METRICS_PATHS = [
  '/vllm/metrics',
  '/sglang/metrics',
  '/trtllm/metrics',
  '/dynamo_frontend/metrics',
  '/dynamo_component/prefill/metrics',
  '/dynamo_component/decode/metrics',
  '/dcgm1/metrics',
  '/dcgm2/metrics',
] as const;

export interface BackendMetricsConfig {
  /** vLLM's metrics config (model name, ranks, context length, cache config). */
  vllm: MetricsConfig;
  blockSize: number;
  numGpuBlocks: number;
  maxNumSeqs: number | null;
  maxNumBatchedTokens: number | null;
  role: 'agg' | 'prefill' | 'decode';
  dcgm: DcgmConfig;
}

const DCGM_CONTENT_TYPE = 'text/plain; version=0.0.4; charset=utf-8';

/**
 * One worker's expositions in other systems' names, each an observer of the same engine: what they observe and
 * what each path serves. Dynamo's component paths: an aggregated engine is both its prefill worker (a request
 * handled from arrival to its first token) and its decode worker (the whole request); a prefill or decode engine
 * serves its own role's path, the other one answers 404.
 */
export function backendMetrics(config: BackendMetricsConfig): {
  observers: EngineObserver[];
  routes: Record<(typeof BACKEND_METRICS_PATHS)[number], MetricsSource | MissingMetrics>;
} {
  const { modelName, ranks, maxModelLen } = config.vllm;
  const vllm = new VllmMetrics(config.vllm);
  const sglang = new SglangMetrics({ modelName, ranks, pageSize: config.blockSize });
  const trtllm = new TrtllmMetrics({ modelName, ranks, blockSize: config.blockSize });
  const frontend = new DynamoFrontendMetrics({
    modelName,
    maxModelLen,
    blockSize: config.blockSize,
    totalKvBlocks: config.numGpuBlocks * ranks,
    maxNumSeqs: config.maxNumSeqs,
    maxNumBatchedTokens: config.maxNumBatchedTokens,
  });
  const component = (role: 'prefill' | 'decode'): DynamoComponentMetrics | MissingMetrics => {
    if (config.role !== 'agg' && config.role !== role) {
      return {
        notFound: `this server is a ${config.role} worker (--disaggregation-mode ${config.role}): its Dynamo component metrics are at /dynamo_component/${config.role}/metrics`,
      };
    }
    return new DynamoComponentMetrics({
      modelName,
      ranks,
      component: role === 'prefill' ? 'prefill' : 'backend',
      span: config.role === 'agg' && role === 'prefill' ? 'prefill' : 'request',
    });
  };
  const prefill = component('prefill');
  const decode = component('decode');
  const dcgm = new DcgmTelemetry(config.dcgm);
  const dcgmSource = (index: number): MetricsSource => ({ text: async () => dcgm.text(index), contentType: DCGM_CONTENT_TYPE });
  const observers: EngineObserver[] = [vllm, sglang, trtllm, frontend, dcgm];
  for (const c of [prefill, decode]) if (c instanceof DynamoComponentMetrics) observers.push(c);
  return {
    observers,
    routes: {
      '/vllm/metrics': vllm,
      '/sglang/metrics': sglang,
      '/trtllm/metrics': trtllm,
      '/dynamo_frontend/metrics': frontend,
      '/dynamo_component/prefill/metrics': prefill,
      '/dynamo_component/decode/metrics': decode,
      '/dcgm1/metrics': dcgmSource(0),
      '/dcgm2/metrics': dcgmSource(1),
    },
  };
}
