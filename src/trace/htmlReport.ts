/**
 * The self-contained HTML report of `mocker trace --report-html`: one page that opens without a network (the
 * uPlot chart library and its stylesheet are inlined, the run's data is embedded as JSON), with a summary of
 * the report's headline numbers, the run's settings, and charts of ReplayCharts.
 */
import { CHART_HELPERS, escapeHtml, reportPage } from '../util/htmlPage.js';
import { reuseByTurn, type ReplayCharts, type ReplayReport } from './collector.js';

export interface HtmlReportInput {
  title: string;
  report: ReplayReport;
  charts: ReplayCharts;
  settings: Record<string, string | number | boolean>;
}

type Unit = 'count' | 'ms' | 'rps' | 'tok/s' | 'ratio';

const SUMMARY: ReadonlyArray<[key: string, label: string, unit: Unit]> = [
  ['num_requests', 'Requests in trace', 'count'],
  ['completed_requests', 'Completed requests', 'count'],
  ['total_input_tokens', 'Input tokens', 'count'],
  ['total_output_tokens', 'Output tokens', 'count'],
  ['duration_ms', 'Duration (run clock)', 'ms'],
  ['wall_time_ms', 'Wall time', 'ms'],
  ['request_throughput_rps', 'Request throughput', 'rps'],
  ['output_throughput_tok_s', 'Output token throughput', 'tok/s'],
  ['total_throughput_tok_s', 'Total token throughput', 'tok/s'],
  ['prefix_cache_reused_ratio', 'Prefix cache reused ratio (most at any admission)', 'ratio'],
  ['first_admission_prefix_cache_reused_ratio', 'Prefix cache reused ratio at first admission', 'ratio'],
];

const LATENCIES: ReadonlyArray<[name: string, label: string]> = [
  ['ttft', 'Time to first token'],
  ['itl', 'Inter-token latency'],
  ['e2e_latency', 'End-to-end latency'],
];
const LATENCY_STATS = ['mean', 'median', 'p99'] as const;

/** Chart sections in page order; the page script fills each by its id. */
const CHARTS: ReadonlyArray<[id: string, heading: string]> = [
  ['chart-ttft', 'Time to first token (CDF)'],
  ['chart-itl', 'Inter-token latency (CDF)'],
  ['chart-e2e', 'End-to-end latency (CDF)'],
  ['chart-throughput', 'Output token throughput over time'],
  ['chart-in-flight', 'Requests in flight over time'],
  ['chart-kv-usage', 'KV cache usage per worker'],
  ['chart-prefix-hit-rate', 'Prefix cache hit rate per worker'],
  ['chart-requests-per-worker', 'Requests per worker'],
];

function format(value: number, unit: Unit): string {
  switch (unit) {
    case 'count':
      return String(Math.round(value));
    case 'ms':
      return `${value.toFixed(2)} ms`;
    case 'rps':
      return `${value.toFixed(2)} req/s`;
    case 'tok/s':
      return `${value.toFixed(2)} tok/s`;
    case 'ratio':
      return `${(value * 100).toFixed(1)} %`;
  }
}

/** A report value's cell; a key the report lacks shows a dash. */
function valueCell(report: ReplayReport, key: string, unit: Unit): string {
  return `<td data-key="${escapeHtml(key)}">${key in report ? escapeHtml(format(report[key], unit)) : '—'}</td>`;
}

function summaryTable(report: ReplayReport): string {
  const rows = SUMMARY.map(([key, label, unit]) => `<tr><th scope="row">${escapeHtml(label)}</th>${valueCell(report, key, unit)}</tr>`);
  return `<table class="summary">${rows.join('')}</table>`;
}

function latencyTable(report: ReplayReport): string {
  const head = `<tr><th></th>${LATENCY_STATS.map((stat) => `<th scope="col">${stat}</th>`).join('')}</tr>`;
  const rows = LATENCIES.map(([name, label]) => {
    const cells = LATENCY_STATS.map((stat) => valueCell(report, `${stat}_${name}_ms`, 'ms'));
    return `<tr><th scope="row">${escapeHtml(label)}</th>${cells.join('')}</tr>`;
  });
  return `<table class="latency">${head}${rows.join('')}</table>`;
}

