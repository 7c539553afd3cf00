/**
 * Dynamo's KV-aware router for trace replay (engine-reference §8.7; the disaggregated variants of §5.4):
 * a prefix-cache indexer fed by the workers' KV events, per-worker active-sequence load, the
 * `overlap_score_weight × prefill_blocks + decode_blocks` cost, and the busy-worker queue.
 */
import { z } from 'zod';
import type { TokenIds } from '../engine/index.js';
import { BlockMap } from '../engine/kv/blockMap.js';
import { blockHashes } from '../engine/kv/fastHash.js';
import { readJsonObjectArg } from '../util/jsonArg.js';
import { BinaryHeap } from '../util/binaryHeap.js';
import { seededUniform } from '../util/mulberry32.js';
import type { Release, RoutedRequest, Router, RouterKvEvent } from './router.js';

/** Dynamo's `KvRouterConfig`, snake_case as in `--router-config`. */
export interface KvRouterConfig {
  overlap_score_weight: number;
  router_temperature: number;
  /** Accepted, no effect: offline replay always feeds the indexer from KV events. */
  use_kv_events: boolean;
  router_track_active_blocks: boolean;
  /** Accepted, no effect: the router sees no per-token output blocks here. */
  router_track_output_blocks: boolean;
  router_assume_kv_reuse: boolean;
  router_track_prefill_tokens: boolean;
  /** "aic" (predicted prefill durations) is refused: not simulated. */
  router_prefill_load_model: 'none';
  /** Fraction of max_num_batched_tokens; null disables queueing. */
  router_queue_threshold: number | null;
  router_queue_policy: 'fcfs' | 'lcfs' | 'wspt';
  /** Accepted, no effect (approximate indexer without KV events, tree pruning, snapshots, indexer threads). */
  router_ttl_secs: number;
  router_max_tree_size: number;
  router_prune_target_ratio: number;
  router_snapshot_threshold: number | null;
  router_event_threads: number;
}

/** The JSON keys with Dynamo's defaults and validation ranges (lib/kv-router config.rs). */
const routerConfigJson = z.strictObject({
  overlap_score_weight: z.number().min(0).default(1),
  router_temperature: z.number().min(0).default(0),
  use_kv_events: z.boolean().default(true),
  router_track_active_blocks: z.boolean().default(true),
  router_track_output_blocks: z.boolean().default(false),
  router_assume_kv_reuse: z.boolean().default(true),
  router_track_prefill_tokens: z.boolean().default(true),
  router_prefill_load_model: z.enum(['none', 'aic']).default('none'),
  router_queue_threshold: z.number().min(0).nullable().default(4),
  router_queue_policy: z.enum(['fcfs', 'lcfs', 'wspt']).default('fcfs'),
  router_ttl_secs: z.number().min(0).default(120),
  router_max_tree_size: z
    .number()
    .int()
    .min(1)
    .default(2 ** 20),
  router_prune_target_ratio: z.number().min(0).max(1).default(0.8),
  router_snapshot_threshold: z.number().int().min(1).nullable().default(1_000_000),
  router_event_threads: z.number().int().min(1).default(4),
});

function routerConfigFrom(raw: unknown): KvRouterConfig {
  const parsed = routerConfigJson.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    if (issue.code === 'unrecognized_keys') throw new Error(`--router-config: unknown key ${issue.keys.map((k) => `"${k}"`).join(', ')}`);
    if (issue.path.length === 0) throw new Error(`--router-config: ${issue.message}`);
    const key = issue.path.join('.');
    throw new Error(`--router-config: "${key}": ${issue.message} (got ${JSON.stringify((raw as Record<string, unknown>)[key])})`);
  }
  const c = parsed.data;
  if (c.router_prefill_load_model === 'aic') {
    throw new Error('--router-config: "router_prefill_load_model": "aic" (AI Configurator prefill load prediction) is not simulated by mocker; use "none"');
  }
  if (c.router_track_output_blocks && !c.router_track_active_blocks) {
    throw new Error('--router-config: "router_track_output_blocks" requires "router_track_active_blocks": true');
  }
  return { ...c, router_prefill_load_model: 'none' };
}

export const DEFAULT_KV_ROUTER_CONFIG: KvRouterConfig = routerConfigFrom({});

