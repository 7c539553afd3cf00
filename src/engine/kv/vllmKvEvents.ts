import { isFullBlock, type BlockId, type KvCacheEvent, type LoraAdapter } from './blockManager.js';
import { eventBlockHash, hashBlockTokens, noneHash, type BlockHashAlgo } from './vllmBlockHash.js';

/** A KV cache event as vLLM publishes it (vllm/distributed/kv_events.py); hashes in their event form (u64). */
export type VllmKvEvent =
  | {
      type: 'BlockStored';
      blockHashes: bigint[];
      parentBlockHash: bigint | null;
      tokenIds: number[];
      blockSize: number;
      /** The adapter the blocks were computed under (vLLM's lora_id and lora_name); its name is every block's extra key. */
      lora?: LoraAdapter | null;
    }
  | { type: 'BlockRemoved'; blockHashes: bigint[] }
  | { type: 'AllBlocksCleared' };

export interface VllmKvEventOptions {
  /** --prefix-caching-hash-algo */
  algo: BlockHashAlgo;
  /** PYTHONHASHSEED, else vLLM's "vllm-none-hash". */
  hashSeed: string;
}

/**
 * Turns the block manager's events into vLLM's: each stored block gets vLLM's chained digest of its
 * tokens (the simulator's own block ids are a fast hash, not vLLM's), kept while the block is cached so
 * children chain from it and evictions name it. Pure computation; events wait in `take()`.
 */
export class VllmKvEventLog {
  private readonly digests = new Map<BlockId, Buffer>();
  private readonly noneHash: Buffer;
  private pending: VllmKvEvent[] = [];

  constructor(
    private readonly options: VllmKvEventOptions,
    private readonly blockSize: number,
  ) {
    this.noneHash = noneHash(options.hashSeed, options.algo);
  }

  record(event: KvCacheEvent): void {
    switch (event.kind) {
      case 'stored': {
        if (!event.origin) throw new Error('a stored KV event without its tokens');
        let parent = event.parent === null ? null : this.digestOf(event.parent);
        const parentBlockHash = parent === null ? null : eventBlockHash(parent);
        const blockHashes: bigint[] = [];
        const tokenIds: number[] = [];
        const lora = event.origin.tokens.lora ?? null;
        // vLLM's generate_block_hash_extra_keys: the adapter's name, for every block.
        const extraKeys = lora ? [lora.name] : null;
        event.blocks.forEach((block, i) => {
          const tokens = event.origin!.tokens.blockTokens(event.origin!.index + i);
          parent = hashBlockTokens(parent, this.noneHash, tokens, extraKeys, this.options.algo);
          this.digests.set(block, parent);
          blockHashes.push(eventBlockHash(parent));
          for (const t of tokens) tokenIds.push(t);
        });
        this.pending.push({ type: 'BlockStored', blockHashes, parentBlockHash, tokenIds, blockSize: this.blockSize, lora });
        return;
      }
      case 'removed': {
        const blockHashes = event.blocks.filter(isFullBlock).map((block) => {
          const hash = eventBlockHash(this.digestOf(block));
          this.digests.delete(block);
          return hash;
        });
        if (blockHashes.length > 0) this.pending.push({ type: 'BlockRemoved', blockHashes });
        return;
      }
      case 'cleared':
        this.digests.clear();
        this.pending.push({ type: 'AllBlocksCleared' });
    }
  }

  /** The events since the last call, oldest first. */
  take(): VllmKvEvent[] {
    const events = this.pending;
    this.pending = [];
    return events;
  }

  /** The event hash of every cached block, given the cache's block ids (what a subscriber's index should hold). */
  eventHashes(blocks: Iterable<BlockId>): bigint[] {
    const hashes: bigint[] = [];
    for (const block of blocks) if (isFullBlock(block)) hashes.push(eventBlockHash(this.digestOf(block)));
    return hashes;
  }

  private digestOf(block: BlockId): Buffer {
    const digest = this.digests.get(block);
    // Every cached full block was stored through this log, so a miss is a bookkeeping bug, not bad input.
    if (!digest) throw new Error(`KV events: block ${block} was never stored`);
    return digest;
  }
}
