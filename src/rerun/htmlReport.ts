/**
 * The HTML view of a rerun report (`mocker rerun --report-html FILE`): one self-contained page (uPlot inlined, the
 * timing data embedded as JSON, no network) with the verdict, the totals, the timing comparison with CDF charts,
 * a table of the exchanges (regressions first), and, side by side, the request, both prompts with their first
 * difference marked and both outputs of every exchange that is not the same (up to SECTION_LIMIT of them).
 */
import { CHART_HELPERS, escapeHtml, reportPage } from '../util/htmlPage.js';
import { formatMs, formatSignedMs } from '../captures/pairing.js';
import type { ChoiceOutput, ExchangeComparison, ExchangeTiming, OutputDifference, PromptComparison, RerunReport, TimingComparison, Verdict } from './report.js';

/** Exchanges shown side by side, and rows of the exchange table: a report of 100,000 exchanges stays openable. */
const SECTION_LIMIT = 200;
const TABLE_LIMIT = 2000;

const VERDICT_ORDER: Record<Verdict, number> = { regression: 0, sampled: 1, 'not-compared': 2, same: 3 };

const TOTALS: ReadonlyArray<[key: keyof RerunReport['totals'], label: string]> = [
  ['compared', 'Exchanges compared'],
  ['same', 'Same'],
  ['regressions', 'Regressions'],
  ['sampled', 'Sampled outputs that differ (not failed)'],
  ['notCompared', 'Not compared'],
  ['promptChanges', 'Prompt changes'],
  ['outputChanges', 'Output changes'],
];

const TIMINGS: ReadonlyArray<[key: keyof RerunReport['timing'], label: string, chartId: string]> = [
  ['ttftMs', 'Time to first token', 'chart-ttft'],
  ['itlMs', 'Inter-token latency', 'chart-itl'],
  ['e2eMs', 'End-to-end latency', 'chart-e2e'],
];
const PERCENTILES = ['p50', 'p90', 'p99'] as const;

const ms = (value: number) => `${value.toFixed(2)} ms`;
const orDash = (text: string | null | undefined) => escapeHtml(text ?? '—');

function exchangeId(exchange: ExchangeComparison): string {
  return `exchange-${exchange.golden}`;
}

function banner(report: RerunReport): string {
  const { regressions, compared } = report.totals;
  return report.regression
    ? `<p id="verdict" class="banner regression">Regression: ${regressions} of ${compared} exchanges compared</p>`
    : `<p id="verdict" class="banner pass">No regression: ${compared} exchanges compared</p>`;
}

function totalsTable(report: RerunReport): string {
  const rows = TOTALS.map(([key, label]) => `<tr><th scope="row">${escapeHtml(label)}</th><td data-key="${key}">${report.totals[key]}</td></tr>`);
  return `<table class="totals">${rows.join('')}</table>`;
}

function runTable(report: RerunReport): string {
  const rows: [string, string][] = [
    ['Golden capture', report.golden],
    ['Rerun capture', report.candidate],
    ['Target', report.target],
    ['Target engine', report.targetEngine],
    ['Target version', report.targetVersion ?? 'unknown'],
    ['Significance level', String(report.alpha)],
  ];
  return `<table class="run">${rows.map(([label, value]) => `<tr><th scope="row">${escapeHtml(label)}</th><td>${escapeHtml(value)}</td></tr>`).join('')}</table>`;
}

function notSentTable(report: RerunReport): string {
  if (report.skipped.length === 0) return '<p class="not-sent">none</p>';
  const rows = report.skipped.map(({ reason, count }) => `<tr><th scope="row">${escapeHtml(reason)}</th><td>${count}</td></tr>`);
  return `<table class="not-sent">${rows.join('')}</table>`;
}