/**
 * `--router-config`: partial JSON over Dynamo's defaults, inline (`{...}`) or a file path; `base` holds settings
 * given elsewhere (the engine args' `router_queue_policy`), which the JSON overrides.
 */
export function parseRouterConfig(text: string, base: Record<string, unknown> = {}): KvRouterConfig {
  return routerConfigFrom({ ...base, ...readJsonObjectArg(text, '--router-config') });
}

/** §5.4: the prefill pool's router does not count decode blocks. */
export function prefillRouterConfig(c: KvRouterConfig): KvRouterConfig {
  return { ...c, router_track_active_blocks: false };
}

/** §5.4: the decode pool's router balances load only (no cache credit, no prompt load). */
export function decodeRouterConfig(c: KvRouterConfig): KvRouterConfig {
  return { ...c, overlap_score_weight: 0, router_assume_kv_reuse: false, router_track_prefill_tokens: false, router_prefill_load_model: 'none' };
}

/** Dynamo's `DEFAULT_MAX_BATCHED_TOKENS`, used for the queue threshold when the engine's is unknown. */
const ROUTER_DEFAULT_MAX_BATCHED_TOKENS = 10_000_000;

export interface KvRouterOptions {
  workers: number;
  /** The engine's block size: what its KV events and the router's block hashes are counted in. */
  blockSize: number;
  config: KvRouterConfig;
  /** The engine's max_num_batched_tokens; null → the router's default. */
  maxNumBatchedTokens: number | null;
  seed: number;
}

/** A request the router holds: admitted on `worker`, or parked (worker -1). */
interface TrackedRequest {
  request: RoutedRequest;
  /** Blocks counted as active load: the hashes, unique ids when KV reuse is not assumed, none when not tracked. */
  activeBlocks: readonly number[];
  /** Cached leading blocks per worker, as seen at arrival (Dynamo keeps them for a parked request). */
  overlaps: Int32Array;
  worker: number;
  /** Prompt tokens still loading the worker (0 once prefill completed or when not tracked). */
  prefillTokens: number;
}

interface Parked {
  key: number;
  seq: number;
  tracked: TrackedRequest;
}

/**
 * How many of a request's active blocks a worker's load holds already. Those are a prefix: the blocks are a hash
 * chain (or ids of its own, held nowhere) and every request counted there holds its whole chain; so bisect.
 */
function heldPrefix(blocks: readonly number[], refs: BlockMap): number {
  let held = 0;
  let notHeld = blocks.length;
  while (held < notHeld) {
    const mid = (held + notHeld) >> 1;
    if (refs.has(blocks[mid])) held = mid + 1;
    else notHeld = mid;
  }
  return held;
}

/** Parked requests come out by key, higher first, then in parking order. */
function before(a: Parked, b: Parked): boolean {
  return a.key !== b.key ? a.key > b.key : a.seq < b.seq;
}

/**
 * Dynamo's KV router as the offline replay runs it: `RadixTree` indexer (here a set of chained block hashes per
 * worker: a request's overlap is its leading blocks found there), `ActiveSequencesMultiWorker` load,
 * `DefaultWorkerSelector`, and the pending queue.
 */
export class KvRouter implements Router {
  readonly usesKvEvents = true;
  private readonly workers: number;
  private readonly blockSize: number;
  private readonly config: KvRouterConfig;
  /** Prefill tokens above which a worker is busy; null: never queue. */
  private readonly busyAbove: number | null;
  private readonly random: () => number;
  /** Per worker: the block hashes its KV events say are cached (a set: each value is 1). */
  private readonly cached: BlockMap[];
  /** Per worker: active block → number of active requests holding it. */
  private readonly activeRefs: BlockMap[];
  private readonly activePrefillTokens: Float64Array;
  private readonly admitted = new Map<string, TrackedRequest>();
  private readonly parked = new BinaryHeap<Parked>(before);
  private nextParkSeq = 0;
  private ready: Release[] = [];
  /** Ids for blocks that count as new everywhere (router_assume_kv_reuse false); engine hashes are never negative. */
  private nextPrivateBlock = -1;
  private readonly logits: Float64Array;

