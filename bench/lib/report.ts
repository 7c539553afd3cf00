/**
 * The figures of `npm run bench` (bench/run.ts): each benchmark's final JSON line(s) mapped to one row per
 * figure, the table printed from them, the JSON lines appended to bench/results/<date>.jsonl, and the docs
 * tables regenerated from such a file (bench/docs.ts). Pure functions: test/bench/bench-runner.test.ts feeds
 * them canned benchmark output.
 */
import type { GeneratedBlock } from '../../scripts/generatedBlock.js';

/** A bound the figure's value must keep. */
export interface Target {
  op: '<=' | '>=';
  bound: number;
}

/** One row of the table: a measured value, what it was compared with in the same run, and its spread. */
export interface Figure {
  /** The runner's name of the benchmark invocation (e.g. "replay-16"). */
  bench: string;
  figure: string;
  value: number;
  unit: string;
  /** What the value was compared with, measured interleaved in the same run; null for absolute figures. */
  baseline: string | null;
  baselineValue: number | null;
  /** Measured system ÷ baseline (median of per-round ratios where the benchmark gives them). */
  ratio: number | null;
  /** The quantity the spread and the target are about: the value itself, or its ratio to the baseline. */
  judged: 'value' | 'ratio';
  /** min–max over rounds of the judged quantity; null where the benchmark measures it once. */
  min: number | null;
  max: number | null;
  target: Target | null;
}

/** The line that opens a run in a results file: when, where, what. */
export interface RunLine {
  kind: 'run';
  run: string;
  date: string;
  machine: Machine;
  loadAverage: { start: number[]; end: number[] };
  seconds: number;
  /** Benchmark invocations, with the arguments each was given and its exit code. */
  benches: { name: string; script: string; args: string[]; exitCode: number | null; seconds: number }[];
}

export interface Machine {
  cpu: string;
  cores: number;
  ramGiB: number;
  node: string;
}

export type FigureLine = Figure & { kind: 'figure'; run: string; met: boolean | null };
/** A benchmark's own JSON line, kept whole as the evidence behind its figures. */
export interface RawLine {
  kind: 'raw';
  run: string;
  bench: string;
  json: unknown;
}
export type ResultLine = RunLine | FigureLine | RawLine;

/** Whether the judged quantity keeps the target; null without a target (or without the ratio it judges). */
export function met(f: Figure): boolean | null {
  const judged = f.judged === 'ratio' ? f.ratio : f.value;
  if (!f.target || judged === null) return null;
  return f.target.op === '<=' ? judged <= f.target.bound : judged >= f.target.bound;
}

/** The JSON objects among a benchmark's stdout lines (its table and progress lines are text). */
export function jsonLinesOf(stdout: string): Record<string, unknown>[] {
  const found: Record<string, unknown>[] = [];
  for (const line of stdout.split('\n')) {
    const text = line.trim();
    if (!text.startsWith('{')) continue;
    try {
      const parsed: unknown = JSON.parse(text);
      if (parsed !== null && typeof parsed === 'object' && !Array.isArray(parsed)) found.push(parsed as Record<string, unknown>);
    } catch {
      // A progress line that happens to start with "{" is not a result.
    }
  }
  return found;
}

export function toJsonl(run: RunLine, figures: Figure[], raw: { bench: string; json: unknown }[]): string {
  const lines: ResultLine[] = [
    run,
    ...raw.map((r): RawLine => ({ kind: 'raw', run: run.run, bench: r.bench, json: r.json })),
    ...figures.map((f): FigureLine => ({ kind: 'figure', run: run.run, ...f, met: met(f) })),
  ];
  return lines.map((l) => `${JSON.stringify(l)}\n`).join('');
}

/** The last run of a results file (a file collects every run of its day). */
export function lastRun(jsonl: string): { run: RunLine; figures: FigureLine[] } {
  const lines = jsonl
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((l) => JSON.parse(l) as ResultLine);
  const runs = lines.filter((l): l is RunLine => l.kind === 'run');
  const run = runs[runs.length - 1];
  if (!run) throw new Error('no run line in the results file');
  return { run, figures: lines.filter((l): l is FigureLine => l.kind === 'figure' && l.run === run.run) };
}

/** Numbers as the table shows them: 3 significant digits, thousands grouped. */
export function formatNumber(x: number): string {
  if (!Number.isFinite(x)) return String(x);
  const abs = Math.abs(x);
  const digits = abs >= 100 ? 0 : abs >= 10 ? 1 : abs >= 1 ? 2 : 3;
  return x.toLocaleString('en-US', { minimumFractionDigits: 0, maximumFractionDigits: digits });
}

