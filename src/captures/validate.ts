/**
 * `mocker captures fit FILE --validate`: the observe → calibrate → validate loop as one command. The perf model is
 * fitted on the first part of the capture (or all of it, against a second file), the held-out requests' arrivals
 * (send times, prompt ids, output lengths) run through the fitted simulator on a virtual clock, and each held-out
 * request's TTFT, ITL and E2E are compared with what the capture saw.
 */
import { createSchedulerCore, runOffline, type AnySchedulerConfig, type PerfModel, type TimedRequest } from '../engine/index.js';
import { InterpolatedPerfModel } from '../engine/perf/perfModel.js';
import { CaptureStore, isGeneration, namingCapture, type StoredExchange } from '../store/captureStore.js';
import { seededUniform } from '../util/mulberry32.js';
import { captureTimeline, type FitCommandOptions } from './fit.js';
import { fitPerfProfile, mean, median, type PerfFit } from './perfFit.js';

export interface ValidateOptions extends Pick<FitCommandOptions, 'blockSize' | 'run' | 'model'> {
  /** The last this fraction of the capture's streamed requests (by send time) is held out; ignored with `against`. */
  holdoutFraction: number;
  /** Fit on all of the capture and validate against this second capture file. */
  against?: string;
  /** The simulated engine a fitted perf model runs in (the serve defaults, from the caller: captures/ reads no settings). */
  scheduler: (model: PerfModel) => AnySchedulerConfig;
}

export const METRICS = ['ttft', 'itl', 'e2e'] as const;
export type Metric = (typeof METRICS)[number];

/** One held-out request: what the capture saw and what the fitted simulator gives (ms; ITL is its mean gap, null for one token). */
export interface RequestComparison {
  label: string;
  /** Send time, ms after the first scored request's. */
  sentMs: number;
  captured: Record<Metric, number | null>;
  simulated: Record<Metric, number | null>;
}

export interface MetricSummary {
  /** Requests with this metric. */
  requests: number;
  capturedMedianMs: number;
  simulatedMedianMs: number;
  /** Median over requests of (simulated − captured) ÷ captured: the typical signed error (a distribution's median alone can jump between its modes). */
  medianError: number;
  /** Mean over requests of |simulated − captured| ÷ captured. */
  mape: number;
  /** What two runs of the engine on the same arrivals differ by (MAPE), at the capture's own step jitter (null when it cannot be estimated). */
  noise: number | null;
}

export interface Validation {
  fit: PerfFit;
  /** What was fitted and what held out, in words. */
  split: string;
  /** Relative step jitter of the capture (robust scatter of its decode steps around the fit). */
  stepJitter: number;
  /** Requests simulated but not scored, and why. */
  notes: string[];
  metrics: Record<Metric, MetricSummary>;
  requests: RequestComparison[];
}

/** Seeds of the jittered re-simulations the noise estimate averages. */
const NOISE_SEEDS = [1, 2, 3];

/**
 * A request sent this soon after another's answer ended, while others were in flight, came from a client that
 * reacted to that end (a closed loop, as benchmark clients and agents run): it reached a busy engine just after a
 * step began, not at a random point of one.
 */
const FOLLOW_WINDOW_MS = 10;

/** A request the simulator runs: one choice of an exchange that reached the engine. */
interface ReplayedRequest {
  label: string;
  sentMs: number;
  promptIds: number[];
  outputTokens: number;
  /** When the client had the whole answer (ms, the send time's clock). */
  endMs: number;
  /** Sent this long after another request's answer ended (the latest within FOLLOW_WINDOW_MS) while others were in flight, else null. */
  reactionMs: number | null;
  /** Token times (ms since sent) when streamed and complete, so it can be scored. */
  tokenMs: number[] | null;
}

function replayedRequests(file: string, options: Pick<ValidateOptions, 'run' | 'model'>): { requests: ReplayedRequest[]; unsimulated: number } {
  return namingCapture(file, () => {
    const store = CaptureStore.open(file, { readonly: true });
    try {
      const runs = options.run && new Set(options.run);
      for (const id of options.run ?? []) if (!store.getRun(id)) throw new Error(`no capture run ${id}`);
      const requests: ReplayedRequest[] = [];
      let unsimulated = 0;
      for (const id of store.exchangeIds()) {
        const ex = store.getExchange(id)!;
        if ((runs && !runs.has(ex.runId)) || ex.endpoint === null || !isGeneration(ex.endpoint) || (ex.status !== null && ex.status >= 400)) continue;
        if (ex.promptIds === null || ex.promptIds.length === 0 || ex.generations.length === 0) {
          unsimulated++;
          continue;
        }
        for (const g of ex.generations) requests.push(replayed(ex, g, options.model));
      }
      return { requests: withReactions(requests.sort((a, b) => a.sentMs - b.sentMs)), unsimulated };
    } finally {
      store.close();
    }
  });
}

