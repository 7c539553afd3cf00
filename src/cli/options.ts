import { type Command, InvalidArgumentError, Option } from 'commander';
import { GROUPS } from '../config/groups.js';
import { longFlag, parseText, type Setting } from '../config/settings.js';
import { laterDefault } from './help.js';

/** A setting's text parser for commander: its errors become commander's "argument is invalid" messages. */
function parserOf(setting: Setting): ((value: string, previous: unknown) => unknown) | undefined {
  const parse = (value: string) => {
    try {
      return parseText(setting, value);
    } catch (err) {
      throw new InvalidArgumentError((err as Error).message);
    }
  };
  const variadic = setting.flags.includes('...>');
  if (setting.repeatable) return (value, previous) => [...((previous as unknown[] | undefined) ?? []), parse(value)];
  if (variadic) return setting.value ? (value, previous) => [...((previous as unknown[] | undefined) ?? []), parse(value)] : undefined;
  return setting.value?.type === 'number' || setting.value?.type === 'parsed' ? (value) => parse(value) : undefined;
}

/** The commander options of a setting (a boolean with a `--no-` form has two). */
export function optionsOf(setting: Setting): Option[] {
  let option = new Option(setting.flags, setting.help);
  if (setting.value?.type === 'choice') option.choices(setting.value.choices);
  if (setting.required) option.makeOptionMandatory();
  const parse = parserOf(setting);
  if (parse) option.argParser(parse);
  if (setting.later !== undefined) option = laterDefault(option, setting.later);
  else if (setting.default !== undefined) option.default(setting.default);
  const options = [option];
  if (setting.negation !== undefined) options.push(new Option(`--no-${longFlag(setting).slice(2)}`, setting.negation));
  return options.map((o) => o.helpGroup(GROUPS[setting.group]));
}

/** Adds the settings' options to a command, in order. */
export function addSettings(command: Command, settings: readonly Setting[]): Command {
  for (const setting of settings) for (const option of optionsOf(setting)) command.addOption(option);
  return command;
}
