/**
 * The faces of a `mocker trace --sweep` comparison: one row per combination of swept values, as a table on
 * stdout, a JSON file holding every run's full report, and a self-contained HTML page with bar charts.
 */
import { CHART_HELPERS, escapeHtml, reportPage } from '../util/htmlPage.js';
import type { ReplayReport } from './collector.js';
import type { Slo } from './goodput.js';
import { boxTable, formatValue } from './report.js';

export type SweepValue = string | number | boolean | null;

/** A swept key and its values, in the order given. */
export interface SweepAxis {
  key: string;
  values: SweepValue[];
}

export interface SweepResult {
  /** The settings every run shares. */
  settings: Record<string, string | number | boolean>;
  slo: Slo | null;
  axes: SweepAxis[];
  /** One per combination, the first axis varying slowest. */
  runs: { values: Record<string, SweepValue>; report: ReplayReport }[];
}

type Unit = 'count' | 'number' | 'ratio';

/** The compared figures: column label, report key, unit. */
const FIGURES: ReadonlyArray<[label: string, key: string, unit: Unit]> = [
  ['completed', 'completed_requests', 'count'],
  ['output tok/s', 'output_throughput_tok_s', 'number'],
  ['req/s', 'request_throughput_rps', 'number'],
  ['TTFT p50 ms', 'median_ttft_ms', 'number'],
  ['TTFT p99 ms', 'p99_ttft_ms', 'number'],
  ['ITL p50 ms', 'median_itl_ms', 'number'],
  ['ITL p99 ms', 'p99_itl_ms', 'number'],
  ['prefix reuse', 'first_admission_prefix_cache_reused_ratio', 'ratio'],
];
const GOODPUT: ReadonlyArray<[label: string, key: string, unit: Unit]> = [
  ['goodput req/s', 'goodput_request_throughput_rps', 'number'],
  ['within SLO', 'goodput_request_fraction', 'ratio'],
];

const figuresOf = (result: SweepResult) => (result.slo === null ? FIGURES : [...FIGURES, ...GOODPUT]);

function cell(value: number | undefined, unit: Unit): string {
  if (value === undefined) return 'N/A';
  if (unit === 'count') return String(value);
  return unit === 'ratio' ? `${(value * 100).toFixed(1)} %` : formatValue(value);
}

/** The comparison table: the swept values, then the figures of each run. */
export function formatSweepTable(result: SweepResult): string {
  const figures = figuresOf(result);
  const keys = result.axes.map((a) => a.key);
  const rows = result.runs.map((run) => [...keys.map((k) => String(run.values[k])), ...figures.map(([, key, unit]) => cell(run.report[key], unit))]);
  return ['mocker trace --sweep', ...boxTable([...keys, ...figures.map(([label]) => label)], rows, keys.length)].join('\n');
}

/** The JSON file: the shared settings, the SLO, the axes, and every run's values with its full report. */
export function sweepJson(result: SweepResult): string {
  return `${JSON.stringify(result, null, 2)}\n`;
}

/** Bar charts of the page: one bar per run. */
const CHARTS: ReadonlyArray<[id: string, key: string, heading: string]> = [
  ['chart-output-throughput', 'output_throughput_tok_s', 'Output token throughput (tokens/s)'],
  ['chart-prefix-reuse', 'first_admission_prefix_cache_reused_ratio', 'Prefix cache reused ratio at first admission'],
  ['chart-ttft-p99', 'p99_ttft_ms', 'Time to first token, p99 (ms)'],
  ['chart-goodput', 'goodput_request_throughput_rps', 'Goodput (requests/s within the SLO)'],
];

const PAGE_SCRIPT = `
(function () {
  'use strict';
  var data = JSON.parse(document.getElementById('report-data').textContent);
${CHART_HELPERS}
  function bars(id, values, name) {
    var indices = values.map(function (_, i) { return i; });
    draw(id, {
      scales: { x: { time: false, range: [-0.5, values.length - 0.5] }, y: { range: function (u, min, max) { return [0, max > 0 ? max * 1.1 : 1]; } } },
      axes: [
        { label: 'run', splits: function () { return indices; }, values: function (u, splits) { return splits.map(function (i) { return String(i + 1); }); } },
        { label: name, size: fitTicks },
      ],
      series: [
        { label: 'run', value: function (u, i) { return i == null ? '-' : data.labels[i]; } },
        { label: name, stroke: color(0), fill: color(0), paths: uPlot.paths.bars({ size: [0.6, 80] }), points: { show: false } },
      ],
    }, [indices, values]);
  }
  data.charts.forEach(function (chart) { bars(chart.id, chart.values, chart.name); });
})();
`;

/** The self-contained comparison page: the table (runs numbered as the charts' bars) and a bar chart per figure. */
export function renderSweepHtml(result: SweepResult, title: string): string {
  const figures = figuresOf(result);
  const keys = result.axes.map((a) => a.key);
  const head = `<tr><th scope="col">run</th>${[...keys, ...figures.map(([label]) => label)].map((h) => `<th scope="col">${escapeHtml(h)}</th>`).join('')}</tr>`;
  const rows = result.runs.map((run, i) => {
    const values = keys.map((k) => `<td>${escapeHtml(String(run.values[k]))}</td>`);
    const cells = figures.map(([, key, unit]) => `<td data-key="${escapeHtml(key)}">${escapeHtml(cell(run.report[key], unit))}</td>`);
    return `<tr><th scope="row">${i + 1}</th>${values.join('')}${cells.join('')}</tr>`;
  });
  const settings = Object.entries(result.settings).map(
    ([key, value]) => `<tr><th scope="row">${escapeHtml(key)}</th><td>${escapeHtml(String(value))}</td></tr>`,
  );
  const charts = CHARTS.filter(([, key]) => result.runs.every((run) => key in run.report));
  const body = `<h1>${escapeHtml(title)}</h1>
<section><h2>Runs</h2><table class="sweep">${head}${rows.join('')}</table></section>
<section><h2>Shared settings</h2><table class="settings">${settings.join('')}</table></section>
<h2>Charts</h2>
<div class="charts">
${charts.map(([id, , heading]) => `<section class="chart" id="${id}"><h3>${escapeHtml(heading)}</h3><div class="plot"></div></section>`).join('\n')}
</div>`;
  const data = {
    labels: result.runs.map((run, i) => `${i + 1}: ${keys.map((k) => `${k}=${String(run.values[k])}`).join(' ')}`),
    charts: charts.map(([id, key, heading]) => ({ id, name: heading, values: result.runs.map((run) => run.report[key]) })),
  };
  return reportPage({ title, body, data, script: PAGE_SCRIPT });
}
