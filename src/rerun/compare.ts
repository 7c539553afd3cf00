/**
 * A golden capture and a rerun's capture compared exchange by exchange: each golden request paired with the
 * target's answer to it (same path, model and body), then what changed in preprocessing (prompt token ids, and
 * where in the request the first change falls), in the output a client sees (token ids, text, reasoning, tool
 * calls as values, finish and stop reasons, usage; embeddings and scores) and in timing.
 */
import { createRequire } from 'node:module';
import { canonicalJson, firstDifference, firstTokenMs, percentiles, percentileShift, requestKey, tokenGaps } from '../captures/pairing.js';
import { RunTokenizers } from '../captures/runTokenizers.js';
import { foldChatDeltas } from '../api/render.js';
import { CaptureStore, isGeneration, namingCapture, type StoredExchange } from '../store/captureStore.js';
import type { Generation } from '../store/generation.js';
import type { ModelTokenizer } from '../tokenizer/index.js';
import { promptPart } from './promptParts.js';
import { whyNotSent } from './requests.js';
import type {
  ChoiceOutput,
  ExchangeComparison,
  ExchangeTiming,
  OutputDifference,
  PromptComparison,
  RerunReport,
  TimingComparison,
  ToolCall,
  Verdict,
} from './report.js';

type Json = Record<string, unknown>;

/**
 * Loaded when first used: its 270 modules cost every command's start 5 MB of heap and 0.1 s (a `captures import`
 * under a 64 MB heap ran out of it).
 */
const kruskalTest = (a: number[], b: number[]) =>
  (createRequire(import.meta.url)('@stdlib/stats-kruskal-test') as typeof import('@stdlib/stats-kruskal-test'))(a, b);

/** The significance level a timing shift must reach to count as beyond the run-to-run noise. */
export const TIMING_ALPHA = 0.01;
/** Text kept of a request or a prompt in the report (per side). */
const TEXT_LIMIT = 64 * 1024;
/** Tokens shown on either side of a prompt's first difference. */
const CONTEXT_TOKENS = 4;
/** Characters shown of a differing text. */
const EXCERPT = 80;
/** Pooling outputs are floats computed on a GPU: equal within this fraction of the vector's largest magnitude. */
const POOLING_TOLERANCE = 1e-4;
/** At most this many samples per side go into the significance test (evenly strided): its cost stays small. */
const TEST_SAMPLES = 10_000;
const CDF_POINTS = 200;

interface Side {
  path: string;
  store: CaptureStore;
  tokenizers: RunTokenizers;
}

function open(path: string): Side {
  const store = CaptureStore.open(path, { readonly: true });
  return { path, store, tokenizers: new RunTokenizers(store) };
}

function exchangesOf(side: Side): StoredExchange[] {
  return namingCapture(side.path, () =>
    side.store
      .exchangeIds()
      .map((id) => side.store.getExchange(id)!) // listed a moment ago, by this reader alone
      .filter((ex) => ex.endpoint !== null),
  );
}

function tokenizerOf(side: Side, ex: StoredExchange): ModelTokenizer | null {
  return namingCapture(side.path, () => side.tokenizers.get(ex.runId).tokenizer);
}

function parseJson(body: Buffer): unknown {
  try {
    return JSON.parse(body.toString('utf8')) as unknown;
  } catch {
    return null;
  }
}

function parse(body: Buffer): Json | null {
  const value = parseJson(body);
  return value !== null && typeof value === 'object' && !Array.isArray(value) ? (value as Json) : null;
}

const cut = (text: string, limit = TEXT_LIMIT) => (text.length > limit ? `${text.slice(0, limit)}…` : text);

/** One choice as the client saw it once the answer was over (a stream's deltas put together, as a replay folds them). */
function choiceOutput(ex: StoredExchange, g: Generation): ChoiceOutput {
  const folded = foldChatDeltas(g.chunkDeltas);
  return {
    index: g.choiceIndex,
    // Ids tokenized from the text are one spelling of it, not the engine's: only the text is compared then.
    tokenIds: ex.tokenSource === 'engine' ? g.outputIds : null,
    text: g.text,
    // vLLM sends the reasoning as `reasoning_content` (and, since 0.11, the same text again as `reasoning`).
    reasoning: folded.reasoningContent ?? folded.reasoning,
    toolCalls: folded.toolCalls.map((call): ToolCall => {
      try {
        return { name: call.name, arguments: JSON.parse(call.arguments) as unknown };
      } catch {
        return { name: call.name, arguments: call.arguments };
      }
    }),
    finishReason: g.finishReason,
    stopReason: g.stopReason,
  };
}

