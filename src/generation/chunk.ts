import type { ChunkDelta } from '../store/generation.js';

// Its own file: the plan and the parts that build chunks (reasoning, tool calls) both use it.

/** A group of output tokens that goes out as one streamed chunk. */
export interface PlannedChunk {
  /** Index one past this chunk's last token. */
  end: number;
  /** The chunk's payload; absent = the text is detokenized from the token ids when it is sent. */
  delta?: ChunkDelta;
}
