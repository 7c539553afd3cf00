import { LruEvictor } from './evictor.js';

/**
 * A block's identity. Full blocks with prefix caching are their chained content hash (a non-negative
 * integer below 2^53); partial blocks and unshareable full blocks get unique negative ids.
 */
export type BlockId = number;

/**
 * The moves a sequence asks of the block manager (engine-reference §3.4):
 * - `use`: take blocks in sequence order (hit, reactivate, or allocate with eviction); stops at the first failure;
 * - `destroy`: drop partial blocks;
 * - `deref`: release full blocks (to the inactive pool at count 0);
 * - `promote`: a partial block became full.
 */
export type MoveBlock =
  | { kind: 'use'; blocks: readonly BlockId[]; parent: BlockId | null; origin?: BlockOrigin }
  | { kind: 'destroy'; blocks: readonly BlockId[] }
  | { kind: 'deref'; blocks: readonly BlockId[] }
  | { kind: 'promote'; partial: BlockId; full: BlockId; parent: BlockId | null; origin?: BlockOrigin };

export type UseMove = Extract<MoveBlock, { kind: 'use' }>;

/** Where a move's first block sits in its sequence, so a stored event can name the blocks' tokens. */
export interface BlockOrigin {
  tokens: BlockTokens;
  index: number;
}

export interface BlockTokens {
  /** The token ids of full block `index`. */
  blockTokens(index: number): number[];
}

/**
 * What the cache did, for KV events: full blocks newly stored (a contiguous run, with the cached block
 * before it as parent) or evicted, or the cache cleared.
 */
export type KvCacheEvent =
  | { kind: 'stored'; blocks: BlockId[]; parent: BlockId | null; origin?: BlockOrigin }
  | { kind: 'removed'; blocks: BlockId[] }
  | { kind: 'cleared' };

export const isFullBlock = (block: BlockId) => block >= 0;

/**
 * vLLM-flavour KV block manager (Dynamo's `KvManager` over a `HashCache`): active blocks with reference
 * counts, inactive blocks in LRU order; both count towards capacity, and an inactive block is evicted only
 * when a new block needs its slot.
 */
export class KvBlockManager {
  private readonly active = new Map<BlockId, number>();
  private readonly inactive = new LruEvictor<BlockId>();

  constructor(
    readonly capacity: number,
    private readonly onEvent?: (event: KvCacheEvent) => void,
  ) {}

  /** Applies one move; returns how many blocks it handled (for `use`: how many were obtained). */
  process(move: MoveBlock): number {
    switch (move.kind) {
      case 'use':
        return this.use(move);
      case 'destroy':
        for (const block of move.blocks) {
          if (!this.active.delete(block)) throw new Error(`destroy of block ${block}, which is not active`);
          if (isFullBlock(block)) this.onEvent?.({ kind: 'removed', blocks: [block] });
        }
        return move.blocks.length;
      case 'deref':
        for (const block of move.blocks) {
          const count = this.active.get(block);
          if (count === undefined) throw new Error(`deref of block ${block}, which is not active`);
          if (count > 1) this.active.set(block, count - 1);
          else {
            this.active.delete(block);
            this.inactive.insert(block);
          }
        }
        return move.blocks.length;
      case 'promote':
        return this.promote(move);
    }
  }

  private use({ blocks, parent, origin }: UseMove): number {
    let run: BlockId[] = [];
    let runStart = 0;
    let runParent = parent;
    const flush = () => {
      if (run.length === 0) return;
      this.onEvent?.({ kind: 'stored', blocks: run, parent: runParent, ...(origin ? { origin: { tokens: origin.tokens, index: origin.index + runStart } } : {}) });
      run = [];
    };
    let obtained = 0;
    for (const block of blocks) {
      const count = this.active.get(block);
      if (count !== undefined) this.active.set(block, count + 1);
      else if (this.inactive.remove(block)) this.active.set(block, 1);
      else {
        if (this.active.size + this.inactive.size >= this.capacity) {
          const evicted = this.inactive.evict();
          if (evicted === undefined) break;
          this.onEvent?.({ kind: 'removed', blocks: [evicted] });
        }
        this.active.set(block, 1);
        if (isFullBlock(block)) {
          if (run.length === 0) runStart = obtained;
          run.push(block);
        }
        obtained++;
        continue;
      }
      // A block that was already cached ends the run stored so far and is the parent of the next one.
      flush();
      if (isFullBlock(block)) runParent = block;
      obtained++;
    }
    flush();
    return obtained;
  }

  private promote({ partial, full, parent, origin }: Extract<MoveBlock, { kind: 'promote' }>): number {
    if (this.active.get(partial) !== 1) throw new Error(`promote of block ${partial}, which is not held exactly once`);
    this.active.delete(partial);
    const count = this.active.get(full);
    if (count !== undefined) this.active.set(full, count + 1);
    else if (this.inactive.remove(full)) this.active.set(full, 1);
    else {
      this.active.set(full, 1);
      this.onEvent?.({ kind: 'stored', blocks: [full], parent, ...(origin ? { origin } : {}) });
    }
    return 1;
  }

  /** Drops every cached block nobody holds (vLLM's reset_prefix_cache); returns how many. */
  clearInactive(): number {
    let dropped = 0;
    while (this.inactive.evict() !== undefined) dropped++;
    this.onEvent?.({ kind: 'cleared' });
    return dropped;
  }

  /** Leading blocks of `blocks` present in the cache (active or inactive), stopping at the first miss. */
  prefixHits(blocks: readonly BlockId[]): number {
    let hits = 0;
    while (hits < blocks.length && this.contains(blocks[hits])) hits++;
    return hits;
  }

  /** Whether the cache holds `block` (active or inactive). */
  contains(block: BlockId): boolean {
    return this.active.has(block) || this.inactive.has(block);
  }

  isActive(block: BlockId): boolean {
    return this.active.has(block);
  }

  get numActive(): number {
    return this.active.size;
  }

  get numInactive(): number {
    return this.inactive.size;
  }

  get numFree(): number {
    return this.capacity - this.active.size - this.inactive.size;
  }

  activeBlocks(): IterableIterator<[BlockId, number]> {
    return this.active.entries();
  }

  inactiveBlocks(): IterableIterator<BlockId> {
    return this.inactive.values();
  }
}
