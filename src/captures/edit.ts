/** `mocker captures import`, `merge` and `prune`: writing capture files, all or nothing. */
import { createHash } from 'node:crypto';
import { statSync } from 'node:fs';
import { CaptureStore, namingCapture, type Exchange, type ExchangeFilter } from '../store/captureStore.js';
import { outputTarget, writeOutput, type OutputRules } from '../util/outputFile.js';
import { readJsonl } from './jsonl.js';

/** Opens a capture file for writing, runs `work` on it, closes it; a failure of the file names `name` (the output, not its temporary file). */
async function withWriter<T>(path: string, name: string, work: (store: CaptureStore) => T | Promise<T>): Promise<T> {
  return namingCapture(name, async () => {
    const store = CaptureStore.open(path);
    try {
      return await work(store);
    } finally {
      store.close();
    }
  });
}

export interface ImportResult {
  /** The new runs' ids in the target file. */
  runs: number[];
  exchanges: number;
}

/** Exchanges saved together (one savepoint): few enough that memory stays small whatever the input's size. */
const IMPORT_BATCH = 64;

/**
 * Reads a JSONL capture from `input` as it writes it into `out`: a new file (the output rules: created whole or
 * not at all), or an existing capture file, which gets its runs as new runs in one transaction.
 */
export async function importCaptures(input: AsyncIterable<Buffer>, source: string, out: string, rules: OutputRules): Promise<ImportResult> {
  const work = (store: CaptureStore) =>
    store.transactionAsync(async () => {
      const runIds = new Map<number, number>();
      let batch: Exchange[] = [];
      let exchanges = 0;
      const flush = () => {
        namingCapture(out, () => store.saveExchanges(batch));
        exchanges += batch.length;
        batch = [];
      };
      for await (const item of readJsonl(input, source)) {
        if (item.type === 'run')
          runIds.set(
            item.ordinal,
            namingCapture(out, () => store.startRun(item.info, item.tokenizerFiles, item.startedAt)),
          );
        else {
          batch.push({ ...item.exchange, runId: runIds.get(item.run)! }); // readJsonl checked the run came first
          if (batch.length >= IMPORT_BATCH) flush();
        }
      }
      flush();
      return { runs: [...runIds.values()], exchanges };
    });
  if (outputTarget(out, rules.inputs) === 'capture') {
    // Read-only first: another SQLite file opened for writing would get mocker's tables.
    CaptureStore.open(out, { readonly: true }).close();
    return withWriter(out, out, work);
  }
  return writeOutput(out, rules, (temp) => withWriter(temp, out, work));
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
export async function mergeCaptures(sources: readonly string[], out: string, { force = false }: Pick<OutputRules, 'force'> = {}): Promise<MergeResult> {
  const opened: CaptureStore[] = [];
  try {
    for (const path of sources) opened.push(CaptureStore.open(path, { readonly: true }));
    return await writeOutput(out, { inputs: sources, force }, (temp) =>
      withWriter(temp, out, (target) =>
        target.transaction(() => {
          const groups = new Map<string, { model: string | null; exchanges: MergedExchange[] }>();
          let runs = 0;
          let exchanges = 0;
          for (const [i, source] of opened.entries()) {
            const read = <T>(work: () => T) => namingCapture(sources[i], work);
            for (const run of read(() => source.runs())) {
              const { id: _, startedAt, tokenizerFiles: __, ...info } = run;
              const runId = target.startRun(
                info,
                read(() => source.storedTokenizerFiles(run)),
                startedAt,
              );
              runs++;
              for (const id of read(() => source.exchangeIds(run.id))) {
                const ex = read(() => source.getExchange(id));
                if (!ex) continue;
                const { id: ___, ...copy } = ex;
                const mergedId = target.saveExchange({ ...copy, runId });
                exchanges++;
                const request = ex.bodiesRedacted ? Buffer.from(`ids:${JSON.stringify(ex.promptIds)}`) : ex.requestBody;
                const key = createHash('sha256')
                  .update(ex.model ?? '')
                  .update('\0')
                  .update(request)
                  .digest('hex');
                const group = groups.get(key) ?? { model: ex.model, exchanges: [] };
                group.exchanges.push({ file: sources[i], id, mergedId });
                groups.set(key, group);
              }
            }
          }
          const duplicateGroups = [...groups.values()].filter((g) => g.exchanges.length > 1);
          return { runs, exchanges, duplicateGroups, duplicates: duplicateGroups.reduce((n, g) => n + g.exchanges.length - 1, 0) };
        }),
      ),
    );
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
      const left = new Set(
        store
          .exchangeSummaries()
          .filter((e) => !removed.has(e.id))
          .map((e) => e.runId),
      );
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
