/**
 * `mocker trace`: Dynamo's `python -m dynamo.replay` (engine-reference §8, §10.2) — a Mooncake trace, a
 * synthetic workload or a capture file's traffic, replayed offline on a virtual clock, online in real time,
 * or against live servers, through one or many workers, and reported like AIPerf.
 */
import { readFile } from 'node:fs/promises';
import { resolve } from 'node:path';
import { loadPerfModel, modelTiming, polynomialPerfModel, type AnySchedulerConfig } from '../engine/index.js';
import { ReplayCollector, type ReplayReport } from '../trace/collector.js';
import { goodputFields, sloText, type Slo } from '../trace/goodput.js';
import { WorkloadDriver, type DriverMode } from '../trace/driver.js';
import { renderHtmlReport } from '../trace/htmlReport.js';
import { decodeRouterConfig, KvRouter, parseRouterConfig, prefillRouterConfig, type KvRouterConfig } from '../trace/kvRouter.js';
import { OfflineReplay, type Fleet } from '../trace/offline.js';
import { LocalWorker, runOnline, type OnlineWorker } from '../trace/online.js';
import { FailureTally, formatReportTable, reportJsonPath, writeReportJson, writeRequestRecords } from '../trace/report.js';
import { RoundRobinRouter, type Router } from '../trace/router.js';
import { checkTraceFormatMode, traceFileWorkload, type TraceFormat } from '../trace/traceFormats.js';
import { foldIntoVocabulary, normalizeArrivals, syntheticWorkload, type SyntheticOptions, type Workload } from '../trace/workload.js';
import { readJsonObjectArg } from '../util/jsonArg.js';
import { checkOutput, writeOutputFile, type OutputRules } from '../util/outputFile.js';
import { progressReporter } from '../util/progress.js';
import { terminalText } from '../util/terminalText.js';
import { applyEngineArgsObject, DEFAULT_ENGINE_ARGS, schedulerConfig, type EngineArgs } from '../config/engineArgs.js';

export interface TraceOptions {
  trace?: string;
  /** The trace file's format (default mooncake). */
  traceFormat?: TraceFormat;
  fromCaptures?: string;
  replayMode?: 'offline' | 'online';
  routerMode: 'round_robin' | 'kv_router';
  numWorkers?: number;
  numPrefillWorkers?: number;
  numDecodeWorkers?: number;
  arrivalSpeedupRatio: number;
  replayConcurrency?: number;
  traceBlockSize: number;
  extraEngineArgs?: string;
  prefillEngineArgs?: string;
  decodeEngineArgs?: string;
  routerConfig?: string;
  speedupRatio?: number;
  reportJson?: string;
  reportHtml?: string;
  /** Also write the per-request records (JSON Lines) there. */
  reportRequests?: string;
  /** Replace existing report files (see util/outputFile.ts). */
  force?: boolean;
  inputTokens?: number;
  outputTokens?: number;
  requestCount?: number;
  arrivalIntervalMs: number;
  turnsPerSession: number;
  sharedPrefixRatio: number;
  numPrefixGroups: number;
  interTurnDelayMs: number;
  seed: number;
  target?: string[];
  kvEvents?: string[];
  model?: string;
  /** With `target`: seconds a request may go without a byte from its server (0: no limit). */
  requestTimeout: number;
  /** Progress on stderr: a bar on a terminal, lines otherwise. */
  progress: boolean;
  /** `key=v1,v2,…` each: run the cross product (app/traceSweep.ts). */
  sweep?: string[];
  /** Adds goodput under this service level objective to the report. */
  slo?: Slo;
}

/** Dynamo engine-args keys that describe the replay role and the KV handoff rather than the scheduler. */
interface RoleArgs {
  engine: EngineArgs;
  /** Dynamo lets engine args choose the router's queue policy. */
  routerQueuePolicy: string | null;
  workerType: 'aggregated' | 'prefill' | 'decode' | null;
  kvBytesPerToken: number | null;
  kvTransferBandwidth: number | null;
}