const withUnit = (x: number, unit: string) => (unit === '' ? formatNumber(x) : `${formatNumber(x)} ${unit}`);

/** The judged quantity with its unit ("0.7×", "2 ms"; a range "0.5–0.7×"): `upTo` is the range's end. */
function judgedText(x: number, f: Figure, upTo = ''): string {
  const unit = f.judged === 'ratio' ? '×' : f.unit === '' ? '' : ` ${f.unit}`;
  return `${formatNumber(x)}${upTo}${unit}`;
}

const HEADER = ['benchmark', 'figure', 'value', 'baseline (same run)', 'ratio', 'spread (min–max)', 'target', 'met'];

/** The cells of one figure's row, as the terminal table and the docs' tables show them. */
export function figureCells(f: Figure): string[] {
  const isMet = met(f);
  return [
    f.bench,
    f.figure,
    withUnit(f.value, f.unit),
    f.baseline === null ? '—' : f.baselineValue === null ? f.baseline : `${f.baseline}: ${withUnit(f.baselineValue, f.unit)}`,
    f.ratio === null ? '—' : `${formatNumber(f.ratio)}×`,
    f.min === null || f.max === null ? '—' : judgedText(f.min, f, `–${formatNumber(f.max)}`),
    f.target ? `${f.target.op === '<=' ? '≤' : '≥'} ${judgedText(f.target.bound, f)}` : '—',
    isMet === null ? '' : isMet ? 'yes' : 'NO',
  ];
}

/** The aligned text table `npm run bench` prints. */
export function formatTable(figures: Figure[]): string {
  const rows = [HEADER, ...figures.map(figureCells)];
  const widths = HEADER.map((_, i) => Math.max(...rows.map((r) => r[i].length)));
  const line = (r: string[]) =>
    r
      .map((c, i) => c.padEnd(widths[i]))
      .join('  ')
      .trimEnd();
  return [line(rows[0]), widths.map((w) => '-'.repeat(w)).join('  '), ...rows.slice(1).map(line)].join('\n');
}

/** docs/benchmarks.md: the whole table of the last run. */
export const TABLE_BLOCK: GeneratedBlock = {
  begin: '<!-- bench:begin (generated by `npm run bench:docs`; edit bench/lib/report.ts, not this table) -->',
  end: '<!-- bench:end -->',
};
/** README.md: the figures that have a target, in short. */
export const HEADLINE_BLOCK: GeneratedBlock = {
  begin: '<!-- bench-headline:begin (generated by `npm run bench:docs`) -->',
  end: '<!-- bench-headline:end -->',
};

const escapeCell = (c: string) => c.replaceAll('|', '\\|');

function measuredLine(run: RunLine, resultsPath: string): string {
  const m = run.machine;
  const load = (l: number[]) => l.map((x) => x.toFixed(2)).join(' ');
  return (
    `Measured ${run.date} by \`npm run bench\` in ${Math.round(run.seconds)} s (results: \`${resultsPath}\`) on ${m.cpu}, ${m.cores} cores, ` +
    `${m.ramGiB} GiB RAM, Node ${m.node}; load average (1, 5, 15 min) ${load(run.loadAverage.start)} at the start, ${load(run.loadAverage.end)} at the end.`
  );
}

/** docs/benchmarks.md's table and its heading line, in Markdown. */
export function tableSection(results: { run: RunLine; figures: FigureLine[] }, resultsPath: string): string {
  const { run, figures } = results;
  return [
    measuredLine(run, resultsPath),
    '',
    `| ${HEADER.join(' | ')} |`,
    `|${HEADER.map(() => '---').join('|')}|`,
    ...figures.map((f) => `| ${figureCells(f).map(escapeCell).join(' | ')} |`),
  ].join('\n');
}

/** The README's short table: only the figures with a target, as value, ratio to the baseline, target and verdict. */
export function headlineSection(results: { run: RunLine; figures: FigureLine[] }, resultsPath: string): string {
  const { run, figures } = results;
  const header = ['figure', 'value', 'ratio to baseline', 'target', 'met'];
  const rows = figures
    .filter((f) => f.target)
    .map((f) => {
      const [, figure, value, , ratio, , target, isMet] = figureCells(f);
      return `| ${[figure, value, ratio, target, isMet].map(escapeCell).join(' | ')} |`;
    });
  return [measuredLine(run, resultsPath), '', `| ${header.join(' | ')} |`, `|${header.map(() => '---').join('|')}|`, ...rows].join('\n');
}
