/**
 * What a trace run sends (engine-reference §8.1–§8.4): sessions of turns. A session's first turn arrives at
 * its start time; each later turn is ready a delay after the previous one completes (closed loop). Prompts
 * are built when a turn is dispatched, so a 12,000-row trace holds hash ids, not millions of tokens.
 */
import type { TokenIds } from '../engine/index.js';
import { seededUniform } from '../util/mulberry32.js';
import { parseMooncake, synthesizeTokens, type TraceRequest } from './mooncake.js';

export interface Turn {
  inputLength: number;
  outputLength: number;
  /** ms after the previous turn of the session completes (first turns: 0). */
  delayMs: number;
  /** The prompt's token ids, built on demand (packed by the generated workloads). */
  prompt(): TokenIds;
  /** The output it is to generate, when planned (a mooncake-delta turn: the next turn's prompt repeats it); else random. */
  outputTokenIds?: () => readonly number[];
}

export interface Session {
  id: string;
  /**
   * Arrival of the first turn (ms), or null when the source has none (only concurrency mode can run it). A session
   * that waits for others is ready after them instead; its start only takes part in normalizeArrivals.
   */
  startMs: number | null;
  turns: Turn[];
  /**
   * Agentic DAGs: the sessions (by id) whose last turn must complete before this session's first turn is ready, which
   * is then `dependencyDelayMs` after the slowest of them completes.
   */
  waitFor?: readonly string[];
  dependencyDelayMs?: number;
  /** The trajectory a DAG's request belongs to, which reports call its session (agentic rows: their session_id). */
  group?: string;
}

export interface Workload {
  sessions: Session[];
  /** Total turns. */
  requests: number;
}

export const workloadOf = (sessions: Session[]): Workload => ({ sessions, requests: sessions.reduce((n, s) => n + s.turns.length, 0) });

/** Mooncake rows grouped into sessions in file order (§8.1). */
export function mooncakeWorkload(rows: readonly TraceRequest[], traceBlockSize: number): Workload {
  const sessions = new Map<string, Session>();
  for (const row of rows) {
    let session = sessions.get(row.sessionId);
    if (!session) {
      session = { id: row.sessionId, startMs: row.timestampMs, turns: [] };
      sessions.set(row.sessionId, session);
    }
    const { hashIds, inputLength } = row;
    session.turns.push({
      inputLength,
      outputLength: row.outputLength,
      delayMs: row.delayMs,
      prompt: () => synthesizeTokens(hashIds, inputLength, traceBlockSize),
    });
  }
  return workloadOf([...sessions.values()]);
}

export function mooncakeFileWorkload(text: string, traceBlockSize: number): Workload {
  return mooncakeWorkload(parseMooncake(text, traceBlockSize), traceBlockSize);
}

/** Planned output ids are Dynamo's synthetic tokens of their own request indices, apart from a synthetic workload's. */
const PLANNED_OUTPUT_REQUESTS = 0xd37a0000;

/** The output ids planned for the `ordinal`-th row of a trace: deterministic, so a run repeats exactly. */
export function plannedOutputTokenIds(ordinal: number, count: number): number[] {
  return Array.from({ length: count }, (_, i) => syntheticTokenId(PLANNED_OUTPUT_REQUESTS + ordinal, i));
}

/**
 * Dynamo's `mooncake-delta` (trace-formats.md, its newest driver): each row holds only what its turn adds, so turn k's
 * prompt is turn k−1's, the output turn k−1 generated (planned, and fed to the engine), then row k's blocks. Each row
 * needs exactly ceil(input_length / trace block size) hash ids.
 */