function roleEngineArgs(source: string | undefined, flag: string): RoleArgs {
  if (source === undefined) return { engine: DEFAULT_ENGINE_ARGS, routerQueuePolicy: null, workerType: null, kvBytesPerToken: null, kvTransferBandwidth: null };
  const {
    worker_type: workerType,
    is_prefill: isPrefill,
    is_decode: isDecode,
    kv_bytes_per_token: bytes,
    kv_transfer_bandwidth: bandwidth,
    router_queue_policy: policy,
    ...rest
  } = readJsonObjectArg(source, flag);
  if (policy !== undefined && policy !== 'fcfs' && policy !== 'lcfs' && policy !== 'wspt')
    throw new Error(`${flag}: "router_queue_policy" must be fcfs, lcfs or wspt (got ${JSON.stringify(policy)})`);
  const positive = (key: string, v: unknown) => {
    if (v === undefined || v === null) return null;
    if (typeof v !== 'number' || !(v >= 0)) throw new Error(`${flag}: "${key}" must be a number >= 0 (got ${JSON.stringify(v)})`);
    return v;
  };
  let role: RoleArgs['workerType'] = null;
  if (workerType !== undefined) {
    if (workerType !== 'aggregated' && workerType !== 'prefill' && workerType !== 'decode')
      throw new Error(`${flag}: "worker_type" must be aggregated, prefill or decode (got ${JSON.stringify(workerType)})`);
    role = workerType;
  }
  if (isPrefill === true) role = 'prefill';
  if (isDecode === true) role = 'decode';
  return {
    engine: applyEngineArgsObject(DEFAULT_ENGINE_ARGS, rest, flag),
    routerQueuePolicy: policy ?? null,
    workerType: role,
    kvBytesPerToken: positive('kv_bytes_per_token', bytes),
    kvTransferBandwidth: positive('kv_transfer_bandwidth', bandwidth),
  };
}

async function schedulerFor(args: EngineArgs, speedupRatio: number | undefined, seed: number): Promise<AnySchedulerConfig> {
  const model = args.plannerProfileData
    ? await loadPerfModel(args.plannerProfileData).catch((err: Error) => {
        throw new Error(`planner_profile_data: ${err.message}`);
      })
    : polynomialPerfModel;
  return schedulerConfig(args, modelTiming(model, speedupRatio ?? args.speedupRatio, args.decodeSpeedupRatio), seed);
}

const SYNTHETIC_FLAGS = ['inputTokens', 'outputTokens', 'requestCount'] as const;

type WorkloadSource = 'trace' | 'synthetic' | 'captures';

/** Which workload the flags ask for, with Dynamo's rules: exactly one source. */
function checkSources(o: TraceOptions): WorkloadSource {
  const synthetic =
    SYNTHETIC_FLAGS.some((k) => o[k] !== undefined) ||
    o.turnsPerSession !== 1 ||
    o.sharedPrefixRatio !== 0 ||
    o.numPrefixGroups !== 0 ||
    o.interTurnDelayMs !== 0;
  const sources = [o.trace !== undefined && 'a trace file', synthetic && 'a synthetic workload', o.fromCaptures !== undefined && '--from-captures'].filter(
    Boolean,
  );
  if (sources.length !== 1) {
    throw new Error(
      sources.length === 0
        ? 'give a trace file, a synthetic workload (--input-tokens, --output-tokens and --request-count) or --from-captures FILE'
        : `give one workload, not ${sources.join(' and ')}`,
    );
  }
  const format = o.traceFormat ?? 'mooncake';
  if (format !== 'mooncake' && o.trace === undefined)
    throw new Error(`--trace-format ${format} is the format of a trace file: ${synthetic ? 'a synthetic workload' : '--from-captures'} has none`);
  if (synthetic) {
    const missing = SYNTHETIC_FLAGS.filter((k) => o[k] === undefined).map((k) => `--${k.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`);
    if (missing.length > 0) throw new Error(`a synthetic workload needs --input-tokens, --output-tokens and --request-count (missing ${missing.join(', ')})`);
    return 'synthetic';
  }
  return o.trace !== undefined ? 'trace' : 'captures';
}