function timingTable(report: RerunReport): string {
  const head =
    '<tr><th rowspan="2"></th><th colspan="2">samples</th><th colspan="3">golden (ms)</th><th colspan="3">candidate (ms)</th><th colspan="3">shift (ms)</th><th rowspan="2">p-value</th><th rowspan="2">beyond noise</th></tr>' +
    `<tr><th>golden</th><th>candidate</th>${[0, 1, 2].map(() => PERCENTILES.map((p) => `<th>${p}</th>`).join('')).join('')}</tr>`;
  const rows = TIMINGS.map(([key, label]) => {
    const t: TimingComparison = report.timing[key];
    const cell = (name: string, text: string) => `<td data-key="${key}.${name}">${escapeHtml(text)}</td>`;
    const cells = [
      cell('golden.count', String(t.golden.count)),
      cell('candidate.count', String(t.candidate.count)),
      ...PERCENTILES.map((p) => cell(`golden.${p}`, formatMs(t.golden[p]))),
      ...PERCENTILES.map((p) => cell(`candidate.${p}`, formatMs(t.candidate[p]))),
      ...PERCENTILES.map((p) => cell(`shift.${p}`, formatSignedMs(t.shift[p]))),
      cell('pValue', t.pValue === null ? '—' : t.pValue.toPrecision(3)),
      cell('beyondNoise', t.beyondNoise ? 'yes' : 'no'),
    ];
    return `<tr class="${t.beyondNoise ? 'beyond-noise' : ''}"><th scope="row">${escapeHtml(label)}</th>${cells.join('')}</tr>`;
  });
  return `<table class="timing">${head}${rows.join('')}</table>`;
}

function exchangeTable(sorted: ExchangeComparison[], withSection: Set<ExchangeComparison>): string {
  const head = '<tr><th>golden id</th><th>endpoint</th><th>model</th><th>verdict</th><th>note</th></tr>';
  const rows = sorted.slice(0, TABLE_LIMIT).map((exchange) => {
    const id = withSection.has(exchange) ? `<a href="#${exchangeId(exchange)}">${exchange.golden}</a>` : String(exchange.golden);
    return `<tr class="${exchange.verdict}"><td>${id}</td><td>${escapeHtml(exchange.endpoint)}</td><td>${orDash(exchange.model)}</td><td class="verdict">${exchange.verdict}</td><td>${orDash(exchange.note)}</td></tr>`;
  });
  const more = sorted.length > TABLE_LIMIT ? `<p class="more">… and ${sorted.length - TABLE_LIMIT} more exchanges</p>` : '';
  return `<table class="exchanges">${head}${rows.join('')}</table>${more}`;
}

/**
 * One side's whole prompt with the first differing token's text marked from `offset` (nothing marked when the
 * text was cut before it).
 */
function promptText(text: string, offset: number, excerpt: string): string {
  if (offset > text.length) return escapeHtml(text);
  const end = offset + Math.max(1, excerpt.length);
  return `${escapeHtml(text.slice(0, offset))}<mark class="first-difference">${escapeHtml(text.slice(offset, end))}</mark>${escapeHtml(text.slice(end))}`;
}

function sideBySide(title: string, golden: string, candidate: string): string {
  return `<div class="side-by-side"><div class="golden"><h5>Golden ${title}</h5>${golden}</div><div class="candidate"><h5>Candidate ${title}</h5>${candidate}</div></div>`;
}

function promptSection(prompt: PromptComparison): string {
  const lengths = `golden ${prompt.goldenLength} tokens, candidate ${prompt.candidateLength} tokens`;
  const unobserved = prompt.observed
    ? ''
    : '<p class="unobserved">These token ids were rendered and tokenized by mocker, not reported by the engines: they say nothing of the target\'s own preprocessing.</p>';
  const difference = prompt.difference;
  if (difference === null) return `<h4>Prompt</h4><p class="prompt-same">Prompts identical (${lengths}).</p>${unobserved}`;
  const token = (id: number | null) => (id === null ? 'none' : String(id));
  const located =
    difference.goldenOffset > prompt.goldenText.length
      ? '<p class="not-located">The prompts were cut before their first difference: nothing is highlighted.</p>'
      : '';
  const summary =
    `<p class="prompt-difference">First difference at token <b>${difference.position}</b>, in the <b class="part">${escapeHtml(difference.partLabel)}</b> ` +
    `(golden token ${token(difference.goldenToken)}, candidate token ${token(difference.candidateToken)}; ${lengths}).</p>`;
  const golden = `<pre class="prompt">${promptText(prompt.goldenText, difference.goldenOffset, difference.goldenText)}</pre>`;
  const candidate = `<pre class="prompt">${promptText(prompt.candidateText, difference.candidateOffset, difference.candidateText)}</pre>`;
  return `<h4>Prompt</h4>${summary}${unobserved}${located}${sideBySide('prompt', golden, candidate)}`;
}

