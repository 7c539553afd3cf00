import randexpModule from 'randexp';

// randexp is CommonJS: its module.exports is the class its types name `default`.
const RandExp = randexpModule as unknown as typeof randexpModule.default;
type RandExp = InstanceType<typeof RandExp>;

/** A regex mocker cannot draw a matching string for; `tooLong`: it can, but not within the characters it may take. */
export class RegexUnsupported extends Error {
  constructor(
    message: string,
    readonly tooLong = false,
  ) {
    super(message);
  }
}

/** randexp's token tree (the `ret` parser's; its numeric token types). */
interface Token {
  type: number;
  stack?: Token[];
  options?: Token[][];
  min?: number;
  max?: number | null;
  value?: Token | number | string;
  followedBy?: boolean;
  notFollowedBy?: boolean;
}
const ROOT = 0;
const GROUP = 1;
const POSITION = 2;
const SET = 3;
const REPETITION = 5;
const REFERENCE = 6;
const CHAR = 7;

/**
 * What randexp does not generate, found in the parse before anything is drawn: a lookaround, a back-reference
 * (re-emitted, so its length escapes the budget), a word boundary, or `^` / `$` anywhere but the pattern's ends.
 * A draw that ignored them would then be tested against the whole regex, whose backtracking on such a string
 * (`(a+)+(?=b)`) is exponential: refused instead, before either.
 */
function unsupportedToken(token: Token, atStart: boolean, atEnd: boolean): string | null {
  if (token.type === REFERENCE) return 'back-references';
  if (token.type === POSITION && !((token.value === '^' && atStart) || (token.value === '$' && atEnd))) return 'word boundaries and anchors inside the pattern';
  if (token.type === GROUP && (token.followedBy || token.notFollowedBy)) return 'lookarounds';
  if (token.type === REPETITION) return unsupportedToken(token.value as Token, false, false);
  const stacks = token.options ?? (token.stack ? [token.stack] : []);
  for (const stack of stacks) {
    for (const [i, t] of stack.entries()) {
      // An anchor counts as at an end only in the pattern's own top level.
      const problem = unsupportedToken(t, token.type === ROOT && i === 0, token.type === ROOT && i === stack.length - 1);
      if (problem !== null) return problem;
    }
  }
  return null;
}

/** Repetitions without an upper bound (`*`, `+`, `{n,}`) repeat at most this many more times than their minimum. */
const OPEN_REPEAT = 16;

/** The most UTF-16 units a string drawn from `token` takes (a code point takes at most 2). */
function longest(token: Token): number {
  switch (token.type) {
    case ROOT:
    case GROUP: {
      const stacks = token.options ?? [token.stack ?? []];
      return Math.max(0, ...stacks.map((stack) => stack.reduce((sum, t) => sum + longest(t), 0)));
    }
    case REPETITION:
      return (token.max ?? 0) * longest(token.value as Token);
    case SET:
    case CHAR:
      return 2;
    default:
      return 0;
  }
}

/** Caps every repetition at `extra` repetitions past its minimum (randexp reads `max` as the bound it draws up to). */
function capRepetitions(token: Token, extra: number): void {
  if (token.type === REPETITION) {
    const min = token.min ?? 0;
    token.max = token.max === null || token.max === undefined || token.max === Infinity ? min + extra : Math.min(token.max, min + extra);
    capRepetitions(token.value as Token, extra);
  }
  for (const stack of token.options ?? (token.stack ? [token.stack] : [])) for (const t of stack) capRepetitions(t, extra);
}

/**
 * A string the whole of `pattern` matches (as a guided regex is matched: from its start to its end), drawn by
 * randexp with `rand`, at most `maxChars` long: repetitions are capped before drawing so that no draw can take more
 * (the work is bounded by the budget, not by `a{1000000}`). Throws `RegexUnsupported` when the pattern does not
 * parse, when even its shortest strings take more than `maxChars`, or when randexp's draws do not match it
 * (lookarounds, back-references and word boundaries it cannot honour). `flags` 'u': read as JSON Schema reads a
 * `pattern` (ECMA-262 with the unicode flag, as Ajv does).
 */
export function sampleRegex(pattern: string, rand: () => number, maxChars: number, flags: '' | 'u' = ''): string {
  let whole: RegExp;
  let generator: RandExp;
  try {
    whole = new RegExp(`^(?:${pattern})$`, flags);
    generator = new RandExp(pattern);
  } catch (err) {
    throw new RegexUnsupported(`Invalid regular expression ${JSON.stringify(pattern)}: ${(err as Error).message}`);
  }
  generator.randInt = (a: number, b: number) => a + Math.floor(rand() * (b - a + 1));
  // randexp draws classes within printable ASCII: a pattern that names other characters (`[а-я]`) gets the
  // Basic Multilingual Plane's too (surrogates aside), or its classes would draw nothing.
  if (/[^\x00-\x7f]|\\u[0-9a-fA-F]{4}|\\x[89a-fA-F][0-9a-fA-F]/.test(pattern)) generator.defaultRange.add(0xa0, 0xd7ff);
  // The token tree is private to randexp's types; it is the parse `gen` walks.
  const tree = (generator as unknown as { tokens: Token }).tokens;
  const unsupported = unsupportedToken(tree, true, true);
  if (unsupported !== null)
    throw new RegexUnsupported(`mocker cannot draw a string matching the regular expression ${JSON.stringify(pattern)}: ${unsupported} are not generated.`);
  let extra = OPEN_REPEAT;
  capRepetitions(tree, extra);
  while (longest(tree) > maxChars && extra > 0) capRepetitions(tree, (extra = Math.floor(extra / 4)));
  if (longest(tree) > maxChars) {
    throw new RegexUnsupported(
      `The regular expression ${JSON.stringify(pattern)} needs more than the ${maxChars} characters this request's max_tokens leaves room for.`,
      true,
    );
  }
  for (let attempt = 0; attempt < 8; attempt++) {
    const drawn = generator.gen();
    if (whole.test(drawn)) return drawn;
  }
  throw new RegexUnsupported(
    `mocker cannot draw a string matching the regular expression ${JSON.stringify(pattern)} (lookarounds, back-references and word boundaries are not generated).`,
  );
}
