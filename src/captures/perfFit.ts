/**
 * The perf model (engine-reference §4) learnt from captured timings. The fitted forms are the ones the
 * simulated engine is built on (a pass is its prefill, then one decode step of every ready request, §1.2–1.5):
 * - decode step (ms) = base + per_sequence × batch + per_kv_token × active KV tokens, from the gaps between
 *   output tokens, with the batch of each step reconstructed from every captured request's token times;
 * - prefill (ms) = base + per_token × t + per_token_context × t × c + per_token_squared × t², t the new prompt
 *   tokens of a pass and c the context they attend over (each prefilled request's prompt length, cached prefix
 *   included, weighted by its new tokens, so that t × c sums each request's new × context: Vidur's attention term; t² tells apart an engine whose cost grows with the whole pass), from the steps under load that prefilled and the first tokens of requests that met an idle
 *   engine together (an idle request's first token also carries the HTTP and request handling outside the engine:
 *   a term of its own, fitted beside and left out of the profile), less the one decode step such a pass also holds.
 * Both are fitted by least squares with Huber weights (a stray late token must not bend the line), and
 * sampled onto the grid `--planner-profile-data` interpolates (§4.2), in the coordinates the engine queries it
 * with: active KV counted in whole blocks, batch = active KV / mean context length.
 */
import { attendedContext } from '../engine/index.js';
import type { PerfTables } from '../engine/perf/perfModel.js';

/** One choice of a streamed, complete generation, on the capture's one time line (ms). */
export interface TimedSequence {
  /** Names it in messages: `exchange 12`, `exchange 12 choice 1`. */
  label: string;
  /** When the request went to the engine. */
  sentMs: number;
  promptTokens: number;
  /** Prompt tokens the engine reported as prefix-cache hits (not computed by the prefill). */
  cachedTokens: number;
  /** When each output token arrived. */
  tokenMs: number[];
  /** Per token: it came alone in its chunk, so its gap from the chunk before is one engine step. */
  aloneInChunk: boolean[];
  /** Fitting points come from it; otherwise it only occupies the engine (another model than `--model`). */
  fitted: boolean;
}

/** A request that held the engine while its token times are unknown (not streamed, failed, aborted). */
export interface OpaqueRequest {
  sentMs: number;
  endMs: number;
}

export interface CaptureTimeline {
  sequences: TimedSequence[];
  opaque: OpaqueRequest[];
}

export interface FitOptions {
  /** The block size the profile will be served with: the engine counts active KV in whole blocks. */
  blockSize: number;
}

export interface TermFit {
  /** Points the fit used. */
  points: number;
  /** Coefficient per term (ms per unit); a term the data cannot tell apart is absent. */
  coefficients: Record<string, number>;
  /** Why terms were left out (e.g. one batch size only). */
  notes: string[];
  r2: number;
  medianAbsResidualMs: number;
  /** Range of each input over the points. */
  ranges: Record<string, [number, number]>;
}

export interface PerfFit {
  tables: PerfTables;
  /**
   * Why the profile is not to be trusted as it is: too few points for the form's terms (the terms beyond them are
   * left out), or a cost fitted negative; each says what to capture more of. Empty for a sound fit.
   */
  warnings: string[];
  decode: TermFit & {
    excluded: { prefillInStep: number; unknownRequestInFlight: number; irregular: number };
    /** Robust relative scatter of the steps around the fit (1.4826 × median |residual| ÷ fitted): the engine's step jitter. */
    relativeScatter: number;
  };
  prefill: TermFit & {
    source: 'prefill steps' | 'idle first tokens' | 'prefill steps and idle first tokens';
    /** Prefill steps under load among the points. */
    steps: number;
    /** Requests that met an idle engine. */
    idleRequests: number;
    /** How much later than the engine's passes an idle request's first token came (fitted); null without enough prefill steps to tell. */
    overheadMs: number | null;
  };
}

