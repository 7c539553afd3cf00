/**
 * Every file a command writes (`-o`, `--report-json`, `--report-html`) goes through here, so that no tool
 * destroys data: an output is never one of the command's inputs, never written through a symbolic link, an
 * existing file is replaced only with `--force`, and a capture file (SQLite) never is. The work goes to a
 * temporary file beside the target, renamed into place once complete: a failure leaves no partial output and
 * the old file as it was.
 */
import { randomBytes } from 'node:crypto';
import { closeSync, fsyncSync, linkSync, lstatSync, mkdirSync, openSync, readSync, renameSync, statSync, unlinkSync, writeSync, type Stats } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { FileError } from './fileError.js';

/** An output file that may not (or could not) be written: the message names it. */
export class OutputFileError extends FileError {}

export interface OutputRules {
  /** The files the command reads: the output may be none of them (compared by device and inode). */
  inputs?: readonly (string | undefined)[];
  /** Replace an existing file (never a capture file). */
  force?: boolean;
}

/** The first 16 bytes of every SQLite database (a capture file is one). */
const SQLITE_HEADER = Buffer.from('SQLite format 3\0', 'latin1');

/** Whether the file at `path` is a SQLite database (a capture file): false when it cannot be read. */
export function isSqlite(path: string): boolean {
  let fd: number;
  try {
    fd = openSync(path, 'r');
  } catch {
    return false;
  }
  try {
    const head = Buffer.alloc(SQLITE_HEADER.length);
    return readSync(fd, head, 0, head.length, 0) === head.length && head.equals(SQLITE_HEADER);
  } finally {
    closeSync(fd);
  }
}

function statOrNull(path: string, follow: boolean): Stats | null {
  try {
    return follow ? statSync(path) : lstatSync(path);
  } catch {
    return null;
  }
}

/** What is at an output path now, once the rules that hold for every writer (link, directory, input) are checked. */
export function outputTarget(path: string, inputs: OutputRules['inputs'] = []): 'absent' | 'capture' | 'file' {
  const here = statOrNull(path, false);
  if (here === null) return 'absent';
  if (here.isSymbolicLink()) throw new OutputFileError(path, 'is a symbolic link: mocker does not write through links (name the file itself)');
  if (here.isDirectory()) throw new OutputFileError(path, 'is a directory');
  for (const input of inputs) {
    const read = input === undefined ? null : statOrNull(input, true);
    if (read && read.dev === here.dev && read.ino === here.ino)
      throw new OutputFileError(
        path,
        `is ${input === path ? 'also' : `the same file as ${input},`} an input of this command: an output never replaces its input`,
      );
  }
  return isSqlite(path) ? 'capture' : 'file';
}

/** Refuses an output path the command may not write (see the module comment); else returns. */
export function checkOutput(path: string, { inputs, force = false }: OutputRules): void {
  const target = outputTarget(path, inputs);
  if (target === 'capture')
    throw new OutputFileError(path, 'already exists and is a capture file (SQLite), which mocker never replaces, even with --force (remove it first)');
  if (target === 'file' && !force) throw new OutputFileError(path, 'already exists (--force replaces it)');
}

const SQLITE_SIDE_FILES = ['-wal', '-shm', '-journal'];

/** Removes a file this command made and could not finish (a capture file: with its side files). */
function discardOutput(path: string): void {
  for (const suffix of ['', ...SQLITE_SIDE_FILES]) {
    try {
      unlinkSync(path + suffix);
    } catch {
      // Not there.
    }
  }
}

/**
 * Checks `path`, lets `write` fill a temporary file beside it (its path given; SQLite's side files are
 * cleaned up too), then checks again and moves it into place. Without `force` the move is a hard link, which
 * fails rather than replace a file that appeared meanwhile.
 */
export async function writeOutput<T>(path: string, rules: OutputRules, write: (tempPath: string) => T | Promise<T>): Promise<T> {
  checkOutput(path, rules);
  // Its directory made if need be: `--junit reports/rerun.xml` works in a fresh checkout.
  mkdirSync(dirname(path), { recursive: true });
  const temp = join(dirname(path), `.${basename(path)}.${process.pid}-${randomBytes(4).toString('hex')}.tmp`);
  try {
    const result = await write(temp);
    checkOutput(path, rules);
    if (rules.force) renameSync(temp, path);
    else {
      try {
        linkSync(temp, path);
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        if (code === 'EEXIST') throw new OutputFileError(path, 'already exists (--force replaces it)');
        // A file system without hard links: the check above has to do.
        if (code !== 'EPERM' && code !== 'ENOTSUP' && code !== 'EOPNOTSUPP') throw err;
        renameSync(temp, path);
      }
    }
    return result;
  } catch (err) {
    // The temporary file is ours, not the user's: errors speak of the output.
    if (err instanceof Error) err.message = err.message.replaceAll(temp, path);
    throw err;
  } finally {
    discardOutput(temp);
  }
}

/**
 * `writeOutput` for bytes and text: `produce` hands chunks to `write` as it makes them (nothing is held whole),
 * and the file is synced to disk before it is moved into place.
 */
export function writeOutputFile<T>(path: string, rules: OutputRules, produce: (write: (chunk: string | Uint8Array) => void) => T | Promise<T>): Promise<T> {
  return writeOutput(path, rules, async (temp) => {
    const io = <R>(op: () => R): R => {
      try {
        return op();
      } catch (err) {
        throw new OutputFileError(path, `cannot be written (${(err as Error).message})`);
      }
    };
    // `wx`: a file already at the temporary name (or a link planted there) is an error, not a target.
    const fd = io(() => openSync(temp, 'wx'));
    try {
      const result = await produce((chunk) =>
        io(() => {
          const bytes = typeof chunk === 'string' ? Buffer.from(chunk, 'utf8') : chunk;
          for (let done = 0; done < bytes.length; ) done += writeSync(fd, bytes, done, bytes.length - done);
        }),
      );
      io(() => fsyncSync(fd));
      return result;
    } finally {
      closeSync(fd);
    }
  });
}
