/**
 * `mocker trace --sweep key=v1,v2,…`: one workload replayed offline over the cross product of fleet, router and
 * engine settings, in worker threads (at most one per core, each running one combination after another), and
 * compared in one table, one JSON file and one HTML page. Each combination is the options of a plain run with
 * its values put where their flag or JSON key would put them, so the code that parses those parses the values.
 */
import { availableParallelism } from 'node:os';
import { Worker } from 'node:worker_threads';
import { ENGINE_ARGS_KEYS } from '../config/engineArgs.js';
import { attributeName, longFlag, parseText, setPath } from '../config/settings.js';
import { TRACE_SETTINGS } from '../config/traceSettings.js';
import { DEFAULT_KV_ROUTER_CONFIG } from '../trace/kvRouter.js';
import { formatSweepTable, renderSweepHtml, sweepJson, type SweepAxis, type SweepResult, type SweepValue } from '../trace/sweepReport.js';
import { readJsonObjectArg } from '../util/jsonArg.js';
import { writeOutputFile } from '../util/outputFile.js';
import type { TraceOptions } from './trace.js';
import type { SweepAnswer, SweepDone, SweepLane } from './traceSweepWorker.js';

/** The trace flags a sweep may vary (named without their dashes; snake_case too). */
const FLAG_KEYS = ['num-workers', 'router-mode', 'replay-concurrency', 'arrival-speedup-ratio', 'num-prefill-workers', 'num-decode-workers'];
const ROUTER_KEYS = Object.keys(DEFAULT_KV_ROUTER_CONFIG);
/** Engine-args keys beside the scheduler's: the disaggregated KV handoff (src/app/trace.ts roleEngineArgs). */
const ENGINE_KEYS = [...ENGINE_ARGS_KEYS, 'kv_bytes_per_token', 'kv_transfer_bandwidth'];

type AxisKind = 'flag' | 'engine' | 'router';
interface Axis extends SweepAxis {
  kind: AxisKind;
}

function kindOf(key: string): AxisKind {
  if (FLAG_KEYS.includes(key)) return 'flag';
  // The router's queue policy is also an engine-args key: the router config is where it acts.
  if (ROUTER_KEYS.includes(key)) return 'router';
  if (ENGINE_KEYS.includes(key)) return 'engine';
  throw new Error(
    `--sweep: unknown key "${key}"; valid keys: ${FLAG_KEYS.join(', ')}; router-config keys: ${ROUTER_KEYS.join(', ')}; engine-args keys: ${ENGINE_KEYS.filter((k) => !ROUTER_KEYS.includes(k)).join(', ')}`,
  );
}

/** A JSON key's value as text: JSON where it parses (`64`, `true`, `null`), else the text itself (`sglang`). */
function jsonValue(text: string): SweepValue {
  try {
    const value: unknown = JSON.parse(text);
    if (value === null || ['string', 'number', 'boolean'].includes(typeof value)) return value as SweepValue;
  } catch {
    // Not JSON: a bare string.
  }
  return text;
}

/** One `--sweep key=v1,v2,…`; a flag's values are parsed by its setting. */
function parseAxis(entry: string): Axis {
  const at = entry.indexOf('=');
  const given = (at < 0 ? entry : entry.slice(0, at)).trim();
  const key = FLAG_KEYS.includes(given.replaceAll('_', '-')) ? given.replaceAll('_', '-') : given;
  const texts = at < 0 ? [] : entry.slice(at + 1).split(',');
  if (key === '' || texts.length === 0 || texts.some((t) => t.trim() === '')) throw new Error(`--sweep: expected key=value1,value2,… got "${entry}"`);
  const kind = kindOf(key);
  const values = texts.map((text) => {
    if (kind !== 'flag') return jsonValue(text.trim());
    const setting = TRACE_SETTINGS.find((s) => longFlag(s) === `--${key}`)!;
    try {
      return parseText(setting, text.trim()) as SweepValue;
    } catch (err) {
      throw new Error(`--sweep ${key}=${text}: ${(err as Error).message}`);
    }
  });
  return { key, kind, values };
}