function excerpt(text: string, at: number): string {
  return JSON.stringify(text.slice(at, at + EXCERPT));
}

function textDifference(field: 'text' | 'reasoning', choice: number, a: string | null, b: string | null): OutputDifference | null {
  if (a === b) return null;
  const at = firstDifference([...(a ?? '')], [...(b ?? '')]) ?? 0;
  const chars = (s: string | null) => (s === null ? 'null' : excerpt([...s].slice(at).join(''), 0));
  return { field, choice, position: at, golden: chars(a), candidate: chars(b) };
}

function outputDifferences(golden: ChoiceOutput[], candidate: ChoiceOutput[]): OutputDifference[] {
  const out: OutputDifference[] = [];
  if (golden.length !== candidate.length) out.push({ field: 'choices', golden: String(golden.length), candidate: String(candidate.length) });
  for (let c = 0; c < Math.min(golden.length, candidate.length); c++) {
    const a = golden[c];
    const b = candidate[c];
    if (a.tokenIds !== null && b.tokenIds !== null) {
      const at = firstDifference(a.tokenIds, b.tokenIds);
      if (at !== null)
        out.push({
          field: 'token_ids',
          choice: c,
          position: at,
          golden: `${a.tokenIds[at] ?? '(end)'} of ${a.tokenIds.length}`,
          candidate: `${b.tokenIds[at] ?? '(end)'} of ${b.tokenIds.length}`,
        });
    }
    for (const d of [textDifference('text', c, a.text, b.text), textDifference('reasoning', c, a.reasoning, b.reasoning)]) if (d) out.push(d);
    const calls = (o: ChoiceOutput) => o.toolCalls.map((t) => canonicalJson(t));
    const callAt = firstDifference(calls(a), calls(b));
    if (callAt !== null)
      out.push({ field: 'tool_calls', choice: c, position: callAt, golden: calls(a)[callAt] ?? '(none)', candidate: calls(b)[callAt] ?? '(none)' });
    if (a.finishReason !== b.finishReason) out.push({ field: 'finish_reason', choice: c, golden: String(a.finishReason), candidate: String(b.finishReason) });
    if (a.stopReason !== b.stopReason)
      out.push({ field: 'stop_reason', choice: c, golden: JSON.stringify(a.stopReason), candidate: JSON.stringify(b.stopReason) });
  }
  return out;
}

function usageDifference(golden: unknown, candidate: unknown): OutputDifference | null {
  const counts = (usage: unknown) => {
    const u = (usage ?? {}) as Json;
    return canonicalJson({ prompt_tokens: u.prompt_tokens, completion_tokens: u.completion_tokens });
  };
  if (golden === null || golden === undefined || candidate === null || candidate === undefined) return null;
  return counts(golden) === counts(candidate) ? null : { field: 'usage', golden: counts(golden), candidate: counts(candidate) };
}

/** An embedding as numbers, whichever `encoding_format` it came in. */
function vector(value: unknown): number[] | null {
  if (Array.isArray(value)) return value.map(Number);
  if (typeof value !== 'string') return null;
  const bytes = Buffer.from(value, 'base64');
  return Array.from(new Float32Array(bytes.buffer, bytes.byteOffset, Math.floor(bytes.length / 4)));
}

function closeEnough(a: readonly number[], b: readonly number[]): boolean {
  if (a.length !== b.length) return false;
  const scale = Math.max(1e-12, ...a.map(Math.abs));
  return a.every((x, i) => Math.abs(x - b[i]) <= POOLING_TOLERANCE * scale);
}

