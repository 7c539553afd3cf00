/** `mocker captures import`, `merge` and `prune`: writing capture files, all or nothing. */
import { createHash } from 'node:crypto';
import { existsSync, rmSync, statSync } from 'node:fs';
import { CaptureFileError, CaptureStore, type ExchangeFilter } from '../store/captureStore.js';
import type { ParsedCaptures } from './jsonl.js';

/** Removes a capture file this command created and could not finish (with its WAL files). */
function discard(path: string): void {
  for (const suffix of ['', '-wal', '-shm']) rmSync(path + suffix, { force: true });
}

/**
 * Opens `path` for writing: a new file (`fresh`), or an existing one that must already be a capture file (a
 * read-only look first: opening another SQLite file for writing would add mocker's tables to it).
 */
function openTarget(path: string): { store: CaptureStore; fresh: boolean } {
  if (!existsSync(path)) {
    try {
      return { store: CaptureStore.open(path), fresh: true };
    } catch (err) {
      discard(path);
      throw err;
    }
  }
  CaptureStore.open(path, { readonly: true }).close();
  return { store: CaptureStore.open(path), fresh: false };
}

/** Writes into `path` (new or existing) in one transaction; a new file is removed again if anything fails. */
function writeInto<T>(path: string, work: (store: CaptureStore) => T): T {
  const { store, fresh } = openTarget(path);
  try {
    const result = store.transaction(() => work(store));
    store.close();
    return result;
  } catch (err) {
    store.close();
    if (fresh) discard(path);
    throw err;
  }
}

export interface ImportResult {
  /** The new runs' ids in the target file. */
  runs: number[];
  exchanges: number;
}

/** Adds every run of a parsed JSONL capture to `path` as new runs. */
export function importCaptures(parsed: ParsedCaptures, path: string): ImportResult {
  return writeInto(path, (store) => {
    const runs: number[] = [];
    let exchanges = 0;
    for (const run of parsed.runs) {
      const runId = store.startRun(run.info, run.tokenizerFiles, run.startedAt);
      runs.push(runId);
      for (const ex of run.exchanges) store.saveExchange({ ...ex, runId });
      exchanges += run.exchanges.length;
    }
    return { runs, exchanges };
  });
}

export interface MergedExchange {
  file: string;
  id: number;
  /** Its id in the merged file. */
  mergedId: number;
}

export interface MergeResult {
  runs: number;
  exchanges: number;
  /** Exchanges with the same model and request body (redacted ones: the same prompt ids), 2 or more a group. */
  duplicateGroups: { model: string | null; exchanges: MergedExchange[] }[];
  /** Exchanges that repeat an earlier one (each group counts its size − 1). */
  duplicates: number;
}

/** Copies every run of `sources` into `out` (a new file), each source run a run of its own, every exchange kept. */
export function mergeCaptures(sources: readonly string[], out: string): MergeResult {
  if (existsSync(out)) throw new CaptureFileError(out, 'already exists: merge writes a new file');
  const opened = sources.map((path) => CaptureStore.open(path, { readonly: true }));
  try {
    return writeInto(out, (target) => {
      const groups = new Map<string, { model: string | null; exchanges: MergedExchange[] }>();
      let runs = 0;
      let exchanges = 0;
      for (const [i, source] of opened.entries()) {
        for (const run of source.runs()) {
          const { id: _, startedAt, tokenizerFiles: __, ...info } = run;
          const runId = target.startRun(info, source.tokenizerFiles(run), startedAt);
          runs++;
          for (const { id } of source.exchangeSummaries({ runId: run.id })) {
            const ex = source.getExchange(id);
            if (!ex) continue;
            const { id: ___, ...copy } = ex;
            const mergedId = target.saveExchange({ ...copy, runId });
            exchanges++;
            const request = ex.bodiesRedacted ? Buffer.from(`ids:${JSON.stringify(ex.promptIds)}`) : ex.requestBody;
            const key = createHash('sha256').update(ex.model ?? '').update('\0').update(request).digest('hex');
            const group = groups.get(key) ?? { model: ex.model, exchanges: [] };
            group.exchanges.push({ file: sources[i], id, mergedId });
            groups.set(key, group);
          }
        }
      }
      const duplicateGroups = [...groups.values()].filter((g) => g.exchanges.length > 1);
      return { runs, exchanges, duplicateGroups, duplicates: duplicateGroups.reduce((n, g) => n + g.exchanges.length - 1, 0) };
    });
  } finally {
    for (const store of opened) store.close();
  }
}

export interface PruneResult {
  /** The exchanges removed (or, dry run, that would be). */
  exchanges: { id: number; runId: number; startedAt: string; model: string | null; outcome: string }[];
  /** Runs left without exchanges, removed with them. */
  runs: number[];
  bytesBefore: number;
  /** After VACUUM (dry run: unchanged). */
  bytesAfter: number;
  dryRun: boolean;
}

/** Removes the exchanges `filter` selects, the runs they leave empty, then VACUUMs the file. */
export function pruneCaptures(path: string, filter: ExchangeFilter, dryRun: boolean): PruneResult {
  // Read-only first: a missing file is not created, another SQLite file not given mocker's tables.
  let store = CaptureStore.open(path, { readonly: true });
  const bytesBefore = statSync(path).size;
  if (!dryRun) {
    store.close();
    store = CaptureStore.open(path);
  }
  try {
    const selected = store.exchangeSummaries(filter);
    const exchanges = selected.map((e) => ({ id: e.id, runId: e.runId, startedAt: new Date(e.startedAt).toISOString(), model: e.model, outcome: e.outcome }));
    const touched = [...new Set(selected.map((e) => e.runId))];
    if (dryRun) {
      const removed = new Set(selected.map((e) => e.id));
      const left = new Set(store.exchangeSummaries().filter((e) => !removed.has(e.id)).map((e) => e.runId));
      return { exchanges, runs: touched.filter((run) => !left.has(run)), bytesBefore, bytesAfter: bytesBefore, dryRun };
    }
    const runs = store.transaction(() => {
      store.deleteExchanges(selected.map((e) => e.id));
      return store.deleteEmptyRuns(touched);
    });
    store.vacuum();
    store.close();
    return { exchanges, runs, bytesBefore, bytesAfter: statSync(path).size, dryRun };
  } finally {
    store.close();
  }
}