/** Requests' send times are stored in whole milliseconds (`Date.now()`), token offsets are not: the one time line is this exact. */
const CLOCK_RESOLUTION_MS = 1;
const PREFILL_GRID_POINTS = 100;
/** Fewer prefill steps under load than this: the prefill is learnt from idle requests' first tokens. */
const MIN_PREFILL_STEPS = 8;
const DECODE_GRID_POINTS = 64;

/** Fits both models; throws (naming what is missing) when the capture cannot support a fit. */
export function fitPerfProfile(timeline: CaptureTimeline, { blockSize }: FitOptions): PerfFit {
  const steps = stepObservations(timeline, blockSize);
  const decode = fitDecode(steps.decode, steps.excluded, blockSize);
  const prefill = fitPrefill(timeline, steps.prefill, blockSize, decode.predict);
  return {
    tables: { ...prefill.grid, ...decode.grid },
    warnings: [...decode.warnings, ...prefill.warnings],
    decode: decode.report,
    prefill: prefill.report,
  };
}

// ---- decode ----

interface DecodePoint {
  batch: number;
  activeKv: number;
  context: number;
  ms: number;
}

/** Active KV (whole blocks) and mean context of a batch of sequence lengths, as the engine computes them (§1.3). */
function batchCoordinates(lengths: number[], blockSize: number): { activeKv: number; context: number } {
  let blocks = 0;
  let total = 0;
  for (const length of lengths) {
    blocks += Math.ceil(length / blockSize);
    total += length;
  }
  return { activeKv: blocks * blockSize, context: Math.floor(total / lengths.length) };
}

/** The engine is queried at (active KV, context): its batch is their ratio. */
const batchOf = (activeKv: number, context: number) => Math.max(1, activeKv / Math.max(1, context));

/**
 * The engine's steps as the capture saw them: every output token, by arrival time, grouped into steps where
 * consecutive arrivals are more than a quarter of the typical gap apart (one engine emits every running
 * sequence's token at the end of each step). A step holding two tokens of one sequence is tokens that came
 * bunched (a stalled reader), not a step.
 */
interface Steps {
  /** Per sequence, per token: the index of its step. */
  stepOf: Int32Array[];
  /** Per step: its tokens as [sequence, position]. */
  members: [number, number][][];
  /** Per step: no sequence appears twice. */
  clean: boolean[];
  /** Per step: when its first token arrived. */
  arrivalMs: number[];
}

function groupSteps(sequences: TimedSequence[]): Steps {
  const tokens: [number, number, number][] = [];
  const gaps: number[] = [];
  sequences.forEach((s, i) =>
    s.tokenMs.forEach((t, k) => {
      tokens.push([t, i, k]);
      if (k > 0 && s.aloneInChunk[k] && t > s.tokenMs[k - 1]) gaps.push(t - s.tokenMs[k - 1]);
    }),
  );
  tokens.sort((a, b) => a[0] - b[0]);
  const split = gaps.length > 0 ? median(gaps) / 4 : 0;
  const stepOf = sequences.map((s) => new Int32Array(s.tokenMs.length));
  const members: [number, number][][] = [];
  const clean: boolean[] = [];
  const arrivalMs: number[] = [];
  let previous = -Infinity;
  let seen = new Set<number>();
  for (const [time, sequence, position] of tokens) {
    if (members.length === 0 || time - previous > split) {
      members.push([]);
      clean.push(true);
      arrivalMs.push(time);
      seen = new Set();
    }
    const step = members.length - 1;
    if (seen.has(sequence)) clean[step] = false;
    seen.add(sequence);
    members[step].push([sequence, position]);
    stepOf[sequence][position] = step;
    previous = time;
  }
  return { stepOf, members, clean, arrivalMs };
}