function choiceHtml(choice: ChoiceOutput): string {
  const facts: [string, string][] = [
    ['finish reason', choice.finishReason ?? '—'],
    ['stop reason', choice.stopReason === null ? '—' : String(choice.stopReason)],
    ['token ids', choice.tokenIds === null ? 'not available' : String(choice.tokenIds.length)],
  ];
  const parts = [
    `<h6>choice ${choice.index}</h6>`,
    `<dl>${facts.map(([term, value]) => `<dt>${term}</dt><dd>${escapeHtml(value)}</dd>`).join('')}</dl>`,
    `<pre class="text">${escapeHtml(choice.text)}</pre>`,
    choice.reasoning === null ? '' : `<p>reasoning</p><pre class="reasoning">${escapeHtml(choice.reasoning)}</pre>`,
    choice.toolCalls.length === 0 ? '' : `<p>tool calls</p><pre class="tool-calls">${escapeHtml(JSON.stringify(choice.toolCalls, null, 2))}</pre>`,
  ];
  return `<div class="choice">${parts.join('')}</div>`;
}

function choices(list: ChoiceOutput[]): string {
  return list.length === 0 ? '<p>no choices</p>' : list.map(choiceHtml).join('');
}

function differencesTable(differences: OutputDifference[]): string {
  if (differences.length === 0) return '<p>No output difference.</p>';
  const head = '<tr><th>field</th><th>choice</th><th>position</th><th>golden</th><th>candidate</th></tr>';
  const rows = differences.map(
    (d) =>
      `<tr><td>${escapeHtml(d.field)}</td><td>${d.choice ?? '—'}</td><td>${d.position ?? '—'}</td><td><pre>${escapeHtml(d.golden)}</pre></td><td><pre>${escapeHtml(d.candidate)}</pre></td></tr>`,
  );
  return `<table class="differences">${head}${rows.join('')}</table>`;
}

function exchangeTiming(exchange: ExchangeComparison): string {
  const ttft = (t: ExchangeTiming | null) => (t?.ttftMs == null ? '—' : ms(t.ttftMs));
  const e2e = (t: ExchangeTiming | null) => (t === null ? '—' : ms(t.e2eMs));
  const { golden, candidate } = exchange.timing;
  return `<table class="exchange-timing"><tr><th></th><th>golden</th><th>candidate</th></tr><tr><th scope="row">TTFT</th><td>${ttft(golden)}</td><td>${ttft(candidate)}</td></tr><tr><th scope="row">E2E</th><td>${e2e(golden)}</td><td>${e2e(candidate)}</td></tr></table>`;
}

