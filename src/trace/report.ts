/**
 * The report's two faces, as Dynamo's replay prints them (engine-reference §8.8): an AIPerf-style table on
 * stdout and a JSON file (keys sorted, two-space indent, floats written as Python writes them).
 */
import { statSync } from 'node:fs';
import { join } from 'node:path';
import { writeOutputFile, type OutputRules } from '../util/outputFile.js';
import { reuseByTurn, type PerRequestRecord, type ReplayReport } from './collector.js';

export const TABLE_TITLE = 'NVIDIA AIPerf | LLM Metrics';
const STAT_COLUMNS = ['avg', 'min', 'max', 'p99', 'p90', 'p75', 'std'] as const;
/** Report keys that are counts (Python ints); every other number is a float. */
const INTEGER_KEYS = new Set([
  'num_requests',
  'completed_requests',
  'total_input_tokens',
  'total_output_tokens',
  'total_reused_input_tokens',
  'total_first_admission_reused_input_tokens',
  'num_sessions',
  'max_turns_per_session',
  'goodput_completed_requests',
]);

/** Python's `f"{v:,.2f}"`; missing → N/A. */
export function formatValue(value: number | undefined): string {
  if (value === undefined || !Number.isFinite(value)) return value === undefined ? 'N/A' : String(value);
  const [whole, fraction] = Math.abs(value).toFixed(2).split('.');
  const grouped = whole.replace(/\B(?=(\d{3})+(?!\d))/g, ',');
  return `${value < 0 && Number(`${whole}.${fraction}`) !== 0 ? '-' : ''}${grouped}.${fraction}`;
}

export function formatReportTable(report: ReplayReport): string {
  const rows: string[][] = [];
  const statRow = (label: string, suffix: string) => {
    if (!(`mean_${suffix}` in report)) return;
    rows.push([label, ...['mean', 'min', 'max', 'p99', 'p90', 'p75', 'std'].map((stat) => formatValue(report[`${stat}_${suffix}`]))]);
  };
  const singleRow = (label: string, value: number | undefined) =>
    rows.push([label, formatValue(value), ...new Array<string>(STAT_COLUMNS.length - 1).fill('N/A')]);
  statRow('Time to First Token (ms)', 'ttft_ms');
  statRow('Time to Second Token (ms)', 'ttst_ms');
  statRow('Request Latency (ms)', 'e2e_latency_ms');
  statRow('Inter Token Latency (ms)', 'itl_ms');
  statRow('Session Latency (ms)', 'session_latency_ms');
  statRow('Output Token Throughput Per User (tokens/sec/user)', 'output_token_throughput_per_user');
  singleRow('Output Token Throughput (tokens/sec)', report.output_throughput_tok_s);
  singleRow('Request Throughput (requests/sec)', report.request_throughput_rps);
  singleRow('Request Count (requests)', report.completed_requests ?? report.num_requests);

  const lines = [TABLE_TITLE, ...boxTable(['Metric', ...STAT_COLUMNS], rows)];
  if (report.wall_time_ms !== undefined) lines.push(`Wall Time (ms): ${formatValue(report.wall_time_ms)}`);
  if (report.prefix_cache_reused_ratio !== undefined) lines.push(`Prefix Cache Reused Ratio: ${formatValue(report.prefix_cache_reused_ratio)}`);
  if (report.first_admission_prefix_cache_reused_ratio !== undefined)
    lines.push(`First Admission Prefix Cache Reused Ratio: ${formatValue(report.first_admission_prefix_cache_reused_ratio)}`);
  if (report.num_sessions !== undefined) {
    lines.push(`Sessions: ${report.num_sessions} (turns per session: mean ${formatValue(report.mean_turns_per_session)}, max ${report.max_turns_per_session})`);
    const byTurn = reuseByTurn(report).map(({ turn, ratio }) => `${turn}: ${formatValue(ratio)}`);
    if (byTurn.length > 0) lines.push(`First Admission Prefix Cache Reused Ratio by Turn: ${byTurn.join(', ')}`);
  }
  if (report.goodput_request_throughput_rps !== undefined)
    lines.push(
      `Goodput (requests/sec): ${formatValue(report.goodput_request_throughput_rps)} (${report.goodput_completed_requests} of ${report.completed_requests} requests within the SLO)`,
    );
  return lines.join('\n');
}

