/**
 * `mocker captures list|show|export|import|merge|prune|stats`: thin shells over src/captures/ that parse flags
 * and print (a table, or JSON with `--json`).
 */
import { once } from 'node:events';
import { Command, InvalidArgumentError, Option } from 'commander';
import { parseAge, parseTimePoint, TimeArgumentError } from '../captures/time.js';
import type { ExchangeFilter } from '../store/captureStore.js';
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

// The implementations are imported when a command runs (see program.ts).
const edit = () => import('../captures/edit.js');
const format = () => import('../captures/format.js');
const inspect = () => import('../captures/inspect.js');
const outputFile = () => import('../util/outputFile.js');

const modelOption = () => new Option('--model <name>', 'only exchanges of this model');
const outcomeOption = () => new Option('--outcome <outcome>', 'only exchanges that ended so').choices(['complete', 'failed', 'aborted']);
const jsonOption = () => new Option('--json', 'print JSON instead of a table');

function printJson(value: unknown): void {
  process.stdout.write(`${terminalJson(value)}\n`);
}

/** Prints a report: what came from the file cannot drive the terminal (single-line fields escape their newlines themselves). */
function print(text: string): void {
  console.log(terminalText(text, { keepNewlines: true }));
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
    const [{ listCaptures }, { formatListing }] = await Promise.all([inspect(), format()]);
    const listing = await listCaptures(file, filter, o.exchanges === true);
    if (o.json) printJson({ file, ...listing });
    else print(formatListing(file, listing));
  });

const show = new Command('show')
  .description('One exchange: request, prompt text and ids, output text and ids per choice, per-chunk timing, outcome.')
  .argument('<file>', 'capture file')
  .argument('<id>', 'exchange id (see list --exchanges)', positiveInteger('the exchange id'))
  .addOption(jsonOption())
  .action(async (file: string, id: number, o) => {
    const [{ showExchange }, { formatShown }] = await Promise.all([inspect(), format()]);
    const shown = await showExchange(file, id);
    if (o.json) printJson(shown);
    else print(formatShown(shown));
  });

const exportCommand = new Command('export')
  .description('Write a capture file as JSONL (one exchange a line, lossless), for review and editing in git.')
  .argument('<file>', 'capture file')
  .option('-o, --output <file>', 'write here instead of stdout (written whole, or not at all)')
  .addOption(forceOption())
  .action(async (file: string, o: { output?: string; force?: boolean }) => {
    const { output } = o;
    const [{ exportCaptures }, { writeOutputFile }] = await Promise.all([inspect(), outputFile()]);
    if (output === undefined) await exportCaptures(file, writeStdout);
    else await writeOutputFile(output, { inputs: [file], force: o.force }, (write) => exportCaptures(file, async (text) => write(text)));
  });

const importCommand = new Command('import')
  .description('Read a JSONL export into a capture file: a new one, or new runs of an existing one.')
  .argument('<jsonl>', "JSONL from 'captures export' ('-': stdin)")
  .requiredOption('-o, --output <file>', 'capture file to write (created, or added to)')
  .addOption(forceOption())
  .addOption(jsonOption())
  .action(async (input: string, o) => {
    const [{ importCaptures }, { jsonlInput }] = await Promise.all([edit(), import('../captures/jsonl.js')]);
    const result = await importCaptures(jsonlInput(input), input === '-' ? 'stdin' : input, o.output, { inputs: input === '-' ? [] : [input], force: o.force });
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
    const [{ mergeCaptures }, { formatMerge }] = await Promise.all([edit(), format()]);
    const result = await mergeCaptures(files, o.output, { force: o.force });
    if (o.json) return printJson({ file: o.output, ...result });
    print(formatMerge(o.output, files.length, result));
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
  .action(async (file: string, o) => {
    const filter: ExchangeFilter = { until: o.olderThan, model: o.model, outcome: o.outcome, runId: o.run };
    if (Object.values(filter).every((v) => v === undefined)) throw new Error('captures prune: name what to remove (--older-than, --model, --outcome or --run)');
    const [{ pruneCaptures }, { formatPrune }, { namingCapture }] = await Promise.all([edit(), format(), import('../store/captureStore.js')]);
    const result = namingCapture(file, () => pruneCaptures(file, filter, o.dryRun === true));
    if (o.json) printJson({ file, ...result });
    else print(formatPrune(file, result));
  });

const stats = new Command('stats')
  .description("Per run, TTFT / ITL / latency / throughput distributions of the captured timing, as mocker trace's report.")
  .argument('<file>', 'capture file')
  .optionsGroup(GROUPS.filters)
  .option('--run <id>', 'only this run', positiveInteger('--run'))
  .optionsGroup(GROUPS.output)
  .addOption(jsonOption())
  .action(async (file: string, o) => {
    const [{ captureStats }, { formatStats }] = await Promise.all([inspect(), format()]);
    const runs = await captureStats(file, o.run);
    if (o.json) return printJson({ file, runs });
    print(formatStats(runs));
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
