/**
 * Metrics that every engine pass (or every token) updates, made cheap. prom-client hashes a label set on every
 * update and a histogram allocates per observation: with eight expositions fed by each pass, that cost more
 * than the engine itself. Here a series is a handle taken once per label set, and updating it is a store or an
 * addition; what a scrape prints is still prom-client's. Gauges and counters are prom-client metrics whose
 * series are written at scrape (`collect`), in the order they were first touched (prom-client's order);
 * `PassHistogram` hands the registry the values prom-client's `Histogram` would.
 */
import { Counter, Gauge, type Histogram, type Registry } from 'prom-client';

export type SeriesLabels = Record<string, string | number>;

interface MetricConfig {
  name: string;
  help: string;
  labelNames: readonly string[];
  registers: Registry[];
}

/** A gauge series: the next scrape shows its last `set`. */
export class GaugeSeries {
  private value = 0;
  private touched = false;
  constructor(
    readonly labels: SeriesLabels,
    /** The metric's series in the order of their first update. */
    private readonly order: GaugeSeries[],
  ) {}

  set(value: number): void {
    this.value = value;
    if (!this.touched) {
      this.touched = true;
      this.order.push(this);
    }
  }

  flush(gauge: Gauge): void {
    gauge.set(this.labels, this.value);
  }
}

/** A prom-client gauge set through `series(labels)` handles; each series is written once per scrape. */
export function passGauge(config: MetricConfig): { series(labels: SeriesLabels): GaugeSeries } {
  const order: GaugeSeries[] = [];
  new Gauge({
    ...config,
    labelNames: [...config.labelNames],
    collect(this: Gauge) {
      for (const s of order) s.flush(this);
    },
  });
  return { series: (labels) => new GaugeSeries(labels, order) };
}

/** A counter series: increments add up between scrapes (whole numbers: the sum is exact whatever the grouping). */
export class CounterSeries {
  private pending = 0;
  private touched = false;
  constructor(
    readonly labels: SeriesLabels,
    /** The metric's series in the order of their first update. */
    private readonly order: CounterSeries[],
  ) {}

  inc(by = 1): void {
    if (by < 0 || !Number.isFinite(by)) throw new RangeError(`counter ${JSON.stringify(this.labels)} incremented by ${by}`);
    this.pending += by;
    if (!this.touched) {
      this.touched = true;
      this.order.push(this);
    }
  }

  flush(counter: Counter): void {
    counter.inc(this.labels, this.pending);
    this.pending = 0;
  }
}

/** A prom-client counter incremented through `series(labels)` handles; the increments reach it at scrape. */
export function passCounter(config: MetricConfig): { series(labels: SeriesLabels): CounterSeries } {
  const order: CounterSeries[] = [];
  new Counter({
    ...config,
    labelNames: [...config.labelNames],
    collect(this: Counter) {
      for (const s of order) s.flush(this);
    },
  });
  return { series: (labels) => new CounterSeries(labels, order) };
}

/** One series of a `PassHistogram`: per-bucket counts (not cumulative), sum and count, as prom-client keeps them. */
export class HistogramSeries {
  readonly counts: Float64Array;
  sum = 0;
  count = 0;
  /** Printed by a scrape: observed or zeroed once (prom-client creates a series then). */
  private shown = false;
  constructor(
    readonly labels: SeriesLabels,
    private readonly bounds: readonly number[],
    /** The histogram's printed series, in the order they appeared. */
    private readonly order: HistogramSeries[],
  ) {
    this.counts = new Float64Array(bounds.length);
  }

  observe(value: number): void {
    if (!Number.isFinite(value)) throw new TypeError(`Value is not a valid number: ${value}`);
    const bounds = this.bounds;
    let i = 0;
    while (i < bounds.length && value > bounds[i]) i++;
    // Above the last bound: only in +Inf (the count), as prom-client.
    if (i < bounds.length) this.counts[i]++;
    this.sum += value;
    this.count++;
    this.show();
  }

  zero(): void {
    this.counts.fill(0);
    this.sum = 0;
    this.count = 0;
    this.show();
  }

  private show(): void {
    if (this.shown) return;
    this.shown = true;
    this.order.push(this);
  }
}

/** A value as prom-client's registry prints it: `labels` (here `le`) first, then the series' labels. */
interface ExportedValue {
  labels: Record<string, string | number>;
  sharedLabels: SeriesLabels;
  value: number;
  metricName: string;
  exemplar?: null;
}

/**
 * A histogram whose observations cost a bucket search and two additions. It registers in a prom-client
 * registry as a metric of its own and gives it, at scrape, the values prom-client's `Histogram` would give for
 * the same observations (its series in creation order, each with its cumulative buckets, +Inf, sum and count).
 */
export class PassHistogram {
  readonly type = 'histogram';
  readonly aggregator = 'sum';
  readonly name: string;
  readonly help: string;
  private readonly bounds: readonly number[];
  private readonly sortedLabelNames: string[];
  private readonly bySeries = new Map<string, HistogramSeries>();
  private readonly shown: HistogramSeries[] = [];

  constructor(config: MetricConfig & { buckets: readonly number[] }) {
    this.name = config.name;
    this.help = config.help;
    this.bounds = [...config.buckets];
    this.sortedLabelNames = [...config.labelNames].sort();
    if (config.labelNames.length === 0) this.zero({});
    // The registry only reads a metric's name, help and type and calls getForPromString or get (resetMetrics, never called here, would need reset).
    for (const registry of config.registers) registry.registerMetric(this as unknown as Histogram);
  }

  /** The series of `labels` (printed from its first observation): keep it, it is the cheap way to observe. */
  series(labels: SeriesLabels): HistogramSeries {
    let key = '';
    for (const name of this.sortedLabelNames) if (labels[name] !== undefined) key += `${name}:${labels[name]},`;
    let series = this.bySeries.get(key);
    if (!series) {
      series = new HistogramSeries(labels, this.bounds, this.shown);
      this.bySeries.set(key, series);
    }
    return series;
  }

  /** Empties the series of `labels` and prints it from now on (zeros before its first observation). */
  zero(labels: SeriesLabels): void {
    this.series(labels).zero();
  }

  async getForPromString(): Promise<{ name: string; help: string; type: string; values: ExportedValue[]; aggregator: string }> {
    const values: ExportedValue[] = [];
    for (const s of this.shown) {
      let cumulative = 0;
      this.bounds.forEach((le, i) => {
        cumulative += s.counts[i];
        values.push({ labels: { le }, sharedLabels: s.labels, value: cumulative, metricName: `${this.name}_bucket`, exemplar: null });
      });
      values.push({ labels: { le: '+Inf' }, sharedLabels: s.labels, value: s.count, metricName: `${this.name}_bucket`, exemplar: null });
      values.push({ labels: {}, sharedLabels: s.labels, value: s.sum, metricName: `${this.name}_sum` });
      values.push({ labels: {}, sharedLabels: s.labels, value: s.count, metricName: `${this.name}_count` });
    }
    return { name: this.name, help: this.help, type: this.type, values, aggregator: this.aggregator };
  }

  /** As prom-client's `get()`: the series' labels merged into each value's. */
  async get(): Promise<{
    name: string;
    help: string;
    type: string;
    values: { labels: Record<string, string | number>; value: number; metricName: string }[];
    aggregator: string;
  }> {
    const data = await this.getForPromString();
    return { ...data, values: data.values.map(({ labels, sharedLabels, ...rest }) => ({ ...rest, labels: { ...labels, ...sharedLabels } })) };
  }
}
