/**
 * Dynamo's agentic trace formats (ai-dynamo/dynamo docs/dynosim/trace-formats.md): `agentic_mooncake`, a request DAG
 * whose rows wait for others to complete, and `applied_compute_agentic`, Applied Compute's tool loops (one row a
 * session of num_turns + 1 requests whose prompt grows by each answer and tool output).
 */
import { promptFields, synthesizeTokens, traceRows, type TraceRow } from './mooncake.js';
import { checkDependencies, workloadOf, type Session, type Turn, type Workload } from './workload.js';

function stringList(value: unknown, where: string, key: string): string[] {
  if (value === undefined) return [];
  if (!Array.isArray(value) || !value.every((v) => typeof v === 'string')) throw new Error(`${where}: ${key} must be a list of request ids (strings)`);
  return value as string[];
}

function optionalMs(row: TraceRow, key: string, where: string, alias?: string): number {
  const value = row[key] ?? (alias === undefined ? undefined : row[alias]);
  if (value === undefined) return 0;
  if (typeof value !== 'number' || !Number.isFinite(value)) throw new Error(`${where}: ${key} must be a finite number of ms`);
  return value;
}

/** The metadata Dynamo keeps but does not schedule by (prefix_reset included: replay does not reset the cache): checked, then ignored. */
function checkMetadata(row: TraceRow, where: string): void {
  stringList(row.branches, where, 'branches');
  if (row.prefix_reset !== undefined && typeof row.prefix_reset !== 'boolean') throw new Error(`${where}: prefix_reset must be true or false`);
  const events = row.tool_events;
  if (events !== undefined && !(Array.isArray(events) && events.every((e) => typeof e === 'object' && e !== null && !Array.isArray(e))))
    throw new Error(`${where}: tool_events must be a list of objects`);
  if (row.session_id !== undefined && typeof row.session_id !== 'string') throw new Error(`${where}: session_id must be a string`);
}

/**
 * `agentic_mooncake`: every row one request (a session of one turn, its id the row's request_id) in the trajectory
 * `session_id` (default `request_<line>`), which reports group by. A row with `wait_for` is ready `delay + tool_wait_ms`
 * after the slowest of those completes, its own timestamp only taking part in the start's normalisation; a root
 * arrives at its timestamp (default 0). Prompts are each row's own hash ids: nothing accumulates.
 */
export function agenticMooncakeWorkload(text: string, traceBlockSize: number): Workload {
  const sessions: Session[] = [];
  const lineOf = new Map<string, number>();
  for (const { row, line } of traceRows(text)) {
    const where = `line ${line}`;
    const id = row.request_id;
    if (typeof id !== 'string' || id.trim() === '') throw new Error(`${where}: request_id must be a non-empty string`);
    if (lineOf.has(id)) throw new Error(`${where} duplicates request_id ${id} (line ${lineOf.get(id)})`);
    lineOf.set(id, line);
    const { hashIds, inputLength, outputLength, timestampMs } = promptFields(row, where, traceBlockSize);
    const waitFor = stringList(row.wait_for, where, 'wait_for');
    checkMetadata(row, where);
    const dependencyDelayMs = optionalMs(row, 'delay', where, 'delay_ms') + optionalMs(row, 'tool_wait_ms', where);
    if (!(dependencyDelayMs >= 0)) throw new Error(`${where}: delay + tool_wait_ms must be >= 0, got ${dependencyDelayMs}`);
    const turn: Turn = { inputLength, outputLength, delayMs: 0, prompt: () => synthesizeTokens(hashIds, inputLength, traceBlockSize) };
    sessions.push({
      id,
      group: typeof row.session_id === 'string' ? row.session_id : `request_${line}`,
      startMs: timestampMs ?? (waitFor.length === 0 ? 0 : null),
      turns: [turn],
      ...(waitFor.length > 0 ? { waitFor, dependencyDelayMs } : {}),
    });
  }
  if (sessions.length === 0) throw new Error('the agentic trace holds no requests');
  checkDependencies(sessions, (id) => `line ${lineOf.get(id)}: `);
  return workloadOf(sessions);
}

/** A list field of an applied_compute_agentic row: one entry per turn, each checked. */
function perTurn(row: TraceRow, key: string, turns: number, where: string, valid: (v: unknown) => boolean, what: string): number[] {
  const value = row[key];
  if (!Array.isArray(value)) throw new Error(`${where}: ${key} must be a list`);
  if (value.length !== turns) throw new Error(`${where}: field ${key} length ${value.length} does not match num_turns ${turns}`);
  value.forEach((v, i) => {
    if (!valid(v)) throw new Error(`${where}: ${key}[${i}] must be ${what}`);
  });
  return value as number[];
}

const isCount = (v: unknown) => Number.isInteger(v) && (v as number) >= 0;

/**
 * `applied_compute_agentic` (Dynamo's trace.rs): row n is the session `applied_compute_agentic_session_<n>` of
 * num_turns requests and a final one. Turn i's prompt is L_i tokens (L_0 = input_prompt_length, then each turn adds
 * its answer and its tool output), the final request's L_num_turns; each waits the previous tool call's latency
 * (seconds) after the previous request completes. A session's hash ids only grow, each new block taking the next id
 * of one counter over the whole file (from 1): turn after turn extends the same prefix. No arrival times: it runs
 * with --replay-concurrency only.
 */
export function appliedComputeWorkload(text: string, traceBlockSize: number): Workload {
  const sessions: Session[] = [];
  let nextHashId = 1;
  for (const { row, line } of traceRows(text)) {
    const where = `line ${line}`;
    const count = (key: string) => {
      if (!isCount(row[key])) throw new Error(`${where}: ${key} must be a non-negative integer`);
      return row[key] as number;
    };
    const numTurns = count('num_turns');
    const promptLength = count('input_prompt_length');
    if (promptLength === 0) throw new Error(`${where}: input_prompt_length must be positive`);
    const answers = perTurn(row, 'assistant_response_length', numTurns, where, isCount, 'a non-negative integer');
    const toolOutputs = perTurn(row, 'tool_call_output_length', numTurns, where, isCount, 'a non-negative integer');
    const latencies = perTurn(
      row,
      'tool_call_latency',
      numTurns,
      where,
      (v) => typeof v === 'number' && Number.isFinite(v) && v >= 0,
      'a finite non-negative number',
    );
    const finalLength = count('final_assistant_response_length');
    const hashIds: number[] = [];
    const turn = (inputLength: number, outputLength: number, delayMs: number): Turn => {
      if (!Number.isSafeInteger(inputLength)) throw new Error(`${where}: the cumulative input length overflows`);
      while (hashIds.length < Math.ceil(inputLength / traceBlockSize)) hashIds.push(nextHashId++);
      // Only the first ceil(inputLength / block) ids are read: later turns' growth does not change this prompt.
      return { inputLength, outputLength, delayMs, prompt: () => synthesizeTokens(hashIds, inputLength, traceBlockSize) };
    };
    const turns: Turn[] = [];
    let length = promptLength;
    for (let i = 0; i < numTurns; i++) {
      turns.push(turn(length, answers[i], i === 0 ? 0 : latencies[i - 1] * 1000));
      length += answers[i] + toolOutputs[i];
    }
    turns.push(turn(length, finalLength, numTurns === 0 ? 0 : latencies[numTurns - 1] * 1000));
    sessions.push({ id: `applied_compute_agentic_session_${line}`, startMs: null, turns });
  }
  if (sessions.length === 0) throw new Error('the applied_compute_agentic trace holds no sessions');
  return workloadOf(sessions);
}
