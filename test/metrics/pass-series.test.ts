import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { passCounter, passGauge, PassHistogram } from '../../src/metrics/passSeries.js';
import { seededUniform } from '../../src/util/mulberry32.js';

/** prom-client itself is the oracle: the same updates through it and through the pass series print the same text. */
describe('pass series print what prom-client prints for the same updates', () => {
  const labelNames = ['engine', 'model_name'];
  const labels = (rank: number) => ({ engine: String(rank), model_name: 'm' });

  it('histograms: series created by zero or by a first observation, values below, on and above the bounds', async () => {
    const oracle = new Registry();
    const fast = new Registry();
    const buckets = [0.001, 0.01, 0.1, 1, 10];
    const expected = new Histogram({ name: 'h_seconds', help: 'A histogram.', buckets, labelNames, registers: [oracle] });
    const tested = new PassHistogram({ name: 'h_seconds', help: 'A histogram.', buckets, labelNames, registers: [fast] });
    const lone = {
      expected: new Histogram({ name: 'lone', help: 'No labels.', buckets, registers: [oracle] }),
      tested: new PassHistogram({ name: 'lone', help: 'No labels.', buckets, labelNames: [], registers: [fast] }),
    };
    expected.zero(labels(1));
    tested.zero(labels(1));
    expect(await fast.metrics()).toBe(await oracle.metrics());
    const series = [tested.series(labels(0)), tested.series(labels(1)), tested.series(labels(2))];
    const random = seededUniform(7);
    const values = [0, 0.001, 0.0010001, 10, 10.5, 1e9, ...Array.from({ length: 500 }, () => random() ** 3 * 20)];
    for (const [i, value] of values.entries()) {
      // Rank 2 first appears after rank 0: prom-client prints series in the order they appeared.
      const rank = i < 3 ? 0 : i % 3;
      expected.labels(labels(rank)).observe(value);
      series[rank].observe(value);
      lone.expected.observe(value / 2);
      lone.tested.series({}).observe(value / 2);
    }
    expect(await fast.metrics()).toBe(await oracle.metrics());
    expect(await fast.getMetricsAsJSON()).toEqual(await oracle.getMetricsAsJSON());
  });

  it('gauges and counters: written at scrape, in the order their series were first updated', async () => {
    const oracle = new Registry();
    const fast = new Registry();
    const gauge = new Gauge({ name: 'g', help: 'A gauge.', labelNames, registers: [oracle] });
    const counter = new Counter({ name: 'c_total', help: 'A counter.', labelNames, registers: [oracle] });
    const fastGauge = passGauge({ name: 'g', help: 'A gauge.', labelNames, registers: [fast] });
    const fastCounter = passCounter({ name: 'c_total', help: 'A counter.', labelNames, registers: [fast] });
    const gauges = [0, 1].map((r) => fastGauge.series(labels(r)));
    const counters = [0, 1].map((r) => fastCounter.series(labels(r)));
    expect(await fast.metrics()).toBe(await oracle.metrics());
    gauge.labels(labels(1)).set(0.25);
    gauges[1].set(0.25);
    counter.labels(labels(1)).inc(0);
    counters[1].inc(0);
    expect(await fast.metrics()).toBe(await oracle.metrics());
    for (let i = 0; i < 50; i++) {
      gauge.labels(labels(i % 2)).set(i / 7);
      gauges[i % 2].set(i / 7);
      counter.labels(labels(i % 2)).inc(i);
      counters[i % 2].inc(i);
      if (i % 20 === 0) expect(await fast.metrics()).toBe(await oracle.metrics());
    }
    expect(await fast.metrics()).toBe(await oracle.metrics());
    expect(() => counters[0].inc(-1)).toThrow(RangeError);
  });
});