/** A run's flags checked against each other: its workload source, where its requests go, its engine args. */
export interface TracePlan {
  source: WorkloadSource;
  topology: Topology;
  roles: Roles;
}

/** The checks made before anything is read; errors name the flags. */
export function planTrace(o: TraceOptions): TracePlan {
  const source = checkSources(o);
  const topology = topologyOf(o);
  return { source, topology, roles: rolesOf(o, topology.disaggregated) };
}

/** Runs `mocker trace`; resolves with the exit code (1: no request completed). */
export async function runTrace(o: TraceOptions): Promise<number> {
  const plan = planTrace(o);
  // The reports are checked now (a long run must not end in a refusal), and written whole at the end.
  const outputs = reportOutputs(o, plan);
  const { report, collector, settings, failures } = await replayTrace(o, plan);
  console.log(formatReportTable(report));
  // A server's error text goes to the terminal: escaped.
  for (const line of failures.lines()) console.error(terminalText(line));
  await writeReportJson(report, outputs.jsonPath, outputs.rules);
  console.log(`Saved full report to: ${outputs.jsonPath}`);
  if (o.reportHtml !== undefined) {
    const page = renderHtmlReport({ title: `mocker trace — ${settings.workload}`, report, charts: collector.charts(), settings });
    await writeOutputFile(o.reportHtml, outputs.rules, (write) => write(page));
    console.log(`Saved HTML report to: ${o.reportHtml}`);
  }
  if (o.reportRequests !== undefined) {
    await writeRequestRecords(collector.perRequest(), o.reportRequests, outputs.rules);
    console.log(`Saved per-request records to: ${o.reportRequests}`);
  }
  // Sent as token-id completions, a capture's requests skip the target's preprocessing: answers are rerun's to check.
  const targets = plan.topology.targets;
  if (plan.source === 'captures' && targets.length > 0)
    console.log(
      `Answers are not compared here: mocker rerun ${o.fromCaptures!} --target ${targets.length === 1 ? targets[0] : 'URL'} checks them against the capture`,
    );
  if (report.completed_requests === 0 && report.num_requests > 0) {
    console.error(`mocker trace: none of the ${report.num_requests} request(s) completed`);
    return 1;
  }
  return 0;
}

/** What one replay measured, and the settings its reports show. */
export interface TraceResult {
  report: ReplayReport;
  collector: ReplayCollector;
  settings: Settings;
  failures: FailureTally;
}

/**
 * Replays the workload of `o` once and measures it: nothing is printed but progress and notes on stderr. `workloads`
 * keeps what it loads for later replays of the same workload.
 */