export function mooncakeDeltaWorkload(rows: readonly TraceRequest[], traceBlockSize: number): Workload {
  const sessions = new Map<string, { session: Session; deltas: TraceRequest[]; build: (index: number) => Uint32Array }>();
  rows.forEach((row, ordinal) => {
    const needed = Math.ceil(row.inputLength / traceBlockSize);
    if (row.inputLength === 0) throw new Error(`line ${row.line}: a mooncake-delta row needs a positive input_length`);
    if (row.hashIds.length !== needed)
      throw new Error(
        `line ${row.line}: input_length ${row.inputLength} requires exactly ${needed} hash IDs at trace_block_size ${traceBlockSize}, got ${row.hashIds.length}`,
      );
    let entry = sessions.get(row.sessionId);
    if (!entry) {
      const session: Session = { id: row.sessionId, startMs: row.timestampMs, turns: [] };
      const deltas: TraceRequest[] = [];
      entry = { session, deltas, build: deltaPrompts(session.turns, deltas, traceBlockSize) };
      sessions.set(row.sessionId, entry);
    }
    const { turns } = entry.session;
    const { build } = entry;
    const previous = turns.at(-1);
    const index = turns.length;
    entry.deltas.push(row);
    turns.push({
      inputLength: (previous ? previous.inputLength + previous.outputLength : 0) + row.inputLength,
      outputLength: row.outputLength,
      delayMs: row.delayMs,
      prompt: () => build(index),
      outputTokenIds: () => plannedOutputTokenIds(ordinal, row.outputLength),
    });
  });
  return workloadOf([...sessions.values()].map((e) => e.session));
}

/**
 * A delta session's prompts, turn by turn. The last one built is kept for the next turn to extend (a session's turns
 * are dispatched in order), and let go with the session's last turn.
 */
function deltaPrompts(turns: readonly Turn[], deltas: readonly TraceRequest[], traceBlockSize: number): (index: number) => Uint32Array {
  let last: { index: number; tokens: Uint32Array } | null = null;
  const build = (index: number): Uint32Array => {
    if (last?.index === index) return last.tokens;
    const delta = synthesizeTokens(deltas[index].hashIds, deltas[index].inputLength, traceBlockSize);
    let tokens = delta;
    if (index > 0) {
      const before = build(index - 1);
      const output = turns[index - 1].outputTokenIds!();
      tokens = new Uint32Array(before.length + output.length + delta.length);
      tokens.set(before);
      tokens.set(output, before.length);
      tokens.set(delta, before.length + output.length);
    }
    last = index === turns.length - 1 ? null : { index, tokens };
    return tokens;
  };
  return build;
}

/**
 * Checks a workload's dependencies: every `waitFor` names another session of the workload, and none waits for itself
 * through others (a cycle would never start). Errors name the sessions, after `where(id)` (a trace's line).
 */
export function checkDependencies(sessions: readonly Session[], where: (id: string) => string = () => ''): void {
  const byId = new Map(sessions.map((s) => [s.id, s]));
  if (byId.size !== sessions.length) {
    const seen = new Set<string>();
    for (const s of sessions) {
      if (seen.has(s.id)) throw new Error(`two requests share the id ${s.id}`);
      seen.add(s.id);
    }
  }
  for (const s of sessions) {
    for (const id of s.waitFor ?? []) {
      if (id === s.id) throw new Error(`${where(s.id)}request ${s.id} cannot wait for itself`);
      if (!byId.has(id)) throw new Error(`${where(s.id)}request ${s.id} waits for unknown request_id ${id}`);
    }
    const delay = s.dependencyDelayMs ?? 0;
    if (!(Number.isFinite(delay) && delay >= 0))
      throw new Error(`${where(s.id)}request ${s.id}: its delay after its dependencies must be a finite number >= 0`);
  }
  // Iterative depth-first search: a trace's chains can be longer than the call stack.
  const state = new Map<string, 'open' | 'done'>();
  for (const root of sessions) {
    if (state.has(root.id)) continue;
    const stack: { session: Session; next: number }[] = [{ session: root, next: 0 }];
    state.set(root.id, 'open');
    while (stack.length > 0) {
      const top = stack[stack.length - 1];
      const deps = top.session.waitFor ?? [];
      if (top.next === deps.length) {
        state.set(top.session.id, 'done');
        stack.pop();
        continue;
      }
      const dep = byId.get(deps[top.next++])!;
      const seen = state.get(dep.id);
      if (seen === 'open') throw new Error(`cycle detected at request ${dep.id}`);
      if (seen === undefined) {
        state.set(dep.id, 'open');
        stack.push({ session: dep, next: 0 });
      }
    }
  }
}

/**
 * Shifts session starts so the earliest is 0 and divides starts and inter-turn delays by `ratio`
 * (Dynamo's normalize_session_starts + speed_up_timing).
 */
