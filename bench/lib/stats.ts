/** Small statistics and printing helpers shared by the benchmarks. */

/** The q-quantile (0..1) of `values`, nearest-rank on a sorted copy; NaN when empty. */
export function quantile(values: ArrayLike<number>, q: number): number {
  const n = values.length;
  if (n === 0) return NaN;
  const sorted = Float64Array.from(values).sort();
  return sorted[Math.min(n - 1, Math.max(0, Math.ceil(q * n) - 1))];
}

export const median = (values: ArrayLike<number>): number => quantile(values, 0.5);

/** Monotonic time in ms, comparable across processes on the same machine (CLOCK_MONOTONIC on Linux). */
export function nowMs(): number {
  return Number(process.hrtime.bigint()) / 1e6;
}

export function round(x: number, digits = 3): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

/** Prints rows as an aligned text table. */
export function printTable(header: string[], rows: (string | number)[][]): void {
  const cells = [header, ...rows.map((r) => r.map((c) => (typeof c === 'number' ? String(round(c)) : c)))];
  const widths = header.map((_, i) => Math.max(...cells.map((r) => r[i].length)));
  const line = (r: string[]) => r.map((c, i) => (i === 0 ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join('  ');
  console.log(line(cells[0]));
  console.log(widths.map((w) => '-'.repeat(w)).join('  '));
  for (const r of cells.slice(1)) console.log(line(r));
}

/** `--name value` from argv as a number, else the default. */
export function numberArg(name: string, fallback: number): number {
  const at = process.argv.indexOf(`--${name}`);
  if (at < 0) return fallback;
  const value = Number(process.argv[at + 1]);
  if (!Number.isFinite(value)) throw new Error(`--${name} needs a number, got ${process.argv[at + 1]}`);
  return value;
}

export const flag = (name: string): boolean => process.argv.includes(`--${name}`);

/** `--name value` from argv as a string, else the default. */
export function stringArg(name: string, fallback: string): string {
  const at = process.argv.indexOf(`--${name}`);
  return at < 0 ? fallback : (process.argv[at + 1] ?? fallback);
}
