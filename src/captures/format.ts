/**
 * The pages `mocker captures list|show|prune|stats` print. Every field from the file is escaped (`inline`) where it
 * sits within a line; the caller escapes the page as a whole before it reaches the terminal.
 */
import { describeOutputIds } from './outputIds.js';
import { formatReportTable } from '../trace/report.js';
import { terminalText } from '../util/terminalText.js';
import type { MergeResult, PruneResult } from './edit.js';
import type { Listing, RunStats, Shown } from './inspect.js';

/** A field from the file shown within a line. */
const inline = (text: string) => terminalText(text);

/** Left-aligned columns, two spaces apart. */
function table(headers: string[], rows: (string | number | null)[][]): string {
  const cells = [headers, ...rows.map((r) => r.map((c) => (c === null ? '-' : inline(String(c)))))];
  const widths = headers.map((_, i) => Math.max(...cells.map((r) => r[i].length)));
  return cells
    .map((r) =>
      r
        .map((c, i) => c.padEnd(widths[i]))
        .join('  ')
        .trimEnd(),
    )
    .join('\n');
}

/** The agents' APIs a listing counts, named only when it holds any. */
const agentCounts = (e: Listing['endpoints']) =>
  (['generate', 'responses', 'messages'] as const)
    .filter((api) => e[api] > 0)
    .map((api) => `, ${e[api]} ${api}`)
    .join('');

/** `captures list`'s page. */
export function formatListing(file: string, l: Listing): string {
  const lines = [
    `${file}: ${l.total} exchanges (${l.outcomes.complete} complete, ${l.outcomes.failed} failed, ${l.outcomes.aborted} aborted; ${l.endpoints.chat} chat, ${l.endpoints.completion} completion${agentCounts(l.endpoints)}${l.endpoints.other ? `, ${l.endpoints.other} other` : ''})`,
  ];
  lines.push(`captured: ${l.from === null ? '-' : `${l.from} .. ${l.until}`}`);
  lines.push(`models: ${l.models.length > 0 ? l.models.map(inline).join(', ') : '-'}`);
  lines.push(
    '',
    table(
      ['run', 'kind', 'engine', 'version', 'upstream', 'label', 'started', 'exchanges'],
      l.runs.map((r) => [r.id, r.kind, r.engine, r.engineVersion, r.upstream, r.label, r.startedAt, r.exchanges]),
    ),
  );
  if (l.exchanges) {
    const rows = l.exchanges.map((e) => [
      e.id,
      e.runId,
      e.startedAt,
      e.endpoint ?? e.path,
      e.stream ? 'stream' : '',
      e.model,
      e.outcome,
      e.status,
      e.promptLen,
      e.totalMs === null ? null : e.totalMs.toFixed(1),
      e.bodiesRedacted ? 'redacted' : '',
    ]);
    lines.push('', table(['id', 'run', 'started', 'endpoint', 'stream', 'model', 'outcome', 'status', 'prompt', 'ms', 'bodies'], rows));
  }
  return lines.join('\n');
}

const ms = (v: number | null) => (v === null ? '-' : v.toFixed(1));
const indent = (text: string) =>
  text
    .split('\n')
    .map((line) => `  ${line}`)
    .join('\n');

const headerLines = (headers: Shown['requestHeaders']) =>
  indent(
    Object.entries(headers)
      .map(([k, v]) => `${inline(k)}: ${inline(Array.isArray(v) ? v.join(', ') : v)}`)
      .join('\n') || '-',
  );

/** A stored body shown on a page at most this long (`--json` and `captures export` give it whole). */
const BODY_CHARS = 64 * 1024;

function bodyText(body: NonNullable<Shown['requestBody']>): string {
  const text = typeof body === 'string' ? body : `base64: ${body.base64}`;
  if (text === '') return '(empty)';
  return text.length > BODY_CHARS ? `${text.slice(0, BODY_CHARS)}\n… (${text.length - BODY_CHARS} more characters: --json shows it whole)` : text;
}

