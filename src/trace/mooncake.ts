/**
 * Mooncake JSONL traces (engine-reference §8.1–§8.2): one request per line, its prompt described by
 * block hash ids that each stand for `traceBlockSize` tokens.
 */

export interface TraceRequest {
  sessionId: string;
  /** Arrival in ms (first turns of sessions). */
  timestampMs: number | null;
  /** For later turns: ms after the previous turn of the session completes. */
  delayMs: number;
  inputLength: number;
  outputLength: number;
  hashIds: number[];
}

type Row = Record<string, unknown>;

const finiteNonNegative = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v) && v >= 0;

/** Parses a Mooncake trace; errors name the line and the field. */
export function parseMooncake(text: string, traceBlockSize = 512): TraceRequest[] {
  const out: TraceRequest[] = [];
  const lastTimestamp = new Map<string, number | null>();
  text.split('\n').forEach((line, index) => {
    if (line.trim() === '') return;
    const where = `line ${index + 1}`;
    let row: Row;
    try {
      row = JSON.parse(line) as Row;
    } catch (err) {
      throw new Error(`${where}: not JSON (${(err as Error).message})`);
    }
    const hashIds = row.hash_ids;
    if (!Array.isArray(hashIds) || !hashIds.every((h) => Number.isInteger(h) && h >= 0))
      throw new Error(`${where}: hash_ids must be a list of non-negative integers`);
    const outputLength = row.output_length ?? row.output_tokens;
    if (!Number.isInteger(outputLength) || (outputLength as number) < 0) throw new Error(`${where}: output_length must be a non-negative integer`);
    const inputLength = row.input_length ?? row.input_tokens ?? hashIds.length * traceBlockSize;
    if (!Number.isInteger(inputLength) || (inputLength as number) < 0) throw new Error(`${where}: input_length must be a non-negative integer`);
    if (hashIds.length * traceBlockSize < (inputLength as number)) {
      throw new Error(`${where}: ${hashIds.length} hash ids × ${traceBlockSize} tokens cannot hold input_length ${String(inputLength)}`);
    }
    const timestamp = row.timestamp ?? row.created_time ?? null;
    if (timestamp !== null && !finiteNonNegative(timestamp)) throw new Error(`${where}: timestamp must be a finite number >= 0`);
    const sessionId = typeof row.session_id === 'string' ? row.session_id : `request_${index}`;
    const explicitDelay = row.delay ?? row.delay_ms;
    const first = !lastTimestamp.has(sessionId);
    if (explicitDelay !== undefined && !finiteNonNegative(explicitDelay)) throw new Error(`${where}: delay must be a finite number >= 0`);
    if (first && explicitDelay !== undefined && explicitDelay !== 0) throw new Error(`${where}: the first turn of session ${sessionId} cannot have a delay`);
    const previous = lastTimestamp.get(sessionId);
    const delayMs = first
      ? 0
      : ((explicitDelay as number | undefined) ?? (timestamp !== null && previous !== null && previous !== undefined ? Math.max(0, timestamp - previous) : 0));
    lastTimestamp.set(sessionId, timestamp);
    out.push({
      sessionId,
      timestampMs: timestamp,
      delayMs,
      inputLength: inputLength as number,
      outputLength: outputLength as number,
      hashIds: hashIds as number[],
    });
  });
  if (out.length === 0) throw new Error('the trace holds no requests');
  return out;
}

/** §8.2: each hash id becomes `traceBlockSize` copies of itself (as u32), cut to `inputLength` tokens. */
export function synthesizeTokens(hashIds: readonly number[], inputLength: number, traceBlockSize: number): Uint32Array {
  const tokens = new Uint32Array(inputLength);
  for (let block = 0, start = 0; start < inputLength; block++, start += traceBlockSize) {
    tokens.fill(hashIds[block], start, Math.min(inputLength, start + traceBlockSize));
  }
  return tokens;
}
