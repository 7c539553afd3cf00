import { readJsonObjectArg } from '../util/jsonArg.js';
import { SERVE_SETTINGS } from './serveSettings.js';
import { defaultsOf, jsonSchema, setPath } from './settings.js';
import type { AnySchedulerConfig, PassTiming, SglangSchedulerSettings, VllmSchedulerSettings } from '../engine/index.js';
import type { ReasoningConfig } from '../generation/reasoning.js';

/** The SGLang flavour's settings (Dynamo's `SglangArgs`, `--sglang-*` flags): the scheduler's, and a page size (null: the block size). */
export type SglangArgs = SglangSchedulerSettings & { pageSize: number | null };

const LLAMA_SERVER_SLOTS = 4;
const LLAMA_SERVER_BATCH = 2048;

/** Whose scheduler is simulated (`--engine-type`). */
export type EngineType = 'vllm' | 'sglang' | 'trtllm' | 'llamacpp';

/** The simulated engine's settings (vLLM / Dynamo mocker flags): the vLLM scheduler's own, and what the server adds. */
export type EngineArgs = VllmSchedulerSettings & {
  /** --engine-type: whose scheduler and KV cache are simulated. */
  engineType: EngineType;
  sglang: SglangArgs;
  speedupRatio: number;
  decodeSpeedupRatio: number;
  dataParallelSize: number;
  plannerProfileData?: string;
  /** Dynamo's `reasoning` (`--reasoning`): random answers open with a thinking span. */
  reasoning?: ReasoningConfig;
};

/** The engine's settings when none are given: the defaults of the table's engine settings. */
// The table's engine paths are EngineArgs' fields, each with a default but the optional ones.
export const DEFAULT_ENGINE_ARGS = defaultsOf(SERVE_SETTINGS).engine as EngineArgs;

/** The settings that have a Dynamo MockEngineArgs key, by that key. */
const BY_DYNAMO_KEY = new Map(SERVE_SETTINGS.filter((s) => s.dynamo).map((s) => [s.dynamo!.key, s]));
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
/** Dynamo ignores it too. */
const IGNORED = new Set(['has_perf_model']);
/** The Dynamo keys engine args may set (`sglang.page_size` for nested ones). */
export const ENGINE_ARGS_KEYS: readonly string[] = [...BY_DYNAMO_KEY].filter(([key, s]) => !UNSUPPORTED.has(key) && !s.dynamo!.asFlag).map(([key]) => key);

/**
 * Applies `--extra-engine-args` (a JSON file or inline JSON object with Dynamo's MockEngineArgs keys) over
 * `base`. Unknown or unsupported keys fail with their name.
 */
export function applyExtraEngineArgs(base: EngineArgs, source: string): EngineArgs {
  return applyEngineArgsObject(base, readJsonObjectArg(source, '--extra-engine-args'), '--extra-engine-args');
}

/** One Dynamo key's value, checked against its setting's schema; errors name `flag` and the key. */
function dynamoValue(key: string, value: unknown, flag: string): unknown {
  const setting = BY_DYNAMO_KEY.get(key);
  if (UNSUPPORTED.has(key)) throw new Error(`${flag}: "${key}" is a Dynamo mocker setting that mocker does not simulate`);
  if (setting?.dynamo?.asFlag) throw new Error(`${flag}: "${key}" is given to mocker as ${setting.dynamo.asFlag}`);
  if (!setting) throw new Error(`${flag}: unknown key "${key}"`);
  const parsed = jsonSchema(setting).safeParse(value);
  if (!parsed.success) throw new Error(`${flag}: "${key}": ${parsed.error.issues[0].message} (got ${JSON.stringify(value)})`);
  return parsed.data === null && setting.dynamo?.nullable === 'unset' ? undefined : parsed.data;
}

/** Applies Dynamo's MockEngineArgs keys over `base`; errors name `flag` and the key. */
export function applyEngineArgsObject(base: EngineArgs, raw: Record<string, unknown>, flag: string): EngineArgs {
  const out = { engine: structuredClone(base) };
  const given = new Set<string>();
  const set = (key: string, value: unknown) => {
    const setting = BY_DYNAMO_KEY.get(key)!;
    setPath(out, setting.to!, value);
    given.add(setting.to!);
  };
  for (const [key, value] of Object.entries(raw)) {
    if (IGNORED.has(key)) continue;
    if (key !== 'sglang') {
      set(key, dynamoValue(key, value, flag));
      continue;
    }
    if (value === null || typeof value !== 'object' || Array.isArray(value))
      throw new Error(`${flag}: "sglang": expected an object (got ${JSON.stringify(value)})`);
    for (const [inner, v] of Object.entries(value)) {
      const nested = `sglang.${inner}`;
      if (!BY_DYNAMO_KEY.has(nested)) throw new Error(`${flag}: "sglang": unknown key "${inner}"`);
      if (v !== undefined) set(nested, dynamoValue(nested, v, flag));
    }
  }
  return resolveEngineArgs(out.engine, (path) => given.has(`engine.${path}`));
}