export async function replayTrace(o: TraceOptions, plan: TracePlan = planTrace(o), workloads?: WorkloadCache): Promise<TraceResult> {
  const { source, topology, roles } = plan;
  let workload = await cachedWorkload(workloadInputs(o, source, roles.engine.blockSize), workloads);
  // A capture's ids are the target's own; generated ones are brought into its vocabulary.
  if (topology.targets.length > 0 && source !== 'captures') workload = foldIntoVocabulary(workload);
  const concurrency = o.replayConcurrency;
  // Closed loop ignores arrival times, so nothing to speed up (Dynamo applies the ratio only in trace mode).
  if (concurrency === undefined) workload = normalizeArrivals(workload, o.arrivalSpeedupRatio);
  const mode: DriverMode = concurrency === undefined ? { kind: 'trace' } : { kind: 'concurrency', limit: concurrency };
  const driver = new WorkloadDriver(workload, mode);
  const settings: Settings = {
    workload: workloadName(o, source),
    requests: workload.requests,
    replay_mode: topology.online ? 'online' : 'offline',
    router_mode: o.routerMode,
    block_size: roles.engine.blockSize,
    ...(concurrency !== undefined ? { replay_concurrency: concurrency } : { arrival_speedup_ratio: o.arrivalSpeedupRatio }),
    ...(o.slo !== undefined ? { slo: sloText(o.slo) } : {}),
  };
  const failures = new FailureTally();
  const progress = progressReporter('trace', o.progress, workload.requests, topology.online ? 'elapsed' : 'simulated');
  const run = { o, topology, roles, driver, settings, progress };
  const { wallMs, collector } = topology.online ? await replayOnline(run, failures) : await replayOffline(run);
  progress.stop();
  const report = collector.report(wallMs);
  if (o.slo !== undefined) Object.assign(report, goodputFields(collector.perRequest(), report.duration_ms, o.slo));
  return { report, collector, settings, failures };
}

/** Where the requests go and how many workers take them. */
interface Topology {
  targets: string[];
  online: boolean;
  disaggregated: boolean;
  numWorkers: number;
}

/** The flags that choose the topology, checked against each other. */
function topologyOf(o: TraceOptions): Topology {
  const targets = o.target ?? [];
  const online = targets.length > 0 || o.replayMode === 'online';
  if (targets.length > 0 && o.replayMode === 'offline')
    throw new Error('--target sends requests to live servers: it runs online, not with --replay-mode offline');
  if (o.kvEvents && o.kvEvents.length > 0 && o.kvEvents.length !== targets.length)
    throw new Error(`--kv-events needs one endpoint per --target (${targets.length} targets, ${o.kvEvents.length} endpoints)`);
  if (o.model !== undefined && targets.length === 0) throw new Error('--model names the model of the --target servers');

  const disaggregated = o.prefillEngineArgs !== undefined || o.decodeEngineArgs !== undefined;
  if (disaggregated) {
    if (o.prefillEngineArgs === undefined || o.decodeEngineArgs === undefined)
      throw new Error('disaggregated replay needs both --prefill-engine-args and --decode-engine-args');
    if (o.extraEngineArgs !== undefined)
      throw new Error('--extra-engine-args is for aggregated workers: with --prefill-engine-args / --decode-engine-args give each pool its own');
    if (o.numWorkers !== undefined) throw new Error('--num-workers is for aggregated replay: use --num-prefill-workers and --num-decode-workers');
    if (online) throw new Error("disaggregated replay runs offline only (as Dynamo's)");
    if (o.routerMode !== 'kv_router') throw new Error('disaggregated replay routes with --router-mode kv_router');
  } else if (o.numPrefillWorkers !== undefined || o.numDecodeWorkers !== undefined) {
    throw new Error('--num-prefill-workers / --num-decode-workers need --prefill-engine-args and --decode-engine-args');
  }
  const numWorkers = targets.length > 0 ? targets.length : (o.numWorkers ?? 1);
  if (targets.length > 0 && o.numWorkers !== undefined && o.numWorkers !== targets.length)
    throw new Error(`--num-workers ${o.numWorkers} but ${targets.length} --target servers: each target is one worker`);
  if (!online && !disaggregated && o.routerMode === 'kv_router' && numWorkers < 2)
    throw new Error('offline --router-mode kv_router needs --num-workers > 1 (one worker has nothing to route)');
  if (o.trace !== undefined) checkTraceFormatMode(o.traceFormat ?? 'mooncake', { online, disaggregated, concurrency: o.replayConcurrency !== undefined });
  return { targets, online, disaggregated, numWorkers };
}

/** Each role's engine args, and what they decide for the router. */
interface Roles {
  aggregated: RoleArgs;
  prefill: RoleArgs;
  decode: RoleArgs;
  /** The engine args the router and the workload follow: the decode pool's when disaggregated. */
  engine: EngineArgs;
  routerConfig: KvRouterConfig;
}