function replayed(ex: StoredExchange, g: StoredExchange['generations'][number], model: string | undefined): ReplayedRequest {
  const scored =
    ex.outcome === 'complete' &&
    ex.stream &&
    ex.generations.length === 1 &&
    (model === undefined || ex.model === model) &&
    g.tokenTimes.length > 0 &&
    g.chunkTokens.reduce((a, b) => a + b, 0) === g.tokenTimes.length;
  return {
    label: `exchange ${ex.id}${ex.generations.length > 1 ? ` choice ${g.choiceIndex}` : ''}`,
    sentMs: ex.startedAt,
    promptIds: ex.promptIds!,
    outputTokens: Math.max(1, g.outputIds.length, g.tokenTimes.length),
    endMs: ex.startedAt + (g.tokenTimes.length > 0 ? g.tokenTimes[g.tokenTimes.length - 1] : ex.totalMs),
    reactionMs: null,
    tokenMs: scored ? g.tokenTimes : null,
  };
}

/**
 * Each request's reaction time (see FOLLOW_WINDOW_MS); `requests` in send order. In flight: sent before its send
 * time and not ended by it. Requests sent in the same millisecond (the choices of one exchange, a burst) do not count
 * each other, whatever their order in the file.
 */
function withReactions(requests: ReplayedRequest[]): ReplayedRequest[] {
  const ends = requests.map((r) => r.endMs).sort((a, b) => a - b);
  let ended = 0;
  let sentBefore = 0;
  requests.forEach((r, i) => {
    if (i > 0 && requests[i - 1].sentMs < r.sentMs) sentBefore = i;
    while (ended < ends.length && ends[ended] <= r.sentMs) ended++;
    const inFlight = sentBefore - ended;
    if (ended > 0 && inFlight > 0 && r.sentMs - ends[ended - 1] <= FOLLOW_WINDOW_MS) r.reactionMs = r.sentMs - ends[ended - 1];
  });
  return requests;
}

function latencies(tokenMs: readonly number[]): Record<Metric, number | null> {
  const first = tokenMs[0];
  const last = tokenMs[tokenMs.length - 1];
  return { ttft: first, itl: tokenMs.length > 1 ? (last - first) / (tokenMs.length - 1) : null, e2e: last };
}

/** A perf model whose every prefill and decode time is multiplied by 1 + N(0, jitter²), seeded: an engine with this capture's step jitter. */
function jittered(model: PerfModel, jitter: number, seed: number): PerfModel {
  const uniform = seededUniform(seed);
  const factor = () => Math.max(0.05, 1 + jitter * Math.sqrt(-2 * Math.log(1 - uniform())) * Math.cos(2 * Math.PI * uniform()));
  return {
    description: `${model.description}, jittered`,
    prefillMs: (...args) => model.prefillMs(...args) * factor(),
    decodeMs: (...args) => model.decodeMs(...args) * factor(),
  };
}

/**
 * Each request's token times (ms since it reached the engine) when the simulator runs all of `requests`; the time
 * outside the engine added to each. A request that reacted to an answer's end reacts to the simulated passes'.
 */
function simulate(config: AnySchedulerConfig, requests: ReplayedRequest[], outsideMs: number): Map<string, number[]> {
  const timed: TimedRequest[] = requests.map((r) => ({
    request: { id: r.label, promptTokenIds: r.promptIds, maxOutputTokens: r.outputTokens },
    arrivalMs: r.sentMs,
    // The client saw its predecessor's end after the time outside the engine; its request takes as long to arrive.
    ...(r.reactionMs !== null ? { reactionMs: Math.max(0, r.reactionMs + outsideMs) } : {}),
  }));
  const { records } = runOffline(createSchedulerCore(config), timed);
  return new Map(
    requests.map((r) => {
      const record = records.get(r.label)!;
      return [r.label, record.tokenTimesMs.map((t) => t - record.arrivalMs + outsideMs)];
    }),
  );
}

type Pair = [value: Record<Metric, number | null>, reference: Record<Metric, number | null>];

/** Per request both have the metric: (value − reference) ÷ reference. */
function relativeErrors(metric: Metric, pairs: Pair[]): number[] {
  return pairs.flatMap(([value, reference]) => {
    const [v, r] = [value[metric], reference[metric]];
    return v === null || r === null || r <= 0 ? [] : [(v - r) / r];
  });
}

/** Mean absolute relative error, over the requests both have the metric. */
function mapeOf(metric: Metric, pairs: Pair[]): number {
  const errors = relativeErrors(metric, pairs);
  return errors.length > 0 ? mean(errors.map(Math.abs)) : Number.NaN;
}

