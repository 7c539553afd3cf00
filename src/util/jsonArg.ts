import { readFileSync } from 'node:fs';

/** A JSON object given inline or as a file path (`--extra-engine-args` and friends); errors name `flag`. */
export function readJsonObjectArg(source: string, flag: string): Record<string, unknown> {
  let text = source;
  if (!source.trimStart().startsWith('{')) {
    try {
      text = readFileSync(source, 'utf8');
    } catch (err) {
      throw new Error(`${flag}: cannot read ${source} (${(err as Error).message})`);
    }
  }
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (err) {
    throw new Error(`${flag}: not valid JSON (${(err as Error).message})`);
  }
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) throw new Error(`${flag}: expected a JSON object`);
  return raw as Record<string, unknown>;
}