/** First index whose value is ≥ `value` (sorted ascending). */
function lowerBound(sorted: ArrayLike<number>, value: number): number {
  let low = 0;
  let high = sorted.length;
  while (low < high) {
    const mid = (low + high) >>> 1;
    if (sorted[mid] < value) low = mid + 1;
    else high = mid;
  }
  return low;
}

/** Whether any interval overlaps (from, to), in O(log n): starts sorted, with the running maximum of the ends. */
class IntervalSet {
  private readonly starts: Float64Array;
  private readonly maxEndSoFar: Float64Array;

  constructor(intervals: { start: number; end: number }[]) {
    const sorted = [...intervals].sort((a, b) => a.start - b.start);
    this.starts = Float64Array.from(sorted, (i) => i.start);
    this.maxEndSoFar = new Float64Array(sorted.length);
    let max = -Infinity;
    sorted.forEach((interval, i) => (this.maxEndSoFar[i] = max = Math.max(max, interval.end)));
  }

  overlaps(from: number, to: number): boolean {
    const before = lowerBound(this.starts, to);
    return before > 0 && this.maxEndSoFar[before - 1] > from;
  }
}

/** A step that prefilled: its new prompt tokens, their context, the batch it then decoded, and how long it took. */
interface PrefillStep {
  newTokens: number;
  /** The context the step's new tokens attend over: each request's prompt length (cached prefix included), weighted by its new tokens, as the engine queries it (timingModels.ts attendedContext). */
  promptContext: number;
  /** How many requests it prefilled. */
  requests: number;
  activeKv: number;
  context: number;
  ms: number;
}

/**
 * The capture's steps, read two ways. A step regular with the one before it — every sequence it holds that
 * is not new came from that step, and every sequence of that step that went on is in it — lasted from the
 * previous step's tokens to its own. Without new sequences, each of its sequences' gaps is a decode point (the
 * batch: each sequence's prompt and the tokens it had before); with new ones whose requests were waiting when
 * it began, it is a prefill step. Bunched or stray tokens break the pattern, and a request of unknown timing in
 * flight leaves the batch unknown: those are left out.
 */
function stepObservations(timeline: CaptureTimeline, blockSize: number) {
  const { sequences } = timeline;
  const { stepOf, members, clean, arrivalMs } = groupSteps(sequences);
  /** Per step: how many of its sequences have a later token (they must all be in the next step). */
  const continuing = members.map((tokens) => tokens.filter(([sequence, position]) => position + 1 < sequences[sequence].tokenMs.length).length);
  const opaque = new IntervalSet(timeline.opaque.map((o) => ({ start: o.sentMs, end: o.endMs })));
  const regular = members.map((tokens, step) => {
    if (step === 0 || !clean[step] || !clean[step - 1]) return false;
    const old = tokens.filter(([, position]) => position > 0);
    return old.length === continuing[step - 1] && old.every(([sequence, position]) => stepOf[sequence][position - 1] === step - 1);
  });
  const lengthsOf = (step: number) => members[step].map(([sequence, position]) => sequences[sequence].promptTokens + position);

  const decode: DecodePoint[] = [];
  const excluded = { prefillInStep: 0, unknownRequestInFlight: 0, irregular: 0 };
  sequences.forEach((own, ownIndex) => {
    if (!own.fitted) return;
    for (let k = 1; k < own.tokenMs.length; k++) {
      if (!own.aloneInChunk[k]) continue;
      const step = stepOf[ownIndex][k];
      if (opaque.overlaps(own.tokenMs[k - 1], own.tokenMs[k])) excluded.unknownRequestInFlight++;
      else if (members[step].some(([, position]) => position === 0)) excluded.prefillInStep++;
      else if (!regular[step]) excluded.irregular++;
      else {
        const lengths = lengthsOf(step);
        decode.push({ batch: lengths.length, ...batchCoordinates(lengths, blockSize), ms: own.tokenMs[k] - own.tokenMs[k - 1] });
      }
    }
  });

  const prefill: PrefillStep[] = [];
  members.forEach((tokens, step) => {
    const fresh = tokens.filter(([, position]) => position === 0).map(([sequence]) => sequences[sequence]);
    if (fresh.length === 0 || !regular[step] || !fresh.some((s) => s.fitted) || opaque.overlaps(arrivalMs[step - 1], arrivalMs[step])) return;
    // Sent before the previous step ended: waiting, so this step began right after it.
    if (fresh.some((s) => s.sentMs > arrivalMs[step - 1] + CLOCK_RESOLUTION_MS)) return;
    const newTokens = fresh.reduce((sum, s) => sum + Math.max(0, s.promptTokens - s.cachedTokens), 0);
    const promptContext = attendedContext(fresh.map((s) => ({ prefix: Math.min(s.cachedTokens, s.promptTokens), isl: s.promptTokens })));
    prefill.push({
      newTokens,
      promptContext,
      requests: fresh.length,
      ...batchCoordinates(lengthsOf(step), blockSize),
      ms: arrivalMs[step] - arrivalMs[step - 1],
    });
  });
  return { decode, prefill, excluded };
}