function rolesOf(o: TraceOptions, disaggregated: boolean): Roles {
  const aggregated = roleEngineArgs(o.extraEngineArgs, '--extra-engine-args');
  const prefill = roleEngineArgs(o.prefillEngineArgs, '--prefill-engine-args');
  const decode = roleEngineArgs(o.decodeEngineArgs, '--decode-engine-args');
  const enginePolicy = (disaggregated ? prefill : aggregated).routerQueuePolicy;
  const routerConfig: KvRouterConfig = parseRouterConfig(o.routerConfig ?? '{}', enginePolicy === null ? {} : { router_queue_policy: enginePolicy });
  if (disaggregated) {
    if (prefill.workerType !== null && prefill.workerType !== 'prefill')
      throw new Error(`--prefill-engine-args: worker_type must be prefill (got ${prefill.workerType})`);
    if (decode.workerType !== null && decode.workerType !== 'decode')
      throw new Error(`--decode-engine-args: worker_type must be decode (got ${decode.workerType})`);
    if (prefill.engine.blockSize !== decode.engine.blockSize)
      throw new Error(`prefill and decode workers need the same block_size (${prefill.engine.blockSize} and ${decode.engine.blockSize})`);
  } else if (aggregated.workerType !== null && aggregated.workerType !== 'aggregated') {
    throw new Error('--extra-engine-args: a prefill or decode worker_type needs --prefill-engine-args and --decode-engine-args');
  }
  for (const args of disaggregated ? [prefill, decode] : [aggregated]) {
    if (args.engine.dataParallelSize !== 1) throw new Error('trace replay runs workers of dp_size 1: use more workers instead');
  }
  return { aggregated, prefill, decode, engine: disaggregated ? decode.engine : aggregated.engine, routerConfig };
}

/** The report files, checked before the run; `rules` keeps them from overwriting an input. */
export function reportOutputs(o: TraceOptions, plan: TracePlan): { jsonPath: string; rules: OutputRules } {
  const { prefill, decode, aggregated } = plan.roles;
  const roles = plan.topology.disaggregated ? [prefill, decode] : [aggregated];
  const rules: OutputRules = {
    inputs: [
      o.trace,
      o.fromCaptures,
      o.extraEngineArgs,
      o.prefillEngineArgs,
      o.decodeEngineArgs,
      o.routerConfig,
      ...roles.map((r) => r.engine.plannerProfileData),
    ],
    force: o.force,
  };
  const jsonPath = reportJsonPath(o.reportJson);
  const named: [flag: string, path: string | undefined][] = [
    ['--report-json', jsonPath],
    ['--report-html', o.reportHtml],
    ['--report-requests', o.reportRequests],
  ];
  for (const [i, [flag, path]] of named.entries()) {
    if (path === undefined) continue;
    const same = named.slice(0, i).find(([, other]) => other !== undefined && resolve(other) === resolve(path));
    if (same) throw new Error(`${same[0]} and ${flag} both name ${path}`);
    checkOutput(path, rules);
  }
  return { jsonPath, rules };
}

/** Everything loading a workload reads, and nothing else: equal inputs load equal workloads. */
type WorkloadInputs =
  | { source: 'trace'; trace: string; traceFormat: TraceFormat; traceBlockSize: number }
  | { source: 'captures'; fromCaptures: string }
  | { source: 'synthetic'; synthetic: SyntheticOptions };

