/**
 * Agent conversations in a capture (issue 40 item 2): an agent resends its whole history each turn, so a request
 * whose prompt ids extend an earlier exchange's prompt, sent after that exchange completed, is that exchange's
 * next turn — the assistant's answer and the tool results (or the user's reply) were appended. The gap between
 * the answer's end and the next request is the tool (or think) time.
 */
import { BinaryHeap } from '../util/binaryHeap.js';
import { PrefixHash } from './rollingHash.js';

/** One captured exchange as a turn: when it ran (epoch ms) and its token ids. */
export interface CapturedTurn {
  startMs: number;
  /** When its answer ended. */
  endMs: number;
  prompt: Uint32Array;
  output: Uint32Array;
}

/**
 * Identical prompts looked at per candidate length (most recently completed first): a capture of the same
 * request sent thousands of times must not make every later turn compare against each of them.
 */
const MAX_SAME_PROMPT_CANDIDATES = 64;

/** The turns that completed with one prompt (a hash key), and the longest output among them. */
interface SamePrompt {
  turns: number[];
  longestOutput: number;
}

/** How many leading ids of `ids` equal `tokens[from…]`. */
function sharedFrom(ids: Uint32Array, tokens: Uint32Array, from: number): number {
  const n = Math.min(ids.length, tokens.length - from);
  let k = 0;
  while (k < n && ids[k] === tokens[from + k]) k++;
  return k;
}

/**
 * Each turn's parent: the index of the turn it continues, or -1 (a conversation's first turn). `turns` must be in
 * start order. A parent A of B completed at or before B started, and A's prompt is a strict prefix of B's; among
 * such turns, the one whose prompt and output share the longest prefix with B's prompt (an answer re-rendered by
 * the chat template usually tokenizes back to its output ids, which is not required); ties go to the longer
 * prompt, then the later completion. Several turns may continue one (branches).
 *
 * Linear in the prompts' total length: each prompt is hashed once, position by position; prompts of earlier
 * turns are found by the hash of B's prefix at their length (only at lengths some completed prompt has).
 */
export function linkTurns(turns: readonly CapturedTurn[]): Int32Array {
  const parent = new Int32Array(turns.length).fill(-1);
  const promptKey: number[] = new Array<number>(turns.length);
  let longest = 0;
  for (const t of turns) longest = Math.max(longest, t.prompt.length);
  /** Whether a completed turn's prompt has this length. */
  const lengthSeen = new Uint8Array(longest + 1);
  const byPrompt = new Map<number, SamePrompt>();
  const completions = new BinaryHeap<number>((a, b) => turns[a].endMs < turns[b].endMs);

  for (let b = 0; b < turns.length; b++) {
    const turn = turns[b];
    // Every turn that completed by now becomes a candidate parent.
    while (completions.size > 0 && turns[completions.peek()!].endMs <= turn.startMs) {
      const a = completions.pop()!;
      lengthSeen[turns[a].prompt.length] = 1;
      let same = byPrompt.get(promptKey[a]);
      if (!same) byPrompt.set(promptKey[a], (same = { turns: [], longestOutput: 0 }));
      same.turns.push(a);
      same.longestOutput = Math.max(same.longestOutput, turns[a].output.length);
    }
    const prompt = turn.prompt;
    const hash = new PrefixHash();
    /** Candidate prompt lengths (ascending) with their turns. */
    const found: [number, SamePrompt][] = [];
    for (let i = 0; i < prompt.length; i++) {
      hash.push(prompt[i]);
      const length = i + 1;
      if (length < prompt.length && lengthSeen[length] === 1) {
        const same = byPrompt.get(hash.key());
        if (same) found.push([length, same]);
      }
    }
    promptKey[b] = hash.key();
    let best = -1;
    let bestShared = -1;
    for (let f = found.length - 1; f >= 0; f--) {
      const [length, same] = found[f];
      if (length + same.longestOutput <= bestShared) continue;
      const candidates = same.turns;
      for (let c = candidates.length - 1, seen = 0; c >= 0 && seen < MAX_SAME_PROMPT_CANDIDATES; c--, seen++) {
        const a = candidates[c];
        // A hash key is trusted, its length checked: keys of different lengths may meet by chance.
        if (turns[a].prompt.length !== length) continue;
        const shared = length + sharedFrom(turns[a].output, prompt, length);
        if (shared > bestShared) {
          bestShared = shared;
          best = a;
        }
      }
    }
    parent[b] = best;
    completions.push(b);
  }
  return parent;
}