/** A JSON object argument with `over` laid on top (nested objects merged a level down: `sglang`). */
function mergedJson(source: string | undefined, over: Record<string, unknown>, flag: string): string {
  const base = source === undefined ? {} : readJsonObjectArg(source, flag);
  const merged: Record<string, unknown> = { ...base };
  for (const [key, value] of Object.entries(over)) {
    const below = base[key];
    merged[key] = typeof value === 'object' && value !== null && typeof below === 'object' && below !== null ? { ...below, ...value } : value;
  }
  return JSON.stringify(merged);
}

/** The options of one combination: each value where its flag or JSON key puts it; engine args go to both pools when disaggregated. */
function combinationOptions(base: TraceOptions, axes: Axis[], values: SweepValue[]): TraceOptions {
  const o: TraceOptions = { ...base, sweep: undefined, progress: false };
  const engine: Record<string, unknown> = {};
  const router: Record<string, unknown> = {};
  axes.forEach((axis, i) => {
    if (axis.kind === 'flag') (o as unknown as Record<string, unknown>)[attributeName(`--${axis.key}`)] = values[i];
    else setPath(axis.kind === 'engine' ? engine : router, axis.key, values[i]);
  });
  if (Object.keys(engine).length > 0) {
    if (base.prefillEngineArgs !== undefined || base.decodeEngineArgs !== undefined) {
      o.prefillEngineArgs = mergedJson(base.prefillEngineArgs, engine, '--prefill-engine-args');
      o.decodeEngineArgs = mergedJson(base.decodeEngineArgs, engine, '--decode-engine-args');
    } else o.extraEngineArgs = mergedJson(base.extraEngineArgs, engine, '--extra-engine-args');
  }
  if (Object.keys(router).length > 0) o.routerConfig = mergedJson(base.routerConfig, router, '--router-config');
  return o;
}

/** Every combination of the axes' values, the first axis varying slowest. */
function crossProduct(axes: Axis[]): SweepValue[][] {
  return axes.reduce<SweepValue[][]>((combos, axis) => combos.flatMap((combo) => axis.values.map((v) => [...combo, v])), [[]]);
}

const label = (axes: Axis[], values: SweepValue[]) => axes.map((axis, i) => `${axis.key}=${String(values[i])}`).join(' ');

/** The swept axes, checked. */
function sweepAxes(o: TraceOptions): Axis[] {
  if ((o.target?.length ?? 0) > 0 || o.replayMode === 'online') throw new Error('--sweep replays offline only: leave out --target and --replay-mode online');
  const axes = (o.sweep ?? []).map(parseAxis);
  const seen = new Set<string>();
  for (const axis of axes) {
    if (seen.has(axis.key)) throw new Error(`--sweep: ${axis.key} is swept twice: give its values in one --sweep`);
    seen.add(axis.key);
  }
  return axes;
}

/** Each combination's options, all checked before anything runs. */
function planSweep(o: TraceOptions, axes: Axis[], planTrace: (o: TraceOptions) => unknown): { values: SweepValue[]; options: TraceOptions }[] {
  return crossProduct(axes).map((values) => {
    const options = combinationOptions(o, axes, values);
    try {
      planTrace(options);
    } catch (err) {
      throw new Error(`--sweep ${label(axes, values)}: ${(err as Error).message}`);
    }
    return { values, options };
  });
}

/**
 * The lanes a sweep runs in, one per core: this thread and worker threads. The workers start before this thread loads
 * the replay's code, so that they load theirs meanwhile (on another core), then wait for the combinations. Each lane
 * claims the next combination from a shared counter when it has finished its last, so no lane waits for a message
 * this thread cannot read while it simulates. A failed combination or worker stops the claiming, and the sweep fails
 * naming it.
 */
class Lanes {
  private readonly next = new Int32Array(new SharedArrayBuffer(4));
  private readonly workers: Worker[];
  private readonly stopped: Promise<void>[];
  private failure: string | null = null;
  private hear: (answer: SweepAnswer) => void = () => {};

