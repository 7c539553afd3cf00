import { BlockMap } from './blockMap.js';
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

/** A LoRA adapter (vLLM's LoRARequest): its name goes into every block hash, its id and name into KV events. */
export interface LoraAdapter {
  name: string;
  /** vLLM's lora_int_id: 1, 2, … in load order. */
  id: number;
}

export interface BlockTokens {
  /** The token ids of full block `index`. */
  blockTokens(index: number): number[];
  /** The adapter the blocks were computed under (none: the base model). */
  readonly lora?: LoraAdapter | null;
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

/** A stored run of a `use` move, whose blocks start `offset` blocks into the move. */
function storedEvent(blocks: BlockId[], parent: BlockId | null, origin: BlockOrigin | undefined, offset: number): KvCacheEvent {
  return origin ? { kind: 'stored', blocks, parent, origin: { tokens: origin.tokens, index: origin.index + offset } } : { kind: 'stored', blocks, parent };
}

/**
 * vLLM-flavour KV block manager (Dynamo's `KvManager` over a `HashCache`): active blocks with reference
 * counts, inactive blocks in LRU order; both count towards capacity, and an inactive block is evicted only
 * when a new block needs its slot. Each held block occupies a slot of typed arrays (its id and count), found
 * through a `BlockMap`.
 */
export class KvBlockManager {
  /** Per slot: the block id and its reference count (0: inactive). */
  private ids: Float64Array;
  private refs: Int32Array;
  /** Block id → slot. */
  private readonly index: BlockMap;
  /** Slots handed out so far; the arrays grow towards `capacity` as they fill. */
  private slotsUsed = 0;
  /** Released slots, reused first. */
  private readonly freed: number[] = [];
  /** Inactive blocks' slots, least recently released first. */
  private readonly inactive = new LruEvictor();
  private active = 0;

  constructor(
    readonly capacity: number,
    private readonly onEvent?: (event: KvCacheEvent) => void,
  ) {
    const slots = Math.min(capacity, 1024);
    this.ids = new Float64Array(slots);
    this.refs = new Int32Array(slots);
    this.index = new BlockMap(slots);
  }

  /** A slot for a new block (the caller has made room: fewer than `capacity` are held). */
  private takeSlot(block: BlockId): number {
    let slot = this.freed.pop();
    if (slot === undefined) {
      if (this.slotsUsed === this.ids.length) this.grow();
      slot = this.slotsUsed++;
    }
    this.ids[slot] = block;
    this.refs[slot] = 1;
    this.index.set(block, slot);
    this.active++;
    return slot;
  }

  /** Drops the block in `slot` from the cache. */
  private releaseSlot(slot: number): void {
    this.index.delete(this.ids[slot]);
    this.refs[slot] = 0;
    this.freed.push(slot);
  }

  /** Doubles the slots (up to capacity). */
  private grow(): void {
    const slots = Math.min(this.capacity, this.ids.length * 2);
    const ids = new Float64Array(slots);
    ids.set(this.ids);
    const refs = new Int32Array(slots);
    refs.set(this.refs);
    this.ids = ids;
    this.refs = refs;
  }

  /** One more reference to the cached block in `slot` (reactivating an inactive one). */
  private reference(slot: number): void {
    if (this.refs[slot]++ === 0) {
      this.inactive.remove(slot);
      this.active++;
    }
  }

  private activeSlot(block: BlockId, move: string): number {
    const slot = this.index.get(block);
    if (slot < 0 || this.refs[slot] === 0) throw new Error(`${move} of block ${block}, which is not active`);
    return slot;
  }