function fitDecode(points: DecodePoint[], excluded: PerfFit['decode']['excluded'], blockSize: number) {
  if (points.length < 2) {
    throw new Error(
      `only ${points.length} output gaps are regular decode steps of known batch (streamed, complete generations, one token per chunk, ` +
        `no request of unknown timing in flight): not enough to fit the decode step`,
    );
  }
  const notes: string[] = [];
  const batches = new Set(points.map((p) => p.batch));
  const terms: Term<DecodePoint>[] = [{ name: 'base', unit: 'step', value: () => 1 }];
  if (batches.size > 1) terms.push({ name: 'per_sequence', unit: 'sequence in the batch', value: (p) => batchOf(p.activeKv, p.context) });
  else notes.push(`every step had ${[...batches][0]} sequence(s): the per-sequence cost is not learnt`);
  if (new Set(points.map((p) => p.activeKv)).size > 1) terms.push({ name: 'per_kv_token', unit: 'active KV token', value: (p) => p.activeKv });
  else notes.push('every step held the same active KV: the per-token cost is not learnt');
  const more = 'capture more streamed requests (one token per chunk), at several concurrencies and lengths';
  const learnt = learnableTerms('decode step', terms, points.length, more);
  const fit = robustFit(points, learnt.terms, (p) => p.ms);
  const warnings = [...learnt.warnings, ...negativeCosts('decode step', learnt.terms, points, fit, more)];
  const coefficient = (name: string) => fit.coefficients[name] ?? 0;
  const predict = (activeKv: number, context: number) =>
    coefficient('base') + coefficient('per_sequence') * batchOf(activeKv, context) + coefficient('per_kv_token') * activeKv;

  const activeKv = range(points.map((p) => p.activeKv));
  const context = range(points.map((p) => p.context));
  // Twice the seen range: the fitted form, rather than the interpolator's edge extrapolation, answers a bigger load.
  const kvAxis = linspace(0, Math.max(2 * activeKv[1], blockSize), DECODE_GRID_POINTS);
  const contextLow = Math.max(1, context[0] / 2);
  const contextAxis = geomspace(contextLow, Math.max(2 * context[1], 2 * contextLow), DECODE_GRID_POINTS);
  const grid = {
    decode_active_kv_tokens: kvAxis,
    decode_context_length: contextAxis,
    decode_itl: Array.from(kvAxis, (kv) => Array.from(contextAxis, (ctx) => Math.max(1, predict(kv, ctx)))),
  };
  const report = {
    ...fit,
    notes,
    excluded,
    relativeScatter: 1.4826 * median(points.map((p) => Math.abs(p.ms - predict(p.activeKv, p.context)) / Math.max(1, predict(p.activeKv, p.context)))),
    ranges: { batch: range(points.map((p) => p.batch)), active_kv_tokens: activeKv, context_length: context },
  };
  return { grid, report, predict, warnings };
}

