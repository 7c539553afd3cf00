/**
 * What a trace run measured (engine-reference §8.8): per request its arrival, first admission (with the
 * prompt tokens the prefix cache supplied), token times and lengths; the report Dynamo's replay writes; and
 * the series the HTML report draws. Token times are not kept per request: each request keeps its first,
 * second and last token time, and the gaps go to one pooled tally of distinct values.
 */

/** Nearest-rank percentile statistics of §8.8 (population std; empty: all zeros). */
export interface Distribution {
  mean: number;
  min: number;
  max: number;
  median: number;
  p75: number;
  p90: number;
  p95: number;
  p99: number;
  std: number;
}

const EMPTY: Distribution = { mean: 0, min: 0, max: 0, median: 0, p75: 0, p90: 0, p95: 0, p99: 0, std: 0 };

/** A sorted multiset: distinct values ascending, each with how many times it occurs. */
class SortedCounts {
  /** Samples in all. */
  readonly size: number;
  /** Sorted sample indices [ends[i − 1], ends[i]) hold values[i]. */
  private readonly ends: Float64Array;

  constructor(
    readonly values: Float64Array,
    readonly counts: Float64Array,
  ) {
    this.ends = new Float64Array(values.length);
    let size = 0;
    for (let i = 0; i < values.length; i++) this.ends[i] = size += counts[i];
    this.size = size;
  }

  /** The sample at index `k` of the sorted samples. */
  at(k: number): number {
    let lo = 0;
    let hi = this.ends.length - 1;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this.ends[mid] > k) hi = mid;
      else lo = mid + 1;
    }
    return this.values[lo];
  }
}

/** §8.8: value at sorted index round((n−1)·p/100). Sums run over the sorted samples one by one, as over an array. */
function summarize(samples: SortedCounts): Distribution {
  const n = samples.size;
  if (n === 0) return { ...EMPTY };
  const { values, counts } = samples;
  let sum = 0;
  for (let i = 0; i < values.length; i++) for (let c = 0; c < counts[i]; c++) sum += values[i];
  const mean = sum / n;
  let squares = 0;
  for (let i = 0; i < values.length; i++) for (let c = 0; c < counts[i]; c++) squares += (values[i] - mean) ** 2;
  const at = (p: number) => samples.at(Math.round(((n - 1) * p) / 100));
  return {
    mean,
    min: values[0],
    max: values[values.length - 1],
    median: at(50),
    p75: at(75),
    p90: at(90),
    p95: at(95),
    p99: at(99),
    std: Math.sqrt(squares / n),
  };
}

/**
 * Samples kept as distinct values with counts. Token gaps repeat (the tokens of one pass mostly share the gap
 * since the previous pass), so a run's millions of gaps take kilobytes and sorting them sorts only the
 * distinct ones. Equal values in a row are counted before they touch the map.
 */
class Tally {
  private readonly counts = new Map<number, number>();
  private runValue = 0;
  private runLength = 0;

  push(value: number): void {
    if (this.runLength > 0 && value === this.runValue) {
      this.runLength++;
      return;
    }
    this.endRun();
    this.runValue = value;
    this.runLength = 1;
  }

  private endRun(): void {
    if (this.runLength > 0) this.counts.set(this.runValue, (this.counts.get(this.runValue) ?? 0) + this.runLength);
    this.runLength = 0;
  }

  sorted(): SortedCounts {
    this.endRun();
    const values = Float64Array.from(this.counts.keys()).sort();
    const counts = new Float64Array(values.length);
    for (let i = 0; i < values.length; i++) counts[i] = this.counts.get(values[i])!; // every key has a count
    return new SortedCounts(values, counts);
  }
}

function sortedCounts(values: Iterable<number>): SortedCounts {
  const tally = new Tally();
  for (const value of values) tally.push(value);
  return tally.sorted();
}

/** §8.8 statistics of `values`. */
export function distribution(values: Iterable<number>): Distribution {
  return summarize(sortedCounts(values));
}