/** Fits, replays the held-out arrivals through the fitted simulator, and compares; throws when nothing can be held out. */
export function validateFit(file: string, options: ValidateOptions): Validation {
  const own = replayedRequests(file, options);
  const other = options.against === undefined ? null : replayedRequests(options.against, options);
  const scorable = own.requests.filter((r) => r.tokenMs !== null);
  const cutIndex = Math.ceil(scorable.length * (1 - options.holdoutFraction));
  // By position, not send time: requests sent in the same millisecond fall on either side as they were stored.
  const heldOut = new Set(other ? [] : scorable.slice(cutIndex).map((r) => r.label));
  if (!other && cutIndex >= scorable.length)
    throw new Error(`${file}: no streamed, complete request to hold out (${scorable.length} in all, hold-out fraction ${options.holdoutFraction})`);

  const timeline = namingCapture(file, () => {
    const store = CaptureStore.open(file, { readonly: true });
    try {
      return captureTimeline(store, options);
    } finally {
      store.close();
    }
  });
  // The held-out requests still occupy the engine while the fitted ones run (the batch is theirs too), but give no points.
  for (const s of timeline.sequences) s.fitted &&= !heldOut.has(s.label);
  const fit = fitPerfProfile(timeline, { blockSize: options.blockSize });
  const model = new InterpolatedPerfModel(fit.tables, 'fitted');
  const outsideMs = fit.prefill.overheadMs ?? 0;

  // Every request of the replayed file runs (those before the cut too: the engine is as loaded at the cut as it was).
  const replay = other ?? own;
  const held = replay.requests.filter((r) => r.tokenMs !== null && (other !== null || heldOut.has(r.label)));
  const simulated = simulate(options.scheduler(model), replay.requests, outsideMs);
  const firstMs = held[0]?.sentMs ?? 0;
  const requests = held.map((r) => ({
    label: r.label,
    sentMs: r.sentMs - firstMs,
    captured: latencies(r.tokenMs!),
    simulated: latencies(simulated.get(r.label)!),
  }));
  const stepJitter = fit.decode.relativeScatter;
  const jitteredRuns = NOISE_SEEDS.map((seed) => simulate(options.scheduler(jittered(model, stepJitter, seed)), replay.requests, outsideMs));
  const metrics = Object.fromEntries(
    METRICS.map((metric): [Metric, MetricSummary] => {
      const captured = requests.flatMap((r) => (r.captured[metric] === null ? [] : [r.captured[metric]!]));
      const sim = requests.flatMap((r) => (r.simulated[metric] === null ? [] : [r.simulated[metric]!]));
      const pairs = requests.map((r): Pair => [r.simulated, r.captured]);
      // Run to run: each jittered run against the next, as two runs of one engine on the same arrivals differ.
      const noise = mean(
        jitteredRuns.map((run, i) => {
          const next = jitteredRuns[(i + 1) % jitteredRuns.length];
          return mapeOf(
            metric,
            held.map((r) => [latencies(run.get(r.label)!), latencies(next.get(r.label)!)]),
          );
        }),
      );
      return [
        metric,
        {
          requests: captured.length,
          capturedMedianMs: median(captured),
          simulatedMedianMs: median(sim),
          medianError: median(relativeErrors(metric, pairs)),
          mape: mapeOf(metric, pairs),
          noise: Number.isFinite(noise) && stepJitter > 0 ? noise : null,
        },
      ];
    }),
  ) as Record<Metric, MetricSummary>;
  const firstHeldMs = held[0]?.sentMs ?? Infinity;
  const unscored = replay.requests.filter((r) => r.tokenMs === null && r.sentMs >= firstHeldMs).length;
  const notes = [
    ...(replay.unsimulated > 0 ? [`${replay.unsimulated} exchange(s) without prompt token ids were left out of the simulation`] : []),
    ...(unscored > 0 ? [`${unscored} held-out request(s) were simulated but not scored (not streamed and complete, several choices, or another model)`] : []),
  ];
  const split = other
    ? `fitted on all of ${file}, validated against the ${held.length} streamed requests of ${options.against}`
    : `fitted on the first ${cutIndex} streamed requests of ${file}, validated on the last ${held.length} (hold-out fraction ${options.holdoutFraction})`;
  return { fit, split, stepJitter, notes, metrics, requests };
}

const percent = (value: number) => `${value >= 0 ? '+' : ''}${(value * 100).toFixed(1)} %`;
const plainPercent = (value: number | null) => (value === null || Number.isNaN(value) ? '—' : `${(value * 100).toFixed(1)} %`);

export const METRIC_LABELS: Record<Metric, string> = { ttft: 'TTFT', itl: 'ITL', e2e: 'E2E' };

/** The validation printed on a terminal. */
export function formatValidation(v: Validation): string {
  const rows = METRICS.map((metric) => {
    const m = v.metrics[metric];
    return [
      METRIC_LABELS[metric].padEnd(6),
      `${m.capturedMedianMs.toFixed(2)} ms`.padStart(12),
      `${m.simulatedMedianMs.toFixed(2)} ms`.padStart(12),
      percent(m.medianError).padStart(12),
      plainPercent(m.mape).padStart(8),
      plainPercent(m.noise).padStart(8),
    ].join('  ');
  });
  return [
    `validation: ${v.split}`,
    `  per request, the simulator against the capture (noise: what two runs of the engine differ by at the capture's own step jitter, ${plainPercent(v.stepJitter)})`,
    `  ${['metric'.padEnd(6), 'captured p50'.padStart(12), 'simulated p50'.padStart(12), 'median error'.padStart(12), 'MAPE'.padStart(8), 'noise'.padStart(8)].join('  ')}`,
    ...rows.map((row) => `  ${row}`),
    ...v.notes.map((note) => `note: ${note}`),
  ].join('\n');
}
