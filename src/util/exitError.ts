/** The exit code of a command that could not do its job at all, as diff(1)'s trouble: `rerun`, `captures diff`. */
export const COULD_NOT_RUN = 2;

/** A failure that ends the command with its own exit code (`captures diff`: COULD_NOT_RUN when a side cannot be read). */
export class ExitError extends Error {
  constructor(
    message: string,
    readonly exitCode: number,
  ) {
    super(message);
  }
}
