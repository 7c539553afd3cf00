/** Where in a file, for the message: what kind of file (`capture file`), and where in it (`line 12`). */
export interface FilePlace {
  kind?: string;
  at?: string;
}

/** A file that cannot be read or written as asked: the message names the file (`[kind ]PATH[ at]: reason`). */
export class FileError extends Error {
  constructor(
    readonly path: string,
    reason: string,
    { kind, at }: FilePlace = {},
  ) {
    super(`${kind ? `${kind} ` : ''}${path}${at ? ` ${at}` : ''}: ${reason}`);
  }
}

const named = (path: string, kind: string) => (err: unknown) => {
  throw err instanceof FileError ? err : new FileError(path, err instanceof Error ? err.message : String(err), { kind });
};

/**
 * Runs `work` (returning a value or a promise) on one file: a failure that does not name its file yet (SQLite's
 * "database disk image is malformed", a decompression error) is reported as that file's.
 */
export function namingFile<T>(path: string, kind: string, work: () => T): T {
  try {
    const result = work();
    return (result instanceof Promise ? result.catch(named(path, kind)) : result) as T;
  } catch (err) {
    return named(path, kind)(err);
  }
}
