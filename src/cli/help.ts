/**
 * How options read in `--help` and in docs/cli.md (scripts/cli-docs.ts): one style for every command — a
 * mandatory option says `required`, choices and defaults come in commander's own `(choices: …, default: …)`,
 * including the defaults a command resolves when it runs (from other flags, the capture file, the
 * environment), which have only a text (`laterDefault`).
 */
import type { Command, Option } from 'commander';

export { GROUPS } from '../config/groups.js';

/**
 * An option whose default the command works out when it runs: the option keeps no value when left out (the
 * command sees `undefined`), and help shows `text` where commander shows a default value.
 */
export function laterDefault(option: Option, text: string): Option {
  return option.default(undefined, text);
}

/** The default an option's help shows, or none: commander's rule, plus the defaults resolved at run time. */
export function optionDefault(option: Option): string | undefined {
  if (option.defaultValue === undefined) return option.defaultValueDescription;
  // commander's rule: a flag without a value shows its default only when the default is a boolean.
  const shown = option.required || option.optional || (option.isBoolean() && typeof option.defaultValue === 'boolean');
  return shown ? option.defaultValueDescription || JSON.stringify(option.defaultValue) : undefined;
}

const optionChoices = (option: Option): string | undefined => option.argChoices?.map((choice) => JSON.stringify(choice)).join(', ');

/** An option's description as `--help` prints it: `… (required, choices: …, default: …)`. */
export function optionDescription(option: Option): string {
  const choices = optionChoices(option);
  const byDefault = optionDefault(option);
  const extra = [option.mandatory && 'required', choices !== undefined && `choices: ${choices}`, byDefault !== undefined && `default: ${byDefault}`].filter(
    Boolean,
  );
  return extra.length > 0 ? `${option.description} (${extra.join(', ')})` : option.description;
}

/** The command and its subcommands, depth first. */
export const everyCommand = (command: Command): Command[] => [command, ...command.commands.flatMap(everyCommand)];

/** Every command of the program prints its options in this style (commander copies no help setting to an added command). */
export function useOptionStyle(program: Command): void {
  for (const command of everyCommand(program)) command.configureHelp({ optionDescription });
}
