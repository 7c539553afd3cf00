/**
 * What `mocker rerun` found: a golden capture's exchanges paired with the target's answers to the same requests,
 * compared in preprocessing (prompt token ids), output and timing. The text, JSON, JUnit and HTML views all read
 * this one value.
 */
import type { Percentiles } from '../captures/pairing.js';
import type { RecordedEndpoint } from '../store/captureStore.js';

export type { Percentiles };

/**
 * Of one exchange: `same`; `regression` (a difference that fails the run: a changed prompt, a changed output of a
 * greedy or seeded request, a failure); `sampled` (the output of a sampled request without a seed differs: reported,
 * not failed); `not-compared` (the golden exchange was not sent — it failed in the capture, say: see `note`).
 */
export type Verdict = 'same' | 'regression' | 'sampled' | 'not-compared';

/** Where a rendered chat prompt's token falls: the part of the request that produced it. */
export type PromptPart =
  | { kind: 'system'; message: number }
  | { kind: 'message'; message: number; role: string }
  | { kind: 'tools' }
  | { kind: 'generation-prompt' }
  /** A completion's prompt (text or ids). */
  | { kind: 'prompt' }
  /** Template text the other parts do not explain (a chat template's own preamble, say). */
  | { kind: 'template' };

export interface PromptDifference {
  /** Index of the first differing token (the shorter length when one is a prefix of the other). */
  position: number;
  goldenToken: number | null;
  candidateToken: number | null;
  /** Text of the few tokens before the position (golden's), special tokens shown. */
  before: string;
  /** Text of the few tokens from the position on, each side. */
  goldenText: string;
  candidateText: string;
  /**
   * Where that token starts in each whole decoded prompt (`PromptComparison.goldenText` / `candidateText`, before
   * they are cut): the length of the text of the tokens before it.
   */
  goldenOffset: number;
  candidateOffset: number;
  part: PromptPart;
  /** The part in words: "system prompt", "message 2 (user)", "tool definitions", "generation prompt", "prompt". */
  partLabel: string;
}

export interface PromptComparison {
  goldenLength: number;
  candidateLength: number;
  /**
   * Whether both sides' ids are the engines' own (from the answer or a tokenize endpoint): ids mocker rendered and
   * tokenized locally (`transformers serve`, a capture without ids) say nothing about the target's preprocessing.
   */
  observed: boolean;
  difference: PromptDifference | null;
  /** The whole prompts when they differ (else empty), decoded with special tokens shown (for the HTML side by side); cut at 64 KiB each. */
  goldenText: string;
  candidateText: string;
}

export interface ToolCall {
  name: string;
  /** Parsed when the arguments are JSON (compared as values, not text), else the text. */
  arguments: unknown;
}

/** One choice's output, as a client sees it once the answer is over. */
export interface ChoiceOutput {
  index: number;
  /** null: the engine's ids were not available on this side (only the text is compared). */
  tokenIds: number[] | null;
  text: string;
  reasoning: string | null;
  toolCalls: ToolCall[];
  finishReason: string | null;
  stopReason: string | number | null;
}

export type OutputField =
  | 'status'
  | 'choices'
  | 'token_ids'
  | 'text'
  | 'reasoning'
  | 'tool_calls'
  | 'finish_reason'
  | 'stop_reason'
  | 'usage'
  | 'embedding'
  | 'rerank';

export interface OutputDifference {
  field: OutputField;
  choice?: number;
  /** Token or character index of the first difference, for sequences. */
  position?: number;
  /** Each side, shortly (a JSON value or a text excerpt). */
  golden: string;
  candidate: string;
}

export interface ExchangeTiming {
  /** Streamed answers only: the first output token's arrival (ms since the request was sent). */
  ttftMs: number | null;
  /** The answer's whole duration (ms). */
  e2eMs: number;
}

export interface ExchangeComparison {
  /** The exchange's id in the golden file and in the rerun file (null: the target's answer was not recorded). */
  golden: number;
  candidate: number | null;
  endpoint: RecordedEndpoint;
  path: string;
  model: string | null;
  stream: boolean;
  /** temperature 0 or top_k 1: any output difference is a regression. */
  greedy: boolean;
  seeded: boolean;
  verdict: Verdict;
  /** Why the verdict, in words, when it is not `same`. */
  note: string | null;
  /** The request as sent (its body's text, cut at 64 KiB). */
  request: string;
  status: { golden: number | null; candidate: number | null };
  /** Generations only. */
  prompt: PromptComparison | null;
  output: { differences: OutputDifference[]; golden: ChoiceOutput[]; candidate: ChoiceOutput[] };
  timing: { golden: ExchangeTiming; candidate: ExchangeTiming | null };
}

export interface TimingComparison {
  golden: Percentiles;
  candidate: Percentiles;
  /** candidate − golden, per percentile (ms); null unless both sides have a sample. */
  shift: { p50: number | null; p90: number | null; p99: number | null };
  /**
   * Two-sided p-value that both samples come from one distribution (Kruskal–Wallis with two groups, which is the
   * Mann–Whitney U test); null with fewer than two samples on a side.
   */
  pValue: number | null;
  /** pValue below `alpha`: the shift is beyond the run-to-run noise. */
  beyondNoise: boolean;
  /** Up to 200 quantiles of each side, ascending (for CDF charts). */
  cdf: { golden: number[]; candidate: number[] };
}

export interface RerunReport {
  golden: string;
  /** The rerun's capture file. */
  candidate: string;
  target: string;
  /** What the target said it is (capture's engine detection) and its `/version`'s version. */
  targetEngine: string;
  targetVersion: string | null;
  exchanges: ExchangeComparison[];
  /** Golden exchanges not sent, by reason ("failed", "aborted", "bodies redacted", …). */
  skipped: { reason: string; count: number }[];
  totals: {
    /** Exchanges sent and compared (`notCompared` are the golden ones not sent). */
    compared: number;
    same: number;
    regressions: number;
    sampled: number;
    notCompared: number;
    promptChanges: number;
    outputChanges: number;
  };
  timing: { ttftMs: TimingComparison; itlMs: TimingComparison; e2eMs: TimingComparison };
  /** The significance level of `beyondNoise`. */
  alpha: number;
  /** Any exchange's verdict is `regression`. */
  regression: boolean;
}
