/**
 * `mocker captures diff A B`: two capture files' exchanges paired by request (or by prompt ids), and what
 * changed between them: prompts tokenized differently (the preprocessing regression), outputs that differ,
 * requests only one file holds, and the shift of the TTFT and ITL distributions.
 */
import { CaptureStore, hasTokens, namingCapture, type StoredExchange } from '../store/captureStore.js';
import {
  firstDifference,
  firstTokenMs,
  formatMs as ms,
  formatSignedMs as signed,
  percentiles,
  percentileShift,
  requestKey,
  tokenGaps,
  type Percentiles,
} from './pairing.js';
import { RunTokenizers } from './runTokenizers.js';

export interface DiffOptions {
  /** Pair by model and prompt token ids instead of model and request body. */
  byPrompt: boolean;
  /** How many examples of each kind of difference are described (all are counted). */
  limit: number;
}

/** Where two token sequences part, with the text around it on each side. */
export interface TokenChange {
  /** Exchange ids in A and in B. */
  a: number;
  b: number;
  model: string;
  /** Output changes: the choice. */
  choice?: number;
  /** Index of the first differing token (the shorter length when one is a prefix of the other). */
  position: number;
  /** The token ids there (null: that side has ended). */
  aToken: number | null;
  bToken: number | null;
  /** The text of the few tokens before the position (A's). */
  before: string | null;
  /** The text of the few tokens from the position on, each side. */
  aText: string | null;
  bText: string | null;
  aLength: number;
  bLength: number;
}

export interface Unpaired {
  exchangeId: number;
  model: string;
  path: string;
}

export interface TimingShift {
  a: Percentiles;
  b: Percentiles;
  /** B − A, per percentile (ms); null unless both sides have a sample. */
  change: { p50: number | null; p90: number | null; p99: number | null };
}

export interface DiffReport {
  a: string;
  b: string;
  pairedBy: 'request' | 'prompt';
  paired: number;
  /** Pairs whose prompt ids and outputs are the same. */
  identical: number;
  promptChanges: number;
  outputChanges: number;
  onlyInA: number;
  onlyInB: number;
  /** Up to `limit` of each. */
  examples: { promptChanges: TokenChange[]; outputChanges: TokenChange[]; onlyInA: Unpaired[]; onlyInB: Unpaired[] };
  /** Over each file's streamed complete exchanges (a non-streamed answer has no token timing). */
  timing: { ttftMs: TimingShift; itlMs: TimingShift };
  /** Anything but timing differs. */
  differs: boolean;
}

function pairingKey(ex: StoredExchange, byPrompt: boolean): string | null {
  if (byPrompt) return ex.promptIds ? `${ex.model}\0${ex.promptIds.join(',')}` : null;
  return requestKey(ex);
}

/** Tokens shown on either side of a difference. */
const CONTEXT_TOKENS = 4;

interface File {
  path: string;
  store: CaptureStore;
  tokenizers: RunTokenizers;
  exchanges: StoredExchange[];
}

/** Opens and reads one side whole (every page checked: damage anywhere fails the diff, naming the file). */
function openFile(path: string): File {
  const store = CaptureStore.open(path, { readonly: true });
  try {
    return namingCapture(path, () => {
      store.checkIntegrity();
      const exchanges = store
        .exchangeIds()
        .map((id) => store.getExchange(id)!) // listed a moment ago, by this reader alone
        .filter((ex) => ex.outcome === 'complete' && hasTokens(ex.endpoint));
      return { path, store, tokenizers: new RunTokenizers(store), exchanges };
    });
  } catch (err) {
    store.close();
    throw err;
  }
}

function textOf(file: File, ex: StoredExchange, ids: readonly number[]): Promise<string | null> {
  return namingCapture(file.path, async () => {
    const { tokenizer } = file.tokenizers.get(ex.runId);
    // Special tokens shown: a template's markers are what a preprocessing change moves.
    return tokenizer ? tokenizer.decode([...ids], false) : null;
  });
}

async function tokenChange(
  a: File,
  exA: StoredExchange,
  idsA: number[],
  b: File,
  exB: StoredExchange,
  idsB: number[],
  position: number,
  choice?: number,
): Promise<TokenChange> {
  return {
    a: exA.id,
    b: exB.id,
    model: exA.model ?? '',
    ...(choice === undefined ? {} : { choice }),
    position,
    aToken: idsA[position] ?? null,
    bToken: idsB[position] ?? null,
    before: await textOf(a, exA, idsA.slice(Math.max(0, position - CONTEXT_TOKENS), position)),
    aText: await textOf(a, exA, idsA.slice(position, position + CONTEXT_TOKENS)),
    bText: await textOf(b, exB, idsB.slice(position, position + CONTEXT_TOKENS)),
    aLength: idsA.length,
    bLength: idsB.length,
  };
}

/** TTFT (the first token of any choice) and the gaps between each choice's successive tokens, of streamed exchanges. */
function timings(exchanges: StoredExchange[]): { ttft: number[]; itl: number[] } {
  const ttft: number[] = [];
  const itl: number[] = [];
  for (const ex of exchanges) {
    const first = firstTokenMs(ex);
    if (first !== null) ttft.push(first);
    for (const gap of tokenGaps(ex)) itl.push(gap);
  }
  return { ttft, itl };
}

function shift(a: number[], b: number[]): TimingShift {
  const pa = percentiles(a);
  const pb = percentiles(b);
  return { a: pa, b: pb, change: percentileShift(pa, pb) };
}

const unpaired = (ex: StoredExchange): Unpaired => ({ exchangeId: ex.id, model: ex.model ?? '', path: ex.path });

