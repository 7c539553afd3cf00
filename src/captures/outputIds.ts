/**
 * Whether a capture's output token ids are the engine's own. vLLM and SGLang return them; for other engines the
 * recorder tokenizes the text (per streamed piece where the text re-tokenizes otherwise), and what the engine says
 * it generated (`usage.completion_tokens`) tells whether that gave back as many tokens as it made.
 */
import { completionTokens } from '../capture/extract.js';
import type { StoredExchange } from '../store/captureStore.js';

export type OutputIdsVerdict = 'engine' | 'as-generated' | 'unchecked' | 'not-the-engines';

export interface OutputIdsCheck {
  verdict: OutputIdsVerdict;
  /** The ids stored, over every choice. */
  stored: number;
  /** What the engine says it generated (null: no usage). */
  generated: number | null;
}

export function outputIdsCheck(ex: Pick<StoredExchange, 'tokenSource' | 'usage' | 'generations'>): OutputIdsCheck {
  const stored = ex.generations.reduce((n, g) => n + g.outputIds.length, 0);
  const generated = completionTokens(ex.usage);
  const verdict: OutputIdsVerdict =
    ex.tokenSource === 'engine' ? 'engine' : generated === null ? 'unchecked' : generated === stored ? 'as-generated' : 'not-the-engines';
  return { verdict, stored, generated };
}

/** The check as a line of `captures show`. */
export function describeOutputIds({ verdict, stored, generated }: OutputIdsCheck): string {
  switch (verdict) {
    case 'engine':
      return "output ids: the engine's own (it returned them)";
    case 'as-generated':
      return `output ids: tokenized from the text, as many as the engine generated (${stored})`;
    case 'unchecked':
      return 'output ids: tokenized from the text, unchecked (the engine reported no usage)';
    case 'not-the-engines':
      return `output ids: NOT the engine's — ${stored} stored, the engine generated ${generated} (its text tokenizes otherwise)`;
  }
}