// ---- prefill ----

/**
 * Sequences whose request met an idle engine: nothing else in flight from its sending to its first token.
 * Send times are whole ms, so an overlap within that resolution is none.
 */
function idleSequences(timeline: CaptureTimeline): TimedSequence[] {
  const intervals = [
    ...timeline.sequences.map((s, i) => ({ start: s.sentMs, end: s.tokenMs[s.tokenMs.length - 1], sequence: i })),
    ...timeline.opaque.map((o) => ({ start: o.sentMs, end: o.endMs, sequence: -1 })),
  ].sort((a, b) => a.start - b.start);
  const idle: TimedSequence[] = [];
  let maxEndBefore = -Infinity;
  intervals.forEach((interval, i) => {
    const sequence = timeline.sequences[interval.sequence];
    const next = intervals[i + 1];
    const aloneBefore = maxEndBefore <= interval.start + CLOCK_RESOLUTION_MS;
    maxEndBefore = Math.max(maxEndBefore, interval.end);
    if (!sequence?.fitted || !aloneBefore) return;
    if (next && next.start < sequence.tokenMs[0] - CLOCK_RESOLUTION_MS) return;
    idle.push(sequence);
  });
  return idle;
}

interface PrefillPoint {
  tokens: number;
  context: number;
  /** Requests prefilled together (the context and squared forms differ only beyond 1). */
  requests: number;
  /** A request that met an idle engine: its first token also carries the time outside the engine. */
  idle: boolean;
  ms: number;
}

/** Grid points of the prefill table's context axis (the form is linear in the context: any grid is exact). */
const PREFILL_CONTEXT_POINTS = 32;

/**
 * Prefill from the prefill steps under load (their duration less the decode they also held) and the first tokens
 * of the requests that met an idle engine (less the decode of their first pass), fitted together; with enough
 * steps, an `overhead` term for the idle requests takes the time outside the engine (HTTP, request handling) out
 * of the profile, which a simulated engine's server adds no less than a real one. Without, that time stays in.
 */
