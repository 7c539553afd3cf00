import { z } from 'zod';
import type { GroupKey } from './groups.js';

/**
 * One setting, defined once: the flag (commander's syntax), what its value may be, its default, its help and
 * help group, where the value goes in the command's options, and its names elsewhere — Dynamo's
 * MockEngineArgs key (`--extra-engine-args`) and the key of `/mocker/engine`'s settings view. The CLI's
 * options, the `MOCKER_*` variables, the Dynamo key mapping, the settings view and docs/cli.md all come from
 * these entries.
 */
export interface Setting {
  /** commander's flags: `--watermark <fraction>`, `--enable-lora`, `--served-model-name <name...>`. */
  flags: string;
  help: string;
  group: GroupKey;
  value?: ValueSpec;
  /** The value when the flag is left out (with `later`: the value the options get, the flag staying unset). */
  default?: unknown;
  /** A default worked out when the command runs (from other flags, the capture file…): the text help shows. */
  later?: string;
  /** The command cannot run without it. */
  required?: boolean;
  /** A boolean flag's `--no-` form, with its help. */
  negation?: string;
  /** Each use adds a value to a list (the default list included). */
  repeatable?: boolean;
  /** Where the value goes in the command's options (a dotted path); none: a rule of `resolve` reads it. */
  to?: string;
  /** Dynamo's MockEngineArgs key that sets the same value (`sglang.page_size` for nested keys). */
  dynamo?: DynamoKey;
  /** Changeable at run time through `/mocker/config` (under the flag's name in snake case). */
  control?: boolean;
  /** The key of the settings view (`/mocker/engine`'s `config`); shown only for `--engine-type sglang` when `sglangOnly`. */
  view?: string;
  sglangOnly?: boolean;
  /**
   * Another tool's flag for a setting here (Dynamo's `--model-path` for `--model`): its value, parsed as that
   * setting's (or `value` when it takes none, `--verbose` for `--log-level debug`), goes to the setting named `of`.
   */
  alias?: { of: string; value?: unknown };
  /** Another tool's flag with no meaning here: using it stops the command with this line (what to use instead). */
  refused?: string;
}

/** A Dynamo key: its JSON values may also be null where `nullable` (`'unset'`: null leaves the setting unset). */
export interface DynamoKey {
  key: string;
  nullable?: boolean | 'unset';
  /** A key that configures the server, not the scheduler: refused in engine args, naming the flag to use. */
  asFlag?: string;
  /** The key's schema when it is not the flag's (a JSON object where the flag takes a file or inline JSON). */
  schema?: z.ZodType;
}

/** Numeric bounds: `min` and `max` inclusive, `above` and `below` exclusive. */
export interface NumberBounds {
  integer?: boolean;
  min?: number;
  max?: number;
  above?: number;
  below?: number;
}

/** What a flag's value may be, from which its text parser and its JSON schema both come. */
export type ValueSpec =
  | ({ type: 'number' } & NumberBounds)
  | { type: 'choice'; choices: readonly string[] }
  /** Text with a parser of its own (JSON, lists, URLs…); errors are Error with a message naming the flag. */
  | { type: 'parsed'; parse: (text: string, flag: string) => unknown };

export const int = (bounds: Omit<NumberBounds, 'integer'> = {}): ValueSpec => ({ type: 'number', integer: true, ...bounds });
export const num = (bounds: Omit<NumberBounds, 'integer'> = {}): ValueSpec => ({ type: 'number', ...bounds });
export const choice = (choices: readonly string[]): ValueSpec => ({ type: 'choice', choices });
export const parsed = (parse: (text: string, flag: string) => unknown): ValueSpec => ({ type: 'parsed', parse });

/** The long flag of a setting: `--watermark <fraction>` → `--watermark`, `-v, --verbose` → `--verbose`. */
export const longFlag = (setting: Setting): string => setting.flags.split(/[ ,]+/).find((f) => f.startsWith('--'))!;

/** commander's attribute name of a flag: `--max-num-seqs` → `maxNumSeqs`. */
export const attributeName = (flag: string): string => flag.replace(/^--/, '').replace(/-([a-z])/g, (_, c: string) => c.toUpperCase());

