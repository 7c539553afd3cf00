import { terminalText } from '../util/terminalText.js';

/** A failure that ends the command with its own exit code (`captures diff`: 2, as diff(1), when a side cannot be read). */
export class ExitError extends Error {
  constructor(
    message: string,
    readonly exitCode: number,
  ) {
    super(message);
  }
}

/** How every command reports the error that ended it: one line on stderr; returns the exit code. */
export function reportFailure(err: unknown): number {
  console.error(`mocker: ${terminalText(err instanceof Error ? err.message : String(err), { keepNewlines: true })}`);
  return err instanceof ExitError ? err.exitCode : 1;
}