function fitPrefill(timeline: CaptureTimeline, steps: PrefillStep[], blockSize: number, decodeMs: (activeKv: number, context: number) => number) {
  const idle = idleSequences(timeline).map((s): PrefillPoint => {
    // The first pass also decodes the new sequence's first token.
    const { activeKv, context } = batchCoordinates([s.promptTokens], blockSize);
    const ms = s.tokenMs[0] - s.sentMs - decodeMs(activeKv, context);
    return { tokens: Math.max(0, s.promptTokens - s.cachedTokens), context: s.promptTokens, requests: 1, idle: true, ms };
  });
  const underLoad = steps.length >= MIN_PREFILL_STEPS;
  const loaded = steps.map(
    (s): PrefillPoint => ({ tokens: s.newTokens, context: s.promptContext, requests: s.requests, idle: false, ms: s.ms - decodeMs(s.activeKv, s.context) }),
  );
  const points = underLoad ? [...loaded, ...idle] : idle;
  if (points.length === 0) {
    throw new Error(
      `no prefill to learn from: ${steps.length} prefill steps under load (${MIN_PREFILL_STEPS} needed) and no streamed generation met an idle engine; ` +
        `capture some requests one at a time, or a load with streamed requests`,
    );
  }
  const distinct = new Set(points.map((p) => p.tokens)).size;
  const linear: Term<PrefillPoint>[] = [{ name: 'base', unit: 'prefill', value: () => 1 }];
  const notes: string[] = [];
  if (distinct > 1) linear.push({ name: 'per_token', unit: 'prompt token', value: (p) => p.tokens });
  if (distinct <= 2)
    notes.push(`only ${distinct} distinct prompt length(s) prefilled: the ${distinct > 1 ? 'context term is' : 'length terms are'} not learnt`);
  const withOverhead = underLoad && idle.length > 0;
  const overheadTerm: Term<PrefillPoint>[] = withOverhead
    ? [{ name: 'overhead', unit: 'request that met an idle engine', value: (p) => (p.idle ? 1 : 0) }]
    : [];
  // The growth beyond linear: new tokens attending over their context (Vidur), and the whole pass's tokens squared
  // (an engine whose cost grows with the pass). One request's context is its own tokens, so the requests prefilled
  // alone fix only the two terms' sum; the passes that prefilled several apportion it. Fitted together, not chosen
  // between: on those few passes (5-9 in a 100-request capture) a choice by closeness flipped under noise, while a
  // joint fit errs only where they differ. A growth term the data give a negative cost is left out and the rest
  // refitted (no attention cost shrinks with more tokens), until none is negative.
  const contextTerm: Term<PrefillPoint> = { name: 'per_token_context', unit: 'prompt token × context token', value: (p) => p.tokens * p.context };
  const squaredTerm: Term<PrefillPoint> = { name: 'per_token_squared', unit: 'prompt token²', value: (p) => p.tokens * p.tokens };
  const several = points.some((p) => p.requests > 1);
  const source = !underLoad ? 'idle first tokens' : idle.length > 0 ? 'prefill steps and idle first tokens' : 'prefill steps';
  const more = underLoad
    ? 'capture more streamed requests under load, with several prompt lengths'
    : `capture more streamed requests one at a time, with several prompt lengths (or a load with at least ${MIN_PREFILL_STEPS} prefill steps)`;
  const what = `prefill (${underLoad ? 'steps under load' : 'requests that met an idle engine'})`;
  const fitWith = (quadratic: Term<PrefillPoint>[]) => {
    const learnt = learnableTerms(what, [...linear, ...quadratic, ...overheadTerm], points.length, more);
    return { learnt, fit: robustFit(points, learnt.terms, (p) => p.ms, { relative: true }) };
  };
  let growth = distinct > 2 ? (several ? [contextTerm, squaredTerm] : [contextTerm]) : [];
  let { learnt, fit } = fitWith(growth);
  for (;;) {
    const kept = growth.filter((t) => !((fit.coefficients[t.name] ?? 0) < 0));
    if (kept.length === growth.length) break;
    // One negative: the other alone, itself checked again; both: neither.
    growth = kept;
    ({ learnt, fit } = fitWith(growth));
  }
  const squared = fit.coefficients.per_token_squared;
  if (squared !== undefined && squared > (fit.coefficients.per_token_context ?? 0))
    notes.push("the prefill grows more with the pass's tokens squared than with each request's tokens × context");
  const warnings = [
    ...learnt.warnings,
    ...negativeCosts(
      what,
      learnt.terms.filter((t) => t.name !== 'overhead'),
      points,
      fit,
      more,
    ),
  ];
  const coefficient = (name: string) => fit.coefficients[name] ?? 0;
  const predict = (t: number, context: number) =>
    Math.max(0, coefficient('base') + coefficient('per_token') * t + coefficient('per_token_context') * t * context + coefficient('per_token_squared') * t * t);
  const { overhead, ...engineCoefficients } = fit.coefficients;
  const tokens = range(points.map((p) => p.tokens));
  const contexts = range(points.map((p) => p.context));
  const axis = linspace(0, Math.max(2 * tokens[1], 2), PREFILL_GRID_POINTS);
  const contextAxis = linspace(0, Math.max(2 * contexts[1], 2), PREFILL_CONTEXT_POINTS);
  const report = {
    ...fit,
    coefficients: engineCoefficients,
    notes,
    source: source as PerfFit['prefill']['source'],
    steps: underLoad ? steps.length : 0,
    idleRequests: idle.length,
    overheadMs: withOverhead ? (overhead ?? null) : null,
    ranges: { new_prompt_tokens: tokens, context_tokens: contexts },
  };
  const grid = {
    // One request without a cached prefix (its context is its own tokens), for readers of the five keys only.
    prefill_isl: axis,
    prefill_ttft_ms: axis.map((t) => predict(t, t)),
    prefill_context_length: contextAxis,
    prefill_ttft_ms_by_context: axis.map((t) => contextAxis.map((c) => predict(t, c))),
  };
  return { grid, report, warnings };
}

