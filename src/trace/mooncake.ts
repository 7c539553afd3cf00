/**
 * Mooncake JSONL traces (engine-reference §8.1–§8.2): one request per line, its prompt described by
 * block hash ids that each stand for `traceBlockSize` tokens.
 */

export interface TraceRequest {
  /** The row's line in the file (1-based). */
  line: number;
  sessionId: string;
  /** Arrival in ms (first turns of sessions). */
  timestampMs: number | null;
  /** For later turns: ms after the previous turn of the session completes. */
  delayMs: number;
  inputLength: number;
  outputLength: number;
  hashIds: number[];
}

export type TraceRow = Record<string, unknown>;

const finiteNonNegative = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v) && v >= 0;

/** The JSON object of every non-blank line, with its line number (1-based); errors name the line. */
export function traceRows(text: string): { row: TraceRow; line: number }[] {
  const out: { row: TraceRow; line: number }[] = [];
  text.split('\n').forEach((text, index) => {
    if (text.trim() === '') return;
    const line = index + 1;
    let row: unknown;
    try {
      row = JSON.parse(text);
    } catch (err) {
      throw new Error(`line ${line}: not JSON (${(err as Error).message})`);
    }
    if (typeof row !== 'object' || row === null || Array.isArray(row)) throw new Error(`line ${line}: not a JSON object`);
    out.push({ row: row as TraceRow, line });
  });
  return out;
}

/** The prompt, output and arrival fields of every Mooncake-family row (with Dynamo's aliases), checked. */
export function promptFields(
  row: TraceRow,
  where: string,
  traceBlockSize: number,
): { hashIds: number[]; inputLength: number; outputLength: number; timestampMs: number | null } {
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
  return { hashIds: hashIds as number[], inputLength: inputLength as number, outputLength: outputLength as number, timestampMs: timestamp };
}

/** Parses a Mooncake trace; errors name the line and the field. */
export function parseMooncake(text: string, traceBlockSize = 512): TraceRequest[] {
  const out: TraceRequest[] = [];
  const lastTimestamp = new Map<string, number | null>();
  for (const { row, line } of traceRows(text)) {
    const where = `line ${line}`;
    const fields = promptFields(row, where, traceBlockSize);
    const timestamp = fields.timestampMs;
    const sessionId = typeof row.session_id === 'string' ? row.session_id : `request_${line - 1}`;
    const explicitDelay = row.delay ?? row.delay_ms;
    const first = !lastTimestamp.has(sessionId);
    if (explicitDelay !== undefined && !finiteNonNegative(explicitDelay)) throw new Error(`${where}: delay must be a finite number >= 0`);
    if (first && explicitDelay !== undefined && explicitDelay !== 0) throw new Error(`${where}: the first turn of session ${sessionId} cannot have a delay`);
    const previous = lastTimestamp.get(sessionId);
    const delayMs = first
      ? 0
      : ((explicitDelay as number | undefined) ?? (timestamp !== null && previous !== null && previous !== undefined ? Math.max(0, timestamp - previous) : 0));
    // Only a row with a timestamp moves the session's last one (Dynamo: a delay-only row between does not).
    if (first || timestamp !== null) lastTimestamp.set(sessionId, timestamp);
    out.push({ line, sessionId, delayMs, ...fields });
  }
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
