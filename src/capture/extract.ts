import type { ChunkDelta, Generation } from '../store/generation.js';

type Json = Record<string, unknown>;

export interface ParsedResponse {
  generations: Generation[];
  /** Output tokens (all choices) received up to and including each SSE event. */
  eventTokens: number[];
  promptIds: number[] | null;
  /** Every generation carried its output token ids (`return_token_ids`). */
  outputIdsFromEngine: boolean;
  usage: unknown;
  model: string | null;
  /** An error event inside a 200 stream, or an unparsable body. */
  error: string | null;
}

const DATA_PREFIX = 'data: ';

/** The JSON payloads of SSE events, with the index of the event they came from. */
export function sseEvents(body: Buffer, eventEnds: readonly number[]): { index: number; data: string }[] {
  const out: { index: number; data: string }[] = [];
  let start = 0;
  eventEnds.forEach((end, index) => {
    const text = body.subarray(start, end).toString('utf8');
    start = end;
    for (const line of text.split('\n')) {
      if (line.startsWith('data:')) out.push({ index, data: line.slice(line.startsWith(DATA_PREFIX) ? 6 : 5).trim() });
    }
  });
  return out;
}

/**
 * A generation being assembled; `hadIds` = every chunk carried its token ids; `finishOnly`: the chunk (and its SSE
 * event) that carried only a finish reason and was counted as the token that ended generation.
 */
type Building = Omit<Generation, 'choiceIndex'> & { hadIds: boolean; finishOnly: { chunk: number; event: number } | null };

function emptyChoice(): Building {
  return { outputIds: [], tokenTimes: [], chunkTokens: [], chunkDeltas: [], text: '', finishReason: null, stopReason: null, hadIds: true, finishOnly: null };
}

/** The chat delta fields a replay re-renders (role and nulls dropped: vLLM serializes deltas exclude_unset). */
function chatDelta(delta: Json): ChunkDelta {
  const out: ChunkDelta = {};
  for (const [k, v] of Object.entries(delta)) if (k !== 'role' && v !== null && v !== undefined) out[k] = v;
  return out;
}

/** A non-streamed chat message as the delta a single chunk would carry. */
function messageDelta(message: Json): ChunkDelta {
  const out = chatDelta(message);
  for (const k of ['refusal', 'annotations', 'audio', 'function_call']) delete out[k];
  if (Array.isArray(out.tool_calls)) {
    if (out.tool_calls.length === 0) delete out.tool_calls;
    else out.tool_calls = (out.tool_calls as Json[]).map((call, index) => ({ index, ...call }));
  }
  return out;
}

/**
 * What stopped a choice: vLLM's `stop_reason`, or SGLang's `matched_stop` (which names the EOS it stopped on
 * too, where vLLM says null: the recorder tells the two apart by the request's stop_token_ids).
 */
function stopOf(c: Json): string | number | null {
  return (c.stop_reason ?? c.matched_stop ?? null) as string | number | null;
}

function deltaText(kind: 'chat' | 'completion', delta: ChunkDelta): string {
  const value = kind === 'chat' ? delta.content : delta.text;
  return typeof value === 'string' ? value : '';
}

function finish(building: Map<number, Building>): Generation[] {
  return [...building.entries()].sort(([a], [b]) => a - b).map(([choiceIndex, { hadIds: _, finishOnly: __, ...gen }]) => ({ choiceIndex, ...gen }));
}

/** What the engine says it generated (`usage.completion_tokens`), null when it does not say. */
export function completionTokens(usage: unknown): number | null {
  const counted = (usage as { completion_tokens?: unknown } | null | undefined)?.completion_tokens;
  return typeof counted === 'number' ? counted : null;
}

/**
 * A chunk with only a finish reason is the token that ended generation in vLLM's streams (an EOS, whose text is
 * empty); llama.cpp sends one after its last token, generating nothing. When the engine's own count
 * (`usage.completion_tokens`) is the chunks' count without those, they carried no token: uncounted.
 */