/** Per worker: what its completed requests' prompts found in its cache, at first admission and at most. */
function reuseTable(workers: ReplayCharts['workers']): string {
  const ratio = (tokens: number, input: number) => (input > 0 ? format(tokens / input, 'ratio') : '—');
  const head = `<tr>${['worker', 'input tokens', 'reused at first admission', 'reused at most'].map((h) => `<th scope="col">${h}</th>`).join('')}</tr>`;
  const rows = workers.map(
    ({ name, reuse }) =>
      `<tr><th scope="row">${escapeHtml(name)}</th><td>${reuse.inputTokens}</td>` +
      `<td>${ratio(reuse.firstAdmissionReusedTokens, reuse.inputTokens)}</td><td>${ratio(reuse.reusedTokens, reuse.inputTokens)}</td></tr>`,
  );
  return `<table class="reuse">${head}${rows.join('')}</table>`;
}

/** Multi-turn and agentic workloads: sessions, their turns and latency, and the prefix reuse of each turn index. */
function sessionTables(report: ReplayReport): string {
  const row = (label: string, cells: string) => `<tr><th scope="row">${escapeHtml(label)}</th>${cells}</tr>`;
  const summary = [
    row('Sessions', valueCell(report, 'num_sessions', 'count')),
    row('Turns per session (mean)', `<td data-key="mean_turns_per_session">${escapeHtml(report.mean_turns_per_session.toFixed(2))}</td>`),
    row('Turns per session (max)', valueCell(report, 'max_turns_per_session', 'count')),
    ...(['mean', 'median', 'p90', 'p99'] as const).map((stat) => row(`Session latency (${stat})`, valueCell(report, `${stat}_session_latency_ms`, 'ms'))),
  ];
  const byTurn = reuseByTurn(report);
  const head = `<tr><th scope="col">turn</th>${byTurn.map(({ turn }) => `<th scope="col">${escapeHtml(turn)}</th>`).join('')}</tr>`;
  const ratios = `<tr><th scope="row">reused at first admission</th>${byTurn.map(({ ratio }) => `<td>${escapeHtml(format(ratio, 'ratio'))}</td>`).join('')}</tr>`;
  return `<table class="sessions">${summary.join('')}</table>${byTurn.length > 0 ? `<table class="reuse-by-turn">${head}${ratios}</table>` : ''}`;
}

function settingsTable(settings: HtmlReportInput['settings']): string {
  const rows = Object.entries(settings).map(([key, value]) => `<tr><th scope="row">${escapeHtml(key)}</th><td>${escapeHtml(String(value))}</td></tr>`);
  return rows.length > 0 ? `<table class="settings">${rows.join('')}</table>` : '<p>none</p>';
}

