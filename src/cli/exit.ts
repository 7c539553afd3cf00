import { ExitError } from '../util/exitError.js';
import { terminalText } from '../util/terminalText.js';

/** How every command reports the error that ended it: one line on stderr; returns the exit code. */
export function reportFailure(err: unknown): number {
  console.error(`mocker: ${terminalText(err instanceof Error ? err.message : String(err), { keepNewlines: true })}`);
  return err instanceof ExitError ? err.exitCode : 1;
}
