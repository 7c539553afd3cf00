import { InvalidArgumentError, Option } from 'commander';

/** A numeric flag's parser: `min` and `max` inclusive, `above` and `below` exclusive bounds. */
export function number(name: string, { integer = false, min = -Infinity, max = Infinity, above = -Infinity, below = Infinity } = {}) {
  return (value: string) => {
    const n = Number(value);
    if (!Number.isFinite(n) || (integer && !Number.isInteger(n)) || n < min || n > max || n <= above || n >= below) {
      const bounds = [min > -Infinity && `>= ${min}`, above > -Infinity && `> ${above}`, max < Infinity && `<= ${max}`, below < Infinity && `< ${below}`]
        .filter(Boolean)
        .join(' and ');
      throw new InvalidArgumentError(`${name} must be ${integer ? 'an integer' : 'a number'}${bounds ? ` ${bounds}` : ''}, got "${value}"`);
    }
    return n;
  };
}

/** `--force` of every command that writes a file (`-o`, `--report-json`, …): see util/outputFile.ts. */
export const forceOption = () => new Option('--force', 'replace an existing output file (never a capture file, nor an input)');
