import { InvalidArgumentError, Option } from 'commander';
import { FORCE } from '../config/commonSettings.js';
import { type NumberBounds, parseNumber } from '../config/settings.js';

/** A numeric flag's parser: `min` and `max` inclusive, `above` and `below` exclusive bounds. */
export function number(name: string, bounds: NumberBounds = {}) {
  return (value: string) => {
    try {
      return parseNumber(name, value, bounds);
    } catch (err) {
      throw new InvalidArgumentError((err as Error).message);
    }
  };
}

/** `--force` of every command that writes a file (`-o`, `--report-json`, …): see util/outputFile.ts. */
export const forceOption = () => new Option(FORCE.flags, FORCE.help);