/** Embeddings (vectors within tolerance) and ranking results (order and scores within tolerance). */
function poolingDifferences(endpoint: 'embeddings' | 'rerank', golden: StoredExchange, candidate: StoredExchange): OutputDifference[] {
  const show = (v: unknown) => cut(JSON.stringify(v) ?? 'null', 400);
  if (endpoint === 'embeddings') {
    const vectors = (body: Json | null) => (Array.isArray(body?.data) ? (body.data as Json[]).map((d) => vector(d.embedding)) : []);
    const va = vectors(parse(golden.responseBody));
    const vb = vectors(parse(candidate.responseBody));
    const at = firstDifference(va, vb, (x, y) => x !== null && y !== null && closeEnough(x, y));
    return at === null ? [] : [{ field: 'embedding', position: at, golden: show(va[at]?.slice(0, 8) ?? null), candidate: show(vb[at]?.slice(0, 8) ?? null) }];
  }
  // vLLM's and Cohere's `results`, Jina's `data`, NIM's `rankings`; TEI's `/rerank` answers a bare list.
  const results = (body: unknown): Json[] => {
    if (Array.isArray(body)) return body as Json[];
    const b = (body ?? {}) as Json;
    const list = b.results ?? b.data ?? b.rankings;
    return Array.isArray(list) ? (list as Json[]) : [];
  };
  const ra = results(parseJson(golden.responseBody));
  const rb = results(parseJson(candidate.responseBody));
  const score = (r: Json) => Number(r.relevance_score ?? r.score ?? r.logit);
  const at = firstDifference(ra, rb, (x, y) => x.index === y.index && closeEnough([score(x)], [score(y)]));
  return at === null ? [] : [{ field: 'rerank', position: at, golden: show(ra[at] ?? null), candidate: show(rb[at] ?? null) }];
}

function timingOf(ex: StoredExchange): ExchangeTiming {
  return { ttftMs: firstTokenMs(ex), e2eMs: ex.totalMs };
}

const sourceObserved = (ex: StoredExchange) => ex.tokenSource === 'engine' || ex.tokenSource === 'tokenize-endpoint';

async function decode(tokenizer: ModelTokenizer | null, ids: readonly number[]): Promise<string> {
  // Special tokens shown: a template's markers are what a preprocessing change moves.
  return tokenizer ? tokenizer.decode([...ids], false) : ids.join(' ');
}

/** The prompts' ids compared; the texts decoded only when they differ (the HTML shows them then). */
async function comparePrompts(golden: Side, exA: StoredExchange, candidate: Side, exB: StoredExchange, request: Json | null): Promise<PromptComparison> {
  const a = exA.promptIds ?? [];
  const b = exB.promptIds ?? [];
  // No ids on a side (a batch of prompts, a render that failed): nothing to compare, not an empty prompt.
  const at = exA.promptIds === null || exB.promptIds === null ? null : firstDifference(a, b);
  const observed = sourceObserved(exA) && sourceObserved(exB) && exA.promptIds !== null && exB.promptIds !== null;
  // Loading a tokenizer takes most of a second: only a prompt shown as text needs one.
  if (at === null) return { goldenLength: a.length, candidateLength: b.length, observed, difference: null, goldenText: '', candidateText: '' };
  const tokA = tokenizerOf(golden, exA);
  const tokB = tokenizerOf(candidate, exB);
  const goldenPrompt = await decode(tokA, a);
  const goldenOffset = (await decode(tokA, a.slice(0, at))).length;
  const difference = {
    goldenOffset,
    candidateOffset: (await decode(tokB, b.slice(0, at))).length,
    position: at,
    goldenToken: a[at] ?? null,
    candidateToken: b[at] ?? null,
    before: await decode(tokA, a.slice(Math.max(0, at - CONTEXT_TOKENS), at)),
    goldenText: await decode(tokA, a.slice(at, at + CONTEXT_TOKENS)),
    candidateText: await decode(tokB, b.slice(at, at + CONTEXT_TOKENS)),
    ...promptPart(exA.endpoint === 'chat' ? 'chat' : 'completion', request, goldenPrompt, goldenOffset),
  };
  return { goldenLength: a.length, candidateLength: b.length, observed, difference, goldenText: cut(goldenPrompt), candidateText: cut(await decode(tokB, b)) };
}

function samplingOf(request: Json | null): { greedy: boolean; seeded: boolean } {
  // vLLM's generate nests them in its `sampling_params`.
  const params = request?.sampling_params !== null && typeof request?.sampling_params === 'object' ? (request.sampling_params as Json) : request;
  return { greedy: params?.temperature === 0 || params?.top_k === 1, seeded: typeof params?.seed === 'number' };
}

