import type { CaptureStore, StoredRun } from '../store/captureStore.js';
import { ModelTokenizer } from '../tokenizer/index.js';

/** Each run's own tokenizer, loaded once from the capture file as `serve` loads it, untrusted (null: the run stored none). */
export class RunTokenizers {
  private readonly runs = new Map<number, { run: StoredRun | undefined; tokenizer: ModelTokenizer | null }>();

  constructor(private readonly store: CaptureStore) {}

  get(runId: number): { run: StoredRun | undefined; tokenizer: ModelTokenizer | null } {
    let entry = this.runs.get(runId);
    if (!entry) {
      const run = this.store.getRun(runId);
      const files = run ? this.store.tokenizerFiles(run) : new Map<string, Buffer>();
      entry = { run, tokenizer: run && files.has('tokenizer.json') ? new ModelTokenizer(run.tokenizerName ?? 'captured', files, { fromCapture: true }) : null };
      this.runs.set(runId, entry);
    }
    return entry;
  }
}
