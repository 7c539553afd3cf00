import { join } from 'node:path';
import { InvalidArgumentError, type Command, type Option } from 'commander';

/**
 * Configuration by environment: every flag of every command as `MOCKER_<FLAG>` (`--max-num-seqs` →
 * `MOCKER_MAX_NUM_SEQS`), and for `serve` the variables of vLLM's mock model for NPUs (vLLM's NPU mock model), so that its
 * users keep their scripts. Precedence: a flag on the command line, then `MOCKER_<FLAG>`, then a variable of vLLM's NPU mock model
 * variable, then the default.
 */

export const ENV_PREFIX = 'MOCKER_';

/** A flag's variable: `--no-progress` → MOCKER_NO_PROGRESS. */
export function envName(option: Option): string {
  return ENV_PREFIX + option.long!.replace(/^--/, '').replaceAll('-', '_').toUpperCase();
}

const TRUE = ['1', 'true', 'yes', 'on'];
const FALSE = ['0', 'false', 'no', 'off', ''];

function truth(variable: string, value: string): boolean {
  const v = value.trim().toLowerCase();
  if (TRUE.includes(v)) return true;
  if (FALSE.includes(v)) return false;
  throw new InvalidArgumentError(`${variable} must be one of ${[...TRUE, ...FALSE.filter(Boolean)].join(', ')} (or empty), got "${value}"`);
}

/** Options a variable can set: the flags with a long name, not --help or --version. */
function settable(command: Command): Option[] {
  return command.options.filter((o) => o.long !== undefined && o.long !== '--help' && o.long !== '--version');
}

/** Sets one option from text, as commander would from the command line, but with source `env`. */
function setFromText(command: Command, option: Option, text: string, variable: string): void {
  const attribute = option.attributeName();
  if (option.isBoolean() || option.negate) {
    // `--x` sets x, `--no-x` clears it: MOCKER_NO_X=1 means off.
    command.setOptionValueWithSource(attribute, truth(variable, text) !== option.negate, 'env');
    return;
  }
  // A variadic or repeatable flag (one with a list default, which each use extends) takes a comma-separated list.
  const list = option.variadic || Array.isArray(option.defaultValue);
  const parts = list
    ? text
        .split(',')
        .map((p) => p.trim())
        .filter(Boolean)
    : [text];
  let value: unknown = option.variadic ? [] : option.defaultValue;
  for (const part of parts) {
    try {
      value = option.parseArg ? option.parseArg(part, value) : option.variadic ? [...(value as string[]), part] : part;
    } catch (err) {
      throw new InvalidArgumentError(`${variable}: ${(err as Error).message}`);
    }
  }
  command.setOptionValueWithSource(attribute, value, 'env');
}

/** Whether the command line or the environment set the option of this attribute (not its default, nor nothing). */
export const isGiven = (command: Command, attribute: string): boolean => !['default', undefined].includes(command.getOptionValueSource(attribute));

/**
 * Applies `MOCKER_<FLAG>` variables, then (for `serve`) vLLM's NPU mock model's, to the options the command line left
 * alone. Returns the names of the variables that took effect (their values may be secrets: never printed).
 */
export function applyEnvironment(command: Command, env: NodeJS.ProcessEnv, allCommands: readonly Command[]): string[] {
  const applied: string[] = [];
  const options = settable(command);
  for (const option of options) {
    const variable = envName(option);
    const text = env[variable];
    if (text === undefined) continue;
    const partner = options.find((o) => o !== option && o.attributeName() === option.attributeName());
    if (partner && env[envName(partner)] !== undefined && option.negate) {
      throw new InvalidArgumentError(`${envName(partner)} and ${variable} both set ${partner.long}: give one`);
    }
    if (isGiven(command, option.attributeName())) continue;
    setFromText(command, option, text, variable);
    applied.push(variable);
  }
  if (command.name() === 'serve') {
    for (const [flag, { value, from }] of Object.entries(npuMockFlags(env))) {
      const option = options.find((o) => o.long === flag)!;
      if (isGiven(command, option.attributeName())) continue;
      setFromText(command, option, value, from.join(' + '));
      applied.push(...from.filter((v) => !applied.includes(v)));
    }
  }
  const known = new Set(allCommands.flatMap((c) => settable(c).map(envName)));
  for (const name of Object.keys(env)) {
    if (name.startsWith(ENV_PREFIX) && !known.has(name)) console.warn(`mocker: ${name} names no flag of any command: ignored`);
  }
  return applied;
}