async function comparePair(golden: Side, exA: StoredExchange, candidate: Side, exB: StoredExchange | undefined): Promise<ExchangeComparison> {
  const request = parse(exA.requestBody);
  const { greedy, seeded } = samplingOf(request);
  const endpoint = exA.endpoint!; // golden exchanges all have one
  const base = {
    golden: exA.id,
    endpoint,
    path: exA.path,
    model: exA.model,
    stream: exA.stream,
    greedy,
    seeded,
  };
  const pooling = endpoint === 'embeddings' || endpoint === 'rerank' ? endpoint : null;
  // The agents' APIs are stored as chat-shaped choices (text, reasoning, tool calls): compared as chat's are.
  const goldenOutputs = !pooling ? exA.generations.map((g) => choiceOutput(exA, g)) : [];
  /** No answer, or an error where the golden had one: always a regression. */
  const failedAnswer = (note: string, rest: Pick<ExchangeComparison, 'candidate' | 'status' | 'prompt' | 'output' | 'timing'>): ExchangeComparison => ({
    ...base,
    verdict: 'regression',
    note,
    request: cut(exA.requestBody.toString('utf8')),
    ...rest,
  });
  if (!exB) {
    return failedAnswer('the target’s answer was not recorded', {
      candidate: null,
      status: { golden: exA.status, candidate: null },
      prompt: null,
      output: { differences: [], golden: goldenOutputs, candidate: [] },
      timing: { golden: timingOf(exA), candidate: null },
    });
  }
  const status = { golden: exA.status, candidate: exB.status };
  if (exB.outcome !== 'complete' || exB.status !== exA.status) {
    const why =
      exB.status === null
        ? `the target did not answer (${exB.error ?? exB.outcome})`
        : `the target answered ${exB.status}${exB.error ? `: ${cut(exB.error, 400)}` : ''}`;
    return failedAnswer(why, {
      candidate: exB.id,
      status,
      prompt: null,
      output: { differences: [{ field: 'status', golden: String(exA.status), candidate: String(exB.status) }], golden: goldenOutputs, candidate: [] },
      timing: { golden: timingOf(exA), candidate: timingOf(exB) },
    });
  }
  const candidateOutputs = !pooling ? exB.generations.map((g) => choiceOutput(exB, g)) : [];
  const differences = !pooling ? outputDifferences(goldenOutputs, candidateOutputs) : poolingDifferences(pooling, exA, exB);
  const usage = !pooling ? usageDifference(exA.usage, exB.usage) : null;
  if (usage) differences.push(usage);
  const prompt = isGeneration(endpoint) ? await comparePrompts(golden, exA, candidate, exB, request) : null;
  let verdict: Verdict = 'same';
  let note: string | null = null;
  if (prompt?.difference) {
    verdict = 'regression';
    note = 'the prompt was tokenized differently';
  } else if (differences.length > 0) {
    const deterministic = pooling !== null || greedy || seeded;
    verdict = deterministic ? 'regression' : 'sampled';
    const fields = [...new Set(differences.map((d) => d.field))].join(', ');
    note = deterministic ? `the output differs (${fields})` : `the output of a sampled request (no seed) differs (${fields}): reported, not failed`;
  }
  const differs = verdict !== 'same';
  return {
    ...base,
    candidate: exB.id,
    verdict,
    note,
    request: differs ? cut(exA.requestBody.toString('utf8')) : '',
    status,
    prompt,
    output: { differences, golden: differs ? goldenOutputs : [], candidate: differs ? candidateOutputs : [] },
    timing: { golden: timingOf(exA), candidate: timingOf(exB) },
  };
}

/** A golden exchange the rerun did not send (failed in the capture, say): listed, not compared. */
function notSent(ex: StoredExchange, why: string): ExchangeComparison {
  const { greedy, seeded } = samplingOf(parse(ex.requestBody));
  return {
    golden: ex.id,
    candidate: null,
    endpoint: ex.endpoint!, // golden exchanges all have one
    path: ex.path,
    model: ex.model,
    stream: ex.stream,
    greedy,
    seeded,
    verdict: 'not-compared',
    note: `not sent: ${why}`,
    request: ex.bodiesRedacted ? '' : cut(ex.requestBody.toString('utf8')),
    status: { golden: ex.status, candidate: null },
    prompt: null,
    output: { differences: [], golden: [], candidate: [] },
    timing: { golden: timingOf(ex), candidate: null },
  };
}

function strided(values: number[], limit: number): number[] {
  if (values.length <= limit) return values;
  const step = values.length / limit;
  return Array.from({ length: limit }, (_, i) => values[Math.floor(i * step)]);
}

