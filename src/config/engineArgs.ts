import { readJsonObjectArg } from '../util/jsonArg.js';
import { z } from 'zod';
import type { AnySchedulerConfig, PassTiming, PreemptionMode, SglangSchedulePolicy } from '../engine/index.js';
import { reasoningConfigSchema, type ReasoningConfig } from '../generation/reasoning.js';

/** The SGLang flavour's settings (Dynamo's `SglangArgs`, `--sglang-*` flags). */
export interface SglangArgs {
  schedulePolicy: SglangSchedulePolicy;
  /** null: the block size. */
  pageSize: number | null;
  maxPrefillTokens: number;
  chunkedPrefillSize: number;
  clipMaxNewTokens: number;
  scheduleConservativeness: number;
}

/** The simulated engine's settings (vLLM / Dynamo mocker flags). */
export interface EngineArgs {
  /** --engine-type: whose scheduler and KV cache are simulated. */
  engineType: 'vllm' | 'sglang';
  sglang: SglangArgs;
  numGpuBlocks: number;
  blockSize: number;
  maxNumSeqs: number | null;
  maxNumBatchedTokens: number | null;
  enablePrefixCaching: boolean;
  enableChunkedPrefill: boolean;
  preemptionMode: PreemptionMode;
  watermark: number;
  speedupRatio: number;
  decodeSpeedupRatio: number;
  dataParallelSize: number;
  plannerProfileData?: string;
  /** Dynamo's `reasoning` (`--reasoning`): random answers open with a thinking span. */
  reasoning?: ReasoningConfig;
}

export const DEFAULT_SGLANG_ARGS: SglangArgs = {
  schedulePolicy: 'fifo',
  pageSize: null,
  maxPrefillTokens: 16384,
  chunkedPrefillSize: 8192,
  clipMaxNewTokens: 4096,
  scheduleConservativeness: 1,
};

export const DEFAULT_ENGINE_ARGS: EngineArgs = {
  engineType: 'vllm',
  sglang: DEFAULT_SGLANG_ARGS,
  numGpuBlocks: 16384,
  blockSize: 64,
  maxNumSeqs: 256,
  maxNumBatchedTokens: 8192,
  enablePrefixCaching: true,
  enableChunkedPrefill: true,
  preemptionMode: 'lifo',
  watermark: 0.01,
  speedupRatio: 1,
  decodeSpeedupRatio: 1,
  dataParallelSize: 1,
};

const positiveInt = z.number().int().positive();
/** Dynamo's MockEngineArgs keys that mocker implements, with the engine argument each sets. */
const supported = {
  num_gpu_blocks: positiveInt,
  block_size: positiveInt,
  max_num_seqs: positiveInt.nullable(),
  max_num_batched_tokens: positiveInt.nullable(),
  enable_prefix_caching: z.boolean(),
  enable_chunked_prefill: z.boolean(),
  preemption_mode: z.enum(['lifo', 'fifo']),
  speedup_ratio: z.number().positive(),
  decode_speedup_ratio: z.number().positive(),
  dp_size: positiveInt,
  planner_profile_data: z.string().nullable(),
  engine_type: z.enum(['vllm', 'sglang']),
  sglang: z.strictObject({
    // "fcfs" is SGLang's own name for FIFO.
    schedule_policy: z
      .enum(['fifo', 'fcfs', 'lpm'])
      .transform((p) => (p === 'fcfs' ? 'fifo' : p))
      .optional(),
    page_size: positiveInt.optional(),
    max_prefill_tokens: positiveInt.optional(),
    chunked_prefill_size: positiveInt.optional(),
    clip_max_new_tokens: positiveInt.optional(),
    schedule_conservativeness: z.number().min(0).max(1).optional(),
  }),
  watermark: z.number().min(0).lt(1),
  reasoning: reasoningConfigSchema,
};
/** Dynamo keys that mocker knows but does not simulate: refused by name rather than ignored. */
const UNSUPPORTED = new Set([
  'startup_time',
  'aic_backend',
  'aic_system',
  'aic_backend_version',
  'aic_tp_size',
  'aic_model_path',
  'aic_moe_tp_size',
  'aic_moe_ep_size',
  'aic_attention_dp_size',
  'enable_local_indexer',
  'bootstrap_port',
  'router_queue_policy',
]);
/** Dynamo keys whose setting is a serve flag in mocker (they configure the server, not the scheduler). */
const AS_FLAGS: Record<string, string> = {
  worker_type: '--disaggregation-mode',
  is_prefill: '--disaggregation-mode prefill',
  is_decode: '--disaggregation-mode decode',
  kv_bytes_per_token: '--kv-bytes-per-token',
  kv_transfer_bandwidth: '--kv-transfer-bandwidth',
  zmq_kv_events_port: '--zmq-kv-events-ports',
  zmq_replay_port: '--zmq-replay-ports',
};
/** Dynamo ignores it too. */
const IGNORED = new Set(['has_perf_model']);

/**
 * Applies `--extra-engine-args` (a JSON file or inline JSON object with Dynamo's MockEngineArgs keys) over
 * `base`. Unknown or unsupported keys fail with their name.
 */
export function applyExtraEngineArgs(base: EngineArgs, source: string): EngineArgs {
  return applyEngineArgsObject(base, readJsonObjectArg(source, '--extra-engine-args'), '--extra-engine-args');
}