function workloadInputs(o: TraceOptions, source: WorkloadSource, blockSize: number): WorkloadInputs {
  if (source === 'trace') return { source, trace: o.trace!, traceFormat: o.traceFormat ?? 'mooncake', traceBlockSize: o.traceBlockSize };
  if (source === 'captures') return { source, fromCaptures: o.fromCaptures! };
  const synthetic: SyntheticOptions = {
    inputTokens: o.inputTokens!,
    outputTokens: o.outputTokens!,
    requestCount: o.requestCount!,
    arrivalIntervalMs: o.arrivalIntervalMs,
    turnsPerSession: o.turnsPerSession,
    sharedPrefixRatio: o.sharedPrefixRatio,
    numPrefixGroups: o.numPrefixGroups,
    interTurnDelayMs: o.interTurnDelayMs,
    blockSize,
    seed: o.seed,
  };
  return { source, synthetic };
}

/**
 * Workloads loaded so far, by their inputs: a sweep's lane replays one workload under each of its combinations, and
 * reads and checks it once. A workload is never changed by a replay (its prompts are built per dispatch).
 */
export type WorkloadCache = Map<string, Promise<Workload>>;

async function loadWorkload(inputs: WorkloadInputs): Promise<Workload> {
  if (inputs.source === 'trace') {
    const text = await readFile(inputs.trace, 'utf8').catch((err: Error) => {
      throw new Error(`cannot read the trace ${inputs.trace}: ${err.message}`);
    });
    return traceFileWorkload(text, inputs.traceFormat, inputs.traceBlockSize);
  }
  if (inputs.source === 'synthetic') return syntheticWorkload(inputs.synthetic);
  // Loaded on demand: only this source opens SQLite.
  const [{ capturedWorkload }, { namingCapture }] = await Promise.all([import('../trace/capturedWorkload.js'), import('../store/captureStore.js')]);
  const file = inputs.fromCaptures;
  const captured = namingCapture(file, () => capturedWorkload(file));
  for (const line of captured.notes) console.error(`mocker trace: ${line}`);
  return captured.workload;
}

function cachedWorkload(inputs: WorkloadInputs, cache: WorkloadCache | undefined): Promise<Workload> {
  if (cache === undefined) return loadWorkload(inputs);
  const key = JSON.stringify(inputs);
  let loading = cache.get(key);
  if (loading === undefined) {
    loading = loadWorkload(inputs);
    cache.set(key, loading);
  }
  return loading;
}

function workloadName(o: TraceOptions, source: WorkloadSource): string {
  if (source === 'trace') return o.trace!;
  if (source === 'captures') return `captures ${o.fromCaptures!}`;
  return `synthetic ${o.requestCount} × ${o.inputTokens} in / ${o.outputTokens} out`;
}

/** The settings the reports show. */
export type Settings = Record<string, string | number | boolean>;

/** What a replay runs with; it adds its workers to `settings`. */
interface ReplayRun {
  o: TraceOptions;
  topology: Topology;
  roles: Roles;
  driver: WorkloadDriver;
  settings: Settings;
  progress: ReturnType<typeof progressReporter>;
}

interface ReplayResult {
  wallMs: number;
  collector: ReplayCollector;
}

function routerFor(o: TraceOptions, workers: number, config: KvRouterConfig, args: EngineArgs): Router {
  return o.routerMode === 'kv_router'
    ? new KvRouter({ workers, blockSize: args.blockSize, config, maxNumBatchedTokens: args.maxNumBatchedTokens, seed: o.seed })
    : new RoundRobinRouter(workers);
}

/** Seeded copies of one scheduler config, the first `firstSeed`. */
const seededConfigs = (config: AnySchedulerConfig, count: number, firstSeed: number) =>
  Array.from({ length: count }, (_, i) => ({ ...config, seed: firstSeed + i }));

const workerNames = (prefix: string, count: number) => Array.from({ length: count }, (_, i) => `${prefix}-${i}`);

