import type { TimingMode } from '../engine/index.js';
import { dynamoKvEventsConfigs, type KvEventsConfig, type KvEventsFormat, parseKvEventsConfig } from '../events/index.js';
import type { MissPolicy, OutputsMode } from '../generation/resolver.js';
import { applyExtraEngineArgs, DEFAULT_ENGINE_ARGS, type EngineArgs, resolveEngineArgs } from './engineArgs.js';
import type { LogConfig } from '../util/log.js';
import type { ServeOptions } from './serveOptions.js';
import { SERVE_SETTINGS } from './serveSettings.js';
import { attributeName, defaultsOf, getPath, longFlag, optionsFrom } from './settings.js';

/** `serve`'s options with every default applied and every cross-field rule checked: what the server is built from. */
export type ResolvedServeOptions = ServeOptions &
  Required<
    Pick<
      ServeOptions,
      | 'host'
      | 'port'
      | 'captures'
      | 'outputs'
      | 'timing'
      | 'onMiss'
      | 'forwardTimeMs'
      | 'upstreamTimeoutMs'
      | 'seed'
      | 'maxBodyBytes'
      | 'redactHeaders'
      | 'numWorkers'
      | 'toolCallRate'
      | 'prefixCachingHashAlgo'
      | 'kvCacheDtype'
      | 'kvTransferBandwidthGBps'
      | 'kvTransferAllowedHosts'
      | 'enablePromptTokensDetails'
      | 'wire'
      | 'role'
      | 'staggerDelayS'
    >
  > & {
    logs: LogConfig & { accessLogs: boolean };
    engine: EngineArgs;
    lora: NonNullable<ServeOptions['lora']>;
    matching: Required<NonNullable<ServeOptions['matching']>>;
    pooling: Required<NonNullable<ServeOptions['pooling']>>;
    faults: Required<NonNullable<ServeOptions['faults']>>;
  };

const isPlainObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v) && Object.getPrototypeOf(v) === Object.prototype;

/** `given` over `defaults`, nested objects merged key by key (lists and other values replaced). */
function merged(defaults: Record<string, unknown>, given: Record<string, unknown>): Record<string, unknown> {
  const out = { ...defaults };
  for (const [key, value] of Object.entries(given)) {
    if (value === undefined) continue;
    out[key] = isPlainObject(value) && isPlainObject(out[key]) ? merged(out[key] as Record<string, unknown>, value) : value;
  }
  return out;
}

/** What `--mode` implies for the settings left out. */
const BY_MODE = {
  outputs: { simulate: 'captured', replay: 'captured', random: 'random' },
  timing: { simulate: 'model', replay: 'captured', random: 'fixed' },
  onMiss: { simulate: 'random', replay: 'error', random: 'error' },
} as const;

/**
 * The one step that turns `serve`'s given options into complete ones: the table's defaults for what is left
 * out (over `base`: the caller's own defaults), the engine arguments completed and checked, and the settings
 * `--mode` implies.
 */
export function completeServeOptions(given: ServeOptions, base: Partial<ServeOptions> = {}): ResolvedServeOptions {
  // The table's paths are ServeOptions' fields: what the merge builds is a ServeOptions.
  const options = merged(merged(defaultsOf(SERVE_SETTINGS), { ...base }), { ...given }) as unknown as ServeOptions & { engine: EngineArgs };
  const mode = options.mode;
  // The merge left no engine setting out; the caller's own say which it set (Dynamo's page-size rule).
  options.engine = resolveEngineArgs(options.engine, (path) => getPath(given.engine ?? {}, path) !== undefined);
  options.outputs ??= BY_MODE.outputs[mode] as OutputsMode;
  options.timing ??= BY_MODE.timing[mode] as TimingMode;
  options.onMiss ??= BY_MODE.onMiss[mode] as MissPolicy;
  // The table's defaults give the rest of `lora`; no adapter is loaded at start unless named.
  options.lora = { modules: [], ...options.lora } as ResolvedServeOptions['lora'];
  options.role ??= 'agg';
  // AIPerf's rule: debug logs include the access log.
  options.logs = { ...options.logs, accessLogs: options.logs?.accessLogs === true || options.logs?.level === 'debug' };
  const resolved = options as ResolvedServeOptions;
  checkServeOptions(resolved);
  resolved.matching.ignoreFields = [...new Set(resolved.matching.ignoreFields)];
  return resolved;
}

