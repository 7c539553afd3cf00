/** `mocker captures fit FILE -o profile.npz [--validate]`: flags in, the fit (captures/fit.ts) and its validation (captures/validate.ts), the reports out. */
import { Command, Option } from 'commander';
import type { FitCommandOptions } from '../captures/fit.js';
import { applyExtraEngineArgs, DEFAULT_ENGINE_ARGS, schedulerConfig } from '../config/engineArgs.js';
import { terminalJson, terminalText } from '../util/terminalText.js';
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
    .option('--validate', 'fit on the first part of the capture, replay the rest through the fitted simulator and print its TTFT, ITL and E2E errors')
    .option(
      '--holdout-fraction <f>',
      'with --validate: the last this fraction of the streamed requests (by send time) is held out',
      numericFlag('--holdout-fraction', { above: 0, below: 1 }),
      0.3,
    )
    .option('--validate-against <file>', 'with --validate: fit on all of FILE and validate against this second capture file')
    .option('--report-html <file>', 'with --validate: also write the validation as one self-contained HTML page with its charts')
    .option(
      '--extra-engine-args <json|path>',
      'with --validate: the simulated engine as serve\'s --extra-engine-args, e.g. \'{"engine_type":"llamacpp","max_num_seqs":4}\' (absent: serve\'s settings)',
    )
    .optionsGroup(GROUPS.output)
    .option('-o, --output <file>', 'where the NPZ goes (written whole, or not at all); required without --validate')
    .addOption(forceOption())
    .option('--json', 'the fit report as JSON')
    .action(async (file: string, o: FitFlags) => {
      if (o.output === undefined && !o.validate) throw new Error('-o, --output is required (where the NPZ goes), unless --validate');
      for (const [flag, given] of [
        ['--validate-against', o.validateAgainst],
        ['--report-html', o.reportHtml],
        ['--extra-engine-args', o.extraEngineArgs],
      ] as const)
        if (given !== undefined && !o.validate) throw new Error(`${flag} needs --validate`);
      const report: Record<string, unknown> = {};
      if (o.output !== undefined) {
        // Imported when it runs (see program.ts).
        const { fitCaptureFile, formatFitReport } = await import('../captures/fit.js');
        const fit = await fitCaptureFile(file, { ...o, output: o.output });
        // Written all the same (the user asked for this capture's profile), but the reader is told it is weak.
        for (const warning of fit.warnings) console.error(`mocker captures fit: warning: ${warning}`);
        if (o.json) Object.assign(report, { output: o.output, ...withoutTables(fit) });
        else console.log(terminalText(formatFitReport(fit, o.output), { keepNewlines: true }));
      }
      if (o.validate) await validate(file, o, report);
      if (o.json) console.log(terminalJson(report));
    });
}

type FitFlags = Omit<FitCommandOptions, 'output'> & {
  output?: string;
  json?: boolean;
  validate?: boolean;
  holdoutFraction: number;
  validateAgainst?: string;
  reportHtml?: string;
  extraEngineArgs?: string;
};

const withoutTables = <T extends { tables: unknown }>({ tables: _tables, ...rest }: T) => rest;

async function validate(file: string, o: FitFlags, report: Record<string, unknown>): Promise<void> {
  const base = { ...DEFAULT_ENGINE_ARGS, blockSize: o.blockSize };
  const engine = o.extraEngineArgs === undefined ? base : applyExtraEngineArgs(base, o.extraEngineArgs);
  const [{ formatValidation, validateFit }, { validationHtml }, { modelTiming }, { writeOutputFile }] = await Promise.all([
    import('../captures/validate.js'),
    import('../captures/validationReport.js'),
    import('../engine/index.js'),
    import('../util/outputFile.js'),
  ]);
  const validation = validateFit(file, {
    ...o,
    against: o.validateAgainst,
    scheduler: (model) => schedulerConfig(engine, modelTiming(model, 1, 1), 0),
  });
  for (const warning of validation.fit.warnings) console.error(`mocker captures fit: warning (validation fit): ${warning}`);
  if (o.reportHtml !== undefined) {
    const html = validationHtml(validation, `mocker captures fit --validate: ${file}`);
    await writeOutputFile(o.reportHtml, { inputs: [file, o.validateAgainst], force: o.force }, (write) => write(html));
  }
  if (o.json) report.validation = { ...validation, fit: withoutTables(validation.fit) };
  else console.log(terminalText(formatValidation(validation), { keepNewlines: true }));
}
