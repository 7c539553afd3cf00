/** `mocker captures fit FILE -o profile.npz`: flags in, the fit (captures/fit.ts), the report out. */
import { Command, Option } from 'commander';
import { fitCaptureFile, formatFitReport, type FitCommandOptions } from '../captures/fit.js';
import { terminalJson, terminalText } from '../util/terminalText.js';
import { DEFAULT_ENGINE_ARGS } from '../config/engineArgs.js';
import { forceOption, number as numericFlag } from './flags.js';
import { GROUPS, laterDefault } from './help.js';

export function fitCommand(): Command {
  return new Command('fit')
    .description("Learn the perf model from a capture's timings and write the NPZ that serve --planner-profile-data reads.")
    .argument('<file>', 'capture file (SQLite), only read')
    .optionsGroup(GROUPS.fit)
    .option(
      '--block-size <n>',
      'block size the profile will be served with, at least 2 (active KV is counted in whole blocks)',
      numericFlag('--block-size', { integer: true, min: 2 }),
      DEFAULT_ENGINE_ARGS.blockSize,
    )
    .addOption(
      laterDefault(
        new Option('--run <id>', 'only this capture run (repeatable)').argParser((v: string, previous: number[] = []) => [
          ...previous,
          numericFlag('--run', { integer: true, min: 1 })(v),
        ]),
        'all',
      ),
    )
    .option('--model <name>', "fitting points only from this model's requests (all requests still occupy the engine)")
    .optionsGroup(GROUPS.output)
    .requiredOption('-o, --output <file>', 'where the NPZ goes (written whole, or not at all)')
    .addOption(forceOption())
    .option('--json', 'the fit report as JSON')
    .action(async (file: string, o: FitCommandOptions & { json?: boolean }) => {
      const fit = await fitCaptureFile(file, o);
      // Written all the same (the user asked for this capture's profile), but the reader is told it is weak.
      for (const warning of fit.warnings) console.error(`mocker captures fit: warning: ${warning}`);
      if (o.json) {
        const { tables: _tables, ...report } = fit;
        console.log(terminalJson({ output: o.output, ...report }));
      } else console.log(terminalText(formatFitReport(fit, o.output), { keepNewlines: true }));
    });
}