/** AIPerf's box-drawn table: the first `leftColumns` columns aligned left, the others right. */
export function boxTable(headers: string[], rows: string[][], leftColumns = 1): string[] {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
  const separator = (left: string, mid: string, right: string) => left + widths.map((w) => '━'.repeat(w + 2)).join(mid) + right;
  const line = (row: string[]) => `┃${row.map((v, i) => ` ${i < leftColumns ? v.padEnd(widths[i]) : v.padStart(widths[i])} `).join('┃')}┃`;
  return [separator('┏', '┳', '┓'), line(headers), separator('┡', '╇', '┩'), ...rows.map(line), separator('└', '┴', '┘')];
}

/** Python's repr of a float (`json.dumps`): `2.0`, `1e-05`, `1e+16`, else the shortest round trip. */
function pythonFloat(value: number): string {
  if (!Number.isFinite(value)) return Number.isNaN(value) ? 'NaN' : value > 0 ? 'Infinity' : '-Infinity';
  const magnitude = Math.abs(value);
  if (magnitude !== 0 && (magnitude < 1e-4 || magnitude >= 1e16)) {
    return value.toExponential().replace(/e([+-])(\d)$/, 'e$10$2');
  }
  const text = String(value);
  return Number.isInteger(value) ? `${text}.0` : text;
}

/** `json.dumps(report, indent=2, sort_keys=True) + "\n"` for a flat report of numbers. */
export function reportJson(report: ReplayReport): string {
  const keys = Object.keys(report).sort();
  if (keys.length === 0) return '{}\n';
  const body = keys.map(
    (key) => `  ${JSON.stringify(key)}: ${INTEGER_KEYS.has(key) && Number.isInteger(report[key]) ? String(report[key]) : pythonFloat(report[key])}`,
  );
  return `{\n${body.join(',\n')}\n}\n`;
}

const stamp = (d: Date) => {
  const p = (n: number) => String(n).padStart(2, '0');
  return `${d.getFullYear()}${p(d.getMonth() + 1)}${p(d.getDate())}_${p(d.getHours())}${p(d.getMinutes())}${p(d.getSeconds())}`;
};

/** Where reports go unless a path is given: a directory of the working directory (made when needed; git-ignored). */
export const DEFAULT_REPORTS_DIR = 'reports';

/** Where the JSON report goes: `path`, a timestamped file inside it when it is a directory, else one in DEFAULT_REPORTS_DIR. */
export function reportJsonPath(path: string | undefined, now = new Date()): string {
  const fileName = `dynamo_replay_report_${stamp(now)}.json`;
  try {
    if (path !== undefined && statSync(path).isDirectory()) return join(path, fileName);
  } catch {
    // Not there yet: a file path.
  }
  return path ?? join(DEFAULT_REPORTS_DIR, fileName);
}

/** Writes the JSON report to `target` under the output rules. */
export async function writeReportJson(report: ReplayReport, target: string, rules: OutputRules): Promise<void> {
  await writeOutputFile(target, rules, (write) => write(reportJson(report)));
}

/** Writes one JSON line per request (its session, turn, times, lengths and prefix reuse) to `target` under the output rules. */
export async function writeRequestRecords(records: readonly PerRequestRecord[], target: string, rules: OutputRules): Promise<void> {
  await writeOutputFile(target, rules, (write) => {
    for (const record of records) write(`${JSON.stringify(record)}\n`);
  });
}

/** Failed requests by message: one line per distinct reason on stderr, the most frequent first. */
export class FailureTally {
  private readonly counts = new Map<string, number>();

  add(message: string): void {
    this.counts.set(message, (this.counts.get(message) ?? 0) + 1);
  }

  lines(shown = 5): string[] {
    const sorted = [...this.counts].sort((a, b) => b[1] - a[1]);
    const lines = sorted.slice(0, shown).map(([message, count]) => `mocker trace: ${count} request(s) failed: ${message}`);
    const rest = sorted.slice(shown).reduce((sum, [, count]) => sum + count, 0);
    if (rest > 0) lines.push(`mocker trace: ${rest} more request(s) failed for ${sorted.length - shown} other reason(s)`);
    return lines;
  }
}