/** Applies Dynamo's MockEngineArgs keys over `base`; errors name `flag` and the key. */
export function applyEngineArgsObject(base: EngineArgs, raw: Record<string, unknown>, flag: string): EngineArgs {
  const out = { ...base };
  for (const [key, value] of Object.entries(raw)) {
    if (IGNORED.has(key)) continue;
    if (UNSUPPORTED.has(key)) throw new Error(`${flag}: "${key}" is a Dynamo mocker setting that mocker does not simulate`);
    if (key in AS_FLAGS) throw new Error(`${flag}: "${key}" is given to mocker as ${AS_FLAGS[key]}`);
    if (!(key in supported)) throw new Error(`${flag}: unknown key "${key}"`);
    const parsed = supported[key as keyof typeof supported].safeParse(value);
    if (!parsed.success) throw new Error(`${flag}: "${key}": ${parsed.error.issues[0].message} (got ${JSON.stringify(value)})`);
    const v = parsed.data;
    switch (key) {
      case 'num_gpu_blocks':
        out.numGpuBlocks = v as number;
        break;
      case 'block_size':
        out.blockSize = v as number;
        break;
      case 'max_num_seqs':
        out.maxNumSeqs = v as number | null;
        break;
      case 'max_num_batched_tokens':
        out.maxNumBatchedTokens = v as number | null;
        break;
      case 'enable_prefix_caching':
        out.enablePrefixCaching = v as boolean;
        break;
      case 'enable_chunked_prefill':
        out.enableChunkedPrefill = v as boolean;
        break;
      case 'preemption_mode':
        out.preemptionMode = v as PreemptionMode;
        break;
      case 'speedup_ratio':
        out.speedupRatio = v as number;
        break;
      case 'decode_speedup_ratio':
        out.decodeSpeedupRatio = v as number;
        break;
      case 'dp_size':
        out.dataParallelSize = v as number;
        break;
      case 'planner_profile_data':
        out.plannerProfileData = (v as string | null) ?? undefined;
        break;
      case 'watermark':
        out.watermark = v as number;
        break;
      case 'engine_type':
        out.engineType = v as EngineArgs['engineType'];
        break;
      case 'reasoning':
        out.reasoning = v as ReasoningConfig;
        break;
      case 'sglang': {
        const g = v as z.infer<typeof supported.sglang>;
        out.sglang = {
          schedulePolicy: g.schedule_policy ?? out.sglang.schedulePolicy,
          pageSize: g.page_size ?? out.sglang.pageSize,
          maxPrefillTokens: g.max_prefill_tokens ?? out.sglang.maxPrefillTokens,
          chunkedPrefillSize: g.chunked_prefill_size ?? out.sglang.chunkedPrefillSize,
          clipMaxNewTokens: g.clip_max_new_tokens ?? out.sglang.clipMaxNewTokens,
          scheduleConservativeness: g.schedule_conservativeness ?? out.sglang.scheduleConservativeness,
        };
        // Dynamo's rule: the page size is the block size when no block size is given.
        if (g.page_size !== undefined && !('block_size' in raw)) out.blockSize = g.page_size;
        break;
      }
    }
  }
  return checkEngineArgs(out);
}

/** Combinations that cannot work fail at startup, naming the setting. */
export function checkEngineArgs(args: EngineArgs): EngineArgs {
  if (args.engineType === 'sglang') {
    const { pageSize, chunkedPrefillSize, maxPrefillTokens } = args.sglang;
    if (pageSize !== null && pageSize !== args.blockSize)
      throw new Error(`the SGLang page size (--sglang-page-size) ${pageSize} and the block size (--block-size) ${args.blockSize} must be equal`);
    if (chunkedPrefillSize % args.blockSize !== 0)
      throw new Error(`--sglang-chunked-prefill-size ${chunkedPrefillSize} must be a multiple of the page size ${args.blockSize}`);
    if (maxPrefillTokens < chunkedPrefillSize)
      throw new Error(`--sglang-max-prefill-tokens ${maxPrefillTokens} must be at least --sglang-chunked-prefill-size ${chunkedPrefillSize}`);
    return args;
  }
  if (args.blockSize < 2) throw new Error(`the block size (--block-size) must be at least 2 with --engine-type vllm, got ${args.blockSize}`);
  if (args.maxNumBatchedTokens !== null && args.maxNumSeqs !== null && args.maxNumBatchedTokens < args.maxNumSeqs) {
    throw new Error(
      `max_num_batched_tokens (--max-num-batched-tokens) ${args.maxNumBatchedTokens} must be at least max_num_seqs (--max-num-seqs) ${args.maxNumSeqs}: every running request needs a token per pass`,
    );
  }
  if (Math.floor(args.watermark * args.numGpuBlocks) >= args.numGpuBlocks)
    throw new Error(`watermark (--watermark) ${args.watermark} leaves no KV cache blocks to use`);
  return args;
}

/** The scheduler's configuration for these engine arguments. */
export function schedulerConfig(args: EngineArgs, timing: PassTiming, seed: number): AnySchedulerConfig {
  if (args.engineType === 'sglang') {
    const g = args.sglang;
    return {
      engineType: 'sglang',
      numGpuBlocks: args.numGpuBlocks,
      blockSize: args.blockSize,
      pageSize: args.blockSize,
      enablePrefixCaching: args.enablePrefixCaching,
      schedulePolicy: g.schedulePolicy,
      maxPrefillTokens: g.maxPrefillTokens,
      chunkedPrefillSize: g.chunkedPrefillSize,
      clipMaxNewTokens: g.clipMaxNewTokens,
      scheduleConservativeness: g.scheduleConservativeness,
      timing,
      seed,
    };
  }
  return {
    engineType: 'vllm',
    numGpuBlocks: args.numGpuBlocks,
    blockSize: args.blockSize,
    maxNumSeqs: args.maxNumSeqs,
    maxNumBatchedTokens: args.maxNumBatchedTokens,
    enablePrefixCaching: args.enablePrefixCaching,
    enableChunkedPrefill: args.enableChunkedPrefill,
    preemptionMode: args.preemptionMode,
    watermark: args.watermark,
    timing,
    seed,
  };
}