export function normalizeArrivals(workload: Workload, ratio: number): Workload {
  if (!(Number.isFinite(ratio) && ratio > 0)) throw new Error(`the arrival speedup ratio must be a finite number > 0, got ${ratio}`);
  let first = Infinity;
  for (const s of workload.sessions) if (s.startMs !== null) first = Math.min(first, s.startMs);
  if (first === Infinity) first = 0;
  return workloadOf(
    workload.sessions.map((s) => ({
      ...s,
      startMs: s.startMs === null ? null : (s.startMs - first) / ratio,
      ...(s.dependencyDelayMs !== undefined ? { dependencyDelayMs: s.dependencyDelayMs / ratio } : {}),
      turns: s.turns.map((t) => ({ ...t, delayMs: t.delayMs / ratio })),
    })),
  );
}

/** Live targets take only ids of their vocabulary: ids folded into this range are ordinary tokens of every 32k+ vocabulary. */
const FOLD_BASE = 1000;
const FOLD_SPAN = 30000;

/**
 * Maps a synthetic or Mooncake workload's token ids (hash ids, u32 mixes) into [1000, 31000), which real
 * servers accept: equal ids stay equal, so shared prefixes stay shared (distinct ids may meet, rarely).
 */
export function foldIntoVocabulary(workload: Workload): Workload {
  return workloadOf(
    workload.sessions.map((s) => ({
      ...s,
      turns: s.turns.map((t) => ({ ...t, prompt: () => t.prompt().map((id) => FOLD_BASE + (id % FOLD_SPAN)) })),
    })),
  );
}

// --- synthetic workloads (§8.3) ---

/** The high 32 bits of the 64-bit product of two u32, with 16-bit limbs so every partial product is exact. */
function mulHigh(x: number, y: number): number {
  const x0 = x & 0xffff,
    x1 = x >>> 16,
    y0 = y & 0xffff,
    y1 = y >>> 16;
  const p00 = x0 * y0;
  const mid = x1 * y0 + x0 * y1 + (p00 >>> 16);
  return Math.floor(mid / 0x10000) + x1 * y1;
}

/**
 * Dynamo's `synthetic_token_id`: SplitMix64 of `(request << 32) ^ token`, low 32 bits, 0 → 1. The 64-bit state
 * is a (high, low) pair of u32 updated in place: this runs for every token of a synthetic prompt.
 */
export function syntheticTokenId(requestIdx: number, tokenIdx: number): number {
  // (request << 32) ^ token, plus 0x9E3779B97F4A7C15
  const sumLow = (tokenIdx >>> 0) + 0x7f4a7c15;
  let low = sumLow >>> 0;
  let high = ((requestIdx >>> 0) + 0x9e3779b9 + (sumLow > 0xffffffff ? 1 : 0)) >>> 0;
  // ^= >> 30
  low = (low ^ ((low >>> 30) | (high << 2))) >>> 0;
  high = (high ^ (high >>> 30)) >>> 0;
  // *= 0xBF58476D1CE4E5B9
  let productHigh = (mulHigh(low, 0x1ce4e5b9) + Math.imul(high, 0x1ce4e5b9) + Math.imul(low, 0xbf58476d)) >>> 0;
  low = Math.imul(low, 0x1ce4e5b9) >>> 0;
  high = productHigh;
  // ^= >> 27
  low = (low ^ ((low >>> 27) | (high << 5))) >>> 0;
  high = (high ^ (high >>> 27)) >>> 0;
  // *= 0x94D049BB133111EB
  productHigh = (mulHigh(low, 0x133111eb) + Math.imul(high, 0x133111eb) + Math.imul(low, 0x94d049bb)) >>> 0;
  low = Math.imul(low, 0x133111eb) >>> 0;
  high = productHigh;
  // ^= >> 31, low half
  low = (low ^ ((low >>> 31) | (high << 1))) >>> 0;
  return low === 0 ? 1 : low;
}

export interface SyntheticOptions {
  inputTokens: number;
  outputTokens: number;
  requestCount: number;
  arrivalIntervalMs: number;
  turnsPerSession: number;
  sharedPrefixRatio: number;
  numPrefixGroups: number;
  interTurnDelayMs: number;
  /** The engine's block size: prefix groups share whole engine blocks. */
  blockSize: number;
  seed: number;
}

