/**
 * A capture file as a trace (`mocker trace --from-captures`): every complete exchange with prompt token ids (chat,
 * completions, vLLM's generate, the agents' APIs) is a turn that asks for as many tokens as it got. Turns are
 * linked into agent conversations (conversations.ts): a conversation's first turn arrives at its captured start,
 * each later one its captured tool or think time after the turn it continues completes.
 * A load, not a check: whether a target answers as captured is `mocker rerun`'s question.
 */
import { isPromptBatch } from '../capture/recorder.js';
import { CaptureStore, isAgentApi, isGeneration, type StoredExchange } from '../store/captureStore.js';
import { type CapturedTurn, linkTurns } from './conversations.js';
import { type Session, type Turn, type Workload, workloadOf } from './workload.js';

/** Exchanges that cannot be sent again, by why. */
export interface SkippedExchanges {
  failed: number;
  aborted: number;
  /** Several choices: a batch of prompts or `n` > 1. */
  batched: number;
  withoutPromptIds: number;
}

/** A captured exchange as a turn of a conversation. */
export interface ExchangeTurn extends CapturedTurn {
  exchangeId: number;
}

/** A capture's turns in start order, each with the turn it continues. */
export interface CapturedConversations {
  turns: ExchangeTurn[];
  /** Per turn: the index of the turn it continues, or -1 (the first turn of a conversation). */
  parent: Int32Array;
  /** Per turn: the index of its conversation's first turn. */
  root: Int32Array;
  /** The models of the turns, first seen first. */
  models: string[];
  skipped: SkippedExchanges;
  /** What to tell the user about the file (skipped exchanges, conversations found). */
  notes: string[];
}

export interface CapturedWorkload {
  workload: Workload;
  /** The models of the sessions, first seen first. */
  models: string[];
  skipped: SkippedExchanges;
  /** What to tell the user about the file (skipped exchanges, conversations found). */
  notes: string[];
}

/** A batch of prompts is stored whole, without prompt ids, with as many choices as the engine gave. */
function isBatch(exchange: StoredExchange): boolean {
  if (exchange.endpoint === null) return false;
  try {
    const request: unknown = JSON.parse(exchange.requestBody.toString('utf8'));
    return request !== null && typeof request === 'object' && isPromptBatch(exchange.endpoint, request as Record<string, unknown>);
  } catch {
    return false;
  }
}

/** The exchanges of a capture that can be sent again, as turns in start order. */
function readTurns(file: string): { turns: ExchangeTurn[]; models: string[]; skipped: SkippedExchanges } {
  const store = CaptureStore.open(file, { readonly: true });
  const turns: ExchangeTurn[] = [];
  const models = new Set<string>();
  const skipped: SkippedExchanges = { failed: 0, aborted: 0, batched: 0, withoutPromptIds: 0 };
  try {
    for (const id of store.exchangeIds()) {
      const exchange = store.getExchange(id)!;
      // Embeddings and rerank exchanges generate nothing: a generation trace has no turn for them. The agents' APIs
      // and vLLM's generate are turns by their prompt ids like chat's.
      if (exchange.endpoint !== null && !isGeneration(exchange.endpoint) && !isAgentApi(exchange.endpoint)) continue;
      // An answer without choices is a failure (the recorder stores it so).
      if (exchange.outcome !== 'complete' || exchange.generations.length === 0) {
        skipped[exchange.outcome === 'complete' ? 'failed' : exchange.outcome]++;
        continue;
      }
      if (exchange.generations.length > 1 || (exchange.promptIds === null && isBatch(exchange))) {
        skipped.batched++;
        continue;
      }
      if (exchange.promptIds === null || exchange.promptIds.length === 0) {
        skipped.withoutPromptIds++;
        continue;
      }
      // Packed: a capture of long prompts stays small until each turn is sent.
      turns.push({
        exchangeId: id,
        startMs: exchange.startedAt,
        endMs: exchange.startedAt + exchange.totalMs,
        prompt: Uint32Array.from(exchange.promptIds),
        output: Uint32Array.from(exchange.generations[0].outputIds),
      });
      if (exchange.model !== null) models.add(exchange.model);
    }
  } finally {
    store.close();
  }
  turns.sort((a, b) => a.startMs - b.startMs || a.exchangeId - b.exchangeId);
  return { turns, models: [...models], skipped };
}

