import { z } from 'zod';
import type { ModelTokenizer } from '../tokenizer/index.js';
import type { PlannedChunk } from './chunk.js';

/**
 * The delta field planned reasoning goes in: vLLM 0.11's `reasoning_content`; the response shape (`--wire`,
 * src/api/render.ts) renders it as its release names it (0.12: both names, 2026: `reasoning`).
 */
export const REASONING_FIELD = 'reasoning_content';

/** AIPerf's mock server: thinking tokens per `reasoning_effort` (medium is its default). */
export const REASONING_EFFORT_TOKENS = { low: 100, medium: 250, high: 500 } as const;
export type ReasoningEffort = keyof typeof REASONING_EFFORT_TOKENS;

/**
 * Dynamo's `ReasoningConfig` (`--reasoning`, the engine args' `reasoning`): the token ids that open and close
 * the thinking span and the share of the output it takes. The ids may be left out: the tokenizer's
 * `<think>` / `</think>` are then used.
 */
export const reasoningConfigSchema = z.strictObject({
  start_thinking_token_id: z.number().int().nonnegative().optional(),
  end_thinking_token_id: z.number().int().nonnegative().optional(),
  thinking_ratio: z.number().min(0).max(1),
});
export type ReasoningConfig = z.infer<typeof reasoningConfigSchema>;

/** A reasoning config with its token ids known. */
export interface ReasoningSpan {
  startTokenId: number;
  endTokenId: number;
  thinkingRatio: number;
}

/** Parses `--reasoning` (or the engine args' `reasoning`); errors name `flag`. */
export function parseReasoningConfig(raw: unknown, flag: string): ReasoningConfig {
  const parsed = reasoningConfigSchema.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new Error(
      `${flag}: ${issue.path.length ? `"${issue.path.join('.')}": ` : ''}${issue.message} (expected {"start_thinking_token_id":N,"end_thinking_token_id":M,"thinking_ratio":0..1})`,
    );
  }
  return parsed.data;
}

/** The config's ids, else the tokenizer's `<think>` / `</think>`; a tokenizer without them needs the ids given. */
export function resolveReasoningSpan(config: ReasoningConfig, tokenizer: ModelTokenizer): ReasoningSpan {
  const idOf = (given: number | undefined, text: string, key: string): number => {
    if (given !== undefined) {
      if (given >= tokenizer.vocabSize) throw new Error(`--reasoning: ${key} ${given} is outside ${tokenizer.name}'s vocabulary (${tokenizer.vocabSize} ids)`);
      return given;
    }
    const id = tokenizer.tokenId(text);
    if (id === undefined) throw new Error(`--reasoning: ${tokenizer.name} has no ${text} token: give ${key}`);
    return id;
  };
  return {
    startTokenId: idOf(config.start_thinking_token_id, '<think>', 'start_thinking_token_id'),
    endTokenId: idOf(config.end_thinking_token_id, '</think>', 'end_thinking_token_id'),
    thinkingRatio: config.thinking_ratio,
  };
}

/**
 * How many of `length` output tokens form the thinking span, its start and end tokens included. Dynamo's rule
 * (`ReasoningConfig::num_thinking_tokens`): none below 2 tokens, else floor(length × ratio) clamped to
 * [2, length], 0 staying 0. A request's `reasoning_effort` replaces the ratio by AIPerf's budget, capped by length.
 */
export function thinkingSpanLength(span: ReasoningSpan, length: number, effort: ReasoningEffort | null): number {
  if (length < 2) return 0;
  const raw = effort === null ? Math.floor(length * span.thinkingRatio) : REASONING_EFFORT_TOKENS[effort];
  if (raw === 0) return 0;
  return Math.min(Math.max(raw, 2), length);
}

/**
 * Chunks of the thinking span `tokenIds[0, spanLength)`, each carrying its text as `reasoning_content`: vLLM's
 * parser sends no chunk for a lone start or end token, so each joins its neighbour thinking token.
 */
export async function reasoningChunks(
  tokenIds: readonly number[],
  spanLength: number,
  tokenizer: ModelTokenizer,
  skipSpecialTokens: boolean,
): Promise<PlannedChunk[]> {
  const stream = tokenizer.decodeStream(skipSpecialTokens);
  const chunks: PlannedChunk[] = [];
  // Thinking tokens are 1 … spanLength-2; the start token rides with the first, the end token with the last.
  for (let i = 1; i < spanLength - 1; i++) {
    const text = (await stream.step(tokenIds[i])) ?? '';
    chunks.push({ end: i === spanLength - 2 ? spanLength : i + 1, delta: { [REASONING_FIELD]: text } });
  }
  if (chunks.length === 0) chunks.push({ end: spanLength, delta: { [REASONING_FIELD]: '' } });
  return chunks;
}
