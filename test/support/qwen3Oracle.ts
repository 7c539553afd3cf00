/** Python HF tokenizers' answers for the bundled Qwen3 tokenizer (test/fixtures/tokenizer/qwen3.jsonl): an independent oracle. */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

interface OracleRow {
  kind: string;
  text?: string;
  ids_without_special?: number[];
  ids_with_special?: number[];
  request?: { messages: { role: string; content: string }[] };
  ids?: number[];
}

const ORACLE = readFileSync(join(import.meta.dirname, '..', 'fixtures', 'tokenizer', 'qwen3.jsonl'), 'utf8')
  .split('\n')
  .filter((l) => l.trim() !== '')
  .map((l) => JSON.parse(l) as OracleRow);

/** The ids of `text` encoded without special tokens. */
export const oracleIds = (text: string): number[] => ORACLE.find((o) => o.kind === 'encode' && o.text === text)!.ids_without_special!;

/** A chat of the fixtures (messages only) whose first message says `first`, with its reference prompt ids. */
export function oracleChat(first: string): { messages: { role: string; content: string }[]; ids: number[] } {
  const row = ORACLE.find((o) => o.kind === 'chat' && o.request?.messages[0].content === first && Object.keys(o.request).length === 1)!;
  return { messages: row.request!.messages, ids: row.ids! };
}

/** The ids of `text` encoded with special tokens (what vLLM's embedding endpoint counts; Qwen3 adds none). */
export const oracleIdsWithSpecial = (text: string): number[] => ORACLE.find((o) => o.kind === 'encode' && o.text === text)!.ids_with_special!;
