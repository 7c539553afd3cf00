/**
 * `mocker trace convert`: requests of a capture (or of a coding agent's session log, claudeLog.ts) written as a
 * text-free trace — Mooncake rows (sessions of turns, each a delay after the previous completes) or Dynamo's
 * `agentic_mooncake` rows (requests that wait for others) — with hash ids for the prompts' blocks (rollingHash.ts).
 */
import { type CapturedConversations, gapMs, requestedOutput } from './capturedWorkload.js';
import { RollingHashIds } from './rollingHash.js';
import type { TraceOutputFormat } from './traceFormats.js';

/** One request of a converted trace. */
export interface ConvertedRequest {
  requestId: string;
  sessionId: string;
  /** The request this one continues (its `wait_for`), or null: the first of its conversation, at `startMs`. */
  after: string | null;
  /** When it started (epoch ms, or any clock shared by the file). */
  startMs: number;
  /** From the end of `after` to this request's start (ms): the tool or think time. */
  delayMs: number;
  inputLength: number;
  outputLength: number;
  hashIds: number[];
}

/**
 * The trace's rows, one JSON line each, in the order given (a Mooncake session's turns must come in order). The
 * first requests of conversations carry `timestamp` (ms after the earliest of them, Dynamo's converters' rule); later
 * ones their `delay` after the request they continue (Mooncake: after the session's previous row, which for a
 * conversation without branches is the same request). Tool and think time are not told apart: no `tool_wait_ms`.
 */
export function* traceLines(requests: readonly ConvertedRequest[], format: TraceOutputFormat): Generator<string> {
  let first = Infinity;
  for (const r of requests) if (r.after === null) first = Math.min(first, r.startMs);
  for (const r of requests) {
    const when = r.after === null ? { timestamp: r.startMs - first } : { delay: r.delayMs };
    const lengths = { input_length: r.inputLength, output_length: r.outputLength, hash_ids: r.hashIds };
    const row =
      format === 'mooncake'
        ? { session_id: r.sessionId, ...when, ...lengths }
        : { request_id: r.requestId, session_id: r.sessionId, ...(r.after === null ? {} : { wait_for: [r.after] }), ...when, ...lengths };
    yield `${JSON.stringify(row)}\n`;
  }
}

/** A capture's turns as requests (start order): each conversation a session named by its first exchange. */
export function capturedRequests(c: CapturedConversations, traceBlockSize: number): ConvertedRequest[] {
  const hashIds = new RollingHashIds(traceBlockSize);
  const id = (turn: number) => `exchange-${c.turns[turn].exchangeId}`;
  return c.turns.map((turn, i) => ({
    requestId: id(i),
    sessionId: id(c.root[i]),
    after: c.parent[i] < 0 ? null : id(c.parent[i]),
    startMs: turn.startMs,
    delayMs: gapMs(c, i),
    inputLength: turn.prompt.length,
    outputLength: requestedOutput(turn),
    hashIds: hashIds.of(turn.prompt),
  }));
}