  /** Applies one move; returns how many blocks it handled (for `use`: how many were obtained). */
  process(move: MoveBlock): number {
    switch (move.kind) {
      case 'use':
        return this.use(move);
      case 'destroy':
        for (const block of move.blocks) {
          this.releaseSlot(this.activeSlot(block, 'destroy'));
          this.active--;
          if (isFullBlock(block)) this.onEvent?.({ kind: 'removed', blocks: [block] });
        }
        return move.blocks.length;
      case 'deref':
        for (const block of move.blocks) {
          const slot = this.activeSlot(block, 'deref');
          if (--this.refs[slot] === 0) {
            this.active--;
            this.inactive.insert(slot);
          }
        }
        return move.blocks.length;
      case 'promote':
        return this.promote(move);
    }
  }

  private use({ blocks, parent, origin }: UseMove): number {
    const onEvent = this.onEvent;
    // The run of newly stored full blocks (only collected for a listener), where it starts and its parent.
    let run: BlockId[] | null = null;
    let runStart = 0;
    let runParent = parent;
    let obtained = 0;
    for (const block of blocks) {
      const slot = this.index.get(block);
      if (slot >= 0) {
        this.reference(slot);
        // A block that was already cached ends the run stored so far and is the parent of the next one.
        if (run !== null) {
          onEvent?.(storedEvent(run, runParent, origin, runStart));
          run = null;
        }
        if (isFullBlock(block)) runParent = block;
        obtained++;
        continue;
      }
      if (this.active + this.inactive.size >= this.capacity) {
        const evicted = this.inactive.evict();
        if (evicted === undefined) break;
        const evictedBlock = this.ids[evicted];
        this.releaseSlot(evicted);
        onEvent?.({ kind: 'removed', blocks: [evictedBlock] });
      }
      this.takeSlot(block);
      if (onEvent && isFullBlock(block)) {
        if (run === null) {
          run = [];
          runStart = obtained;
        }
        run.push(block);
      }
      obtained++;
    }
    if (run !== null) onEvent?.(storedEvent(run, runParent, origin, runStart));
    return obtained;
  }

  private promote({ partial, full, parent, origin }: Extract<MoveBlock, { kind: 'promote' }>): number {
    const partialSlot = this.index.get(partial);
    if (partialSlot < 0 || this.refs[partialSlot] !== 1) throw new Error(`promote of block ${partial}, which is not held exactly once`);
    this.releaseSlot(partialSlot);
    this.active--;
    const slot = this.index.get(full);
    if (slot >= 0) this.reference(slot);
    else {
      this.takeSlot(full);
      this.onEvent?.({ kind: 'stored', blocks: [full], parent, ...(origin ? { origin } : {}) });
    }
    return 1;
  }

  /** Drops every cached block nobody holds (vLLM's reset_prefix_cache); returns how many. */
  clearInactive(): number {
    let dropped = 0;
    for (let slot = this.inactive.evict(); slot !== undefined; slot = this.inactive.evict()) {
      this.releaseSlot(slot);
      dropped++;
    }
    this.onEvent?.({ kind: 'cleared' });
    return dropped;
  }

  /** Leading blocks of `blocks` present in the cache (active or inactive), stopping at the first miss. */
  prefixHits(blocks: readonly BlockId[]): number {
    let hits = 0;
    while (hits < blocks.length && this.index.has(blocks[hits])) hits++;
    return hits;
  }

  /** Whether the cache holds `block` (active or inactive). */
  contains(block: BlockId): boolean {
    return this.index.has(block);
  }

  isActive(block: BlockId): boolean {
    const slot = this.index.get(block);
    return slot >= 0 && this.refs[slot] > 0;
  }

  get numActive(): number {
    return this.active;
  }

  get numInactive(): number {
    return this.inactive.size;
  }

  get numFree(): number {
    return this.capacity - this.active - this.inactive.size;
  }

  /** Active blocks with their reference counts. */
  *activeBlocks(): IterableIterator<[BlockId, number]> {
    for (let slot = 0; slot < this.slotsUsed; slot++) if (this.refs[slot] > 0) yield [this.ids[slot], this.refs[slot]];
  }

  /** Inactive blocks, least recently released first. */
  *inactiveBlocks(): IterableIterator<BlockId> {
    for (const slot of this.inactive.values()) yield this.ids[slot];
  }
}