/** The workers of an offline replay, simulated on a virtual clock. */
async function replayOffline(run: ReplayRun): Promise<ReplayResult> {
  const { o, roles, settings } = run;
  const started = performance.now();
  let fleet: Fleet;
  let collector: ReplayCollector;
  if (run.topology.disaggregated) {
    const { prefill, decode, routerConfig } = roles;
    const numPrefill = o.numPrefillWorkers ?? 1;
    const numDecode = o.numDecodeWorkers ?? 1;
    const prefillConfig = await schedulerFor(prefill.engine, o.speedupRatio, o.seed);
    const decodeConfig = await schedulerFor(decode.engine, o.speedupRatio, o.seed);
    const bytes = prefill.kvBytesPerToken ?? decode.kvBytesPerToken;
    const bandwidth = prefill.kvTransferBandwidth ?? decode.kvTransferBandwidth;
    fleet = {
      kind: 'disaggregated',
      prefill: seededConfigs(prefillConfig, numPrefill, o.seed),
      decode: seededConfigs(decodeConfig, numDecode, o.seed + numPrefill),
      prefillRouter: routerFor(o, numPrefill, prefillRouterConfig(routerConfig), prefill.engine),
      decodeRouter: routerFor(o, numDecode, decodeRouterConfig(routerConfig), decode.engine),
      // Dynamo charges the handoff only when both are given (§5.2).
      handoff: bytes !== null && bandwidth !== null ? { bytesPerToken: bytes, bandwidthGBps: bandwidth } : null,
    };
    collector = new ReplayCollector([...workerNames('prefill', numPrefill), ...workerNames('decode', numDecode)]);
    Object.assign(settings, { prefill_workers: numPrefill, decode_workers: numDecode });
  } else {
    const numWorkers = run.topology.numWorkers;
    const config = await schedulerFor(roles.engine, o.speedupRatio, o.seed);
    fleet = { kind: 'aggregated', workers: seededConfigs(config, numWorkers, o.seed), router: routerFor(o, numWorkers, roles.routerConfig, roles.engine) };
    collector = new ReplayCollector(workerNames('worker', numWorkers));
    settings.workers = numWorkers;
  }
  const simulation = new OfflineReplay(fleet, run.driver, collector, (done, nowMs) => run.progress.update(done, nowMs));
  simulation.run();
  const wallMs = performance.now() - started;
  for (const [why, count] of simulation.rejections) console.error(`mocker trace: ${count} request(s) rejected: ${why}`);
  return { wallMs, collector };
}

/** The workers of an online replay: live `--target` servers, or local engines in real time. */
async function replayOnline(run: ReplayRun, failures: FailureTally): Promise<ReplayResult> {
  const { o, roles, settings } = run;
  const { engine } = roles;
  const targets = run.topology.targets;
  let workers: OnlineWorker[];
  if (targets.length > 0) {
    // Loaded on demand: only live targets need HTTP streaming and ZMQ.
    const { connectTargets } = await import('../trace/httpTarget.js');
    workers = await connectTargets(
      targets.map((url, i) => ({ url, kvEvents: o.kvEvents?.[i] })),
      {
        model: o.model,
        routerBlockSize: engine.blockSize,
        stallTimeoutMs: o.requestTimeout > 0 ? o.requestTimeout * 1000 : null,
      },
    );
    settings.targets = targets.join(', ');
  } else {
    const config = await schedulerFor(engine, o.speedupRatio, o.seed);
    const speedup = o.speedupRatio ?? engine.speedupRatio;
    workers = seededConfigs(config, run.topology.numWorkers, o.seed).map((seeded, i) => new LocalWorker(`worker-${i}`, seeded, speedup));
    settings.speedup_ratio = speedup;
  }
  settings.workers = workers.length;
  const collector = new ReplayCollector(workers.map((w) => w.name));
  const router = routerFor(o, workers.length, roles.routerConfig, engine);
  try {
    const wallMs = await runOnline(workers, router, run.driver, collector, {
      onProgress: (done, elapsedMs) => run.progress.update(done, elapsedMs),
      onAnswer: (answer) => {
        if (answer.error !== null) failures.add(answer.error);
      },
    });
    return { wallMs, collector };
  } finally {
    await Promise.all(workers.map((w) => w.close()));
  }
}