/** vLLM's NPU mock model's variables that mean nothing here, each with why. */
const NPU_MOCK_IGNORED: Record<string, string> = {
  MOCK_CAPTURE_FILE_LOCK: 'SQLite locks the capture file itself',
  MOCK_COMPUTE_LOGITS: 'there are no logits to mock',
  TORCH_COMPILE_MODE_MOCK: 'there is no torch graph',
  NO_NPU_MOCK: 'no accelerator is ever needed',
};

/** True when a mode variable of vLLM's NPU mock model asks for capture: `serve` then runs `mocker capture` on its own port. */
export function npuMockCapture(env: NodeJS.ProcessEnv): boolean {
  return npuMockModes(env).includes('CAPTURE_MODE');
}

function npuMockModes(env: NodeJS.ProcessEnv): string[] {
  const modes = ['CAPTURE_MODE', 'REPLAY_MODE', 'RANDOM_MODE'].filter((v) => env[v] !== undefined && truth(v, env[v]!));
  if (modes.length > 1) throw new InvalidArgumentError(`${modes.join(' and ')} are exclusive: set one`);
  return modes;
}

/**
 * `serve` flags meant by the variables of vLLM's NPU mock model, each with the variables it comes from:
 * - `REPLAY_MODE=1` → `--mode replay`, as fast as possible unless `SIMULATE_ELAPSED_TIME=1` (`--timing captured`,
 *   the captured elapsed time) or `FORWARD_TIME` (`--timing fixed`);
 * - `RANDOM_MODE=1` → `--mode random` (its steps take `FORWARD_TIME` ms, 25 by default as the seed's example);
 * - `FORWARD_TIME=MS` → `--forward-time-ms`; `SIMULATE_ELAPSED_TIME=1` → `--timing captured`;
 * - `MOCK_CAPTURE_DIR` + `MOCK_CAPTURE_FILE` → `--captures DIR/FILE`;
 * - `KV_CACHE_MODE=1` → PD: `--disaggregation-mode decode`, or `prefill` with `PREFILL_PROCESS=1`.
 */
export function npuMockFlags(env: NodeJS.ProcessEnv): Record<string, { value: string; from: string[] }> {
  const flags: Record<string, { value: string; from: string[] }> = {};
  const on = (v: string) => env[v] !== undefined && truth(v, env[v]!);
  const [mode] = npuMockModes(env);
  if (mode === 'REPLAY_MODE') flags['--mode'] = { value: 'replay', from: [mode] };
  if (mode === 'RANDOM_MODE') flags['--mode'] = { value: 'random', from: [mode] };
  if (env.FORWARD_TIME !== undefined) flags['--forward-time-ms'] = { value: env.FORWARD_TIME, from: ['FORWARD_TIME'] };
  if (on('SIMULATE_ELAPSED_TIME')) flags['--timing'] = { value: 'captured', from: ['SIMULATE_ELAPSED_TIME'] };
  else if (mode === 'REPLAY_MODE')
    flags['--timing'] = env.FORWARD_TIME !== undefined ? { value: 'fixed', from: [mode, 'FORWARD_TIME'] } : { value: 'none', from: [mode] };
  const dir = env.MOCK_CAPTURE_DIR;
  const file = env.MOCK_CAPTURE_FILE;
  if (dir !== undefined || file !== undefined) {
    flags['--captures'] = { value: join(dir ?? '.', file ?? 'mocker.db'), from: ['MOCK_CAPTURE_DIR', 'MOCK_CAPTURE_FILE'].filter((v) => env[v] !== undefined) };
  }
  const prefill = on('PREFILL_PROCESS');
  if (on('KV_CACHE_MODE'))
    flags['--disaggregation-mode'] = { value: prefill ? 'prefill' : 'decode', from: prefill ? ['KV_CACHE_MODE', 'PREFILL_PROCESS'] : ['KV_CACHE_MODE'] };
  else if (prefill) throw new InvalidArgumentError('PREFILL_PROCESS=1 marks the prefill node of PD separation, which needs KV_CACHE_MODE=1 too');
  for (const [name, why] of Object.entries(NPU_MOCK_IGNORED)) if (env[name] !== undefined) console.warn(`mocker: ${name} is ignored: ${why}`);
  return flags;
}