// ---- least squares ----

interface Term<P> {
  name: string;
  /** What one unit of the term is (its coefficient is ms per unit). */
  unit: string;
  value: (point: P) => number;
}

const names = <P>(terms: Term<P>[]) => terms.map((t) => t.name).join(', ');

/**
 * The terms `points` points can fit with a residual left over: fewer terms than points (the last, highest-order
 * ones go first). As many terms as points go through every point exactly (R² 1 whatever the noise) and say
 * nothing of the engine; the warnings say so and what to capture.
 */
function learnableTerms<P>(what: string, terms: Term<P>[], points: number, more: string): { terms: Term<P>[]; warnings: string[] } {
  if (points > terms.length) return { terms, warnings: [] };
  const kept = terms.slice(0, Math.max(1, points - 1));
  const dropped = terms.slice(kept.length);
  const fate = dropped.length > 0 ? `${names(dropped)} not learnt` : 'an exact fit with no residual, not to be trusted';
  return {
    terms: kept,
    warnings: [
      `${what}: only ${points} point(s) for the ${terms.length} term(s) of its form (${names(terms)}): ${fate}; ${terms.length + 1} points are needed: ${more}`,
    ],
  };
}

/**
 * A cost fitted negative that matters (it takes off more than the typical residual across the points' range):
 * more work in less time, which no engine does, so the fit followed noise or something else than the form.
 */
function negativeCosts<P>(
  what: string,
  terms: Term<P>[],
  points: P[],
  fit: { coefficients: Record<string, number>; medianAbsResidualMs: number },
  more: string,
): string[] {
  return terms
    .filter((t) => t.name !== 'base')
    .filter((t) => {
      const [low, high] = range(points.map(t.value));
      const c = fit.coefficients[t.name];
      return c < 0 && -c * (high - low) > fit.medianAbsResidualMs;
    })
    .map(
      (t) =>
        `${what}: the ${t.name} cost is fitted negative (${fit.coefficients[t.name].toPrecision(3)} ms per ${t.unit}): more work in less time is no engine's timing, the profile is not to be trusted; ${more}`,
    );
}

/** Huber's tuning constant: 95 % efficiency on Gaussian noise, bounded pull of outliers. */
const HUBER_K = 1.345;
const IRLS_ROUNDS = 30;

/**
 * Least squares with Huber weights, by iteratively reweighted least squares (residual scale: 1.4826 × MAD). With
 * `relative`, residuals are taken relative to the fitted time and each point weighs 1 / fitted²: a prefill's jitter
 * grows with its duration (a 200 ms prefill scatters by ms where a 20 ms one scatters by tenths). R² and the median
 * residual are over all points, unweighted.
 */
