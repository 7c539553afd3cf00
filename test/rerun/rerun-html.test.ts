import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { rerunHtml } from '../../src/rerun/htmlReport.js';
import type { ExchangeComparison, PromptComparison, RerunReport } from '../../src/rerun/report.js';
import { reportPages } from '../support/chromiumPage.js';
import { sampleReport, TEMPLATE_CHANGE } from '../support/rerunReports.js';

/** The hostile request's markup, as a reader must see it (HOSTILE's start). */
const HOSTILE_MARKUP = '</script><img src=x onerror="window.pwned=1">]]>&amp;';

interface ChartState {
  id: string;
  canvases: number;
  /** Opaque, strongly coloured canvas pixels: the series (axes and grid are grey). */
  coloredPixels: number;
  legend: string;
  noData: boolean;
}

// Strings, not functions: the test project has no DOM types.
const READ_CHARTS = `[...document.querySelectorAll('section.chart')].map((section) => {
  const canvases = section.querySelectorAll('canvas');
  let coloredPixels = 0;
  if (canvases[0]) {
    const { data } = canvases[0].getContext('2d').getImageData(0, 0, canvases[0].width, canvases[0].height);
    for (let i = 0; i < data.length; i += 4) {
      if (data[i + 3] > 200 && Math.max(data[i], data[i + 1], data[i + 2]) - Math.min(data[i], data[i + 1], data[i + 2]) > 80) coloredPixels++;
    }
  }
  const legend = section.querySelector('.u-legend');
  return { id: section.id, canvases: canvases.length, coloredPixels, legend: legend ? legend.textContent : '', noData: section.querySelector('.no-data') !== null };
})`;

/** Of a PNG (base64), decoded by the browser: the share of pixels that are not white and how many colours there are. */
const IMAGE_STATS = (png: string) => `new Promise((resolve, reject) => {
  const image = new Image();
  image.onerror = () => reject(new Error('the screenshot does not decode'));
  image.onload = () => {
    const canvas = document.createElement('canvas');
    canvas.width = image.width;
    canvas.height = image.height;
    const context = canvas.getContext('2d');
    context.drawImage(image, 0, 0);
    const { data } = context.getImageData(0, 0, image.width, image.height);
    const colours = new Set();
    let notWhite = 0;
    for (let i = 0; i < data.length; i += 4) {
      if (data[i] < 240 || data[i + 1] < 240 || data[i + 2] < 240) notWhite++;
      colours.add((data[i] << 16) | (data[i + 1] << 8) | data[i + 2]);
    }
    resolve({ width: image.width, height: image.height, notWhiteShare: notWhite / (data.length / 4), colours: colours.size });
  };
  image.src = 'data:image/png;base64,${png}';
})`;

const cellTexts = (selector: string) =>
  `[...document.querySelectorAll(${JSON.stringify(selector)})].map((row) => [...row.querySelectorAll('td')].map((cell) => cell.textContent))`;

