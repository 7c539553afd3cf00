/**
 * A capture's tokenizer.json comes from whoever made the capture, and two things in it can take the server down
 * whatever the requests are, so they are refused before it serves (`serve` then exits naming the problem; `--model`
 * tokenizes with files the user trusts instead):
 * - A regular expression (a `Split` pre-tokenizer's, a `Replace`'s) that backtracks exponentially: the `tokenizers`
 *   binding runs it in Oniguruma, whose backtracking limit is a Rust panic that aborts the whole process
 *   (`(a|aa)+$` on 30 characters and a `b`, measured). The classic shapes are refused: a group repeated by `*`, `+`
 *   or `{…}` that itself repeats or alternates (`(a+)+`, `(a|aa)*`). The split patterns of real tokenizers (GPT-2,
 *   cl100k, o200k, Llama 3, Qwen) have no such group. A pattern that backtracks polynomially on a hostile text is
 *   not caught by this.
 * - A normalizer or decoder that lengthens a text many times over: it runs in Rust, outside any heap limit
 *   (`Replace` "a" by ten "a", three times in a `Sequence`, turned 1,000 characters into a million).
 * - A token of a megabyte: random answers draw from the vocabulary, 1,000 such tokens a gigabyte of text.
 */

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v);

/**
 * Most times longer a capture's normalizer, or its decoder, may make a text: NFKC's worst is 18 (a few ligatures);
 * BERT's normalizer spaces CJK characters (3) after NFD.
 */
export const MAX_TEXT_GROWTH = 64;

/** Longest token a capture's vocabulary may hold, in characters (Qwen3's and Llama 3's longest: 128). */
export const MAX_TOKEN_CHARS = 1024;

/** A repeated group of `pattern` that repeats or alternates inside, or null. */
export function exponentialGroup(pattern: string): string | null {
  /** Open groups: where each starts and whether a quantifier or a `|` was seen inside it. */
  const open: { start: number; inner: boolean }[] = [];
  let closed: { start: number; inner: boolean } | null = null;
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i];
    const justClosed = closed;
    closed = null;
    if (c === '\\') {
      // An escape, with its braces (`\p{L}`, `\x{41}`).
      if (pattern[i + 2] === '{' && /[pPx]/.test(pattern[i + 1])) i = Math.max(i + 1, pattern.indexOf('}', i));
      else i++;
    } else if (c === '[') {
      i = classEnd(pattern, i);
    } else if (c === '(') {
      open.push({ start: i, inner: false });
    } else if (c === ')') {
      closed = open.pop() ?? null;
      // What the group held counts for the groups around it.
      if (closed?.inner && open.length > 0) open[open.length - 1].inner = true;
    } else if (c === '|') {
      if (open.length > 0) open[open.length - 1].inner = true;
    } else if (c === '*' || c === '+' || c === '{') {
      if (c === '{' && !/^\{\d*,?\d*\}/.test(pattern.slice(i))) continue;
      if (justClosed?.inner) return pattern.slice(justClosed.start, i + 1);
      for (const group of open) group.inner = true;
    }
  }
  return null;
}

/** The index of the `]` that ends the character class opened at `start` (classes nest in Oniguruma). */
function classEnd(pattern: string, start: number): number {
  let depth = 0;
  for (let i = start; i < pattern.length; i++) {
    if (pattern[i] === '\\') i++;
    else if (pattern[i] === '[') depth++;
    else if (pattern[i] === ']' && i > start + 1 && --depth === 0) return i;
  }
  return pattern.length;
}

/** How many times longer a normalizer or decoder (tokenizer.json's) may make a text, at most. */
function growth(component: unknown): number {
  if (!isObject(component)) return 1;
  switch (component.type) {
    case 'Sequence': {
      const parts = component.normalizers ?? component.decoders;
      return Array.isArray(parts) ? parts.reduce((product: number, part) => product * growth(part), 1) : 1;
    }
    case 'Replace': {
      const content = typeof component.content === 'string' ? component.content.length : 0;
      const literal = isObject(component.pattern) ? component.pattern.String : undefined;
      // A regex may match one character (or none, between two).
      return typeof literal === 'string' && literal.length > 0 ? Math.max(1, content / literal.length) : content + 1;
    }
    case 'NFKC':
    case 'NFKD':
    case 'Precompiled':
      return 18;
    case 'NFC':
    case 'NFD':
      return 4;
    case 'BertNormalizer':
      return 3 * 4;
    case 'Prepend':
      return 1 + (typeof component.prepend === 'string' ? component.prepend.length : 0);
    default:
      return 1;
  }
}

/** Every regular expression of a tokenizer.json (its vocabulary and merges left out: they hold none). */
function regexes(value: unknown, out: string[] = []): string[] {
  if (Array.isArray(value)) for (const v of value) regexes(v, out);
  else if (isObject(value)) {
    for (const [key, v] of Object.entries(value)) {
      if (key === 'Regex' && typeof v === 'string') out.push(v);
      else if (key !== 'model' && key !== 'added_tokens') regexes(v, out);
    }
  }
  return out;
}

/** Why a capture's tokenizer.json is not served, or null when nothing in it is known to take the server down. */
export function untrustedTokenizerProblem(tokenizerJson: Json): string | null {
  for (const pattern of regexes(tokenizerJson)) {
    const group = exponentialGroup(pattern);
    if (group !== null)
      return `its regular expression ${JSON.stringify(pattern)} repeats ${JSON.stringify(group)}, which backtracks exponentially (a long enough text aborts the process)`;
  }
  for (const part of ['normalizer', 'decoder'] as const) {
    const times = growth(tokenizerJson[part]);
    if (times > MAX_TEXT_GROWTH)
      return `its ${part} can make a text ${times > 1e15 ? 'astronomically' : `${Math.round(times)} times`} longer (at most ${MAX_TEXT_GROWTH} are served)`;
  }
  const model = isObject(tokenizerJson.model) ? tokenizerJson.model : {};
  // BPE's and WordPiece's vocabulary is an object of tokens, Unigram's a list of [token, score].
  const tokens = isObject(model.vocab)
    ? Object.keys(model.vocab)
    : Array.isArray(model.vocab)
      ? model.vocab.map((entry) => (Array.isArray(entry) ? entry[0] : ''))
      : [];
  if (Array.isArray(tokenizerJson.added_tokens)) tokens.push(...tokenizerJson.added_tokens.map((t) => (isObject(t) ? t.content : '')));
  const longest = tokens.reduce((most: number, token) => Math.max(most, typeof token === 'string' ? token.length : 0), 0);
  if (longest > MAX_TOKEN_CHARS) return `it has a token of ${longest} characters (at most ${MAX_TOKEN_CHARS} are served)`;
  return null;
}