/** Fields --ignore-field refuses: the lookup key itself, and the one that decides which bytes (SSE or JSON) a capture holds. */
const UNIGNORABLE_FIELDS: Record<string, string> = {
  model: 'the served model is part of the lookup key',
  prompt: 'the prompt is the lookup key (--match prefix matches prompts that only share a prefix)',
  messages: 'the prompt is the lookup key (--match prefix matches prompts that only share a prefix)',
  stream: 'a streamed and a non-streamed answer are different bytes (a capture of the other kind is rendered)',
};

/** The rules across settings, and the bounds of values given in process (the CLI's parsers check its flags' own). */
function checkServeOptions(o: ResolvedServeOptions): void {
  if (!Number.isInteger(o.numWorkers) || o.numWorkers < 1) throw new Error(`--num-workers must be a positive integer, got ${o.numWorkers}`);
  if ((o.onMiss === 'passthrough' || o.onMiss === 'record') && !o.upstream) throw new Error(`--on-miss ${o.onMiss} needs --upstream URL`);
  if (!(o.forwardTimeMs >= 0)) throw new Error(`--forward-time-ms must be >= 0, got ${o.forwardTimeMs}`);
  if ((o.lora.enabled || o.lora.modules.length > 0) && o.engine.engineType !== 'vllm' && o.engine.engineType !== 'trtllm')
    throw new Error(`--enable-lora / --lora-modules: LoRA adapters are simulated with --engine-type vllm or trtllm, not ${o.engine.engineType}`);
  if (o.role !== undefined && o.role !== 'agg' && o.engine.engineType === 'llamacpp')
    throw new Error(`--disaggregation-mode ${o.role}: llama.cpp has no disaggregated prefill (--engine-type llamacpp)`);
  if ((o.kvEvents ?? []).length > 0 && o.engine.engineType === 'llamacpp')
    throw new Error('--kv-events-config / --zmq-kv-events-ports: llama.cpp publishes no KV events (--engine-type llamacpp)');
  if (!(o.engine.speedupRatio > 0)) throw new Error(`--speedup-ratio must be > 0, got ${o.engine.speedupRatio}`);
  if (!(o.engine.decodeSpeedupRatio > 0)) throw new Error(`--decode-speedup-ratio must be > 0, got ${o.engine.decodeSpeedupRatio}`);
  if (o.latency && o.timing !== 'latency') throw new Error(`--ttft / --itl apply to --timing latency, not --timing ${o.timing}`);
  const { match, minPrefixRatio, ignoreFields } = o.matching;
  if (!['exact', 'prefix', 'sequence'].includes(match)) throw new Error(`--match must be exact, prefix or sequence, got ${match}`);
  if (!(minPrefixRatio > 0 && minPrefixRatio <= 1)) throw new Error(`--min-prefix-ratio must be > 0 and <= 1, got ${minPrefixRatio}`);
  for (const name of ignoreFields) if (Object.hasOwn(UNIGNORABLE_FIELDS, name)) throw new Error(`--ignore-field ${name}: ${UNIGNORABLE_FIELDS[name]}`);
  if (!(o.toolCallRate >= 0 && o.toolCallRate <= 1)) throw new Error(`--tool-call-rate must be between 0 and 1, got ${o.toolCallRate}`);
  const kvEvents = o.kvEvents ?? [];
  if (kvEvents.length > 1 && kvEvents.length !== o.numWorkers) throw new Error(`${kvEvents.length} KV event configs for ${o.numWorkers} worker(s)`);
  if (!(o.kvTransferBandwidthGBps >= 0)) throw new Error(`--kv-transfer-bandwidth must be >= 0, got ${o.kvTransferBandwidthGBps}`);
  if (o.noTokenizer && o.mode === 'replay')
    throw new Error("--no-tokenizer counts character chunks: a capture's token ids never match them; replay with the capture's tokenizer");
}

/** `/mocker/engine`'s settings view: each setting with a view key, as resolved (`atStart`: the values only known once the model is loaded). */
export function settingsView(
  o: ResolvedServeOptions,
  atStart: Record<string, string | number | boolean | null>,
): Record<string, string | number | boolean | null | string[]> {
  const view: Record<string, string | number | boolean | null | string[]> = { mode: o.mode, perf_model: null };
  for (const setting of SERVE_SETTINGS) {
    if (setting.view === undefined || (setting.sglangOnly && o.engine.engineType !== 'sglang')) continue;
    view[setting.view] = (getPath(o, setting.to ?? '') ?? null) as string | number | boolean | null | string[];
  }
  return { ...view, ...atStart };
}

