import type { ModelTokenizer } from '../tokenizer/index.js';
import type { ReasoningEffort } from './reasoning.js';
import type { StructuredOutput } from './structured.js';
import type { ToolOffer } from './toolCalls.js';
import type { PlannedChunk } from './chunk.js';

export type EndpointKind = 'chat' | 'completion';

/** The request fields that decide what is generated (vLLM's SamplingParams, as far as outputs go). */
export interface OutputParams {
  kind: EndpointKind;
  n: number;
  /** Effective max_tokens (request value, else vLLM's default for the endpoint). */
  maxTokens: number;
  /** Whether the client set max_tokens itself. */
  maxTokensRequested: boolean;
  minTokens: number;
  ignoreEos: boolean;
  stop: string[];
  stopTokenIds: number[];
  includeStopStrInOutput: boolean;
  skipSpecialTokens: boolean;
  seed: number | null;
  /** Chat `reasoning_effort`: the thinking span's budget under `--reasoning`. */
  reasoningEffort?: ReasoningEffort | null;
  /** The chat's tools, when it lets the model call one. */
  tools?: ToolOffer | null;
  /** The output's constraint (`response_format`, `structured_outputs`, `guided_*`); absent or null: free text. */
  structured?: StructuredOutput | null;
}

/** Everything one choice will produce, decided before the engine runs. */
export interface ChoicePlan {
  tokenIds: number[];
  capturedTimesMs?: number[];
  chunks: PlannedChunk[];
  finishReason: string;
  stopReason: string | number | null;
}

/** The plan ended after `end` tokens, with these chunks and this finish. */
export function endPlan(plan: ChoicePlan, end: number, chunks: PlannedChunk[], finishReason: string, stopReason: string | number | null): ChoicePlan {
  return {
    ...plan,
    tokenIds: plan.tokenIds.slice(0, end),
    capturedTimesMs: plan.capturedTimesMs?.slice(0, end),
    chunks,
    finishReason,
    stopReason,
  };
}

/** The key of the text a chunk delta carries for each endpoint. */
export function textField(kind: EndpointKind): 'content' | 'text' {
  return kind === 'chat' ? 'content' : 'text';
}

/**
 * Applies `stop_token_ids` (and EOS unless `ignore_eos`) to planned tokens whose text is decoded on the fly:
 * the output ends at the first stop token at or after `min_tokens`. The stop token is kept in the ids, its
 * text is not (vLLM skips the text of the token that stopped the request).
 */
export function cutAtStopToken(plan: ChoicePlan, params: OutputParams, eosTokenIds: readonly number[]): ChoicePlan {
  const stopIds = new Set(params.stopTokenIds);
  const eos = new Set(params.ignoreEos ? [] : eosTokenIds);
  for (let i = params.minTokens; i < plan.tokenIds.length; i++) {
    const id = plan.tokenIds[i];
    const isEos = eos.has(id);
    if (!isEos && !stopIds.has(id)) continue;
    const keptChunks = plan.chunks.filter((c) => c.end <= i);
    // A captured chunk that ends with this very token already holds vLLM's text for it (the stop token's skipped):
    // a non-streamed capture is one such chunk, with the whole text.
    const ending = plan.chunks.find((c) => c.end === i + 1 && c.delta);
    const chunks = [...keptChunks, ending ?? { end: i + 1, delta: { [textField(params.kind)]: '' } }];
    return endPlan(plan, i + 1, chunks, 'stop', isEos ? null : id);
  }
  return plan;
}

/** Text of each chunk, decoding the chunks that carry no delta (as the stream would). */
export async function chunkTexts(plan: ChoicePlan, kind: EndpointKind, tokenizer: ModelTokenizer, skipSpecial: boolean): Promise<string[]> {
  const field = textField(kind);
  const stream = tokenizer.decodeStream(skipSpecial);
  const texts: string[] = [];
  let start = 0;
  for (const chunk of plan.chunks) {
    if (chunk.delta) texts.push(typeof chunk.delta[field] === 'string' ? (chunk.delta[field] as string) : '');
    else {
      let text = '';
      for (let i = start; i < chunk.end; i++) text += (await stream.step(plan.tokenIds[i])) ?? '';
      texts.push(text);
    }
    start = chunk.end;
  }
  return texts;
}

/** The first index whose value is at least `value` in ascending `values` (their length when none is). */
function firstAtLeast(values: readonly number[], value: number): number {
  let low = 0;
  let high = values.length;
  while (low < high) {
    const mid = (low + high) >>> 1;
    if (values[mid] < value) low = mid + 1;
    else high = mid;
  }
  return low;
}

/**
 * Applies `stop` strings to a plan: the output ends with the chunk in which a stop string first appears (its last
 * character is in it, the chunk ends past `min_tokens`); the text is cut before the stop string (or after it with
 * `include_stop_str_in_output`), `stop_reason` = the string. Each stop string is looked for once, in the whole
 * text: looking chunk by chunk cost chunks × stop strings × their length (1.6 s for 20,000 tokens and 900 stop
 * strings of 1,000 characters).
 */
export async function cutAtStopString(plan: ChoicePlan, params: OutputParams, tokenizer: ModelTokenizer): Promise<ChoicePlan> {
  if (params.stop.length === 0) return plan;
  const field = textField(params.kind);
  const texts = await chunkTexts(plan, params.kind, tokenizer, params.skipSpecialTokens);
  const first = plan.chunks.findIndex((chunk) => chunk.end > params.minTokens);
  if (first < 0) return plan;
  // Where the text ends after each chunk.
  const ends: number[] = [];
  let length = 0;
  for (const t of texts) ends.push((length += t.length));
  const text = texts.join('');
  // A stop string seen by the first chunk that may stop the output may have started in the chunks before it.
  const longest = Math.max(...params.stop.map((s) => s.length));
  const from = Math.max(0, (first === 0 ? 0 : ends[first - 1]) - longest + 1);
  let hit: { chunk: number; at: number; stop: string } | undefined;
  for (const stop of params.stop) {
    const at = stop.length > 0 ? text.indexOf(stop, from) : -1;
    if (at < 0) continue;
    const chunk = Math.max(first, firstAtLeast(ends, at + stop.length));
    if (!hit || chunk < hit.chunk || (chunk === hit.chunk && at < hit.at)) hit = { chunk, at, stop };
  }
  if (!hit) return plan;
  const c = hit.chunk;
  const cut = hit.at + (params.includeStopStrInOutput ? hit.stop.length : 0);
  // vLLM's detokenizer streams all but the last (longest stop − 1) characters until the request finishes
  // (get_next_output_text's stop buffer), so the start of a stop string that spans chunks is never sent: each
  // chunk sends its text up to that buffer, the last one up to the cut.
  const buffer = params.includeStopStrInOutput ? 0 : longest - 1;
  let sent = 0;
  // Chunks that carry other fields only (a thinking span's reasoning) keep their delta as it is.
  const chunks = plan.chunks.slice(0, c + 1).map((chunk, k) => {
    if (chunk.delta && !(field in chunk.delta)) return chunk;
    const upTo = k === c ? cut : Math.min(cut, ends[k] - buffer);
    const delta = text.slice(sent, Math.max(sent, upTo));
    sent = Math.max(sent, upTo);
    return { ...chunk, delta: { ...(chunk.delta ?? {}), [field]: delta } };
  });
  return endPlan(plan, chunks[c].end, chunks, 'stop', hit.stop);
}