function uncountSurplusFinishChunks(building: Map<number, Building>, usage: unknown, eventTokens: number[]): void {
  const generated = completionTokens(usage);
  const choices = [...building.values()];
  const finishOnly = choices.filter((b) => b.finishOnly !== null);
  const counted = choices.reduce((n, b) => n + b.tokenTimes.length, 0);
  if (generated === null || finishOnly.length === 0 || counted - finishOnly.length !== generated) return;
  for (const b of finishOnly) {
    const { chunk, event } = b.finishOnly!;
    const before = b.chunkTokens.slice(0, chunk).reduce((n, c) => n + c, 0);
    b.tokenTimes.splice(before, 1);
    b.chunkTokens.splice(chunk, 1);
    b.chunkDeltas.splice(chunk, 1);
    for (let e = event; e < eventTokens.length; e++) eventTokens[e]--;
  }
}

/**
 * Reads what an engine answered on /v1/completions or /v1/chat/completions (vLLM's formats, and SGLang's, which
 * differ in where the ids and the stop are): per choice the output token ids with their arrival times, the chunks
 * with their deltas, finish and stop reasons.
 */
export function parseResponse(
  kind: 'chat' | 'completion',
  stream: boolean,
  body: Buffer,
  eventEnds: readonly number[],
  eventTimes: readonly number[],
  totalMs: number,
): ParsedResponse {
  const building = new Map<number, Building>();
  const choice = (i: number) => {
    let b = building.get(i);
    if (!b) building.set(i, (b = emptyChoice()));
    return b;
  };
  let promptIds: number[] | null = null;
  let usage: unknown;
  let model: string | null = null;
  let error: string | null = null;
  const eventTokens: number[] = eventEnds.map(() => 0);
  let tokensSoFar = 0;

  const absorb = (c: Json, delta: ChunkDelta, at: number, event: number) => {
    const b = choice(Number(c.index ?? 0));
    const ids = Array.isArray(c.token_ids) ? (c.token_ids as number[]) : null;
    if (Array.isArray(c.prompt_token_ids)) promptIds = c.prompt_token_ids as number[];
    const hasPayload = Object.keys(delta).length > 0 && (deltaText(kind, delta) !== '' || Object.keys(delta).some((k) => k !== 'content' && k !== 'text'));
    const count = ids ? ids.length : hasPayload || c.finish_reason ? 1 : 0;
    tokensSoFar += count;
    if (!ids && count > 0) b.hadIds = false;
    if (count > 0 || hasPayload) {
      if (!ids && !hasPayload) b.finishOnly = { chunk: b.chunkTokens.length, event };
      b.chunkTokens.push(count);
      b.chunkDeltas.push(delta);
      for (let i = 0; i < count; i++) {
        if (ids) b.outputIds.push(ids[i]);
        b.tokenTimes.push(at);
      }
      b.text += deltaText(kind, delta);
    }
    if (c.finish_reason != null) {
      b.finishReason = String(c.finish_reason);
      b.stopReason = stopOf(c);
    }
  };

  if (stream) {
    let lastEvent = 0;
    for (const { index, data } of sseEvents(body, eventEnds)) {
      for (; lastEvent < index; lastEvent++) eventTokens[lastEvent] = tokensSoFar;
      if (data === '[DONE]') continue;
      let chunk: Json;
      try {
        chunk = JSON.parse(data) as Json;
      } catch {
        error = `unparsable SSE event: ${data.slice(0, 200)}`;
        continue;
      }
      if (chunk.error) {
        const e = chunk.error as Json;
        error = String(e.message ?? JSON.stringify(e));
        continue;
      }
      if (typeof chunk.model === 'string') model = chunk.model;
      if (Array.isArray(chunk.prompt_token_ids)) promptIds = chunk.prompt_token_ids as number[];
      if (chunk.usage) usage = chunk.usage;
      for (const c of (chunk.choices ?? []) as Json[]) {
        const delta = kind === 'chat' ? chatDelta((c.delta ?? {}) as Json) : { text: String(c.text ?? '') };
        // vLLM's first chat chunk (role + empty content) carries no token.
        if (
          kind === 'chat' &&
          (c.delta as Json | undefined)?.role !== undefined &&
          !Array.isArray(c.token_ids) &&
          deltaText(kind, delta) === '' &&
          c.finish_reason == null
        ) {
          choice(Number(c.index ?? 0));
          continue;
        }
        absorb(c, delta, eventTimes[index] ?? totalMs, index);
      }
    }
    for (; lastEvent < eventEnds.length; lastEvent++) eventTokens[lastEvent] = tokensSoFar;
    uncountSurplusFinishChunks(building, usage, eventTokens);
  } else {
    try {
      const json = JSON.parse(body.toString('utf8')) as Json;
      if (typeof json.model === 'string') model = json.model;
      if (Array.isArray(json.prompt_token_ids)) promptIds = json.prompt_token_ids as number[];
      usage = json.usage;
      for (const c of (json.choices ?? []) as Json[]) {
        const delta = kind === 'chat' ? messageDelta((c.message ?? {}) as Json) : { text: String(c.text ?? '') };
        const b = choice(Number(c.index ?? 0));
        const ids = Array.isArray(c.token_ids) ? (c.token_ids as number[]) : null;
        if (Array.isArray(c.prompt_token_ids)) promptIds = c.prompt_token_ids as number[];
        b.hadIds = ids !== null;
        b.outputIds = ids ?? [];
        b.tokenTimes = b.outputIds.map(() => totalMs);
        b.chunkTokens = [b.outputIds.length];
        b.chunkDeltas = [delta];
        b.text = deltaText(kind, delta);
        b.finishReason = c.finish_reason == null ? null : String(c.finish_reason);
        b.stopReason = stopOf(c);
      }
    } catch {
      error = 'unparsable JSON response body';
    }
  }
  const generations = finish(building);
  return {
    generations,
    eventTokens,
    promptIds,
    outputIdsFromEngine: generations.length > 0 && [...building.values()].every((b) => b.hadIds),
    usage,
    model,
    error,
  };
}

