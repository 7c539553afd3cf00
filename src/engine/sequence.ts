import { isFullBlock, type BlockId, type BlockTokens, type LoraAdapter, type MoveBlock, type UseMove } from './kv/blockManager.js';
import type { TokenIds } from './contract.js';
import { blockHashes, chainHash, contentHash, loraChainSeed } from './kv/fastHash.js';

/**
 * A request's tokens chunked into KV blocks (Dynamo's `ActiveSequence`, engine-reference §3.5): one id per
 * full block (its chained hash, or a unique id without prefix caching) plus a trailing partial block, and
 * how many tokens have blocks allocated. It produces the block moves; the scheduler applies them.
 */
const NO_MOVES: readonly MoveBlock[] = Object.freeze([]);

export class ActiveSequence implements BlockTokens {
  /** The prompt as given (not copied: prompts can be tens of thousands of tokens). */
  private readonly prompt: TokenIds;
  /**
   * The generated tokens, the first `generated` entries (a packed buffer grown by doubling: one store per
   * token, no boxing of ids above 2^31). Float64 holds any id exactly.
   */
  private output = new Float64Array(0);
  readonly promptLength: number;
  generated = 0;
  numAllocatedTokens = 0;
  /** One per block, in order; the last may be partial. */
  readonly blocks: BlockId[] = [];
  /** Sequence hashes of the full blocks (chained even without prefix caching). */
  private readonly hashes: number[];
  private lastIsPartial = false;
  /** The first block's parent hash: the adapter's seed, so no block is shared across adapters. */
  private readonly chainSeed: number | null;

  constructor(
    prompt: TokenIds,
    readonly maxOutput: number,
    readonly blockSize: number,
    private readonly prefixCaching: boolean,
    private readonly uniqueId: () => BlockId,
    /** Keep every block after the last token (a prefill engine holding KV for a remote decode). */
    private readonly keepBlocksWhenDone = false,
    readonly lora: LoraAdapter | null = null,
  ) {
    this.prompt = prompt;
    this.promptLength = prompt.length;
    this.chainSeed = lora ? loraChainSeed(lora.name) : null;
    this.hashes = blockHashes(prompt, blockSize, this.chainSeed).slice();
    for (const hash of this.hashes) this.blocks.push(prefixCaching ? hash : uniqueId());
    if (prompt.length % blockSize !== 0) {
      this.blocks.push(uniqueId());
      this.lastIsPartial = true;
    }
  }

  get length(): number {
    return this.promptLength + this.generated;
  }

  blockTokens(index: number): number[] {
    const start = index * this.blockSize;
    const block = new Array<number>(this.blockSize);
    for (let i = start; i < start + this.blockSize; i++) block[i - start] = i < this.promptLength ? this.prompt[i] : this.output[i - this.promptLength];
    return block;
  }

  /** The content hash of full block `index`, read in place where the block holds output tokens only. */
  private blockContentHash(index: number): number {
    const start = index * this.blockSize - this.promptLength;
    return start >= 0 ? contentHash(this.output, start, start + this.blockSize) : contentHash(this.blockTokens(index), 0, this.blockSize);
  }

  private addFullBlock(index: number, content: number): BlockId {
    const hash = chainHash(index > 0 ? this.hashes[index - 1] : this.chainSeed, content);
    this.hashes[index] = hash;
    const id = this.prefixCaching ? hash : this.uniqueId();
    this.blocks[index] = id;
    return id;
  }

  private blocksFor(tokens: number): number {
    return Math.min(Math.ceil(tokens / this.blockSize), this.blocks.length);
  }

  /** The `use` move that gives blocks to the first `tokens` tokens, or null when they already have them. */
  prepareAllocation(tokens: number): UseMove | null {
    const from = this.blocksFor(this.numAllocatedTokens);
    const to = this.blocksFor(tokens);
    if (to <= from) return null;
    return { kind: 'use', blocks: this.blocks.slice(from, to), parent: from > 0 ? this.blocks[from - 1] : null, origin: { tokens: this, index: from } };
  }

  commitAllocation(tokens: number): void {
    this.numAllocatedTokens = tokens;
  }

  /** Real ids of full blocks allocated under placeholder ids while their KV is pulled from a prefill engine. */
  private inFlight: Map<number, BlockId> | null = null;