interface RequestRecord {
  uuid: string;
  sessionId: string | null;
  turnIndex: number | null;
  arrivalMs: number;
  admittedMs: number | null;
  /** The most prompt tokens the cache supplied at any admission (a preempted request re-finds its own KV). */
  reusedTokens: number;
  /** What the cache supplied at its first admission: prefix reuse proper. */
  firstAdmissionReusedTokens: number;
  inputLength: number;
  outputLength: number;
  worker: number | null;
  decodeWorker: number | null;
  tokens: number;
  firstMs: number;
  secondMs: number;
  lastMs: number;
  /** Its tokens came one by one (false: all at once, in a non-streamed answer). */
  streamed: boolean;
}

/** A request the report counts as completed: admitted, with at least one token. */
const isCompleted = (r: RequestRecord): boolean => r.admittedMs !== null && r.tokens > 0;

export interface PerRequestRecord {
  uuid: string;
  session_id: string | null;
  turn_index: number | null;
  /** The worker that computed its prompt. */
  worker: string | null;
  /** Disaggregated: the worker that generated its tokens. */
  decode_worker: string | null;
  arrival_time_ms: number;
  first_admit_ms: number | null;
  first_token_ms: number | null;
  last_token_ms: number | null;
  input_length: number;
  requested_output_length: number;
  output_length: number;
  reused_input_tokens: number;
  first_admission_reused_input_tokens: number;
}

/** The JSON report: Dynamo's keys (`python -m dynamo.replay --report-json`), and per-session figures of multi-turn workloads. */
export type ReplayReport = Record<string, number>;

/** Turn indices whose prefix reuse is reported one by one; later turns are pooled. */
const TURNS_REPORTED = 8;
const TURN_REUSE_KEY = 'first_admission_prefix_cache_reused_ratio_turn_';
const POOLED_TURNS = `${TURNS_REPORTED}_plus`;

/** A report's first-admission prefix reuse by turn index, in turn order (`8+`: the later turns pooled). */
export function reuseByTurn(report: ReplayReport): { turn: string; ratio: number }[] {
  const out: { turn: string; ratio: number }[] = [];
  for (let turn = 0; turn < TURNS_REPORTED; turn++) {
    const ratio = report[`${TURN_REUSE_KEY}${turn}`];
    if (ratio !== undefined) out.push({ turn: String(turn), ratio });
  }
  const pooled = report[`${TURN_REUSE_KEY}${POOLED_TURNS}`];
  if (pooled !== undefined) out.push({ turn: `${TURNS_REPORTED}+`, ratio: pooled });
  return out;
}

/** One worker's cache over time, sampled at its passes. */
export interface WorkerSeries {
  name: string;
  requests: number;
  timesMs: number[];
  /** Active KV blocks ÷ total blocks. */
  kvUsage: number[];
  /** Cumulative prefix-cache hits ÷ queries (tokens). */
  prefixHitRate: number[];
}

/** What the HTML report draws. Latency arrays are sorted (CDFs); time series are bucketed. */
/** A worker's completed requests (by the worker that computed their prompts): input tokens and what the cache supplied. */
export interface WorkerReuse {
  inputTokens: number;
  /** The most at any admission, summed. */
  reusedTokens: number;
  firstAdmissionReusedTokens: number;
}

export interface ReplayCharts {
  ttftMs: number[];
  itlMs: number[];
  e2eMs: number[];
  /** Bucket starts (ms on the run's clock), output tokens per second and requests in flight per bucket. */
  timeline: { timesMs: number[]; outputTokensPerS: number[]; inFlight: number[] };
  workers: (WorkerSeries & { reuse: WorkerReuse })[];
}

/** At most this many points per drawn series: the page stays small whatever the run's size. */
const MAX_POINTS = 2000;

/** The sorted samples, or MAX_POINTS of them evenly spaced by rank. */
function thin(samples: SortedCounts): number[] {
  const n = samples.size;
  const points = Math.min(n, MAX_POINTS);
  const out: number[] = [];
  for (let i = 0; i < points; i++) out.push(samples.at(points === n ? i : Math.round((i * (n - 1)) / (MAX_POINTS - 1))));
  return out;
}

export interface PassSample {
  activeBlocks: number;
  totalBlocks: number;
  prefixCacheQueries: number;
  prefixCacheHits: number;
}

export class ReplayCollector {
  private readonly requests = new Map<string, RequestRecord>();
  private readonly gaps = new Tally();
  private readonly workerSeries: WorkerSeries[];
  private readonly lastSampleMs: number[];