/** A number within bounds, or an error naming the flag (as the CLI has always said it). */
export function parseNumber(
  flag: string,
  value: string,
  { integer = false, min = -Infinity, max = Infinity, above = -Infinity, below = Infinity }: NumberBounds,
): number {
  const n = Number(value);
  if (!Number.isFinite(n) || (integer && !Number.isInteger(n)) || n < min || n > max || n <= above || n >= below) {
    const bounds = [min > -Infinity && `>= ${min}`, above > -Infinity && `> ${above}`, max < Infinity && `<= ${max}`, below < Infinity && `< ${below}`]
      .filter(Boolean)
      .join(' and ');
    throw new Error(`${flag} must be ${integer ? 'an integer' : 'a number'}${bounds ? ` ${bounds}` : ''}, got "${value}"`);
  }
  return n;
}

/** A setting's value from text (a flag's argument, a `MOCKER_*` variable); errors name the flag. */
export function parseText(setting: Setting, value: string): unknown {
  const spec = setting.value;
  const flag = longFlag(setting);
  if (spec?.type === 'number') return parseNumber(flag, value, spec);
  if (spec?.type === 'parsed') return spec.parse(value, flag);
  // commander checks a flag's choices itself; other callers (trace --sweep's values) rely on this.
  if (spec?.type === 'choice' && !spec.choices.includes(value)) throw new Error(`${flag} must be one of ${spec.choices.join(', ')}, got "${value}"`);
  return value;
}

/** The JSON schema of a setting's Dynamo key, from the same spec as its flag. */
export function jsonSchema(setting: Setting): z.ZodType {
  const dynamo = setting.dynamo!;
  let schema: z.ZodType;
  const spec = setting.value;
  if (dynamo.schema) schema = dynamo.schema;
  else if (spec?.type === 'number') {
    let n = spec.integer ? z.number().int() : z.number();
    if (spec.min !== undefined) n = n.min(spec.min);
    if (spec.max !== undefined) n = n.max(spec.max);
    if (spec.above !== undefined) n = n.gt(spec.above);
    if (spec.below !== undefined) n = n.lt(spec.below);
    schema = n;
  } else if (spec?.type === 'choice') schema = z.enum(spec.choices as [string, ...string[]]);
  // A flag without a value spec is a switch, unless it takes an argument (`--planner-profile-data <path>`): text.
  else if (spec === undefined && !setting.flags.includes('<')) schema = z.boolean();
  else schema = z.string();
  return dynamo.nullable ? schema.nullable() : schema;
}

/** Reads a dotted path of an object. */
export function getPath(object: object, path: string): unknown {
  return path.split('.').reduce<unknown>((o, key) => (o === undefined || o === null ? undefined : (o as Record<string, unknown>)[key]), object);
}

/** Writes a dotted path of an object, creating the objects on the way. */
export function setPath(object: Record<string, unknown>, path: string, value: unknown): void {
  const keys = path.split('.');
  let o = object;
  for (const key of keys.slice(0, -1)) {
    if (typeof o[key] !== 'object' || o[key] === null) o[key] = {};
    o = o[key] as Record<string, unknown>;
  }
  o[keys.at(-1)!] = value;
}

/** The options a command's settings make of its flag values (by commander attribute name): each value at its `to`. */
export function optionsFrom(settings: readonly Setting[], values: Record<string, unknown>): Record<string, unknown> {
  const options: Record<string, unknown> = {};
  for (const setting of settings) {
    const flag = longFlag(setting);
    // A `--no-x` flag of its own (not a setting's negation): commander stores it as x = false.
    const value = flag.startsWith('--no-') ? (values[attributeName(`--${flag.slice(5)}`)] === false ? true : undefined) : values[attributeName(flag)];
    if (setting.to !== undefined && value !== undefined) setPath(options, setting.to, value);
  }
  return options;
}

/** The defaults of a command's settings, at their `to` (what a caller that gives only some options gets for the others). */
export function defaultsOf(settings: readonly Setting[]): Record<string, unknown> {
  const options: Record<string, unknown> = {};
  for (const setting of settings) if (setting.to !== undefined && setting.default !== undefined) setPath(options, setting.to, structuredClone(setting.default));
  return options;
}