  constructor(options: KvRouterOptions) {
    const { workers, blockSize, config, maxNumBatchedTokens, seed } = options;
    if (!Number.isInteger(workers) || workers < 1) throw new Error(`the KV router needs at least one worker, got ${workers}`);
    if (!Number.isInteger(blockSize) || blockSize < 1) throw new Error(`the KV router needs a positive integer block size, got ${blockSize}`);
    this.workers = workers;
    this.blockSize = blockSize;
    this.config = config;
    // Dynamo's offline router queues only with more than one worker.
    const threshold = workers > 1 ? config.router_queue_threshold : null;
    this.busyAbove = threshold === null ? null : threshold * (maxNumBatchedTokens ?? ROUTER_DEFAULT_MAX_BATCHED_TOKENS);
    this.random = seededUniform(seed);
    this.cached = Array.from({ length: workers }, () => new BlockMap());
    this.activeRefs = Array.from({ length: workers }, () => new BlockMap());
    this.activePrefillTokens = new Float64Array(workers);
    this.logits = new Float64Array(workers);
  }

  // The clock is not needed: without AIC prefill decay, load changes only on lifecycle calls.
  admit(request: RoutedRequest, _nowMs: number): number | null {
    if (this.admitted.has(request.uuid)) throw new Error(`KV router: request ${request.uuid} is already admitted`);
    const hashes = blockHashes(request.tokens, this.blockSize);
    const tracked: TrackedRequest = {
      request,
      activeBlocks: this.activeBlocksOf(hashes),
      overlaps: this.overlapsOf(hashes),
      worker: -1,
      prefillTokens: 0,
    };
    if (this.allBusy()) {
      this.parked.push({ key: this.queueKey(tracked), seq: this.nextParkSeq++, tracked });
      return null;
    }
    return this.place(tracked);
  }

  markPrefillCompleted(uuid: string, _nowMs: number): void {
    const tracked = this.admitted.get(uuid);
    if (!tracked) return;
    this.dropPrefill(tracked);
    this.drain();
  }

  free(uuid: string, _nowMs: number): void {
    const tracked = this.admitted.get(uuid);
    if (!tracked) return;
    this.dropPrefill(tracked);
    const refs = this.activeRefs[tracked.worker];
    for (const block of tracked.activeBlocks) {
      const count = refs.get(block);
      if (count === 1) refs.delete(block);
      else refs.set(block, count - 1);
    }
    this.admitted.delete(uuid);
    this.drain();
  }

  released(_nowMs: number): Release[] {
    const out = this.ready;
    this.ready = [];
    return out;
  }

  applyKvEvents(worker: number, events: readonly RouterKvEvent[]): void {
    const cached = this.cached[worker];
    if (!cached) throw new Error(`KV router: no worker ${worker} (have ${this.workers})`);
    for (const event of events) {
      switch (event.kind) {
        case 'stored':
          for (const block of event.blocks) cached.set(block, 1);
          break;
        case 'removed':
          for (const block of event.blocks) cached.delete(block);
          break;
        case 'cleared':
          cached.clear();
          break;
      }
    }
  }

  overlaps(tokens: TokenIds): number[] {
    return Array.from(this.overlapsOf(blockHashes(tokens, this.blockSize)));
  }

  private activeBlocksOf(hashes: readonly number[]): readonly number[] {
    if (!this.config.router_track_active_blocks) return [];
    if (this.config.router_assume_kv_reuse) return hashes;
    const own = new Array<number>(hashes.length);
    for (let i = 0; i < own.length; i++) own[i] = this.nextPrivateBlock--;
    return own;
  }

  private overlapsOf(hashes: readonly number[]): Int32Array {
    const overlaps = new Int32Array(this.workers);
    for (let w = 0; w < this.workers; w++) {
      const cached = this.cached[w];
      let n = 0;
      while (n < hashes.length && cached.has(hashes[n])) n++;
      overlaps[w] = n;
    }
    return overlaps;
  }

  private uncachedTokens(tracked: TrackedRequest, worker: number): number {
    return Math.max(0, tracked.request.tokens.length - tracked.overlaps[worker] * this.blockSize);
  }

  private allBusy(): boolean {
    if (this.busyAbove === null) return false;
    for (let w = 0; w < this.workers; w++) if (this.activePrefillTokens[w] <= this.busyAbove) return false;
    return true;
  }

