/**
 * prom-client's text exposition rewritten the way vLLM's Python prometheus_client prints it, so a scrape of
 * mocker reads like a scrape of vLLM line for line: labels in alphabetical order (`engine`, `le`,
 * `model_name`), values and `le` bounds as prometheus_client's `floatToGoString` (`1.0`, `1e-05`,
 * `1.234567e+06`), a histogram's `_count` before its `_sum`, no blank lines between families.
 * (prometheus_client's `_created` samples are not reproduced.)
 */

/** Python's `repr(float)`: the shortest round-trip digits, exponent form below 1e-4 and from 1e16. */
function pythonFloatRepr(x: number): string {
  if (x === 0) return Object.is(x, -0) ? '-0.0' : '0.0';
  const abs = Math.abs(x);
  if (abs < 1e-4 || abs >= 1e16) {
    const [mantissa, exponent] = x.toExponential().split('e');
    const e = Number(exponent);
    return `${mantissa}e${e < 0 ? '-' : '+'}${String(Math.abs(e)).padStart(2, '0')}`;
  }
  const text = String(x);
  return text.includes('.') ? text : `${text}.0`;
}

/** prometheus_client's `floatToGoString`, quirks included (`1e+015`). */
export function floatToGoString(d: number): string {
  if (d === Infinity) return '+Inf';
  if (d === -Infinity) return '-Inf';
  if (Number.isNaN(d)) return 'NaN';
  const s = pythonFloatRepr(d);
  const dot = s.indexOf('.');
  if (d > 0 && dot > 6) {
    const mantissa = `${s[0]}.${s.slice(1, dot)}${s.slice(dot + 1)}`.replace(/[0.]+$/, '');
    return `${mantissa}e+0${dot - 1}`;
  }
  return s;
}

const SAMPLE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/;
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;

function rewriteSample(line: string): { name: string; labels: string; text: string } | null {
  const match = SAMPLE.exec(line);
  if (!match) return null;
  const [, name, labelText = '', value] = match;
  const labels = [...labelText.matchAll(LABEL)]
    .map(([, key, raw]) => [key, key === 'le' ? floatToGoString(Number(raw === '+Inf' ? Infinity : raw)) : raw] as const)
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  const labelPart = labels.length > 0 ? `{${labels.map(([k, v]) => `${k}="${v}"`).join(',')}}` : '';
  const numeric = value === '+Inf' ? Infinity : value === '-Inf' ? -Infinity : Number(value);
  return { name, labels: labelPart, text: `${name}${labelPart} ${floatToGoString(numeric)}` };
}

export function toPrometheusClientText(promClientText: string): string {
  const out: string[] = [];
  const lines = promClientText.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    if (line === '') continue;
    if (line.startsWith('#')) {
      out.push(line);
      continue;
    }
    const sample = rewriteSample(line);
    if (!sample) {
      out.push(line);
      continue;
    }
    // prom-client prints a series' _sum, then its _count; prometheus_client the other way round.
    const next = sample.name.endsWith('_sum') ? rewriteSample(lines[i + 1] ?? '') : null;
    if (next && next.name === `${sample.name.slice(0, -'_sum'.length)}_count` && next.labels === sample.labels) {
      out.push(next.text, sample.text);
      i++;
      continue;
    }
    out.push(sample.text);
  }
  return `${out.join('\n')}\n`;
}
