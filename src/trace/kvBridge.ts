/**
 * A router's view of a real engine's KV events (vLLM's wire, vllm-wire-reference §5): engines name blocks by
 * their own hashes (sha256 of tokens, a seed, …), which a router cannot recompute. Like Dynamo's router, each
 * stored block is re-keyed by the local chained hash of its tokens (the event carries them), and the
 * engine's hash is remembered so later removals and children can be translated.
 */
import { chainHash, contentHash } from '../engine/kv/fastHash.js';
import type { VllmKvEvent } from '../engine/index.js';
import type { RouterKvEvent } from './router.js';

export class KvEventBridge {
  /** Engine hash → local hash, per worker. */
  private readonly local: Map<bigint, number>[];

  constructor(workers: number) {
    this.local = Array.from({ length: workers }, () => new Map());
  }

  /** Translates one worker's events; blocks of a size other than the router's are skipped (they cannot match). */
  translate(worker: number, events: readonly VllmKvEvent[], routerBlockSize: number): RouterKvEvent[] {
    const known = this.local[worker];
    const out: RouterKvEvent[] = [];
    for (const event of events) {
      switch (event.type) {
        case 'BlockStored': {
          if (event.blockSize !== routerBlockSize) continue;
          let parent = event.parentBlockHash === null ? null : (known.get(event.parentBlockHash) ?? null);
          // A child of a block the router never saw stored cannot be placed in the chain.
          if (event.parentBlockHash !== null && parent === null) continue;
          const first = parent;
          const blocks: number[] = [];
          event.blockHashes.forEach((hash, i) => {
            const start = i * event.blockSize;
            if (start + event.blockSize > event.tokenIds.length) return;
            parent = chainHash(parent, contentHash(event.tokenIds, start, start + event.blockSize));
            known.set(hash, parent);
            blocks.push(parent);
          });
          if (blocks.length > 0) out.push({ kind: 'stored', blocks, parent: first });
          break;
        }
        case 'BlockRemoved': {
          const blocks: number[] = [];
          for (const hash of event.blockHashes) {
            const block = known.get(hash);
            if (block === undefined) continue;
            known.delete(hash);
            blocks.push(block);
          }
          if (blocks.length > 0) out.push({ kind: 'removed', blocks });
          break;
        }
        case 'AllBlocksCleared':
          known.clear();
          out.push({ kind: 'cleared' });
      }
    }
    return out;
  }
}