  /** `count` combinations over at most one lane per core. */
  constructor(count: number) {
    this.workers = Array.from(
      { length: Math.min(availableParallelism(), count) - 1 },
      () => new Worker(new URL('./traceSweepWorker.js', import.meta.url), { workerData: { sweepLane: true } }),
    );
    this.stopped = this.workers.map(
      (worker) =>
        new Promise<void>((resolve) => {
          worker.on('message', (answer: SweepAnswer) => this.hear(answer));
          worker.on('error', (err) => {
            Atomics.store(this.next, 0, count);
            this.failure ??= `--sweep: a worker thread failed: ${err.message}`;
          });
          worker.on('exit', (code) => {
            if (code !== 0) this.failure ??= `--sweep: a worker thread stopped (exit code ${code})`;
            resolve();
          });
        }),
    );
  }

  /** The sweep was refused before it ran: the workers stop waiting. */
  async cancel(): Promise<void> {
    await Promise.all(this.workers.map((worker) => worker.terminate()));
  }

  /** Runs the combinations; `onDone` hears of each as it ends. */
  async run(jobs: { options: TraceOptions; label: string }[], onDone: (index: number, done: SweepDone) => void): Promise<SweepDone[]> {
    const { runLane } = await import('./traceSweepWorker.js');
    const lane: SweepLane = { next: this.next, combinations: jobs.map((job) => job.options) };
    const results: SweepDone[] = new Array(jobs.length);
    this.hear = (answer) => {
      if ('error' in answer) this.failure ??= `--sweep ${jobs[answer.index].label}: ${answer.error}`;
      else {
        results[answer.index] = answer;
        onDone(answer.index, answer);
      }
    };
    for (const worker of this.workers) worker.postMessage(lane);
    await runLane(lane, this.hear);
    await Promise.all(this.stopped);
    if (this.failure !== null) throw new Error(this.failure);
    return results;
  }
}

/** Runs `mocker trace --sweep`; resolves with the exit code (1: a combination completed no request). */
export async function runTraceSweep(o: TraceOptions): Promise<number> {
  const axes = sweepAxes(o);
  const lanes = new Lanes(axes.reduce((n, axis) => n * axis.values.length, 1));
  const planned = import('./trace.js').then(({ planTrace, reportOutputs }) => {
    const combos = planSweep(o, axes, planTrace);
    // The reports are checked now (a long run must not end in a refusal), and written whole at the end; the
    // inputs they must not overwrite are the flags' files (a combination's engine args are inline JSON).
    return { combos, outputs: reportOutputs(o, planTrace(combos[0].options)) };
  });
  const { combos, outputs } = await planned.catch(async (err: unknown) => {
    await lanes.cancel();
    throw err;
  });
  let done = 0;
  const results = await lanes.run(
    combos.map((c) => ({ options: c.options, label: label(axes, c.values) })),
    (index, result) => {
      if (o.progress)
        console.error(
          `mocker trace: sweep ${++done}/${combos.length} done: ${label(axes, combos[index].values)} (${(result.report.wall_time_ms / 1000).toFixed(1)} s)`,
        );
    },
  );
  const runs = results.map((result, i) => ({
    values: Object.fromEntries(axes.map((axis, k) => [axis.key, combos[i].values[k]])),
    report: result.report,
    settings: result.settings,
  }));
  // The settings every run shares; what differs is in each run's values.
  const settings = Object.fromEntries(Object.entries(runs[0].settings).filter(([key, value]) => runs.every((r) => r.settings[key] === value)));
  const result: SweepResult = {
    settings,
    slo: o.slo ?? null,
    axes: axes.map(({ key, values }) => ({ key, values })),
    runs: runs.map(({ values, report }) => ({ values, report })),
  };
  console.log(formatSweepTable(result));
  await writeOutputFile(outputs.jsonPath, outputs.rules, (write) => write(sweepJson(result)));
  console.log(`Saved sweep report to: ${outputs.jsonPath}`);
  if (o.reportHtml !== undefined) {
    await writeOutputFile(o.reportHtml, outputs.rules, (write) => write(renderSweepHtml(result, `mocker trace --sweep — ${String(settings.workload ?? '')}`)));
    console.log(`Saved HTML report to: ${o.reportHtml}`);
  }
  const empty = runs.filter((r) => r.report.completed_requests === 0 && r.report.num_requests > 0);
  for (const run of empty)
    console.error(
      `mocker trace: ${Object.entries(run.values)
        .map(([k, v]) => `${k}=${String(v)}`)
        .join(' ')}: none of the ${run.report.num_requests} request(s) completed`,
    );
  return empty.length > 0 ? 1 : 0;
}