/** What `mocker serve`'s flags ask for besides the server: a PD deployment, threads, the shutdown grace. */
export interface ServeCommand {
  options: ResolvedServeOptions;
  pd?: string;
  threads?: number;
  shutdownTimeoutS: number;
}

/** The flag values of `mocker serve` (by commander attribute name) turned into the server's options; `isGiven` tells a flag given from a default. */
export function resolveServeFlags(values: Record<string, unknown>, isGiven: (attribute: string) => boolean): ServeCommand {
  // The table's paths are ServeOptions' fields.
  const options = optionsFrom(SERVE_SETTINGS, values) as unknown as ServeOptions & { engine: EngineArgs };
  const engineFlag = new Map(SERVE_SETTINGS.filter((s) => s.to?.startsWith('engine.')).map((s) => [s.to!.slice('engine.'.length), attributeName(longFlag(s))]));
  let engine = resolveEngineArgs({ ...DEFAULT_ENGINE_ARGS, ...options.engine, sglang: { ...DEFAULT_ENGINE_ARGS.sglang, ...options.engine.sglang } }, (path) =>
    isGiven(engineFlag.get(path)!),
  );
  if (typeof values.extraEngineArgs === 'string') engine = applyExtraEngineArgs(engine, values.extraEngineArgs);
  options.engine = engine;
  options.kvEvents = kvEventsOf(values, options.numWorkers ?? 1);
  options.role = roleOf(values);
  options.timing = timingOf(values, options);
  options.showHiddenMetrics = values.showHiddenMetricsForVersion !== undefined;
  return {
    options: completeServeOptions(options),
    pd: values.pd as string | undefined,
    threads: values.threads as number | undefined,
    shutdownTimeoutS: values.shutdownTimeout as number,
  };
}

function kvEventsOf(values: Record<string, unknown>, workers: number): KvEventsConfig[] | undefined {
  const format = values.kvEventsFormat as KvEventsFormat;
  if (values.kvEventsConfig && values.zmqKvEventsPorts) throw new Error('--kv-events-config and --zmq-kv-events-ports both configure KV events: give one');
  if (values.zmqReplayPorts && !values.zmqKvEventsPorts) throw new Error('--zmq-replay-ports needs --zmq-kv-events-ports');
  if (typeof values.kvEventsConfig === 'string') {
    const config = parseKvEventsConfig(values.kvEventsConfig, format);
    return config ? [config] : undefined;
  }
  if (values.zmqKvEventsPorts)
    return dynamoKvEventsConfigs(values.zmqKvEventsPorts as number[], values.zmqReplayPorts as number[] | undefined, workers, format);
  return undefined;
}

function roleOf(values: Record<string, unknown>): NonNullable<ServeOptions['role']> {
  if (values.disaggregationMode && (values.isPrefillWorker || values.isDecodeWorker))
    throw new Error('--disaggregation-mode cannot be combined with --is-prefill-worker / --is-decode-worker');
  if (values.isPrefillWorker && values.isDecodeWorker) throw new Error('--is-prefill-worker and --is-decode-worker are exclusive');
  return (values.disaggregationMode as ServeOptions['role']) ?? (values.isPrefillWorker ? 'prefill' : values.isDecodeWorker ? 'decode' : 'agg');
}

/** `--fast` is `--timing none`; a latency knob is `--timing latency`; neither combines with another timing. */
function timingOf(values: Record<string, unknown>, options: ServeOptions): TimingMode | undefined {
  const latencyGiven = options.latency !== undefined && Object.keys(options.latency).length > 0;
  const timing = values.timing as TimingMode | undefined;
  if (values.fast && timing !== undefined && timing !== 'none') throw new Error(`--fast is --timing none: it cannot be combined with --timing ${timing}`);
  if (values.fast && latencyGiven) throw new Error('--fast (no latency) cannot be combined with --ttft / --itl / --ttft-std / --itl-std');
  if (latencyGiven && timing !== undefined && timing !== 'latency')
    throw new Error(`--ttft / --itl / --ttft-std / --itl-std are --timing latency's: they cannot be combined with --timing ${timing}`);
  return values.fast ? 'none' : latencyGiven ? 'latency' : timing;
}