  constructor(workerNames: readonly string[]) {
    this.workerSeries = workerNames.map((name) => ({ name, requests: 0, timesMs: [], kvUsage: [], prefixHitRate: [] }));
    this.lastSampleMs = workerNames.map(() => -Infinity);
  }

  onArrival(uuid: string, arrivalMs: number, inputLength: number, outputLength: number, turn?: { sessionId: string; turnIndex: number }): void {
    this.requests.set(uuid, {
      uuid,
      sessionId: turn?.sessionId ?? null,
      turnIndex: turn?.turnIndex ?? null,
      arrivalMs,
      admittedMs: null,
      reusedTokens: 0,
      firstAdmissionReusedTokens: 0,
      inputLength,
      outputLength,
      worker: null,
      decodeWorker: null,
      tokens: 0,
      firstMs: 0,
      secondMs: 0,
      lastMs: 0,
      streamed: true,
    });
  }

  /** The worker that computes the request's prompt, or (disaggregated) the decode worker that generates its tokens. */
  onRouted(uuid: string, worker: number, stage: 'prefill' | 'decode' = 'prefill'): void {
    const record = this.record(uuid);
    this.workerSeries[worker].requests++;
    if (stage === 'prefill') record.worker = worker;
    else record.decodeWorker = worker;
  }

  /**
   * An admission to a worker's running set: the first one's time and reuse (Dynamo's first-admission figure),
   * and the most prefix reuse seen over all of them (§8.8).
   */
  onAdmit(uuid: string, nowMs: number, reusedTokens: number): void {
    const record = this.record(uuid);
    if (record.admittedMs === null) {
      record.admittedMs = nowMs;
      record.firstAdmissionReusedTokens = reusedTokens;
    }
    record.reusedTokens = Math.max(record.reusedTokens, reusedTokens);
  }

  onTokens(uuid: string, timeMs: number, count = 1): void {
    const record = this.record(uuid);
    for (let i = 0; i < count; i++) {
      if (record.tokens === 0) record.firstMs = timeMs;
      else {
        if (record.tokens === 1) record.secondMs = timeMs;
        this.gaps.push(Math.max(0, timeMs - record.lastMs));
      }
      record.lastMs = timeMs;
      record.tokens++;
    }
  }

  /**
   * A non-streamed answer: its `count` tokens all at `timeMs`. It counts as a completed request with its tokens
   * and end-to-end latency, but has no first-token time or gaps between tokens (nor a per-user token rate).
   */
  onAnswered(uuid: string, timeMs: number, count: number): void {
    const record = this.record(uuid);
    Object.assign(record, { streamed: false, tokens: count, firstMs: timeMs, secondMs: timeMs, lastMs: timeMs });
  }

  /** A worker's cache state after a pass; kept at most every `minGapMs` of the run's clock per worker. */
  onPass(worker: number, nowMs: number, sampleNow: () => PassSample, minGapMs: number): void {
    if (nowMs - this.lastSampleMs[worker] < minGapMs) return;
    this.lastSampleMs[worker] = nowMs;
    const sample = sampleNow();
    const series = this.workerSeries[worker];
    series.timesMs.push(nowMs);
    series.kvUsage.push(sample.totalBlocks > 0 ? sample.activeBlocks / sample.totalBlocks : 0);
    series.prefixHitRate.push(sample.prefixCacheQueries > 0 ? sample.prefixCacheHits / sample.prefixCacheQueries : 0);
  }

  /** Tokens seen so far for a request (0 when unknown). */
  tokensOf(uuid: string): number {
    return this.requests.get(uuid)?.tokens ?? 0;
  }

  private record(uuid: string): RequestRecord {
    const record = this.requests.get(uuid);
    if (!record) throw new Error(`trace collector: request ${uuid} never arrived`);
    return record;
  }