  /**
   * Like `prepareAllocation`, for KV pulled from a prefill engine: full blocks from `firstMissing` on are taken
   * under unique placeholder ids, so that until the KV lands they are neither found nor announced as cached
   * (vLLM caches a decode request's blocks once it has received them).
   */
  prepareRemoteAllocation(tokens: number, firstMissing: number): UseMove | null {
    const to = this.blocksFor(tokens);
    for (let i = Math.max(firstMissing, this.blocksFor(this.numAllocatedTokens)); i < to; i++) {
      if (!isFullBlock(this.blocks[i])) continue;
      this.inFlight ??= new Map();
      this.inFlight.set(i, this.blocks[i]);
      this.blocks[i] = this.uniqueId();
    }
    return this.prepareAllocation(tokens);
  }

  /** The pulled KV has landed: each placeholder becomes its block's real id, now cached (and stored). */
  landRemote(): MoveBlock[] {
    const moves: MoveBlock[] = [];
    for (const [index, full] of this.inFlight ?? []) {
      moves.push(this.promotion(index, this.blocks[index], full));
      this.blocks[index] = full;
    }
    this.inFlight = null;
    return moves;
  }

  /** Block `index`, held under the uncached id `partial`, becomes the cached block `full`. */
  private promotion(index: number, partial: BlockId, full: BlockId): MoveBlock {
    return { kind: 'promote', partial, full, parent: index > 0 ? this.blocks[index - 1] : null, origin: { tokens: this, index } };
  }

  /**
   * Appends a generated token. The first token of a new block promotes the previous partial block (now
   * full) and takes a new partial block; the last token also releases every block.
   */
  generate(token: number): readonly MoveBlock[] {
    if (this.generated === this.output.length) {
      const grown = new Float64Array(Math.max(this.generated + 1, Math.min(this.maxOutput, Math.max(16, this.output.length * 2))));
      grown.set(this.output);
      this.output = grown;
    }
    this.output[this.generated++] = token;
    const crossing = this.length % this.blockSize === 1;
    const last = this.generated >= this.maxOutput;
    if (!crossing && !last) return NO_MOVES;
    const moves: MoveBlock[] = [];
    if (crossing) {
      const index = this.blocks.length - 1;
      if (this.lastIsPartial) {
        const partial = this.blocks[index];
        const full = this.addFullBlock(index, this.blockContentHash(index));
        moves.push(this.promotion(index, partial, full));
      }
      // A kept sequence's last token (a prefill's sampled token, its KV held for a remote decode) is never
      // computed: no block for it, as vLLM holds ceil(prompt / block size) blocks.
      if (!(last && this.keepBlocksWhenDone)) {
        const partial = this.uniqueId();
        this.blocks.push(partial);
        this.lastIsPartial = true;
        moves.push({ kind: 'use', blocks: [partial], parent: null });
      }
    }
    if (last && !this.keepBlocksWhenDone) moves.push(...this.freeMoves(this.blocks.length));
    return moves;
  }

  /** Undoes the token just generated (its block could not be allocated). */
  pop(): void {
    this.generated--;
    if (this.lastIsPartial && this.length % this.blockSize === 0) {
      this.blocks.pop();
      this.lastIsPartial = false;
    }
  }

  /** Releases every allocated block (preemption or abort); generated tokens are kept for recompute. */
  reset(): MoveBlock[] {
    const moves = this.freeMoves(this.blocksFor(this.numAllocatedTokens));
    this.numAllocatedTokens = 0;
    // KV that never landed was never cached: its placeholders are dropped, the blocks get their ids back.
    for (const [index, full] of this.inFlight ?? []) this.blocks[index] = full;
    this.inFlight = null;
    return moves;
  }

  /**
   * Tail first, so the deepest blocks become the oldest inactive ones (evicted first); blocks in a row that
   * go the same way share one move.
   */
  private freeMoves(count: number): MoveBlock[] {
    const moves: { kind: 'destroy' | 'deref'; blocks: BlockId[] }[] = [];
    for (let i = count - 1; i >= 0; i--) {
      const kind = (this.lastIsPartial && i === this.blocks.length - 1) || this.inFlight?.has(i) === true ? 'destroy' : 'deref';
      const last = moves.at(-1);
      if (last?.kind === kind) last.blocks.push(this.blocks[i]);
      else moves.push({ kind, blocks: [this.blocks[i]] });
    }
    return moves;
  }
}
