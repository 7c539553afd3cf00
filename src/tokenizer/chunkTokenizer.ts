/**
 * `--no-tokenizer` (AIPerf's mock server): tokens are character chunks, as AIPerf's mock server counts prompts — 4
 * characters, or 6 when the 5th is not whitespace and the 6th is (the word's end and its space taken in) — instead of
 * a model's vocabulary. The same surface as a Hugging Face tokenizer (what ModelTokenizer calls), so templates,
 * counting, the engine and streaming work unchanged.
 */

/** AIPerf's `_tokenize`: the text's chunks, in order (their lengths sum to the text's). */
export function characterChunks(text: string): string[] {
  const chunks: string[] = [];
  const space = (c: string | undefined) => c !== undefined && /\s/.test(c);
  for (let i = 0; i < text.length; ) {
    let end = Math.min(i + 4, text.length);
    if (end < text.length && !space(text[end]) && space(text[end + 1])) end += 2;
    chunks.push(text.slice(i, end));
    i = end;
  }
  return chunks;
}

const CONSONANTS = 'bcdfghjklmnprstvwz';
const VOWELS = 'aeiou';
/** The base vocabulary random outputs draw from: two-syllable words with their space ("bako "), 8,100 of them. */
const BASE: string[] = [];
for (const a of CONSONANTS) for (const b of VOWELS) for (const c of CONSONANTS) for (const d of VOWELS) BASE.push(`${a}${b}${c}${d} `);

/**
 * Chunks seen in requests get ids after the base vocabulary, in first-seen order, up to this many; beyond, a chunk
 * shares an id by hash (decoding that id then gives the chunk first seen with it): requests are untrusted, and a
 * mock server must not grow without bound.
 */
const INTERNED = 1 << 20;

/** The encoding a Hugging Face tokenizer returns, as far as it is read. */
interface ChunkEncoding {
  getIds(): number[];
  getLength(): number;
}

function fnv1a(text: string): number {
  let hash = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) hash = Math.imul(hash ^ text.charCodeAt(i), 0x01000193);
  return hash >>> 0;
}

export class ChunkVocabulary {
  private readonly ids = new Map<string, number>(BASE.map((chunk, id) => [chunk, id]));
  private readonly chunks: string[] = [...BASE];

  private idOf(chunk: string): number {
    const known = this.ids.get(chunk);
    if (known !== undefined) return known;
    if (this.chunks.length >= BASE.length + INTERNED) return BASE.length + (fnv1a(chunk) % INTERNED);
    const id = this.chunks.length;
    this.chunks.push(chunk);
    this.ids.set(chunk, id);
    return id;
  }

  async encode(text: string, _pair: null, _options: { addSpecialTokens: boolean }): Promise<ChunkEncoding> {
    const ids = characterChunks(text).map((chunk) => this.idOf(chunk));
    return { getIds: () => ids, getLength: () => ids.length };
  }

  async decode(ids: number[], _skipSpecialTokens: boolean): Promise<string> {
    return ids.map((id) => this.chunks[id] ?? '').join('');
  }

  idToToken(id: number): string | null {
    return this.chunks[id] ?? null;
  }

  tokenToId(token: string): number | null {
    return this.ids.get(token) ?? null;
  }

  /** The base vocabulary (what random outputs draw from); ids of chunks seen in requests come after it. */
  getVocab(_withAddedTokens: boolean): Record<string, number> {
    return Object.fromEntries(BASE.map((chunk, id) => [chunk, id]));
  }

  getVocabSize(withAddedTokens: boolean): number {
    return withAddedTokens ? BASE.length + INTERNED : BASE.length;
  }
}