/** `captures show`'s page. */
export function formatShown(s: Shown): string {
  const lines = [`exchange ${s.id} · run ${s.run} · ${s.startedAt} · ${inline(s.method)} ${inline(s.path)}${s.stream ? ' · stream' : ''}`];
  lines.push(
    `model: ${inline(s.model ?? '-')}   outcome: ${s.outcome}${s.status === null ? '' : ` (HTTP ${s.status})`}   total: ${ms(s.totalMs)} ms   token ids from: ${s.tokenSource ?? '-'}`,
  );
  if (s.error) lines.push(`error: ${inline(s.error)}`);
  if (s.bodiesRedacted)
    lines.push(
      'bodies: redacted at capture (--redact-bodies): no request body, response bytes or text were stored; the texts below are decoded from the token ids',
    );
  lines.push('request headers (as stored: secrets never are):', headerLines(s.requestHeaders));
  if (s.requestBody !== null) lines.push('request body:', indent(bodyText(s.requestBody)));
  lines.push('response headers:', headerLines(s.responseHeaders));
  // The choices below present a complete answer's body; what did not complete (or has no choices) shows it as stored.
  if (s.responseBody !== null && (s.outcome !== 'complete' || s.choices.length === 0)) lines.push('response body:', indent(bodyText(s.responseBody)));
  if (s.promptIds) {
    lines.push(`prompt (${s.promptIds.length} tokens):`);
    if (s.promptText !== null) lines.push(indent(s.promptText));
    lines.push(`  ids: ${JSON.stringify(s.promptIds)}`);
  }
  if (s.choices.length > 0) lines.push(describeOutputIds(s.outputIds));
  for (const c of s.choices) {
    lines.push(
      `choice ${c.index}: ${c.outputIds.length} tokens, finish_reason ${inline(c.finishReason ?? '-')}, stop_reason ${inline(JSON.stringify(c.stopReason))}`,
    );
    lines.push(`  text${c.textDecoded ? ' (decoded from the ids)' : ''}: ${JSON.stringify(c.text)}`, `  ids: ${JSON.stringify(c.outputIds)}`);
    const rows = c.chunks.map((k, i) => [i, ms(k.atMs), ms(k.gapMs), k.tokens, k.delta === undefined ? '' : JSON.stringify(k.delta)]);
    lines.push(indent(table(['chunk', 'at ms', 'gap ms', 'tokens', 'delta'], rows)));
  }
  if (s.usage !== null) lines.push(`usage: ${JSON.stringify(s.usage)}`);
  return lines.join('\n');
}

/** What `captures prune` removed, or would. */
export function formatPrune(file: string, r: PruneResult): string {
  const verb = r.dryRun ? 'would remove' : 'removed';
  const lines = [`${file}: ${verb} ${r.exchanges.length} exchanges${r.runs.length > 0 ? ` and runs ${r.runs.join(', ')} (left empty)` : ''}`];
  if (r.exchanges.length > 0)
    lines.push(
      table(
        ['id', 'run', 'started', 'model', 'outcome'],
        r.exchanges.map((e) => [e.id, e.runId, e.startedAt, e.model, e.outcome]),
      ),
    );
  lines.push(r.dryRun ? `file: ${r.bytesBefore} bytes (nothing changed)` : `file: ${r.bytesBefore} -> ${r.bytesAfter} bytes after VACUUM`);
  return lines.join('\n');
}

/** What `captures merge` wrote, and the duplicates it found. */
export function formatMerge(output: string, files: number, result: MergeResult): string {
  const lines = [
    `${output}: ${result.exchanges} exchanges in ${result.runs} runs from ${files} files; ${result.duplicates} duplicates (same model and request body) in ${result.duplicateGroups.length} groups`,
  ];
  for (const g of result.duplicateGroups)
    lines.push(`  ${inline(g.model ?? '-')}: ${g.exchanges.map((e) => `${e.file}#${e.id} (now #${e.mergedId})`).join(' = ')}`);
  return lines.join('\n');
}

/** Which exchanges the timing figures are over: a non-streamed answer has no first token or gaps. */
function timingCoverage({ exchanges: { streamed, notStreamed } }: RunStats): string {
  const counts = `${streamed} streamed, ${notStreamed} not streamed generation exchanges`;
  if (notStreamed === 0) return counts;
  if (streamed === 0) return `${counts}: no TTFT, ITL or per-user token rate (a non-streamed answer has no token timing); latency and counts over all`;
  return `${counts}: TTFT, ITL and per-user token rate over the ${streamed} streamed only (a non-streamed answer has no token timing); latency and counts over all`;
}

/** `captures stats`' page: per run, its timing table. */
export function formatStats(runs: RunStats[]): string {
  return runs
    .map(
      (r) =>
        `run ${r.run}${r.engine ? ` (${inline(r.engine)})` : ''}${r.label ? ` ${inline(r.label)}` : ''}, started ${r.startedAt}\n${timingCoverage(r)}\n${formatReportTable(r.report)}`,
    )
    .join('\n\n');
}