describe('HTML report of mocker rerun', () => {
  const pages = reportPages('rerun-html-');
  const open = pages.open;

  afterAll(() => pages.close());

  it('renders the verdict, tables, side by side differences and CDF charts offline, hostile text as text', async () => {
    const { page, errors, offFileRequests } = await open('report', rerunHtml(sampleReport()));

    expect(await page.locator('#verdict').getAttribute('class')).toBe('banner regression');
    expect(await page.locator('#verdict').textContent()).toBe('Regression: 2 of 5 exchanges compared');
    const totals = ['compared', 'same', 'regressions', 'sampled', 'notCompared', 'promptChanges', 'outputChanges'];
    expect(await Promise.all(totals.map((key) => page.locator(`table.totals td[data-key="${key}"]`).textContent()))).toEqual([
      '5',
      '1',
      '2',
      '1',
      '1',
      '1',
      '3',
    ]);
    expect(await page.locator('table.run').textContent()).toContain('Target version0.11.0');
    expect(await page.locator('table.run').textContent()).toContain(`http://127.0.0.1:8000/${HOSTILE_MARKUP}`);
    expect(await page.evaluate(`[...document.querySelectorAll('table.not-sent tr')].map((row) => row.textContent)`)).toEqual(['failed2', 'bodies redacted1']);

    // e2e golden 40 50 60 80 90 (p50 60, p90 90), candidate 55 62.5 250 1500 1600 (p50 250, p90 1600).
    const timing = async (key: string) => page.locator(`table.timing td[data-key="${key}"]`).textContent();
    expect(await timing('e2eMs.golden.p50')).toBe('60.00');
    expect(await timing('e2eMs.candidate.p90')).toBe('1600.00');
    expect(await timing('e2eMs.shift.p50')).toBe('+190.00');
    expect(await timing('e2eMs.shift.p90')).toBe('+1510.00');
    expect(await timing('e2eMs.pValue')).toBe('0.0300');
    expect(await timing('e2eMs.beyondNoise')).toBe('yes');
    expect(await timing('ttftMs.pValue')).toBe('0.420');
    expect(await timing('ttftMs.beyondNoise')).toBe('no');
    expect(await timing('itlMs.golden.count')).toBe('6');

    // Regressions first (1 and 5), then the sampled one (2), the one not compared (3), the same one (4).
    const rows: string[][] = await page.evaluate(cellTexts('table.exchanges tr'));
    expect(rows.slice(1).map((row) => [row[0], row[1], row[3]])).toEqual([
      ['1', 'chat', 'regression'],
      ['5', 'chat', 'regression'],
      ['2', 'completion', 'sampled'],
      ['3', 'embeddings', 'not-compared'],
      ['4', 'chat', 'same'],
    ]);
    expect(rows[1][2]).toContain(HOSTILE_MARKUP);
    expect(rows[5][4]).toBe('—');
    expect(await page.evaluate(`[...document.querySelectorAll('section.exchange')].map((section) => section.id)`)).toEqual([
      'exchange-1',
      'exchange-5',
      'exchange-2',
      'exchange-3',
    ]);

    // The template change: the highlight starts at the role, on both sides.
    const difference = TEMPLATE_CHANGE.difference!;
    expect(await page.locator('#exchange-1 .candidate mark.first-difference').textContent()).toBe(difference.candidateText);
    expect(await page.locator('#exchange-1 .golden mark.first-difference').textContent()).toBe(difference.goldenText);
    expect(await page.locator('#exchange-1 .candidate pre.prompt').textContent()).toBe(TEMPLATE_CHANGE.candidateText);
    expect(await page.locator('#exchange-1 .part').textContent()).toBe('message 1 (user)');
    expect(await page.locator('#exchange-1 .not-located').count()).toBe(0);
    expect(await page.locator('#exchange-1 .candidate pre.text').textContent()).toContain(`Hey ${HOSTILE_MARKUP}`);
    expect(await page.locator('#exchange-1 .golden pre.reasoning').textContent()).toBe('The user greets.');
    const request = JSON.parse((await page.locator('#exchange-1 pre.request').textContent()) ?? '');
    expect(request.messages[1].content).toContain(`Say hi & ${HOSTILE_MARKUP}`);
    expect(await page.locator('#exchange-2 .prompt-same').textContent()).toBe('Prompts identical (golden 5 tokens, candidate 5 tokens).');
    expect(JSON.parse((await page.locator('#exchange-5 .candidate pre.tool-calls').textContent()) ?? '')).toEqual([
      { name: 'get_weather', arguments: { city: 'paris' } },
    ]);
    expect(await page.evaluate(cellTexts('#exchange-5 table.differences tr'))).toEqual([[], ['tool_calls', '0', '—', '{"city":"Paris"}', '{"city":"paris"}']]);
    expect(await page.locator('#exchange-3 .note').textContent()).toContain('the target answered 404: model </script><img');

    const charts: ChartState[] = await page.evaluate(READ_CHARTS);
    expect(charts.map((chart) => chart.id)).toEqual(['chart-ttft', 'chart-itl', 'chart-e2e']);
    for (const chart of charts) {
      expect(chart, chart.id).toMatchObject({ canvases: 1, noData: false });
      expect(chart.coloredPixels, chart.id).toBeGreaterThan(50);
      expect(chart.legend, chart.id).toMatch(/golden.*candidate/);
    }

    // The hostile markup stayed text: no image element, its handler never ran.
    expect(await page.locator('img').count()).toBe(0);
    expect(await page.evaluate('window.pwned')).toBeUndefined();

    const screenshot = join(pages.dir, 'report.png');
    await page.screenshot({ path: screenshot, fullPage: true });
    const stats = (await page.evaluate(IMAGE_STATS(readFileSync(screenshot).toString('base64')))) as {
      width: number;
      height: number;
      notWhiteShare: number;
      colours: number;
    };
    expect(stats.width).toBe(1200);
    expect(stats.height).toBeGreaterThan(900);
    expect(stats.notWhiteShare).toBeGreaterThan(0.02);
    expect(stats.colours).toBeGreaterThan(100);

    expect(errors).toEqual([]);
    expect(offFileRequests).toEqual([]);
    await page.close();
  });

  it('caps the sections and table rows of a large report, and shows "no data" for an empty timing series', async () => {
    const sample = sampleReport();
    const regression = sample.exchanges[0];
    const same = sample.exchanges[3];
    const exchanges: ExchangeComparison[] = [
      ...Array.from({ length: 2100 }, (_, i) => ({ ...same, golden: 1000 + i })),
      ...Array.from({ length: 250 }, (_, i) => ({ ...regression, golden: 10 + i })),
    ];
    const report: RerunReport = { ...sample, exchanges, timing: { ...sample.timing, itlMs: { ...sample.timing.itlMs, cdf: { golden: [], candidate: [] } } } };
    const { page, errors, offFileRequests } = await open('large', rerunHtml(report));

    expect(await page.locator('section.exchange').count()).toBe(200);
    expect(await page.locator('section.exchange').first().getAttribute('id')).toBe('exchange-10');
    expect(await page.locator('section.exchange').last().getAttribute('id')).toBe('exchange-209');
    expect(await page.locator('p.more').allTextContents()).toEqual([
      '… and 350 more exchanges',
      '… and 50 more exchanges that are not the same, not shown here',
    ]);
    expect(await page.locator('table.exchanges tr').count()).toBe(2001);
    // The rows of the regressions come first, each linked to its section while one is shown.
    expect(await page.locator('table.exchanges tr.regression').count()).toBe(250);
    expect(await page.locator('table.exchanges tr.regression a').count()).toBe(200);

    const charts: ChartState[] = await page.evaluate(READ_CHARTS);
    expect(charts.map((chart) => [chart.id, chart.canvases, chart.noData])).toEqual([
      ['chart-ttft', 1, false],
      ['chart-itl', 0, true],
      ['chart-e2e', 1, false],
    ]);
    expect(errors).toEqual([]);
    expect(offFileRequests).toEqual([]);
    await page.close();
  });

  it('says so when nothing regressed', async () => {
    const sample = sampleReport();
    const report: RerunReport = {
      ...sample,
      exchanges: [sample.exchanges[3]],
      totals: { compared: 1, same: 1, regressions: 0, sampled: 0, notCompared: 0, promptChanges: 0, outputChanges: 0 },
      skipped: [],
      targetVersion: null,
      regression: false,
    };
    const { page, errors } = await open('pass', rerunHtml(report));
    expect(await page.locator('#verdict').getAttribute('class')).toBe('banner pass');
    expect(await page.locator('#verdict').textContent()).toBe('No regression: 1 exchanges compared');
    expect(await page.locator('section.exchange').count()).toBe(0);
    expect(await page.locator('p.not-sent').textContent()).toBe('none');
    expect(await page.locator('table.run').textContent()).toContain('Target versionunknown');
    expect(errors).toEqual([]);
    await page.close();
  });
});