function quantiles(values: number[]): number[] {
  const sorted = [...values].sort((x, y) => x - y);
  if (sorted.length <= CDF_POINTS) return sorted;
  return Array.from({ length: CDF_POINTS }, (_, i) => sorted[Math.round((i * (sorted.length - 1)) / (CDF_POINTS - 1))]);
}

/** The two samples' percentiles, shift and whether the shift is beyond noise (Kruskal–Wallis of two groups: Mann–Whitney U). */
export function compareTiming(golden: number[], candidate: number[], alpha = TIMING_ALPHA): TimingComparison {
  const a = percentiles(golden);
  const b = percentiles(candidate);
  let pValue: number | null = null;
  if (golden.length >= 2 && candidate.length >= 2) {
    const p = kruskalTest(strided(golden, TEST_SAMPLES), strided(candidate, TEST_SAMPLES)).pValue;
    // Every value tied: the samples cannot be told apart.
    pValue = Number.isNaN(p) ? 1 : p;
  }
  return {
    golden: a,
    candidate: b,
    shift: percentileShift(a, b),
    pValue,
    beyondNoise: pValue !== null && pValue < alpha,
    cdf: { golden: quantiles(golden), candidate: quantiles(candidate) },
  };
}

export interface CompareInput {
  golden: string;
  candidate: string;
  target: string;
  skipped: RerunReport['skipped'];
}

/**
 * Compares the golden file's complete exchanges with the rerun file's. Requests sent more than once pair in
 * capture order: the i-th in the golden file with the i-th answer recorded.
 */
export async function compareRerun(input: CompareInput): Promise<RerunReport> {
  const golden = open(input.golden);
  let candidate: Side | undefined;
  try {
    candidate = open(input.candidate);
    const goldenExchanges = exchangesOf(golden);
    const waiting = new Map<string, StoredExchange[]>();
    for (const ex of exchangesOf(candidate)) {
      const key = requestKey(ex);
      const same = waiting.get(key);
      if (same) same.push(ex);
      else waiting.set(key, [ex]);
    }
    const exchanges: ExchangeComparison[] = [];
    const ttft: [number[], number[]] = [[], []];
    const itl: [number[], number[]] = [[], []];
    const e2e: [number[], number[]] = [[], []];
    for (const exA of goldenExchanges) {
      const why = whyNotSent(exA);
      if (why !== null) {
        exchanges.push(notSent(exA, why));
        continue;
      }
      const exB = waiting.get(requestKey(exA))?.shift();
      const comparison = await comparePair(golden, exA, candidate, exB);
      exchanges.push(comparison);
      // Timing is compared like for like: only exchanges both sides answered in full.
      if (exB && exB.outcome === 'complete' && comparison.timing.candidate) {
        const ta = comparison.timing.golden;
        const tb = comparison.timing.candidate;
        if (ta.ttftMs !== null && tb.ttftMs !== null) ttft[0].push(ta.ttftMs), ttft[1].push(tb.ttftMs);
        for (const gap of tokenGaps(exA)) itl[0].push(gap);
        for (const gap of tokenGaps(exB)) itl[1].push(gap);
        e2e[0].push(ta.e2eMs);
        e2e[1].push(tb.e2eMs);
      }
    }
    const run = namingCapture(input.candidate, () => candidate!.store.latestRun());
    const count = (verdict: Verdict) => exchanges.filter((e) => e.verdict === verdict).length;
    return {
      golden: input.golden,
      candidate: input.candidate,
      target: input.target,
      targetEngine: run?.engine ?? 'unknown',
      targetVersion: run?.engineVersion ?? null,
      exchanges,
      skipped: input.skipped,
      totals: {
        compared: exchanges.length - count('not-compared'),
        same: count('same'),
        regressions: count('regression'),
        sampled: count('sampled'),
        notCompared: count('not-compared'),
        promptChanges: exchanges.filter((e) => e.prompt?.difference).length,
        outputChanges: exchanges.filter((e) => e.output.differences.some((d) => d.field !== 'status')).length,
      },
      timing: { ttftMs: compareTiming(...ttft), itlMs: compareTiming(...itl), e2eMs: compareTiming(...e2e) },
      alpha: TIMING_ALPHA,
      regression: exchanges.some((e) => e.verdict === 'regression'),
    };
  } finally {
    golden.store.close();
    candidate?.store.close();
  }
}
