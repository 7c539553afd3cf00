/**
 * The self-contained HTML page of `mocker captures fit --validate --report-html`: the errors table, the fitted
 * forms, and per metric a chart of each held-out request as the capture saw it and as the fitted simulator gives it.
 */
import { CHART_HELPERS, escapeHtml, reportPage } from '../util/htmlPage.js';
import { formatFitReport } from './fit.js';
import { METRIC_LABELS, METRICS, type Validation } from './validate.js';

const percent = (value: number | null, signed = false) =>
  value === null || Number.isNaN(value) ? '—' : `${signed && value >= 0 ? '+' : ''}${(value * 100).toFixed(1)} %`;

function errorsTable(v: Validation): string {
  const head = ['metric', 'requests', 'captured p50', 'simulated p50', 'median error', 'MAPE', 'noise'].map((h) => `<th scope="col">${h}</th>`).join('');
  const rows = METRICS.map((metric) => {
    const m = v.metrics[metric];
    const cells = [
      String(m.requests),
      `${m.capturedMedianMs.toFixed(2)} ms`,
      `${m.simulatedMedianMs.toFixed(2)} ms`,
      percent(m.medianError, true),
      percent(m.mape),
      percent(m.noise),
    ];
    return `<tr data-metric="${metric}"><th scope="row">${METRIC_LABELS[metric]}</th>${cells.map((c) => `<td>${escapeHtml(c)}</td>`).join('')}</tr>`;
  });
  return `<table class="errors"><tr>${head}</tr>${rows.join('')}</table>`;
}

/** One chart per metric: x the request's send time, the captured and the simulated value. */
const PAGE_SCRIPT = `
(function () {
  'use strict';
  var data = JSON.parse(document.getElementById('report-data').textContent);
${CHART_HELPERS}
  function compare(id, metric, name) {
    var rows = data.requests.filter(function (r) { return r.captured[metric] !== null; });
    if (rows.length === 0) return noData(id);
    var seconds = rows.map(function (r) { return r.sentMs / 1000; });
    var dots = { show: true, size: 6 };
    draw(id, {
      scales: { x: { time: false } },
      axes: [{ label: 'sent (s)' }, { label: name + ' (ms)', size: fitTicks }],
      series: [
        { label: 'sent (s)' },
        { label: 'captured', stroke: color(0), width: 0, points: dots },
        { label: 'simulated', stroke: color(1), width: 0, points: dots },
      ],
    }, [seconds, rows.map(function (r) { return r.captured[metric]; }), rows.map(function (r) { return r.simulated[metric]; })]);
  }
${METRICS.map((metric) => `  compare('chart-${metric}', '${metric}', '${METRIC_LABELS[metric]}');`).join('\n')}
})();
`;

export function validationHtml(v: Validation, title: string): string {
  const charts = METRICS.map(
    (metric) =>
      `<section class="chart" id="chart-${metric}"><h3>${METRIC_LABELS[metric]} per held-out request: captured and simulated</h3><div class="plot"></div></section>`,
  );
  const body = `<h1>${escapeHtml(title)}</h1>
<p>${escapeHtml(v.split)}. Noise: the MAPE a perfect model scores against the capture's own step jitter (${percent(v.stepJitter)}).</p>
<section><h2>Errors per request</h2>${errorsTable(v)}</section>
<h2>Charts</h2>
<div class="charts">
${charts.join('\n')}
</div>
<section><h2>The fitted perf model</h2><pre>${escapeHtml(formatFitReport(v.fit, null))}</pre></section>
${v.notes.length > 0 ? `<ul>${v.notes.map((n) => `<li>${escapeHtml(n)}</li>`).join('')}</ul>` : ''}`;
  return reportPage({ title, body, data: { requests: v.requests }, script: PAGE_SCRIPT });
}