describe('HTML report of mocker rerun, as text', () => {
  it('escapes untrusted text and embeds only the timing data, with no "<" in it', () => {
    const report = sampleReport();
    const html = rerunHtml(report);
    expect(html).not.toContain('<img');
    expect(html).toContain('&lt;/script&gt;&lt;img src=x onerror=&quot;window.pwned=1&quot;&gt;]]&gt;&amp;amp;');
    // uPlot, the data and the page script: three elements, each closed once.
    expect(html.match(/<script/g)).toHaveLength(3);
    expect(html.match(/<\/script/g)).toHaveLength(3);
    const data = /<script type="application\/json" id="report-data">([\s\S]*?)<\/script>/.exec(html)?.[1] ?? '';
    expect(data).not.toContain('<');
    expect(JSON.parse(data)).toEqual([
      { id: 'chart-ttft', name: 'Time to first token', ...report.timing.ttftMs.cdf },
      { id: 'chart-itl', name: 'Inter-token latency', ...report.timing.itlMs.cdf },
      { id: 'chart-e2e', name: 'End-to-end latency', ...report.timing.e2eMs.cdf },
    ]);
  });

  it('prints a shift that rounds to zero as 0.00, without a sign, as the golden and candidate figures', () => {
    const report = sampleReport();
    report.timing.ttftMs = { ...report.timing.ttftMs, shift: { p50: 0, p90: -0.001, p99: 0.004 } };
    const html = rerunHtml(report);
    const cell = (key: string) => new RegExp(`data-key="${key.replaceAll('.', '\\.')}">([^<]*)<`).exec(html)?.[1];
    expect([cell('ttftMs.shift.p50'), cell('ttftMs.shift.p90'), cell('ttftMs.shift.p99')]).toEqual(['0.00', '0.00', '0.00']);
    // Away from zero the sign stays (the sample's e2e p50 shift: 250 - 60).
    expect(cell('e2eMs.shift.p50')).toBe('+190.00');
  });

  it('marks the first difference at its offset on each side, and nothing when the prompts were cut before it', () => {
    const exchange = sampleReport().exchanges[0];
    const marked = (prompt: PromptComparison) =>
      [...rerunHtml({ ...sampleReport(), exchanges: [{ ...exchange, prompt }] }).matchAll(/<mark class="first-difference">([^<]*)<\/mark>/g)].map((m) => m[1]);
    // Each side's differing token, from the offset on: `user` in the golden prompt, `human` in the candidate's.
    expect(marked(TEMPLATE_CHANGE)).toEqual(['user\nSay hi &amp;', 'human\nSay hi &amp;']);
    const cut: PromptComparison = {
      ...TEMPLATE_CHANGE,
      goldenText: TEMPLATE_CHANGE.goldenText.slice(0, 40),
      candidateText: TEMPLATE_CHANGE.candidateText.slice(0, 40),
    };
    expect(marked(cut)).toEqual([]);
    expect(rerunHtml({ ...sampleReport(), exchanges: [{ ...exchange, prompt: cut }] })).toContain('cut before their first difference');
  });
});
