/**
 * What mocker's self-contained HTML reports (`trace --report-html`, `rerun --report-html`) share: escaping of
 * untrusted text, data embedded as JSON in a <script>, the uPlot chart library inlined from its package, and the
 * page's base style and chart helpers.
 */
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';

export function escapeHtml(text: string): string {
  return text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;').replace(/'/g, '&#39;');
}

/** JSON that cannot end its <script> element or open an HTML comment in it: every `<` is written as \u003c. */
export function scriptJson(value: unknown): string {
  return JSON.stringify(value).replace(/</g, '\\u003c');
}

/** A file of the installed uplot package, checked to be safe to inline in its element. */
export function uplotAsset(file: 'uPlot.min.css' | 'uPlot.iife.min.js'): string {
  const closingTag = file.endsWith('.css') ? '</style' : '</script';
  const text = readFileSync(createRequire(import.meta.url).resolve(`uplot/dist/${file}`), 'utf8');
  if (text.toLowerCase().includes(closingTag) || text.includes('<!--'))
    throw new Error(`uplot/dist/${file} contains ${closingTag} or <!--: it cannot be inlined`);
  return text;
}

export const BASE_STYLE = `
body { font: 14px/1.4 system-ui, sans-serif; color: #222; background: #fff; margin: 24px auto; max-width: 1100px; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 16px; word-break: break-word; }
h2 { font-size: 16px; margin: 24px 0 8px; }
h3 { font-size: 14px; margin: 0 0 4px; }
table { border-collapse: collapse; margin-bottom: 8px; }
th, td { border: 1px solid #ddd; padding: 4px 10px; text-align: left; }
td { font-variant-numeric: tabular-nums; word-break: break-word; }
.tables { display: flex; flex-wrap: wrap; gap: 24px; align-items: flex-start; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(480px, 1fr)); gap: 24px; }
.chart { min-width: 0; }
.no-data { color: #888; border: 1px dashed #ccc; padding: 48px 0; text-align: center; margin: 0; }
`;

/**
 * Page-script functions both reports' charts use (plain ES5: it runs as written in the page). A chart is drawn into
 * the `.plot` element of the element with its id.
 */
export const CHART_HELPERS = `
  var HEIGHT = 260;
  function color(i) { return 'hsl(' + Math.round((210 + i * 137.5) % 360) + ', 75%, 42%)'; }
  function percent(u, splits) { return splits.map(function (v) { return Math.round(v * 100) + '%'; }); }
  // uPlot's default y axis width clips tick labels longer than about five characters.
  function fitTicks(u, values) {
    var longest = 0;
    (values || []).forEach(function (v) { longest = Math.max(longest, String(v).length); });
    return Math.max(50, longest * 7 + 20);
  }
  function target(id) { return document.getElementById(id).querySelector('.plot'); }
  function noData(id) {
    var p = document.createElement('p');
    p.className = 'no-data';
    p.textContent = 'no data';
    target(id).appendChild(p);
  }
  function draw(id, opts, aligned) {
    var el = target(id);
    opts.width = el.clientWidth;
    opts.height = HEIGHT;
    new uPlot(opts, aligned, el);
  }
`;

/**
 * A whole self-contained report page: uPlot and its stylesheet inlined, `data` embedded as JSON (read by
 * `script` from `#report-data`), `body` as given (already escaped).
 */
export function reportPage(page: { title: string; style?: string; body: string; data: unknown; script: string }): string {
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${escapeHtml(page.title)}</title>
<style>${uplotAsset('uPlot.min.css')}</style>
<style>${BASE_STYLE}${page.style ?? ''}</style>
</head>
<body>
${page.body}
<script>${uplotAsset('uPlot.iife.min.js')}</script>
<script type="application/json" id="report-data">${scriptJson(page.data)}</script>
<script>${page.script}</script>
</body>
</html>
`;
}