/** Draws every chart section from the embedded data; an empty series shows "no data" instead of a chart. */
const PAGE_SCRIPT = `
(function () {
  'use strict';
  var charts = JSON.parse(document.getElementById('report-data').textContent);
${CHART_HELPERS}
  function fromZero(u, min, max) { return [0, max > 0 ? max * 1.1 : 1]; }
  function cdf(id, sortedMs, name) {
    if (sortedMs.length === 0) return noData(id);
    var fractions = sortedMs.map(function (_, i) { return (i + 1) / sortedMs.length; });
    draw(id, {
      scales: { x: { time: false }, y: { range: [0, 1] } },
      axes: [{ label: name + ' (ms)' }, { label: 'fraction of requests', values: percent, size: fitTicks }],
      series: [{ label: name + ' (ms)' }, { label: 'fraction \\u2264 x', stroke: color(0), width: 2, paths: uPlot.paths.stepped({ align: 1 }) }],
    }, [sortedMs, fractions]);
  }
  function timeline(id, values, name) {
    var seconds = charts.timeline.timesMs.map(function (ms) { return ms / 1000; });
    // The timeline counts completed requests only: all zero means none completed.
    if (values.every(function (v) { return v === 0; })) return noData(id);
    draw(id, {
      scales: { x: { time: false }, y: { range: fromZero } },
      axes: [{ label: 'time (s)' }, { label: name, size: fitTicks }],
      series: [{ label: 'time (s)' }, { label: name, stroke: color(0), fill: 'hsla(210, 75%, 42%, 0.15)', width: 2, paths: uPlot.paths.stepped({ align: 1 }) }],
    }, [seconds, values]);
  }
  function perWorker(id, field, name) {
    var sampled = charts.workers.map(function (w, i) { return { worker: w, index: i }; })
      .filter(function (s) { return s.worker.timesMs.length > 0; });
    if (sampled.length === 0) return noData(id);
    var aligned = uPlot.join(sampled.map(function (s) {
      return [s.worker.timesMs.map(function (ms) { return ms / 1000; }), s.worker[field]];
    }));
    draw(id, {
      scales: { x: { time: false }, y: { range: [0, 1] } },
      axes: [{ label: 'time (s)' }, { label: name, values: percent, size: fitTicks }],
      series: [{ label: 'time (s)' }].concat(sampled.map(function (s) {
        return { label: s.worker.name, stroke: color(s.index), width: 2, spanGaps: true };
      })),
    }, aligned);
  }
  function requestsPerWorker(id) {
    var workers = charts.workers;
    if (workers.length === 0) return noData(id);
    var indices = workers.map(function (_, i) { return i; });
    var names = workers.map(function (w) { return w.name; });
    draw(id, {
      scales: { x: { time: false, range: [-0.5, workers.length - 0.5] }, y: { range: fromZero } },
      axes: [
        { label: 'worker', splits: function () { return indices; }, values: function (u, splits) { return splits.map(function (i) { return names[i]; }); } },
        { label: 'requests routed', size: fitTicks },
      ],
      series: [
        { label: 'worker', value: function (u, i) { return i == null ? '-' : names[i]; } },
        { label: 'requests', stroke: color(0), fill: color(0), paths: uPlot.paths.bars({ size: [0.6, 80] }), points: { show: false } },
      ],
    }, [indices, workers.map(function (w) { return w.requests; })]);
  }
  cdf('chart-ttft', charts.ttftMs, 'TTFT');
  cdf('chart-itl', charts.itlMs, 'ITL');
  cdf('chart-e2e', charts.e2eMs, 'end-to-end latency');
  timeline('chart-throughput', charts.timeline.outputTokensPerS, 'output tokens/s');
  timeline('chart-in-flight', charts.timeline.inFlight, 'requests in flight');
  perWorker('chart-kv-usage', 'kvUsage', 'KV cache usage');
  perWorker('chart-prefix-hit-rate', 'prefixHitRate', 'prefix cache hit rate');
  requestsPerWorker('chart-requests-per-worker');
})();
`;

export function renderHtmlReport(input: HtmlReportInput): string {
  const sections = CHARTS.map(([id, heading]) => `<section class="chart" id="${id}"><h3>${escapeHtml(heading)}</h3><div class="plot"></div></section>`);
  const body = `<h1>${escapeHtml(input.title)}</h1>
<div class="tables">
<section><h2>Summary</h2>${summaryTable(input.report)}</section>
<section><h2>Latency</h2>${latencyTable(input.report)}</section>
<section><h2>Prefix reuse per worker</h2>${reuseTable(input.charts.workers)}</section>
${'num_sessions' in input.report ? `<section><h2>Sessions</h2>${sessionTables(input.report)}</section>\n` : ''}<section><h2>Settings</h2>${settingsTable(input.settings)}</section>
</div>
<h2>Charts</h2>
<div class="charts">
${sections.join('\n')}
</div>`;
  return reportPage({ title: input.title, body, data: input.charts, script: PAGE_SCRIPT });
}