export const isWorkloadSynthetic = (o: SyntheticOptions) => o.turnsPerSession > 1 || o.sharedPrefixRatio > 0 || o.numPrefixGroups > 0 || o.interTurnDelayMs > 0;

function checkSynthetic(o: SyntheticOptions): void {
  const positive = (name: string, v: number) => {
    if (!(Number.isInteger(v) && v >= 1)) throw new Error(`${name} must be an integer >= 1, got ${v}`);
  };
  positive('--input-tokens', o.inputTokens);
  positive('--output-tokens', o.outputTokens);
  positive('--request-count', o.requestCount);
  positive('--turns-per-session', o.turnsPerSession);
  if (!(Number.isFinite(o.arrivalIntervalMs) && o.arrivalIntervalMs >= 0))
    throw new Error(`--arrival-interval-ms must be a finite number >= 0, got ${o.arrivalIntervalMs}`);
  if (!(o.sharedPrefixRatio >= 0 && o.sharedPrefixRatio <= 1)) throw new Error(`--shared-prefix-ratio must be in [0, 1], got ${o.sharedPrefixRatio}`);
  if (!(Number.isInteger(o.numPrefixGroups) && o.numPrefixGroups >= 0))
    throw new Error(`--num-prefix-groups must be an integer >= 0, got ${o.numPrefixGroups}`);
  if (!(Number.isFinite(o.interTurnDelayMs) && o.interTurnDelayMs >= 0))
    throw new Error(`--inter-turn-delay-ms must be a finite number >= 0, got ${o.interTurnDelayMs}`);
}

/**
 * §8.3. Flat (no workload flag): `requestCount` single-turn sessions of Dynamo's synthetic tokens, no prefix
 * sharing, arriving every `arrivalIntervalMs`. Workload: sessions of `turnsPerSession` turns whose first
 * `round(blocks × ratio)` blocks are their prefix group's (hash ids `0xD00D…` per group and block) and the
 * rest fresh ids; each hash id stands for one engine block of tokens.
 */
export function syntheticWorkload(o: SyntheticOptions): Workload {
  checkSynthetic(o);
  const sessions: Session[] = [];
  if (!isWorkloadSynthetic(o)) {
    for (let i = 0; i < o.requestCount; i++) {
      const input = o.inputTokens;
      const prompt = () => {
        const tokens = new Uint32Array(input);
        for (let t = 0; t < input; t++) tokens[t] = syntheticTokenId(i, t);
        return tokens;
      };
      sessions.push({
        id: `request_${i}`,
        startMs: i * o.arrivalIntervalMs,
        turns: [{ inputLength: input, outputLength: o.outputTokens, delayMs: 0, prompt }],
      });
    }
    return workloadOf(sessions);
  }
  const random = seededUniform(o.seed);
  const bs = o.blockSize;
  const numBlocks = Math.ceil(o.inputTokens / bs);
  const prefixBlocks = Math.min(Math.round(numBlocks * o.sharedPrefixRatio), numBlocks);
  // Hash ids are tokens (§8.2: `hash_id as u32`): prefix ids keep group and block in 32 bits, fresh ids count up from 1.
  const prefixId = (group: number, block: number) => (0xd00d0000 ^ (group << 12) ^ block) >>> 0;
  let nextId = 1;
  for (let i = 0; i < o.requestCount; i++) {
    const group = o.numPrefixGroups > 0 && o.sharedPrefixRatio > 0 ? Math.floor(random() * o.numPrefixGroups) : 0;
    const turns: Turn[] = [];
    for (let turn = 0; turn < o.turnsPerSession; turn++) {
      const hashIds: number[] = [];
      for (let b = 0; b < numBlocks; b++) hashIds.push(b < prefixBlocks ? prefixId(group, b) : nextId++);
      turns.push({
        inputLength: o.inputTokens,
        outputLength: o.outputTokens,
        delayMs: turn === 0 ? 0 : o.interTurnDelayMs,
        prompt: () => synthesizeTokens(hashIds, o.inputTokens, bs),
      });
    }
    sessions.push({ id: `session_${i}`, startMs: i * o.arrivalIntervalMs, turns });
  }
  return workloadOf(sessions);
}