  /** One record per request, in arrival order (Dynamo's per-request records, with snake_case keys). */
  perRequest(): PerRequestRecord[] {
    return [...this.requests.values()].map((r) => ({
      uuid: r.uuid,
      session_id: r.sessionId,
      turn_index: r.turnIndex,
      worker: r.worker === null ? null : this.workerSeries[r.worker].name,
      decode_worker: r.decodeWorker === null ? null : this.workerSeries[r.decodeWorker].name,
      arrival_time_ms: r.arrivalMs,
      first_admit_ms: r.admittedMs,
      first_token_ms: r.tokens > 0 ? r.firstMs : null,
      last_token_ms: r.tokens > 0 ? r.lastMs : null,
      input_length: r.inputLength,
      requested_output_length: r.outputLength,
      output_length: r.tokens,
      reused_input_tokens: r.reusedTokens,
      first_admission_reused_input_tokens: r.firstAdmissionReusedTokens,
    }));
  }

  /** Completed requests, in arrival order. */
  private completed(): RequestRecord[] {
    return [...this.requests.values()].filter(isCompleted);
  }

  report(wallTimeMs: number): ReplayReport {
    const done = this.completed();
    let input = 0;
    let output = 0;
    let reused = 0;
    let firstReused = 0;
    let durationMs = 0;
    const ttft: number[] = [];
    const ttst: number[] = [];
    const tpot: number[] = [];
    const e2e: number[] = [];
    for (const r of done) {
      input += r.inputLength;
      output += r.outputLength;
      reused += r.reusedTokens;
      firstReused += r.firstAdmissionReusedTokens;
      durationMs = Math.max(durationMs, r.lastMs);
      e2e.push(Math.max(0, r.lastMs - r.arrivalMs));
      if (!r.streamed) continue;
      ttft.push(Math.max(0, r.firstMs - r.arrivalMs));
      if (r.tokens >= 2) {
        ttst.push(Math.max(0, r.secondMs - r.firstMs));
        tpot.push(Math.max(0, (r.lastMs - r.firstMs) / (r.tokens - 1)));
      }
    }
    const gaps = this.gaps.sorted();
    // 1000 / gap decreases as the gap grows: the positive gaps, largest first, give the rates in ascending order.
    const positive = gaps.values.findIndex((gap) => gap > 0);
    const rates = positive < 0 ? 0 : gaps.values.length - positive;
    const rateValues = new Float64Array(rates);
    const rateCounts = new Float64Array(rates);
    for (let j = 0; j < rates; j++) {
      const i = gaps.values.length - 1 - j;
      rateValues[j] = 1000 / gaps.values[i];
      rateCounts[j] = gaps.counts[i];
    }
    const durationS = Math.max(durationMs / 1000, 1e-9);
    const report: ReplayReport = {
      num_requests: this.requests.size,
      completed_requests: done.length,
      total_input_tokens: input,
      total_output_tokens: output,
      duration_ms: durationMs,
      wall_time_ms: wallTimeMs,
      request_throughput_rps: done.length / durationS,
      input_throughput_tok_s: input / durationS,
      output_throughput_tok_s: output / durationS,
      total_throughput_tok_s: (input + output) / durationS,
      total_reused_input_tokens: reused,
      total_first_admission_reused_input_tokens: firstReused,
      prefix_cache_reused_ratio: input > 0 ? reused / input : 0,
      first_admission_prefix_cache_reused_ratio: input > 0 ? firstReused / input : 0,
    };
    const put = (name: string, d: Distribution, unit = '_ms') => {
      for (const [stat, value] of Object.entries(d)) report[`${stat}_${name}${unit}`] = value;
    };
    put('ttft', distribution(ttft));
    put('ttst', distribution(ttst));
    put('tpot', distribution(tpot));
    put('itl', summarize(gaps));
    put('e2e_latency', distribution(e2e));
    put('output_token_throughput_per_user', summarize(new SortedCounts(rateValues, rateCounts)), '');
    return Object.assign(report, this.sessionFigures());
  }

