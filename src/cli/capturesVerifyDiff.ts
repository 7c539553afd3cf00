/** `mocker captures verify FILE` and `mocker captures diff A B`: flags in, a library call, the report out. */
import { Command } from 'commander';
import { terminalJson, terminalText } from '../util/terminalText.js';
import { COULD_NOT_RUN, ExitError } from '../util/exitError.js';
import { number } from './flags.js';
import { GROUPS } from './help.js';

const limit = number('--limit', { integer: true, min: 1 });

const DEFAULT_LIMIT = 20;

const printReport = (json: boolean, report: object, format: () => string) =>
  console.log(json ? terminalJson(report) : terminalText(format(), { keepNewlines: true }));

export function capturesVerifyCommand(): Command {
  return new Command('verify')
    .description(
      "Render every complete exchange again from its stored token ids with mocker's own rendering and compare with the captured bytes; exit 1 on any mismatch.",
    )
    .argument('<file>', 'capture file (SQLite)')
    .option('--json', 'print the report as JSON')
    .option('--limit <n>', `describe at most n mismatching exchanges (all are counted)`, limit, DEFAULT_LIMIT)
    .action(async (file: string, o: { json?: boolean; limit: number }) => {
      // Imported when it runs (see program.ts).
      const { formatVerifyReport, verifyCaptures } = await import('../captures/verify.js');
      const report = await verifyCaptures(file, { limit: o.limit });
      printReport(o.json === true, report, () => formatVerifyReport(report));
      process.exitCode = report.mismatched > 0 ? 1 : 0;
    });
}

export function capturesDiffCommand(): Command {
  return new Command('diff')
    .description(
      'Pair the exchanges of two capture files by request and report prompts tokenized differently, outputs that differ, requests only in one file and the TTFT/ITL shift; exit 1 on any difference but timing, 2 when a file cannot be read.',
    )
    .argument('<a>', 'capture file A (the reference)')
    .argument('<b>', 'capture file B')
    .optionsGroup(GROUPS.pairing)
    .option('--by-prompt', 'pair by model and prompt token ids instead of model and request body')
    .optionsGroup(GROUPS.output)
    .option('--json', 'print the report as JSON')
    .option('--limit <n>', `describe at most n of each kind of difference (all are counted)`, limit, DEFAULT_LIMIT)
    .action(async (a: string, b: string, o: { byPrompt?: boolean; json?: boolean; limit: number }) => {
      const { diffCaptures, formatDiffReport } = await import('../captures/diff.js');
      const report = await diffCaptures(a, b, { byPrompt: o.byPrompt === true, limit: o.limit }).catch((err: Error) => {
        throw new ExitError(err.message, COULD_NOT_RUN);
      });
      printReport(o.json === true, report, () => formatDiffReport(report));
      process.exitCode = report.differs ? 1 : 0;
    });
}
