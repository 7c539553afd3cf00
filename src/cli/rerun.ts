/**
 * `mocker rerun GOLDEN --target URL`: flags in, the rerun (app/rerun.ts) run through `capture`'s proxy. Exit 0: no
 * regression; 1: regressions; 2: it could not run.
 */
import { Command, Option } from 'commander';
import type { RerunOptions } from '../app/rerun.js';
import { COULD_NOT_RUN, ExitError } from '../util/exitError.js';
import { forceOption, number } from './flags.js';
import { GROUPS, laterDefault } from './help.js';
import { DEFAULT_UPSTREAM_TIMEOUT_MS } from '../config/commonSettings.js';

const DEFAULT_LIMIT = 20;

export function rerunCommand(): Command {
  const command = new Command('rerun')
    .description(
      "Send a golden capture's requests again, each as its client sent it, to a new build (--target), record its answers as a new capture file, and report what changed: " +
        'prompt token ids (preprocessing), outputs, timing. Exit 0: no regression; 1: regressions; 2: it could not run.',
    )
    .argument('<file>', 'the golden capture file (read only)')
    .optionsGroup(GROUPS.target)
    .requiredOption('--target <url>', 'the server to check (any engine `capture` speaks to)')
    .option(
      '--header <header>',
      'add this header to every request ("Name: value"; repeatable); stored secrets never exist, so keys come from here or --api-key',
      (v: string, prev: string[]) => [...prev, v],
      [] as string[],
    )
    .addOption(laterDefault(new Option('--api-key <key>', 'send Authorization: Bearer <key>'), '$OPENAI_API_KEY when set'))
    .option(
      '--upstream-timeout <ms>',
      'give up on an answer after this long without a byte from the target',
      number('--upstream-timeout', { integer: true, min: 1 }),
      DEFAULT_UPSTREAM_TIMEOUT_MS,
    )
    .option('--upstream-ca-certs <file>', "CA certificates (PEM) an https: target's certificate is checked against, instead of Node's")
    .optionsGroup(GROUPS.pacing)
    .option('--concurrency <n>', 'requests in flight at once, each sent when one ends', number('--concurrency', { integer: true, min: 1 }), 1)
    .addOption(new Option('--as-captured', 'send each request at its captured arrival time instead (see --speedup)').conflicts('concurrency'))
    .option('--speedup <x>', 'with --as-captured: divide the captured arrival times by x', number('--speedup', { above: 0 }), 1)
    .optionsGroup(GROUPS.output)
    .addOption(
      laterDefault(new Option('-o, --output <file>', "the new capture file of the target's answers (never an existing file)"), 'captures/rerun-<UTC time>.db'),
    )
    .option('--json', 'print the report as JSON')
    .option('--junit <file>', 'also write the report as JUnit XML, one test case per exchange (for CI systems)')
    .option('--report-html <file>', 'also write the report as one self-contained HTML page: the exchanges side by side, timing CDFs')
    .option('--limit <n>', 'describe at most n differing exchanges (all are counted)', number('--limit', { integer: true, min: 1 }), DEFAULT_LIMIT)
    .addOption(forceOption())
    .action(async (file: string, o: RerunOptions) => {
      // Imported when it runs (see program.ts).
      const { runRerun } = await import('../app/rerun.js');
      process.exitCode = await runRerun(file, o);
    });
  // A usage error is one more way of not running: 2, as every other.
  command.configureOutput({ outputError: () => undefined }).exitOverride((err) => {
    if (err.exitCode === 0) process.exit(0);
    throw new ExitError(err.message.replace(/^error: /, ''), COULD_NOT_RUN);
  });
  return command;
}