  /**
   * Sessions (a DAG's trajectories), only when one has more than one request: their number, turns per session,
   * session latency (first arrival to last token, of sessions whose requests all completed) and the first-admission
   * prefix reuse of the completed requests by turn index.
   */
  private sessionFigures(): ReplayReport {
    const sessions = new Map<string, RequestRecord[]>();
    for (const r of this.requests.values()) {
      if (r.sessionId === null) continue;
      const requests = sessions.get(r.sessionId);
      if (requests) requests.push(r);
      else sessions.set(r.sessionId, [r]);
    }
    let maxTurns = 0;
    for (const requests of sessions.values()) maxTurns = Math.max(maxTurns, requests.length);
    if (maxTurns <= 1) return {};
    const latencies: number[] = [];
    const slots = TURNS_REPORTED + 1;
    const input = new Array<number>(slots).fill(0);
    const reused = new Array<number>(slots).fill(0);
    for (const requests of sessions.values()) {
      let first = Infinity;
      let last = -Infinity;
      for (const r of requests) {
        first = Math.min(first, r.arrivalMs);
        last = Math.max(last, r.lastMs);
        if (!isCompleted(r) || r.turnIndex === null) continue;
        const slot = Math.min(r.turnIndex, TURNS_REPORTED);
        input[slot] += r.inputLength;
        reused[slot] += r.firstAdmissionReusedTokens;
      }
      if (requests.every(isCompleted)) latencies.push(last - first);
    }
    const figures: ReplayReport = {
      num_sessions: sessions.size,
      mean_turns_per_session: [...sessions.values()].reduce((n, requests) => n + requests.length, 0) / sessions.size,
      max_turns_per_session: maxTurns,
    };
    for (const [stat, value] of Object.entries(distribution(latencies))) figures[`${stat}_session_latency_ms`] = value;
    for (let slot = 0; slot < slots; slot++) {
      if (input[slot] > 0) figures[`${TURN_REUSE_KEY}${slot === TURNS_REPORTED ? POOLED_TURNS : slot}`] = reused[slot] / input[slot];
    }
    return figures;
  }

  charts(): ReplayCharts {
    const done = this.completed();
    const sorted = (values: number[]) => thin(sortedCounts(values));
    let endMs = 0;
    for (const r of done) endMs = Math.max(endMs, r.lastMs);
    const buckets = Math.max(1, Math.min(200, Math.ceil(endMs / 10)));
    const bucketMs = Math.max(endMs / buckets, 1e-9);
    const tokens = new Array<number>(buckets).fill(0);
    const inFlightMs = new Array<number>(buckets).fill(0);
    for (const r of done) {
      // Output tokens spread evenly between the first and last token; in flight from arrival to last token.
      const spread = (from: number, to: number, amount: number, into: number[], perMs: boolean) => {
        const span = to - from;
        if (span <= 0) {
          into[Math.min(buckets - 1, Math.floor(from / bucketMs))] += perMs ? 0 : amount;
          return;
        }
        for (let b = Math.max(0, Math.floor(from / bucketMs)); b < buckets && b * bucketMs < to; b++) {
          const overlap = Math.min(to, (b + 1) * bucketMs) - Math.max(from, b * bucketMs);
          if (overlap > 0) into[b] += perMs ? overlap : (amount * overlap) / span;
        }
      };
      spread(r.firstMs, r.lastMs, r.tokens, tokens, false);
      spread(r.arrivalMs, r.lastMs, 0, inFlightMs, true);
    }
    return {
      ttftMs: sorted(done.filter((r) => r.streamed).map((r) => Math.max(0, r.firstMs - r.arrivalMs))),
      itlMs: thin(this.gaps.sorted()),
      e2eMs: sorted(done.map((r) => Math.max(0, r.lastMs - r.arrivalMs))),
      timeline: {
        timesMs: tokens.map((_, b) => b * bucketMs),
        outputTokensPerS: tokens.map((n) => (n * 1000) / bucketMs),
        inFlight: inFlightMs.map((ms) => ms / bucketMs),
      },
      workers: this.workerSeries.map((series, worker) => {
        // Every step-th sample keeps the page small whatever the run's length.
        const step = Math.max(1, Math.ceil(series.timesMs.length / MAX_POINTS));
        const every = <T>(values: T[]) => values.filter((_, i) => i % step === 0);
        const reuse = { inputTokens: 0, reusedTokens: 0, firstAdmissionReusedTokens: 0 };
        for (const r of done) {
          if (r.worker !== worker) continue;
          reuse.inputTokens += r.inputLength;
          reuse.reusedTokens += r.reusedTokens;
          reuse.firstAdmissionReusedTokens += r.firstAdmissionReusedTokens;
        }
        return { ...series, timesMs: every(series.timesMs), kvUsage: every(series.kvUsage), prefixHitRate: every(series.prefixHitRate), reuse };
      }),
    };
  }
}