function robustFit<P>(points: P[], terms: Term<P>[], target: (point: P) => number, { relative = false } = {}) {
  const rows = points.map((p) => terms.map((t) => t.value(p)));
  const y = points.map(target);
  let coefficients = weightedLeastSquares(
    rows,
    y,
    points.map(() => 1),
  );
  for (let round = 0; round < IRLS_ROUNDS; round++) {
    // A fitted time under 1 ms is no scale for a step's jitter (the engine's floor: MIN_DECODE_MS).
    const scaleOf = rows.map((row) => (relative ? Math.max(1, dot(row, coefficients)) : 1));
    const residuals = rows.map((row, i) => (y[i] - dot(row, coefficients)) / scaleOf[i]);
    const scale = 1.4826 * median(residuals.map(Math.abs));
    if (!(scale > 0)) break;
    const weights = residuals.map((r, i) => (Math.abs(r) <= HUBER_K * scale ? 1 : (HUBER_K * scale) / Math.abs(r)) / scaleOf[i] ** 2);
    const next = weightedLeastSquares(rows, y, weights);
    const settled = next.every((c, i) => Math.abs(c - coefficients[i]) <= 1e-9 * (1 + Math.abs(c)));
    coefficients = next;
    if (settled) break;
  }
  const residuals = rows.map((row, i) => y[i] - dot(row, coefficients));
  const mean = y.reduce((a, b) => a + b, 0) / y.length;
  const total = y.reduce((a, v) => a + (v - mean) ** 2, 0);
  const unexplained = residuals.reduce((a, r) => a + r * r, 0);
  return {
    points: points.length,
    coefficients: Object.fromEntries(terms.map((t, i) => [t.name, coefficients[i]])),
    r2: total > 0 ? 1 - unexplained / total : 1,
    medianAbsResidualMs: median(residuals.map(Math.abs)),
  };
}

const dot = (a: number[], b: number[]) => a.reduce((sum, v, i) => sum + v * b[i], 0);

/**
 * Solves the weighted normal equations on columns scaled to [-1, 1] (inputs span 1 to 10⁸: tokens²). A column
 * the others already explain (a vanishing pivot) gets coefficient 0 instead of a meaningless huge one.
 */
function weightedLeastSquares(rows: number[][], y: number[], weights: number[]): number[] {
  const n = rows[0].length;
  const scale = Array.from({ length: n }, (_, j) => rows.reduce((max, r) => Math.max(max, Math.abs(r[j])), 0) || 1);
  const a = Array.from({ length: n }, () => new Array<number>(n + 1).fill(0));
  rows.forEach((row, i) => {
    const x = row.map((v, j) => v / scale[j]);
    for (let r = 0; r < n; r++) {
      for (let c = 0; c < n; c++) a[r][c] += weights[i] * x[r] * x[c];
      a[r][n] += weights[i] * x[r] * y[i];
    }
  });
  const diagonal = a.map((row, j) => row[j]);
  const used = new Array<boolean>(n).fill(true);
  // Gaussian elimination in order: the matrix is symmetric positive semi-definite, no row swaps needed.
  for (let j = 0; j < n; j++) {
    if (!(a[j][j] > 1e-10 * diagonal[j])) {
      used[j] = false;
      continue;
    }
    for (let r = j + 1; r < n; r++) {
      const factor = a[r][j] / a[j][j];
      for (let c = j; c <= n; c++) a[r][c] -= factor * a[j][c];
    }
  }
  const solution = new Array<number>(n).fill(0);
  for (let j = n - 1; j >= 0; j--) {
    if (!used[j]) continue;
    let rest = a[j][n];
    for (let c = j + 1; c < n; c++) rest -= a[j][c] * solution[c];
    solution[j] = rest / a[j][j];
  }
  return solution.map((v, j) => v / scale[j]);
}

// ---- small numeric helpers ----

export function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = sorted.length >> 1;
  return sorted.length % 2 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2;
}

export const mean = (values: number[]) => values.reduce((a, b) => a + b, 0) / values.length;

function range(values: number[]): [number, number] {
  return values.reduce<[number, number]>(([low, high], v) => [Math.min(low, v), Math.max(high, v)], [Infinity, -Infinity]);
}

function linspace(from: number, to: number, count: number): number[] {
  return Array.from({ length: count }, (_, i) => from + ((to - from) * i) / (count - 1));
}

/** Evenly spaced on a log scale: batch = KV / context is hyperbolic in the context, which this grid follows closely. */
function geomspace(from: number, to: number, count: number): number[] {
  return Array.from({ length: count }, (_, i) => from * (to / from) ** (i / (count - 1)));
}
