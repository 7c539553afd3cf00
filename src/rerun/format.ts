/** The rerun report as lines for a terminal (regressions first, then sampled differences, then timing and totals). */
import { formatMs as ms, formatSignedMs as signed } from '../captures/pairing.js';
import type { ExchangeComparison, OutputDifference, RerunReport, TimingComparison } from './report.js';

function describeOutput(d: OutputDifference): string {
  const where = `${d.choice === undefined ? '' : ` choice ${d.choice}`}${d.position === undefined ? '' : ` at ${d.position}`}`;
  return `${d.field}${where}: golden ${d.golden}, target ${d.candidate}`;
}

function describeExchange(e: ExchangeComparison): string[] {
  const head = `${e.verdict === 'regression' ? 'REGRESSION' : 'sampled'} #${e.golden} ${e.endpoint} ${e.path}${e.model ? ` (${e.model})` : ''}: ${e.note ?? ''}`;
  const lines = [head];
  const d = e.prompt?.difference;
  if (d) {
    lines.push(
      `  prompt: first difference at token ${d.position} of ${e.prompt!.goldenLength} / ${e.prompt!.candidateLength}, in the ${d.partLabel}: ` +
        `after ${JSON.stringify(d.before)}: golden ${d.goldenToken ?? '(end)'} ${JSON.stringify(d.goldenText)}, target ${d.candidateToken ?? '(end)'} ${JSON.stringify(d.candidateText)}` +
        (e.prompt!.observed ? '' : ' (ids rendered locally, not the engine’s)'),
    );
  }
  for (const o of e.output.differences) lines.push(`  output ${describeOutput(o)}`);
  return lines;
}

function describeTiming(name: string, t: TimingComparison, alpha: number): string {
  const test =
    t.pValue === null
      ? 'too few samples to test'
      : `Mann–Whitney p=${t.pValue.toPrecision(2)}: ${t.beyondNoise ? `beyond noise (p < ${alpha})` : 'within noise'}`;
  return (
    `${name} ms (golden ${t.golden.count} / target ${t.candidate.count} samples): p50 ${ms(t.golden.p50)} -> ${ms(t.candidate.p50)} (${signed(t.shift.p50)}), ` +
    `p90 ${ms(t.golden.p90)} -> ${ms(t.candidate.p90)} (${signed(t.shift.p90)}), p99 ${ms(t.golden.p99)} -> ${ms(t.candidate.p99)} (${signed(t.shift.p99)}); ${test}`
  );
}

/** `limit`: at most this many exchanges described (all are counted). */
export function formatRerunReport(report: RerunReport, limit: number): string {
  const lines = [
    `rerun of ${report.golden} against ${report.target} (${report.targetEngine}${report.targetVersion ? ` ${report.targetVersion}` : ''}); its answers are in ${report.candidate}`,
  ];
  const shown = [...report.exchanges.filter((e) => e.verdict === 'regression'), ...report.exchanges.filter((e) => e.verdict === 'sampled')];
  for (const e of shown.slice(0, limit)) lines.push(...describeExchange(e));
  if (shown.length > limit) lines.push(`… and ${shown.length - limit} more (--limit)`);
  lines.push(
    describeTiming('TTFT', report.timing.ttftMs, report.alpha),
    describeTiming('ITL', report.timing.itlMs, report.alpha),
    describeTiming('E2E', report.timing.e2eMs, report.alpha),
  );
  const t = report.totals;
  const skipped = report.skipped.length === 0 ? '' : `; not sent: ${report.skipped.map((s) => `${s.count} ${s.reason}`).join(', ')}`;
  lines.push(
    `${t.compared} exchanges compared: ${t.same} same, ${t.regressions} regression(s), ${t.sampled} sampled difference(s) (reported, not failed)` +
      `; ${t.promptChanges} prompt change(s), ${t.outputChanges} output change(s)${skipped}`,
  );
  return lines.join('\n');
}