/**
 * The text of each streamed chunk that counted one token, when every counted chunk carried text alone (one token
 * per chunk, as llama.cpp and `transformers serve` stream); the empty chunk of a stop token is left out. Null when
 * the chunks cannot say which text each token made (tool calls, reasoning, several tokens in a chunk).
 */
export function streamedPieces(kind: 'chat' | 'completion', gen: Generation, endsOnStopToken: boolean): string[] | null {
  const field = kind === 'chat' ? 'content' : 'text';
  const pieces: string[] = [];
  for (const [i, count] of gen.chunkTokens.entries()) {
    if (count === 0) continue;
    const delta = gen.chunkDeltas[i];
    const piece = delta?.[field];
    const onlyText = delta !== undefined && Object.keys(delta).every((k) => k === field);
    if (endsOnStopToken && i === gen.chunkTokens.length - 1 && count === 1 && (piece === undefined || piece === '')) continue;
    if (count !== 1 || !onlyText || typeof piece !== 'string' || piece === '') return null;
    pieces.push(piece);
  }
  return pieces;
}

/**
 * Gives a generation whose engine sent no token ids the ids of its text (from /tokenize or the local
 * tokenizer), keeping one token per streamed chunk where the counts allow.
 */
export function withOutputIds(gen: Generation, ids: number[]): Generation {
  const chunkTimes: number[] = [];
  let seen = 0;
  for (const count of gen.chunkTokens) {
    chunkTimes.push(gen.tokenTimes[seen] ?? gen.tokenTimes[gen.tokenTimes.length - 1] ?? 0);
    seen += count;
  }
  const chunkTokens = [...gen.chunkTokens];
  let total = chunkTokens.reduce((a, b) => a + b, 0);
  for (let i = chunkTokens.length - 1; i >= 0 && total > ids.length; i--) {
    const take = Math.min(chunkTokens[i], total - ids.length);
    chunkTokens[i] -= take;
    total -= take;
  }
  if (total < ids.length && chunkTokens.length > 0) chunkTokens[chunkTokens.length - 1] += ids.length - total;
  const times: number[] = [];
  chunkTokens.forEach((count, i) => {
    for (let k = 0; k < count; k++) times.push(chunkTimes[i]);
  });
  return { ...gen, outputIds: ids, chunkTokens, tokenTimes: times };
}
