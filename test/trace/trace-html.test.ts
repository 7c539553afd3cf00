import { statSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ReplayCollector } from '../../src/trace/collector.js';
import { renderHtmlReport } from '../../src/trace/htmlReport.js';
import { reportPages } from '../support/chromiumPage.js';

/** Text that would end the data <script> or add markup if the page inserted it unescaped. */
const HOSTILE = '</script><b>x';

const CHART_IDS = [
  'chart-ttft',
  'chart-itl',
  'chart-e2e',
  'chart-throughput',
  'chart-in-flight',
  'chart-kv-usage',
  'chart-prefix-hit-rate',
  'chart-requests-per-worker',
];

interface ChartState {
  id: string;
  canvases: number;
  width: number;
  height: number;
  /** Opaque, strongly coloured canvas pixels: the series (axes and grid are grey). */
  coloredPixels: number;
  noData: boolean;
}

// A string, not a function: the test project has no DOM types.
const READ_CHARTS = `[...document.querySelectorAll('section.chart')].map((section) => {
  const canvases = section.querySelectorAll('canvas');
  const canvas = canvases[0];
  let coloredPixels = 0;
  if (canvas) {
    const { data } = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height);
    for (let i = 0; i < data.length; i += 4) {
      if (data[i + 3] > 200 && Math.max(data[i], data[i + 1], data[i + 2]) - Math.min(data[i], data[i + 1], data[i + 2]) > 80) coloredPixels++;
    }
  }
  return { id: section.id, canvases: canvases.length, width: canvas ? canvas.width : 0, height: canvas ? canvas.height : 0, coloredPixels, noData: section.querySelector('.no-data') !== null };
})`;

describe('HTML report of mocker trace', () => {
  const pages = reportPages('trace-html-');
  const open = pages.open;

  afterAll(() => pages.close());

  it('draws every chart offline, shows the summary, and keeps hostile names as text', async () => {
    const collector = new ReplayCollector(['worker-a', HOSTILE]);
    collector.onArrival('r1', 0, 32, 3);
    collector.onArrival('r2', 5, 32, 2);
    collector.onArrival('r3', 10, 32, 4);
    collector.onArrival('r4', 15, 32, 2);
    collector.onRouted('r1', 0);
    collector.onRouted('r2', 1);
    collector.onRouted('r3', 0);
    collector.onRouted('r4', 1);
    collector.onAdmit('r1', 0, 0);
    collector.onAdmit('r2', 5, 16);
    collector.onAdmit('r3', 12, 16);
    for (const t of [10, 20, 30]) collector.onTokens('r1', t);
    for (const t of [25, 35]) collector.onTokens('r2', t);
    for (const t of [40, 45, 50, 60]) collector.onTokens('r3', t);
    for (const [step, t] of [0, 10, 20, 30, 40, 50, 60].entries()) {
      collector.onPass(0, t, () => ({ activeBlocks: step, totalBlocks: 8, prefixCacheQueries: 32 * (step + 1), prefixCacheHits: 8 * step }), 0);
    }
    for (const [step, t] of [5, 15, 25, 35].entries()) {
      collector.onPass(1, t, () => ({ activeBlocks: 4 - step, totalBlocks: 8, prefixCacheQueries: 32 * (step + 1), prefixCacheHits: 16 * step }), 0);
    }
    const title = `mocker trace: ${HOSTILE}`;
    const html = renderHtmlReport({
      title,
      report: collector.report(123),
      charts: collector.charts(),
      settings: { model: HOSTILE, num_workers: 2, enable_prefix_caching: true },
    });

    const { page, errors, offFileRequests } = await open('report', html);
    const charts: ChartState[] = await page.evaluate(READ_CHARTS);
    expect(charts.map((chart) => chart.id)).toEqual(CHART_IDS);
    for (const chart of charts) {
      expect(chart, chart.id).toMatchObject({ canvases: 1, noData: false });
      expect(chart.width, chart.id).toBeGreaterThan(0);
      expect(chart.height, chart.id).toBeGreaterThan(0);
      expect(chart.coloredPixels, chart.id).toBeGreaterThan(50);
    }

    // r1, r2 and r3 have tokens; r4 never was admitted. TTFTs 10, 20 and 30 ms.
    expect(await page.locator('td[data-key="completed_requests"]').textContent()).toBe('3');
    expect(await page.locator('td[data-key="num_requests"]').textContent()).toBe('4');
    expect(await page.locator('td[data-key="mean_ttft_ms"]').textContent()).toBe('20.00 ms');

    expect(await page.title()).toBe(title);
    expect(await page.locator('h1').textContent()).toBe(title);
    expect(await page.locator('table.settings').textContent()).toContain(`model${HOSTILE}`);
    expect(await page.locator('#chart-kv-usage').textContent()).toContain(HOSTILE);
    expect(await page.locator('b').count()).toBe(0);

    const screenshot = join(pages.dir, 'report.png');
    await page.screenshot({ path: screenshot, fullPage: true });
    expect(statSync(screenshot).size).toBeGreaterThan(0);

    expect(errors).toEqual([]);
    expect(offFileRequests).toEqual([]);
    await page.close();
  });

  it('shows "no data" for an empty series and still draws the others', async () => {
    // Every request has one output token: no inter-token gaps, so no ITL values.
    const collector = new ReplayCollector(['worker-a', 'worker-b']);
    collector.onArrival('r1', 0, 16, 1);
    collector.onArrival('r2', 4, 16, 1);
    collector.onRouted('r1', 0);
    collector.onRouted('r2', 1);
    collector.onAdmit('r1', 0, 0);
    collector.onAdmit('r2', 4, 0);
    collector.onTokens('r1', 12);
    collector.onTokens('r2', 20);
    collector.onPass(0, 0, () => ({ activeBlocks: 1, totalBlocks: 4, prefixCacheQueries: 16, prefixCacheHits: 0 }), 0);
    collector.onPass(1, 4, () => ({ activeBlocks: 1, totalBlocks: 4, prefixCacheQueries: 16, prefixCacheHits: 0 }), 0);
    const html = renderHtmlReport({ title: 'single-token run', report: collector.report(30), charts: collector.charts(), settings: {} });

    const { page, errors, offFileRequests } = await open('single-token', html);
    const charts: ChartState[] = await page.evaluate(READ_CHARTS);
    const itl = charts.find((chart) => chart.id === 'chart-itl');
    expect(itl).toMatchObject({ canvases: 0, noData: true });
    expect(await page.locator('#chart-itl .no-data').textContent()).toBe('no data');
    for (const chart of charts.filter((c) => c.id !== 'chart-itl')) {
      expect(chart, chart.id).toMatchObject({ canvases: 1, noData: false });
      expect(chart.coloredPixels, chart.id).toBeGreaterThan(0);
    }
    expect(await page.locator('td[data-key="completed_requests"]').textContent()).toBe('2');
    expect(errors).toEqual([]);
    expect(offFileRequests).toEqual([]);
    await page.close();
  });
});
