/**
 * A capture file as a trace (`mocker trace --from-captures`): every complete exchange with prompt token ids
 * becomes a single-turn session that arrives at its captured start and asks for as many tokens as it got;
 * what it got is the answer a target should give again (`AnswerComparison`).
 */
import { isPromptBatch } from '../capture/recorder.js';
import { CaptureStore, isGeneration, type StoredExchange } from '../store/captureStore.js';
import type { OnlineAnswer } from './online.js';
import type { Session, Workload } from './workload.js';

export interface ExpectedAnswer {
  /** The captured output ids; null when they were not the engine's own (tokenized from the text). */
  outputTokenIds: number[] | null;
  text: string;
}

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
  /** By turn `ref` (the exchange id). */
  expected: Map<string, ExpectedAnswer>;
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
  const expected = new Map<string, ExpectedAnswer>();
  const skipped: SkippedExchanges = { failed: 0, aborted: 0, batched: 0, withoutPromptIds: 0 };
  try {
    for (const id of store.exchangeIds()) {
      const exchange = store.getExchange(id)!;
      // Embeddings and rerank exchanges generate nothing: a generation trace has no turn for them.
      if (exchange.endpoint !== null && !isGeneration(exchange.endpoint)) continue;
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
      const ref = String(id);
      // Packed: a capture of long prompts stays small until each turn is sent.
      const prompt = Uint32Array.from(exchange.promptIds);
      sessions.push({
        id: `exchange-${id}`,
        startMs: exchange.startedAt,
        turns: [{ inputLength: prompt.length, outputLength: Math.max(1, generation.outputIds.length), delayMs: 0, prompt: () => Array.from(prompt), ref }],
      });
      // Ids tokenized from the text are one spelling of it, not necessarily the engine's: only the text is compared then.
      expected.set(ref, { outputTokenIds: exchange.tokenSource === 'engine' ? generation.outputIds : null, text: generation.text });
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
    notes.push(`${total} exchange(s) skipped: ${reasons.filter(([n]) => n > 0).map(([n, why]) => `${n} ${why}`).join(', ')}`);
  }
  return { workload: { sessions, requests: sessions.length }, models: [...models], expected, skipped, notes };
}

export interface ComparisonSummary {
  compared: number;
  mismatches: number;
  /** The first mismatches (at most 10), each with what differs first. */
  examples: { ref: string; reason: string }[];
}

const MAX_EXAMPLES = 10;
const SNIPPET = 20;

/** Index of the first difference of two sequences, or -1 when they are equal. */
function firstDifference<T>(a: ArrayLike<T>, b: ArrayLike<T>): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return i;
  return a.length === b.length ? -1 : n;
}

/** Why `answer` is not the expected one, or null when it is: output ids when both sides have them, else text. */
function mismatch(expected: ExpectedAnswer | undefined, answer: OnlineAnswer): string | null {
  if (!expected) return 'not in the capture';
  if (answer.error !== null) return `error: ${answer.error}`;
  if (expected.outputTokenIds !== null && answer.outputTokenIds !== null) {
    const want = expected.outputTokenIds;
    const got = answer.outputTokenIds;
    const i = firstDifference(want, got);
    if (i < 0) return null;
    if (i < want.length && i < got.length) return `output token ${i}: expected ${want[i]}, got ${got[i]}`;
    return `output token ${i}: expected ${want.length} tokens, got ${got.length}`;
  }
  if (answer.text === null) return 'the answer has no text to compare';
  const i = firstDifference(expected.text, answer.text);
  if (i < 0) return null;
  return `text offset ${i}: expected ${JSON.stringify(expected.text.slice(i, i + SNIPPET))}, got ${JSON.stringify(answer.text.slice(i, i + SNIPPET))}`;
}

/** Checks a target's answers against the captured ones. */
export class AnswerComparison {
  private compared = 0;
  private mismatches = 0;
  private readonly examples: { ref: string; reason: string }[] = [];

  constructor(private readonly expected: ReadonlyMap<string, ExpectedAnswer>) {}

  check(ref: string, answer: OnlineAnswer): void {
    this.compared++;
    const reason = mismatch(this.expected.get(ref), answer);
    if (reason === null) return;
    this.mismatches++;
    if (this.examples.length < MAX_EXAMPLES) this.examples.push({ ref, reason });
  }

  summary(): ComparisonSummary {
    return { compared: this.compared, mismatches: this.mismatches, examples: [...this.examples] };
  }
}
