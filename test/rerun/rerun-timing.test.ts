/**
 * The timing comparison of `mocker rerun`: the shift's significance against SciPy's Mann–Whitney U test
 * (`scipy.stats.mannwhitneyu(x, y, alternative='two-sided', use_continuity=False, method='asymptotic')`, SciPy
 * 1.17.1: the tie-corrected normal approximation), and percentiles as engine-reference §8.8 defines them (the value
 * at sorted index round((n − 1)·p/100), the trace report's), worked out by hand.
 */
import { describe, expect, it } from 'vitest';
import { compareTiming } from '../../src/rerun/compare.js';

describe('rerun timing comparison', () => {
  it("gives Mann–Whitney's two-sided p-value as SciPy does, ties included, and calls p < 0.01 beyond noise", () => {
    const slower = compareTiming([12.1, 13.4, 11.8, 12.9, 14.2, 12.5, 13.0, 12.2], [14.9, 15.3, 13.9, 16.1, 15.0, 14.4, 15.8, 15.2]);
    expect(slower.pValue).toBeCloseTo(0.0011313264268228342, 12);
    expect(slower.beyondNoise).toBe(true);
    const tied = compareTiming([5, 5, 6, 6, 7, 7, 8, 8, 9], [5, 6, 6, 7, 7, 7, 8, 9, 9, 10]);
    expect(tied.pValue).toBeCloseTo(0.40542808442990497, 12);
    expect(tied.beyondNoise).toBe(false);
  });

  it('reports each side and the shift, with no test under two samples a side and p = 1 when every value ties', () => {
    const t = compareTiming([10, 20, 30, 40], [15, 25, 35, 45]);
    // Four values: p50 at index round(1.5) = 2, p90 at round(2.7) = 3, p99 at round(2.97) = 3.
    expect(t.golden).toEqual({ count: 4, p50: 30, p90: 40, p99: 40 });
    expect(t.candidate).toEqual({ count: 4, p50: 35, p90: 45, p99: 45 });
    expect(t.shift).toEqual({ p50: 5, p90: 5, p99: 5 });
    expect(t.cdf).toEqual({ golden: [10, 20, 30, 40], candidate: [15, 25, 35, 45] });
    expect(compareTiming([10], [12, 13]).pValue).toBeNull();
    expect(compareTiming([7, 7], [7, 7, 7]).pValue).toBe(1);
  });
});
