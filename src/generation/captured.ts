import type { Generation } from '../store/generation.js';
import type { ModelTokenizer } from '../tokenizer/index.js';
import { cutAtStopString, cutAtStopToken, endPlan, textField, type ChoicePlan, type OutputParams } from './plan.js';
import type { PlannedChunk } from './chunk.js';

/** The request needs more tokens than the capture holds (the capture ended by `length`). */
export class PartialHit {
  constructor(
    readonly captured: number,
    readonly requested: number,
  ) {}
}

/** The chunks as the engine sent them. */
function capturedChunks(gen: Generation): PlannedChunk[] {
  const chunks: PlannedChunk[] = [];
  let end = 0;
  gen.chunkTokens.forEach((count, i) => {
    end += count;
    chunks.push({ end, delta: gen.chunkDeltas[i] });
  });
  return chunks;
}

function fromGeneration(gen: Generation, chunks: PlannedChunk[]): ChoicePlan {
  return {
    tokenIds: gen.outputIds,
    capturedTimesMs: gen.tokenTimes,
    chunks,
    finishReason: gen.finishReason ?? 'stop',
    stopReason: gen.stopReason,
  };
}

/**
 * A non-streamed capture holds its whole output as one chunk, but the engine made it one token per step (and
 * streams, and checks stop strings, per step: vllm-wire-reference.md §1.4). One chunk per token, carrying the
 * incremental detokenizer's piece, when those pieces give back the captured text exactly; else null (a text
 * cut by a stop string, reasoning or tool calls: kept whole).
 */
async function perTokenChunks(gen: Generation, params: OutputParams, tokenizer: ModelTokenizer): Promise<PlannedChunk[] | null> {
  const field = textField(params.kind);
  const delta = gen.chunkDeltas[0];
  // Captured with --redact-bodies: no text to check the pieces against; rendered from the ids per token.
  if (delta === undefined) return gen.outputIds.map((_, i) => ({ end: i + 1 }));
  if (gen.chunkTokens.length !== 1 || gen.outputIds.length < 2 || Object.keys(delta).some((k) => k !== field) || typeof delta[field] !== 'string') return null;
  const stream = tokenizer.decodeStream(true);
  const chunks: PlannedChunk[] = [];
  let text = '';
  for (const [i, id] of gen.outputIds.entries()) {
    const piece = (await stream.step(id)) ?? '';
    text += piece;
    chunks.push({ end: i + 1, delta: { [field]: piece } });
  }
  return text === delta[field] ? chunks : null;
}

/** Cuts a captured plan to `max` tokens; a chunk cut in the middle gets its text re-decoded. */
async function truncate(plan: ChoicePlan, max: number, params: OutputParams, tokenizer: ModelTokenizer): Promise<ChoicePlan> {
  const chunks: PlannedChunk[] = [];
  let start = 0;
  for (const chunk of plan.chunks) {
    if (chunk.end <= max) chunks.push(chunk);
    else {
      if (start < max) {
        const before = await tokenizer.decode(plan.tokenIds.slice(0, start), params.skipSpecialTokens);
        const after = await tokenizer.decode(plan.tokenIds.slice(0, max), params.skipSpecialTokens);
        chunks.push({ end: max, delta: { [textField(params.kind)]: after.slice(before.length) } });
      }
      break;
    }
    start = chunk.end;
  }
  return endPlan(plan, max, chunks, 'length', null);
}

/**
 * How a captured generation answers a request with the same prompt tokens (PRODUCT §2): cut by a smaller
 * max_tokens, by stop strings or stop token ids found earlier; a request wanting more tokens than a
 * length-capped capture holds, and not stopped within them, is a partial hit.
 */
export async function planFromCapture(gen: Generation, params: OutputParams, tokenizer: ModelTokenizer, streamed: boolean): Promise<ChoicePlan | PartialHit> {
  let plan = fromGeneration(gen, (streamed ? null : await perTokenChunks(gen, params, tokenizer)) ?? capturedChunks(gen));
  const captured = plan.tokenIds.length;
  if (params.maxTokens < captured) plan = await truncate(plan, params.maxTokens, params, tokenizer);
  plan = cutAtStopToken(plan, { ...params, ignoreEos: true }, tokenizer.eosTokenIds);
  plan = await cutAtStopString(plan, params, tokenizer);
  // Still ending by length after the stop rules: the request would have gone on past the captured tokens.
  if (params.maxTokens > captured && plan.finishReason === 'length' && params.maxTokensRequested) return new PartialHit(captured, params.maxTokens);
  return plan;
}

/** Extends a partial hit with random tokens (`--on-miss random`): the captured tokens first, then random ones. */
export function extendPlan(captured: ChoicePlan, extension: ChoicePlan): ChoicePlan {
  const offset = captured.tokenIds.length;
  return {
    tokenIds: [...captured.tokenIds, ...extension.tokenIds],
    capturedTimesMs: captured.capturedTimesMs,
    chunks: [...captured.chunks, ...extension.chunks.map((c) => ({ ...c, end: c.end + offset }))],
    finishReason: extension.finishReason,
    stopReason: extension.stopReason,
  };
}