function skippedNote(skipped: SkippedExchanges): string | null {
  const total = skipped.failed + skipped.aborted + skipped.batched + skipped.withoutPromptIds;
  if (total === 0) return null;
  const reasons = [
    [skipped.failed, 'failed'],
    [skipped.aborted, 'aborted'],
    [skipped.batched, 'with several choices (a batch of prompts or n > 1)'],
    [skipped.withoutPromptIds, 'without prompt token ids'],
  ] as const;
  return `${total} exchange(s) skipped: ${reasons
    .filter(([n]) => n > 0)
    .map(([n, why]) => `${n} ${why}`)
    .join(', ')}`;
}

/** The capture's turns linked into conversations (conversations.ts). */
export function capturedConversations(file: string): CapturedConversations {
  const { turns, models, skipped } = readTurns(file);
  const parent = linkTurns(turns);
  // A parent started before its children: it comes first.
  const root = new Int32Array(turns.length);
  const children = new Uint32Array(turns.length);
  for (let i = 0; i < turns.length; i++) {
    root[i] = parent[i] < 0 ? i : root[parent[i]];
    if (parent[i] >= 0) children[parent[i]]++;
  }
  const notes: string[] = [];
  const skippedLine = skippedNote(skipped);
  if (skippedLine !== null) notes.push(skippedLine);
  if (turns.length > 0) {
    const conversations = parent.filter((p) => p < 0).length;
    const branchPoints = children.filter((n) => n > 1).length;
    notes.push(
      `${turns.length} turn(s) in ${conversations} conversation(s): ${turns.length - conversations} continue an earlier exchange after its tool or think time` +
        (branchPoints > 0 ? `, ${branchPoints} exchange(s) continued by several branches` : ''),
    );
  }
  return { turns, parent, root, models, skipped, notes };
}

/** A turn's time from the end of the turn it continues to its own start (0 for a conversation's first turn). */
export function gapMs(c: Pick<CapturedConversations, 'turns' | 'parent'>, turn: number): number {
  const parent = c.parent[turn];
  return parent < 0 ? 0 : c.turns[turn].startMs - c.turns[parent].endMs;
}

/** The tokens a turn asks for: as many as it got, and at least one (an answer of no token still takes a step). */
export const requestedOutput = (turn: CapturedTurn): number => Math.max(1, turn.output.length);

const sessionId = (turn: ExchangeTurn) => `exchange-${turn.exchangeId}`;

/**
 * The conversations as sessions: a chain of turns is one session (each turn its gap after the previous completes,
 * so it runs closed-loop too); a turn continued by several branches ends its session, and each branch starts one
 * that waits for it (a request DAG, Dynamo's agentic readiness). A conversation's sessions share its first turn's
 * id as their group, which reports show as the session (turns in start order).
 */
export function conversationSessions(c: CapturedConversations): Session[] {
  const { turns, parent, root } = c;
  const children: number[][] = turns.map(() => []);
  for (let i = 0; i < turns.length; i++) if (parent[i] >= 0) children[parent[i]].push(i);
  /** The session each turn ended up in. */
  const sessionOf: Session[] = new Array<Session>(turns.length);
  const sessions: Session[] = [];
  const turnOf = (i: number): Turn => {
    const prompt = turns[i].prompt;
    return { inputLength: prompt.length, outputLength: requestedOutput(turns[i]), delayMs: gapMs(c, i), prompt: () => Array.from(prompt) };
  };
  for (let first = 0; first < turns.length; first++) {
    const p = parent[first];
    // A single continuation is its parent's session's next turn.
    if (p >= 0 && children[p].length === 1) continue;
    const session: Session = { id: sessionId(turns[first]), startMs: turns[first].startMs, turns: [], group: sessionId(turns[root[first]]) };
    if (p >= 0) {
      session.waitFor = [sessionOf[p].id];
      session.dependencyDelayMs = gapMs(c, first);
    }
    for (let i = first; ; i = children[i][0]) {
      const turn = turnOf(i);
      session.turns.push(i === first ? { ...turn, delayMs: 0 } : turn);
      sessionOf[i] = session;
      if (children[i].length !== 1) break;
    }
    sessions.push(session);
  }
  return sessions;
}

export function capturedWorkload(file: string): CapturedWorkload {
  const conversations = capturedConversations(file);
  const sessions = conversationSessions(conversations);
  const { models, skipped, notes } = conversations;
  return { workload: workloadOf(sessions), models, skipped, notes };
}
