/**
 * `mocker captures list|show|export|import|merge|prune|stats`: thin shells over src/captures/ that parse flags
 * and print (a table, or JSON with `--json`).
 */
import { once } from 'node:events';
import { createReadStream, openSync } from 'node:fs';
import { Command, InvalidArgumentError, Option } from 'commander';
import { importCaptures, mergeCaptures, pruneCaptures, type PruneResult } from '../captures/edit.js';
import { captureStats, listCaptures, showExchange, type Listing, type RunStats, type Shown } from '../captures/inspect.js';
import { exportJsonl } from '../captures/jsonl.js';
import { parseAge, parseTimePoint, TimeArgumentError } from '../captures/time.js';
import { CaptureStore, namingCapture, type ExchangeFilter } from '../store/captureStore.js';
import { formatReportTable } from '../trace/report.js';
import { FileError } from '../util/fileError.js';
import { writeOutputFile } from '../util/outputFile.js';
import { terminalJson, terminalText } from '../util/terminalText.js';
import { forceOption } from './flags.js';
import { GROUPS } from './help.js';

function positiveInteger(what: string) {
  return (value: string) => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError(`${what} must be a positive integer, got "${value}"`);
    return n;
  };
}

function timePoint(flag: string) {
  return (value: string) => {
    try {
      return parseTimePoint(flag, value);
    } catch (err) {
      if (err instanceof TimeArgumentError) throw new InvalidArgumentError(err.message);
      throw err;
    }
  };
}

/** `--older-than`: an age (`30d`) or a date; exchanges started before that point. */
function olderThan(value: string): number {
  if (parseAge(value) === null && !/^\d{4}-/.test(value))
    throw new InvalidArgumentError(`--older-than: "${value}" is neither an age (30m, 12h, 7d) nor a date (2026-11-01)`);
  return timePoint('--older-than')(value);
}

const modelOption = () => new Option('--model <name>', 'only exchanges of this model');
const outcomeOption = () => new Option('--outcome <outcome>', 'only exchanges that ended so').choices(['complete', 'failed', 'aborted']);
const jsonOption = () => new Option('--json', 'print JSON instead of a table');

/** Reads a capture file: any failure, opening it or later (a damaged page), names the file. */
async function withReadonly<T>(file: string, work: (store: CaptureStore) => T | Promise<T>): Promise<T> {
  return namingCapture(file, async () => {
    const store = CaptureStore.open(file, { readonly: true });
    try {
      return await work(store);
    } finally {
      store.close();
    }
  });
}

function printJson(value: unknown): void {
  process.stdout.write(`${terminalJson(value)}\n`);
}

/** Prints a report: what came from the file cannot drive the terminal (single-line fields escape their newlines themselves). */
function print(text: string): void {
  console.log(terminalText(text, { keepNewlines: true }));
}

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