/** The request's body as pretty JSON, or as sent when it is not JSON (a body cut at 64 KiB is not). */
function prettyRequest(text: string): string {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

function exchangeSection(exchange: ExchangeComparison): string {
  const rerun = exchange.candidate === null ? 'not recorded in the rerun' : `rerun #${exchange.candidate}`;
  const sampling = exchange.greedy ? 'greedy' : exchange.seeded ? 'sampled with a seed' : 'sampled without a seed';
  const status = `status golden ${exchange.status.golden ?? '—'}, candidate ${exchange.status.candidate ?? '—'}`;
  const heading = `Golden #${exchange.golden} (${rerun}): ${exchange.endpoint} ${exchange.path}${exchange.model === null ? '' : ` · ${exchange.model}`}`;
  return [
    `<section class="exchange ${exchange.verdict}" id="${exchangeId(exchange)}">`,
    `<h3>${escapeHtml(heading)} <span class="verdict">${exchange.verdict}</span></h3>`,
    exchange.note === null ? '' : `<p class="note">${escapeHtml(exchange.note)}</p>`,
    `<p class="facts">${exchange.stream ? 'streamed' : 'not streamed'}, ${sampling}, ${status}</p>`,
    `<h4>Request</h4><pre class="request">${escapeHtml(prettyRequest(exchange.request))}</pre>`,
    exchange.prompt === null ? '' : promptSection(exchange.prompt),
    '<h4>Output</h4>',
    differencesTable(exchange.output.differences),
    sideBySide('output', choices(exchange.output.golden), choices(exchange.output.candidate)),
    '<h4>Timing</h4>',
    exchangeTiming(exchange),
    '</section>',
  ].join('\n');
}

const STYLE = `
.banner { font-size: 18px; font-weight: 600; padding: 10px 14px; border-radius: 4px; }
.banner.regression { background: #fde8e8; color: #9b1c1c; border: 1px solid #f5b5b5; }
.banner.pass { background: #e6f4ea; color: #1e6b34; border: 1px solid #a8d5b5; }
tr.regression td.verdict, .exchange.regression .verdict { color: #b91c1c; font-weight: 600; }
tr.sampled td.verdict, .exchange.sampled .verdict { color: #a15c00; }
tr.not-compared td.verdict, .exchange.not-compared .verdict { color: #666; }
tr.beyond-noise td[data-key$="beyondNoise"] { color: #b91c1c; font-weight: 600; }
.exchange { border-top: 2px solid #ddd; margin-top: 24px; padding-top: 8px; }
h4 { font-size: 13px; margin: 12px 0 4px; }
h5 { font-size: 13px; margin: 0 0 4px; color: #555; }
h6 { font-size: 12px; margin: 4px 0; }
pre { background: #f6f8fa; border: 1px solid #e1e4e8; padding: 6px 8px; margin: 0 0 6px; max-height: 320px; overflow: auto; white-space: pre-wrap; word-break: break-all; font-size: 12px; }
td pre { max-height: 120px; margin: 0; }
.side-by-side { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; }
.side-by-side > div { min-width: 0; }
mark.first-difference { background: #ffd54f; outline: 1px solid #e0a800; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 0 8px; margin: 0 0 4px; font-size: 12px; }
dt { color: #555; }
dd { margin: 0; }
.note, .unobserved, .not-located { color: #444; }
.more { color: #555; font-style: italic; }
`;

/** Draws the CDF charts (golden and candidate on one chart) and scrolls each prompt to its first difference. */
const PAGE_SCRIPT = `
(function () {
  'use strict';
  var timing = JSON.parse(document.getElementById('report-data').textContent);
${CHART_HELPERS}
  function cdf(id, sides, name) {
    var drawn = sides.filter(function (side) { return side.quantiles.length > 0; });
    if (drawn.length === 0) return noData(id);
    var aligned = uPlot.join(drawn.map(function (side) {
      var n = side.quantiles.length;
      return [side.quantiles, side.quantiles.map(function (_, i) { return (i + 1) / n; })];
    }));
    draw(id, {
      scales: { x: { time: false }, y: { range: [0, 1] } },
      axes: [{ label: name + ' (ms)' }, { label: 'fraction of samples', values: percent, size: fitTicks }],
      series: [{ label: name + ' (ms)' }].concat(drawn.map(function (side) {
        return { label: side.label, stroke: color(side.color), width: 2, spanGaps: true, paths: uPlot.paths.stepped({ align: 1 }) };
      })),
    }, aligned);
  }
  timing.forEach(function (chart) {
    cdf(chart.id, [
      { label: 'golden', quantiles: chart.golden, color: 0 },
      { label: 'candidate', quantiles: chart.candidate, color: 1 },
    ], chart.name);
  });
  document.querySelectorAll('pre.prompt').forEach(function (pre) {
    var mark = pre.querySelector('mark.first-difference');
    if (mark) pre.scrollTop = Math.max(0, mark.offsetTop - pre.offsetTop - 40);
  });
})();
`;

export function rerunHtml(report: RerunReport): string {
  const sorted = [...report.exchanges].sort((a, b) => VERDICT_ORDER[a.verdict] - VERDICT_ORDER[b.verdict]);
  const notSame = sorted.filter((exchange) => exchange.verdict !== 'same');
  const shown = notSame.slice(0, SECTION_LIMIT);
  const more =
    notSame.length > shown.length ? `<p class="more">… and ${notSame.length - shown.length} more exchanges that are not the same, not shown here</p>` : '';
  const charts = TIMINGS.map(([key, label, id]) => ({ id, name: label, golden: report.timing[key].cdf.golden, candidate: report.timing[key].cdf.candidate }));
  const chartSections = TIMINGS.map(
    ([, label, id]) => `<section class="chart" id="${id}"><h3>${escapeHtml(label)} (CDF)</h3><div class="plot"></div></section>`,
  );
  const title = 'mocker rerun';
  const body = `<h1>${title}: ${escapeHtml(report.golden)} against ${escapeHtml(report.target)}</h1>
${banner(report)}
<div class="tables">
<section><h2>Totals</h2>${totalsTable(report)}</section>
<section><h2>Run</h2>${runTable(report)}</section>
<section><h2>Golden exchanges not sent</h2>${notSentTable(report)}</section>
</div>
<h2>Timing</h2>
${timingTable(report)}
<div class="charts">
${chartSections.join('\n')}
</div>
<h2>Exchanges</h2>
${exchangeTable(sorted, new Set(shown))}
<h2>Differences</h2>
${shown.length === 0 ? '<p>Every exchange is the same.</p>' : shown.map(exchangeSection).join('\n')}
${more}`;
  return reportPage({ title, style: STYLE, body, data: charts, script: PAGE_SCRIPT });
}
