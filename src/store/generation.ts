// A stored choice's output: its own file, since the store and its packed encoding (pack.ts) both use it.

/** One streamed chunk's payload for one choice: `{text}` for completions, the chat delta (minus role) for chat. */
export type ChunkDelta = Record<string, unknown>;

export interface Generation {
  choiceIndex: number;
  outputIds: number[];
  tokenTimes: number[];
  chunkTokens: number[];
  chunkDeltas: ChunkDelta[];
  text: string;
  finishReason: string | null;
  stopReason: string | number | null;
}