  /** Higher goes first (priority_jump is 0 in replay). */
  private queueKey(tracked: TrackedRequest): number {
    switch (this.config.router_queue_policy) {
      case 'fcfs':
        return -Math.max(0, tracked.request.arrivalMs) / 1000;
      case 'lcfs':
        return Math.max(0, tracked.request.arrivalMs) / 1000;
      case 'wspt': {
        // Smith's rule on the prefill left after the best cache hit on any worker.
        let best = 0;
        for (let w = 0; w < this.workers; w++) best = Math.max(best, tracked.overlaps[w]);
        return 1 / Math.max(1, tracked.request.tokens.length - best * this.blockSize);
      }
    }
  }

  /** Chooses the worker, adds the request to its active load and returns the worker. */
  private place(tracked: TrackedRequest): number {
    const worker = this.select(tracked);
    const refs = this.activeRefs[worker];
    for (const block of tracked.activeBlocks) {
      const count = refs.get(block);
      refs.set(block, count < 0 ? 1 : count + 1);
    }
    tracked.worker = worker;
    tracked.prefillTokens = this.config.router_track_prefill_tokens ? this.uncachedTokens(tracked, worker) : 0;
    this.activePrefillTokens[worker] += tracked.prefillTokens;
    this.admitted.set(tracked.request.uuid, tracked);
    return worker;
  }

  private dropPrefill(tracked: TrackedRequest): void {
    this.activePrefillTokens[tracked.worker] -= tracked.prefillTokens;
    tracked.prefillTokens = 0;
  }

  /** Admits parked requests in key order while some worker is not busy. */
  private drain(): void {
    let next: Parked | undefined;
    while (!this.allBusy() && (next = this.parked.pop()) !== undefined) {
      const { tracked } = next;
      this.ready.push({ request: tracked.request, worker: this.place(tracked) });
    }
  }

  private select(tracked: TrackedRequest): number {
    const { overlap_score_weight: weight, router_track_prefill_tokens: trackPrefill, router_temperature: temperature } = this.config;
    const logits = this.logits;
    for (let w = 0; w < this.workers; w++) {
      const prefillTokens = trackPrefill ? this.activePrefillTokens[w] + this.uncachedTokens(tracked, w) : 0;
      // With active blocks untracked, activeBlocks is empty and so is every worker's refs: decode blocks are 0.
      const refs = this.activeRefs[w];
      const newBlocks = tracked.activeBlocks.length - heldPrefix(tracked.activeBlocks, refs);
      logits[w] = (weight * prefillTokens) / this.blockSize + refs.size + newBlocks;
    }
    return temperature === 0 ? this.argmin(logits) : this.softmaxSample(logits, temperature);
  }

  /** Lowest logit; ties go to the smaller cache (indexer tree), then uniformly at random. */
  private argmin(logits: Float64Array): number {
    let bestLogit = Infinity;
    let bestTree = Infinity;
    let ties = 0;
    for (let w = 0; w < this.workers; w++) {
      const tree = this.cached[w].size;
      if (logits[w] < bestLogit || (logits[w] === bestLogit && tree < bestTree)) {
        bestLogit = logits[w];
        bestTree = tree;
        ties = 1;
      } else if (logits[w] === bestLogit && tree === bestTree) {
        ties++;
      }
    }
    let pick = ties === 1 ? 0 : Math.floor(this.random() * ties);
    for (let w = 0; w < this.workers; w++) {
      if (logits[w] === bestLogit && this.cached[w].size === bestTree && pick-- === 0) return w;
    }
    throw new Error('unreachable: a minimum always exists');
  }

  /** Softmax over −logit/(max − min)/T (uniform when all are equal), one seeded draw. */
  private softmaxSample(logits: Float64Array, temperature: number): number {
    let min = Infinity;
    let max = -Infinity;
    for (const l of logits) {
      min = Math.min(min, l);
      max = Math.max(max, l);
    }
    const draw = this.random();
    if (min === max) return Math.floor(draw * this.workers);
    const scale = -1 / ((max - min) * temperature);
    let total = 0;
    for (const l of logits) total += Math.exp((l - min) * scale);
    let cumulative = 0;
    for (let w = 0; w < this.workers; w++) {
      cumulative += Math.exp((logits[w] - min) * scale) / total;
      if (draw <= cumulative) return w;
    }
    return this.workers - 1;
  }
}
