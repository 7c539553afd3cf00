/**
 * A capture file as a trace (`mocker trace --from-captures`): every complete exchange with prompt token ids (chat,
 * completions, vLLM's generate, the agents' APIs) becomes a single-turn session that arrives at its captured start and asks for as many tokens as it got.
 * A load, not a check: whether a target answers as captured is `mocker rerun`'s question.
 */
import { isPromptBatch } from '../capture/recorder.js';
import { CaptureStore, isAgentApi, isGeneration, type StoredExchange } from '../store/captureStore.js';
import type { Session, Workload } from './workload.js';

/** Exchanges that cannot be sent again, by why. */
export interface SkippedExchanges {
  failed: number;
  aborted: number;
  /** Several choices: a batch of prompts or `n` > 1. */
  batched: number;
  withoutPromptIds: number;
}

export interface CapturedWorkload {
  workload: Workload;
  /** The models of the sessions, first seen first. */
  models: string[];
  skipped: SkippedExchanges;
  /** What to tell the user about the file (skipped exchanges). */
  notes: string[];
}

/** A batch of prompts is stored whole, without prompt ids, with as many choices as the engine gave. */
function isBatch(exchange: StoredExchange): boolean {
  if (exchange.endpoint === null) return false;
  try {
    const request: unknown = JSON.parse(exchange.requestBody.toString('utf8'));
    return request !== null && typeof request === 'object' && isPromptBatch(exchange.endpoint, request as Record<string, unknown>);
  } catch {
    return false;
  }
}

export function capturedWorkload(file: string): CapturedWorkload {
  const store = CaptureStore.open(file, { readonly: true });
  const sessions: Session[] = [];
  const models = new Set<string>();
  const skipped: SkippedExchanges = { failed: 0, aborted: 0, batched: 0, withoutPromptIds: 0 };
  try {
    for (const id of store.exchangeIds()) {
      const exchange = store.getExchange(id)!;
      // Embeddings and rerank exchanges generate nothing: a generation trace has no turn for them. The agents' APIs
      // and vLLM's generate are turns by their prompt ids like chat's.
      if (exchange.endpoint !== null && !isGeneration(exchange.endpoint) && !isAgentApi(exchange.endpoint)) continue;
      // An answer without choices is a failure (the recorder stores it so).
      if (exchange.outcome !== 'complete' || exchange.generations.length === 0) {
        skipped[exchange.outcome === 'complete' ? 'failed' : exchange.outcome]++;
        continue;
      }
      if (exchange.generations.length > 1 || (exchange.promptIds === null && isBatch(exchange))) {
        skipped.batched++;
        continue;
      }
      if (exchange.promptIds === null || exchange.promptIds.length === 0) {
        skipped.withoutPromptIds++;
        continue;
      }
      const [generation] = exchange.generations;
      // Packed: a capture of long prompts stays small until each turn is sent.
      const prompt = Uint32Array.from(exchange.promptIds);
      sessions.push({
        id: `exchange-${id}`,
        startMs: exchange.startedAt,
        turns: [{ inputLength: prompt.length, outputLength: Math.max(1, generation.outputIds.length), delayMs: 0, prompt: () => Array.from(prompt) }],
      });
      if (exchange.model !== null) models.add(exchange.model);
    }
  } finally {
    store.close();
  }
  const notes: string[] = [];
  const total = skipped.failed + skipped.aborted + skipped.batched + skipped.withoutPromptIds;
  if (total > 0) {
    const reasons = [
      [skipped.failed, 'failed'],
      [skipped.aborted, 'aborted'],
      [skipped.batched, 'with several choices (a batch of prompts or n > 1)'],
      [skipped.withoutPromptIds, 'without prompt token ids'],
    ] as const;
    notes.push(
      `${total} exchange(s) skipped: ${reasons
        .filter(([n]) => n > 0)
        .map(([n, why]) => `${n} ${why}`)
        .join(', ')}`,
    );
  }
  return { workload: { sessions, requests: sessions.length }, models: [...models], skipped, notes };
}