export async function diffCaptures(pathA: string, pathB: string, options: DiffOptions): Promise<DiffReport> {
  const a = openFile(pathA);
  let b: File | undefined;
  try {
    b = openFile(pathB);
    // Requests sent more than once pair in capture order: the i-th in A with the i-th in B.
    const waiting = new Map<string, StoredExchange[]>();
    const onlyInB: StoredExchange[] = [];
    for (const ex of b.exchanges) {
      const key = pairingKey(ex, options.byPrompt);
      if (key === null) onlyInB.push(ex);
      else waiting.set(key, [...(waiting.get(key) ?? []), ex]);
    }
    const pairs: [StoredExchange, StoredExchange][] = [];
    const onlyInA: StoredExchange[] = [];
    for (const ex of a.exchanges) {
      const key = pairingKey(ex, options.byPrompt);
      const match = key === null ? undefined : waiting.get(key)?.shift();
      if (match) pairs.push([ex, match]);
      else onlyInA.push(ex);
    }
    for (const rest of waiting.values()) onlyInB.push(...rest);
    onlyInB.sort((x, y) => x.id - y.id);

    const promptChanges: TokenChange[] = [];
    const outputChanges: TokenChange[] = [];
    let promptChanged = 0;
    let outputChanged = 0;
    let identical = 0;
    for (const [exA, exB] of pairs) {
      let same = true;
      const promptA = exA.promptIds ?? [];
      const promptB = exB.promptIds ?? [];
      const at = firstDifference(promptA, promptB);
      if (at !== null) {
        same = false;
        promptChanged++;
        if (promptChanges.length < options.limit) promptChanges.push(await tokenChange(a, exA, promptA, b, exB, promptB, at));
      }
      const choices = Math.max(exA.generations.length, exB.generations.length);
      let outputDiffers = false;
      for (let c = 0; c < choices; c++) {
        const outA = exA.generations[c]?.outputIds ?? [];
        const outB = exB.generations[c]?.outputIds ?? [];
        const k = firstDifference(outA, outB);
        if (k === null) continue;
        outputDiffers = true;
        if (outputChanges.length < options.limit) outputChanges.push(await tokenChange(a, exA, outA, b, exB, outB, k, c));
        break;
      }
      if (outputDiffers) {
        same = false;
        outputChanged++;
      }
      if (same) identical++;
    }
    const timingA = timings(a.exchanges);
    const timingB = timings(b.exchanges);
    return {
      a: pathA,
      b: pathB,
      pairedBy: options.byPrompt ? 'prompt' : 'request',
      paired: pairs.length,
      identical,
      promptChanges: promptChanged,
      outputChanges: outputChanged,
      onlyInA: onlyInA.length,
      onlyInB: onlyInB.length,
      examples: {
        promptChanges,
        outputChanges,
        onlyInA: onlyInA.slice(0, options.limit).map(unpaired),
        onlyInB: onlyInB.slice(0, options.limit).map(unpaired),
      },
      timing: { ttftMs: shift(timingA.ttft, timingB.ttft), itlMs: shift(timingA.itl, timingB.itl) },
      differs: promptChanged + outputChanged + onlyInA.length + onlyInB.length > 0,
    };
  } finally {
    a.store.close();
    b?.store.close();
  }
}

function describeChange(kind: string, c: TokenChange): string {
  const choice = c.choice === undefined ? '' : ` choice ${c.choice}`;
  const text = (t: string | null) => (t === null ? '(no tokenizer)' : JSON.stringify(t));
  return (
    `${kind} A#${c.a} / B#${c.b} (${c.model})${choice}: first difference at token ${c.position} of ${c.aLength} / ${c.bLength}: ` +
    `after ${text(c.before)}: A ${c.aToken ?? '(end)'} ${text(c.aText)}, B ${c.bToken ?? '(end)'} ${text(c.bText)}`
  );
}

/** The report as lines for a terminal. */
export function formatDiffReport(report: DiffReport): string {
  const lines: string[] = [];
  for (const c of report.examples.promptChanges) lines.push(describeChange('prompt tokenization changed:', c));
  for (const c of report.examples.outputChanges) lines.push(describeChange('output differs:', c));
  for (const u of report.examples.onlyInA) lines.push(`only in A: exchange ${u.exchangeId} (${u.model}, ${u.path})`);
  for (const u of report.examples.onlyInB) lines.push(`only in B: exchange ${u.exchangeId} (${u.model}, ${u.path})`);
  const shown = report.examples;
  const more =
    report.promptChanges -
    shown.promptChanges.length +
    report.outputChanges -
    shown.outputChanges.length +
    report.onlyInA -
    shown.onlyInA.length +
    report.onlyInB -
    shown.onlyInB.length;
  if (more > 0) lines.push(`… and ${more} more (--limit)`);
  for (const [name, t] of [
    ['TTFT', report.timing.ttftMs],
    ['ITL', report.timing.itlMs],
  ] as const) {
    lines.push(
      `${name} ms (A ${t.a.count} / B ${t.b.count} samples): p50 ${ms(t.a.p50)} -> ${ms(t.b.p50)} (${signed(t.change.p50)}), ` +
        `p90 ${ms(t.a.p90)} -> ${ms(t.b.p90)} (${signed(t.change.p90)}), p99 ${ms(t.a.p99)} -> ${ms(t.b.p99)} (${signed(t.change.p99)})`,
    );
  }
  lines.push(
    `A ${report.a}, B ${report.b}: ${report.paired} paired by ${report.pairedBy} (${report.identical} identical), ` +
      `${report.promptChanges} prompt tokenization changes, ${report.outputChanges} output changes, ${report.onlyInA} only in A, ${report.onlyInB} only in B`,
  );
  return lines.join('\n');
}