/**
 * llama-server's own defaults where the slots and batch are not given: `-np` auto (4 slots with its unified KV
 * cache) and `-b 2048` (tools/server's common params), not vLLM's 256 sequences and 8,192 tokens.
 */
function withLlamaServerDefaults(args: EngineArgs, given: (path: string) => boolean): EngineArgs {
  return {
    ...args,
    maxNumSeqs: given('maxNumSeqs') ? args.maxNumSeqs : LLAMA_SERVER_SLOTS,
    maxNumBatchedTokens: given('maxNumBatchedTokens') ? args.maxNumBatchedTokens : LLAMA_SERVER_BATCH,
  };
}

/**
 * The engine arguments made complete and checked, once for every source: SGLang's "fcfs" is FIFO, and
 * (Dynamo's rule) the page size is the block size when only the page size is given (`given` says which of
 * the arguments the source at hand set). Combinations that cannot work fail at startup, naming the setting.
 */
export function resolveEngineArgs(requested: EngineArgs, given: (path: string) => boolean): EngineArgs {
  const args = requested.engineType === 'llamacpp' ? withLlamaServerDefaults(requested, given) : requested;
  const sglang = { ...args.sglang, schedulePolicy: (args.sglang.schedulePolicy as string) === 'fcfs' ? 'fifo' : args.sglang.schedulePolicy };
  const blockSize = sglang.pageSize !== null && given('sglang.pageSize') && !given('blockSize') ? sglang.pageSize : args.blockSize;
  const checked = checkEngineArgs({ ...args, blockSize, sglang });
  return { ...checked, sglang: { ...checked.sglang, pageSize: checked.blockSize } };
}

/** Combinations that cannot work fail at startup, naming the setting. */
function checkEngineArgs(args: EngineArgs): EngineArgs {
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
  if (args.engineType === 'llamacpp' && args.maxNumSeqs === null)
    throw new Error("--engine-type llamacpp needs a number of slots (--max-num-seqs, llama-server's -np)");
  if (args.engineType === 'llamacpp' && args.maxNumBatchedTokens === null)
    throw new Error("--engine-type llamacpp needs a batch size (--max-num-batched-tokens, llama-server's -b)");
  if (args.blockSize < 2 && args.engineType !== 'llamacpp')
    throw new Error(`the block size (--block-size) must be at least 2 with --engine-type ${args.engineType}, got ${args.blockSize}`);
  if (args.maxNumBatchedTokens !== null && args.maxNumSeqs !== null && args.maxNumBatchedTokens < args.maxNumSeqs) {
    throw new Error(
      `max_num_batched_tokens (--max-num-batched-tokens) ${args.maxNumBatchedTokens} must be at least max_num_seqs (--max-num-seqs) ${args.maxNumSeqs}: every running request needs a token per pass`,
    );
  }
  if (Math.floor(args.watermark * args.numGpuBlocks) >= args.numGpuBlocks)
    throw new Error(`watermark (--watermark) ${args.watermark} leaves no KV cache blocks to use`);
  return args;
}

/** The scheduler's configuration for these engine arguments: its settings as they are, what the server adds beside them. */
export function schedulerConfig(args: EngineArgs, timing: PassTiming, seed: number): AnySchedulerConfig {
  const { engineType, sglang, speedupRatio, decodeSpeedupRatio, dataParallelSize, plannerProfileData, reasoning, ...vllm } = args;
  if (engineType === 'sglang') {
    const { pageSize, ...settings } = sglang;
    return {
      engineType,
      ...settings,
      numGpuBlocks: args.numGpuBlocks,
      pageSize: args.blockSize,
      enablePrefixCaching: args.enablePrefixCaching,
      timing,
      seed,
    };
  }
  if (engineType === 'llamacpp') {
    return {
      engineType,
      // checkEngineArgs has made sure both are given.
      slots: vllm.maxNumSeqs!,
      nBatch: vllm.maxNumBatchedTokens!,
      numGpuBlocks: vllm.numGpuBlocks,
      blockSize: vllm.blockSize,
      cachePrompt: vllm.enablePrefixCaching,
      timing,
      seed,
    };
  }
  // TRT-LLM is vLLM's core under GUARANTEED_NO_EVICT (Dynamo's EngineType::Trtllm); max_num_tokens is the batch budget.
  return { engineType, ...vllm, timing, seed, ...(engineType === 'trtllm' ? { schedulingPolicy: 'trtllm-guaranteed-no-evict' as const } : {}) };
}
