import { isDeepStrictEqual } from 'node:util';
import { type Command, InvalidArgumentError, Option } from 'commander';
import { GROUPS } from '../config/groups.js';
import { attributeName, longFlag, parseText, type Setting } from '../config/settings.js';
import { isGiven } from './environment.js';
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

/** An alias parses its value as the setting it stands for does (unless it gives the value itself). */
function asAlias(setting: Setting, settings: readonly Setting[]): Setting {
  if (setting.alias === undefined || setting.alias.value !== undefined) return setting;
  const target = settings.find((s) => longFlag(s) === setting.alias!.of);
  if (target === undefined) throw new Error(`the settings table's ${longFlag(setting)} stands for ${setting.alias.of}, which the command has not`);
  return { ...setting, value: target.value };
}

/**
 * Before the command runs (after the environment is applied): a refused flag stops it with its line; an alias's
 * value goes to its setting, unless that setting is given too, which must then agree. A `--no-x` flag shares x's
 * attribute (commander's rule), set to false.
 */
function applyCompatibility(command: Command, settings: readonly Setting[]): void {
  const used = (setting: Setting) => {
    const option = new Option(setting.flags);
    const attribute = option.attributeName();
    const value = command.getOptionValue(attribute);
    return isGiven(command, attribute) && (option.negate ? value === false : value !== false) ? { attribute, value } : null;
  };
  for (const setting of settings) {
    if (setting.refused !== undefined && used(setting)) throw new InvalidArgumentError(`${longFlag(setting)} is not supported: ${setting.refused}`);
  }
  for (const setting of settings) {
    const alias = setting.alias;
    const given = alias && used(setting);
    if (!alias || !given) continue;
    const value = alias.value ?? given.value;
    const target = attributeName(alias.of);
    if (!isGiven(command, target)) command.setOptionValueWithSource(target, value, command.getOptionValueSource(given.attribute)!);
    else if (!isDeepStrictEqual(command.getOptionValue(target), value))
      throw new InvalidArgumentError(`${longFlag(setting)} and ${alias.of} ask for different values: give one`);
  }
}

/** Adds the settings' options to a command, in order, and applies its aliases and refusals before it runs. */
export function addSettings(command: Command, settings: readonly Setting[]): Command {
  for (const setting of settings) for (const option of optionsOf(asAlias(setting, settings))) command.addOption(option);
  const compatibility = settings.filter((s) => s.alias !== undefined || s.refused !== undefined);
  if (compatibility.length > 0) command.hook('preAction', () => applyCompatibility(command, compatibility));
  return command;
}
