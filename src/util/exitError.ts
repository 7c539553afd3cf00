/** A failure that ends the command with its own exit code (`captures diff`: 2, as diff(1), when a side cannot be read). */
export class ExitError extends Error {
  constructor(
    message: string,
    readonly exitCode: number,
  ) {
    super(message);
  }
}