function printListing(file: string, l: Listing): void {
  const lines = [
    `${file}: ${l.total} exchanges (${l.outcomes.complete} complete, ${l.outcomes.failed} failed, ${l.outcomes.aborted} aborted; ${l.endpoints.chat} chat, ${l.endpoints.completion} completion${l.endpoints.other ? `, ${l.endpoints.other} other` : ''})`,
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
  print(lines.join('\n'));
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

function printShown(s: Shown): void {
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
  for (const c of s.choices) {
    lines.push(
      `choice ${c.index}: ${c.outputIds.length} tokens, finish_reason ${inline(c.finishReason ?? '-')}, stop_reason ${inline(JSON.stringify(c.stopReason))}`,
    );
    lines.push(`  text${c.textDecoded ? ' (decoded from the ids)' : ''}: ${JSON.stringify(c.text)}`, `  ids: ${JSON.stringify(c.outputIds)}`);
    const rows = c.chunks.map((k, i) => [i, ms(k.atMs), ms(k.gapMs), k.tokens, k.delta === undefined ? '' : JSON.stringify(k.delta)]);
    lines.push(indent(table(['chunk', 'at ms', 'gap ms', 'tokens', 'delta'], rows)));
  }
  if (s.usage !== null) lines.push(`usage: ${JSON.stringify(s.usage)}`);
  print(lines.join('\n'));
}

function printPrune(file: string, r: PruneResult): void {
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
  print(lines.join('\n'));
}

/** A JSONL input as bytes: a file (opened now, so that a missing one is said at once) or stdin (`-`). */
function inputBytes(path: string): AsyncIterable<Buffer> {
  if (path === '-') return process.stdin;
  try {
    return createReadStream(path, { fd: openSync(path, 'r'), highWaterMark: 1 << 20 });
  } catch (err) {
    throw new FileError(path, (err as NodeJS.ErrnoException).code === 'ENOENT' ? 'no such file' : (err as Error).message);
  }
}

async function writeStdout(text: string): Promise<void> {
  if (!process.stdout.write(text)) await once(process.stdout, 'drain');
}

const list = new Command('list')
  .description('What a capture file holds: runs, models, exchanges by outcome and endpoint, date range (filtered).')
  .argument('<file>', 'capture file')
  .optionsGroup(GROUPS.filters)
  .addOption(modelOption())
  .addOption(new Option('--endpoint <endpoint>', 'only exchanges of this endpoint').choices(['chat', 'completion', 'embeddings', 'rerank']))
  .addOption(outcomeOption())
  .option('--since <time>', 'only exchanges started at or after: a date (2026-11-01, ISO 8601) or an age (7d, 12h)', timePoint('--since'))
  .option('--until <time>', 'only exchanges started before: a date or an age', timePoint('--until'))
  .optionsGroup(GROUPS.output)
  .option('--exchanges', 'also list every selected exchange (id, run, endpoint, outcome, prompt tokens, duration)')
  .addOption(jsonOption())
  .action(async (file: string, o) => {
    const filter: ExchangeFilter = { model: o.model, endpoint: o.endpoint, outcome: o.outcome, since: o.since, until: o.until };
    const listing = await withReadonly(file, (store) => listCaptures(store, filter, o.exchanges === true));
    if (o.json) printJson({ file, ...listing });
    else printListing(file, listing);
  });

const show = new Command('show')
  .description('One exchange: request, prompt text and ids, output text and ids per choice, per-chunk timing, outcome.')
  .argument('<file>', 'capture file')
  .argument('<id>', 'exchange id (see list --exchanges)', positiveInteger('the exchange id'))
  .addOption(jsonOption())
  .action(async (file: string, id: number, o) => {
    const shown = await withReadonly(file, (store) => {
      const ex = store.getExchange(id);
      if (!ex) throw new Error(`no exchange ${id}`);
      return showExchange(store, ex);
    });
    if (o.json) printJson(shown);
    else printShown(shown);
  });

const exportCommand = new Command('export')
  .description('Write a capture file as JSONL (one exchange a line, lossless), for review and editing in git.')
  .argument('<file>', 'capture file')
  .option('-o, --output <file>', 'write here instead of stdout (written whole, or not at all)')
  .addOption(forceOption())
  .action(async (file: string, o: { output?: string; force?: boolean }) => {
    const { output } = o;
    if (output === undefined) await withReadonly(file, (store) => exportJsonl(store, writeStdout));
    else
      await writeOutputFile(output, { inputs: [file], force: o.force }, (write) =>
        withReadonly(file, (store) => exportJsonl(store, async (text) => write(text))),
      );
  });

const importCommand = new Command('import')
  .description('Read a JSONL export into a capture file: a new one, or new runs of an existing one.')
  .argument('<jsonl>', "JSONL from 'captures export' ('-': stdin)")
  .requiredOption('-o, --output <file>', 'capture file to write (created, or added to)')
  .addOption(forceOption())
  .addOption(jsonOption())
  .action(async (input: string, o) => {
    const result = await importCaptures(inputBytes(input), input === '-' ? 'stdin' : input, o.output, { inputs: input === '-' ? [] : [input], force: o.force });
    if (o.json) printJson({ file: o.output, ...result });
    else print(`${o.output}: imported ${result.exchanges} exchanges as run${result.runs.length === 1 ? '' : 's'} ${result.runs.join(', ')}`);
  });

const merge = new Command('merge')
  .description('Copy several capture files into a new one: every exchange kept, each run kept apart, duplicates reported.')
  .argument('<files...>', 'capture files to merge')
  .requiredOption('-o, --output <file>', 'the merged capture file (a new file)')
  .addOption(forceOption())
  .addOption(jsonOption())
  .action(async (files: string[], o) => {
    const result = await mergeCaptures(files, o.output, { force: o.force });
    if (o.json) return printJson({ file: o.output, ...result });
    const lines = [
      `${o.output}: ${result.exchanges} exchanges in ${result.runs} runs from ${files.length} files; ${result.duplicates} duplicates (same model and request body) in ${result.duplicateGroups.length} groups`,
    ];
    for (const g of result.duplicateGroups)
      lines.push(`  ${inline(g.model ?? '-')}: ${g.exchanges.map((e) => `${e.file}#${e.id} (now #${e.mergedId})`).join(' = ')}`);
    print(lines.join('\n'));
  });

const prune = new Command('prune')
  .description('Remove exchanges by age, model, outcome or run (runs left empty too), then VACUUM the file.')
  .argument('<file>', 'capture file')
  .optionsGroup(GROUPS.filters)
  .option('--older-than <age>', 'exchanges started before this age (30d, 12h) or date ago', olderThan)
  .addOption(modelOption())
  .addOption(outcomeOption())
  .option('--run <id>', 'exchanges of this run', positiveInteger('--run'))
  .optionsGroup(GROUPS.output)
  .option('--dry-run', 'only print what would be removed')
  .addOption(jsonOption())
  .action((file: string, o) => {
    const filter: ExchangeFilter = { until: o.olderThan, model: o.model, outcome: o.outcome, runId: o.run };
    if (Object.values(filter).every((v) => v === undefined)) throw new Error('captures prune: name what to remove (--older-than, --model, --outcome or --run)');
    const result = namingCapture(file, () => pruneCaptures(file, filter, o.dryRun === true));
    if (o.json) printJson({ file, ...result });
    else printPrune(file, result);
  });

/** Which exchanges the timing figures are over: a non-streamed answer has no first token or gaps. */
function timingCoverage({ exchanges: { streamed, notStreamed } }: RunStats): string {
  const counts = `${streamed} streamed, ${notStreamed} not streamed generation exchanges`;
  if (notStreamed === 0) return counts;
  if (streamed === 0) return `${counts}: no TTFT, ITL or per-user token rate (a non-streamed answer has no token timing); latency and counts over all`;
  return `${counts}: TTFT, ITL and per-user token rate over the ${streamed} streamed only (a non-streamed answer has no token timing); latency and counts over all`;
}

const stats = new Command('stats')
  .description("Per run, TTFT / ITL / latency / throughput distributions of the captured timing, as mocker trace's report.")
  .argument('<file>', 'capture file')
  .optionsGroup(GROUPS.filters)
  .option('--run <id>', 'only this run', positiveInteger('--run'))
  .optionsGroup(GROUPS.output)
  .addOption(jsonOption())
  .action(async (file: string, o) => {
    const runs = await withReadonly(file, (store) => {
      if (o.run !== undefined && !store.getRun(o.run)) throw new Error(`no run ${o.run}`);
      return captureStats(store, o.run);
    });
    if (o.json) return printJson({ file, runs });
    print(
      runs
        .map(
          (r) =>
            `run ${r.run}${r.engine ? ` (${inline(r.engine)})` : ''}${r.label ? ` ${inline(r.label)}` : ''}, started ${r.startedAt}\n${timingCoverage(r)}\n${formatReportTable(r.report)}`,
        )
        .join('\n\n'),
    );
  });

export {
  list as capturesList,
  show as capturesShow,
  exportCommand as capturesExport,
  importCommand as capturesImport,
  merge as capturesMerge,
  prune as capturesPrune,
  stats as capturesStats,
};
