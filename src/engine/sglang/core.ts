import type { Admission, CacheEvent, CoreRequest, EngineStats, KvTraceEntry, PassResult, RequestView, TokenOut } from '../contract.js';
import type { KvCacheEvent } from '../kv/blockManager.js';
import { VllmKvEventLog, type VllmKvEvent, type VllmKvEventOptions } from '../kv/vllmKvEvents.js';
import { PrefillBatch, type PassTiming } from '../timingModels.js';
import type { SchedulerCore } from '../contract.js';
import { WaitQueue } from '../waitQueue.js';
import { mulberry32 } from '../../util/mulberry32.js';
import { lpmOrder, type SglangSchedulePolicy } from './policy.js';
import { RadixCache, type RadixNode } from './radixCache.js';
import { SglangRequest } from './request.js';

const INIT_NEW_TOKEN_RATIO = 0.7;
const MIN_NEW_TOKEN_RATIO_FACTOR = 0.14;
const NEW_TOKEN_RATIO_DECAY_STEPS = 600;

/** The SGLang-flavour scheduler's settings (SGLang's server argument names in the comments): all given, no defaults here. */
export interface SglangSchedulerSettings {
  /** --schedule-policy: fifo (fcfs) or lpm. */
  schedulePolicy: SglangSchedulePolicy;
  /** --max-prefill-tokens: prompt tokens per pass. */
  maxPrefillTokens: number;
  /** --chunked-prefill-size: longer prompts are prefilled in chunks of at most this (a multiple of the page size). */
  chunkedPrefillSize: number;
  /** Output tokens reserved per request at most when admitting (SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION). */
  clipMaxNewTokens: number;
  /** --schedule-conservativeness in [0, 1]: scales the output reservation ratio. */
  scheduleConservativeness: number;
}

/** The SGLang-flavour scheduler's configuration. */
export interface SglangSchedulerConfig extends SglangSchedulerSettings {
  /** KV capacity in blocks of `pageSize` tokens (the pool holds numGpuBlocks × pageSize token slots). */
  numGpuBlocks: number;
  /** --page-size: the radix cache's granularity, and the tokens per block in stats and KV events. */
  pageSize: number;
  /** Off: SGLang's --disable-radix-cache (no prefix matching, finished requests free everything). */
  enablePrefixCaching: boolean;
  timing: PassTiming;
  /** Seeds the tokens generated for requests that bring no output ids. */
  seed: number;
  /** A prefill engine's token comes out when its prefill ends, with no decode step charged (engine-reference §5.1). */
  workerType?: 'aggregated' | 'prefill';
  /** KV events on vLLM's wire (SGLang publishes the same ZMQ events): one hash per page. */
  kvEvents?: VllmKvEventOptions;
  /** Dynamo's DYN_MOCKER_KV_CACHE_TRACE: note the cache occupancy at every allocation and eviction. */
  kvTrace?: boolean;
  /** Keep the radix tree's stores and evictions in chained page hashes for `takeCacheEvents` (a simulated router). */
  cacheEvents?: boolean;
}

/** What one pass did, kept on the side while it runs (as a PrefillBatch: its prefilling requests). */
class PassTally extends PrefillBatch {
  readonly admitted: Admission[] = [];
  readonly preempted: string[] = [];
  readonly tokens: TokenOut[] = [];
  scheduledTokens = 0;
  promptTokens = 0;

  /** A prefill of `request`'s tokens [start, end) (KV pulled from a prefill engine costs no compute). */
  prefilled(request: SglangRequest, start: number, end: number): void {
    if (request.remoteKv) return;
    this.add(start, end);
    this.scheduledTokens += end - start;
    const prompt = request.promptLength;
    this.promptTokens += Math.max(0, Math.min(end, prompt) - Math.min(start, prompt));
  }
}

/**
 * The SGLang-flavour engine core (engine-reference §2, Dynamo's `SglangCore` over sglang's scheduler): each
 * pass admits prefills under an adaptive reservation of future output (`new_token_ratio`), then decodes every
 * running request, retracting the ones with the fewest outputs when the KV pool runs short. Its cache is a
 * radix tree over a token pool. Pure and clock-free like `EngineCore`, with the same public contract, so the
 * same drivers run it.
 *
 * Where it departs from Dynamo [S] (all but the fourth following sglang itself):
 * - a prefix is matched over the whole current sequence before the budgets are charged, capped at length - 1
 *   (the last token is computed for its logits), and only the tokens after it are prefilled and charged;
 *   Dynamo matches within the first chunk only and charges the matched tokens too;
 * - the request being chunk-prefilled is held apart (sglang's `chunked_req`) and continues first in every
 *   pass whatever the reservation says, instead of queueing at the front of waiting behind the same check —
 *   which could leave it holding memory that neither it nor the running requests can then get past;
 * - a cache insert that finds tokens already in the tree frees the request's duplicate slots and adopts the
 *   tree's (Dynamo leaks them), and a fresh admission's matched prefix counts as cached at once (Dynamo frees
 *   the tree's slots if such a request is retracted before its first decode);
 * - when the pool cannot give the running requests one slot each and only one is left running, the chunked
 *   prefill is retracted too (otherwise both wait forever);
 * - `evictableSize` counts all unlocked tree tokens, as sglang does (see radixCache.ts).
 * KV events are page-level (sglang, and Dynamo after its PR #12108), from the tree: a stored event for each
 * node inserted, a removed event for each node evicted. Dynamo publishes them at the end of the pass
 * (`kvEventVisibility`). Generated tokens come from the seeded generator EngineCore uses. A prompt pulled from
 * a prefill engine (`remotePrefill`) is allocated whole in its first pass and costs no prefill; the pull
 * itself takes no time here (EngineCore's `kvTransfer` is not modelled).
 */
export class SglangCore implements SchedulerCore {
  /** When Dynamo makes this flavour's KV events visible to a router: after the pass (vLLM's: at its start). */
  readonly kvEventVisibility = 'pass-end' as const;
  readonly cache: RadixCache;
  /** The radix cache's page: also the block of stats and KV events. */
  readonly pageSize: number;
  private readonly schedulePolicy: SglangSchedulePolicy;
  private readonly maxPrefillTokens: number;
  private readonly chunkedPrefillSize: number;
  private readonly clipMaxNewTokens: number;
  private readonly initNewTokenRatio: number;
  private readonly minNewTokenRatio: number;
  private readonly newTokenRatioDecay: number;
  private ratio: number;
  private readonly requests = new Map<string, SglangRequest>();
  private readonly waiting = new WaitQueue<SglangRequest>();
  private running: SglangRequest[] = [];
  /** The request whose prompt is being prefilled in chunks (at most one). */
  private chunked: SglangRequest | null = null;
  /** Finished requests whose KV waits for a remote decode to pull it. */
  private readonly held = new Map<string, SglangRequest>();
  /** Σ over requests of allocated − materialized tokens (the partly filled last pages). */
  private extraReserved = 0;
  private readonly random: () => number;
  private stats = { preemptions: 0, prefixCacheQueries: 0, prefixCacheHits: 0, passes: 0, prefillMs: 0 };
  private readonly kvEventLog?: VllmKvEventLog;
  private kvTrace: KvTraceEntry[] = [];
  private cacheEvents: CacheEvent[] = [];

  constructor(readonly config: SglangSchedulerConfig) {
    const positiveInteger = (value: number, what: string) => {
      if (!Number.isInteger(value) || value < 1) throw new Error(`${what} must be a positive integer, got ${value}`);
      return value;
    };
    positiveInteger(config.numGpuBlocks, 'the number of GPU blocks');
    this.pageSize = positiveInteger(config.pageSize, 'the page size');
    this.schedulePolicy = config.schedulePolicy;
    this.maxPrefillTokens = positiveInteger(config.maxPrefillTokens, 'max_prefill_tokens');
    this.chunkedPrefillSize = positiveInteger(config.chunkedPrefillSize, 'chunked_prefill_size');
    this.clipMaxNewTokens = positiveInteger(config.clipMaxNewTokens, 'clip_max_new_tokens');
    // Otherwise a prompt just under the chunk size is charged more than a whole chunk and never admitted.
    if (this.chunkedPrefillSize % this.pageSize !== 0) {
      throw new Error(`chunked_prefill_size (${this.chunkedPrefillSize}) must be a multiple of the page size (${this.pageSize})`);
    }
    // Otherwise a prompt longer than max_prefill_tokens but within a chunk is never admitted.
    if (this.maxPrefillTokens < this.chunkedPrefillSize) {
      throw new Error(`max_prefill_tokens (${this.maxPrefillTokens}) must be at least chunked_prefill_size (${this.chunkedPrefillSize})`);
    }
    const conservativeness = config.scheduleConservativeness;
    if (!(conservativeness >= 0 && conservativeness <= 1)) throw new Error(`schedule_conservativeness must be in [0, 1], got ${conservativeness}`);
    this.initNewTokenRatio = INIT_NEW_TOKEN_RATIO * conservativeness;
    this.minNewTokenRatio = this.initNewTokenRatio * MIN_NEW_TOKEN_RATIO_FACTOR;
    this.newTokenRatioDecay = (this.initNewTokenRatio - this.minNewTokenRatio) / NEW_TOKEN_RATIO_DECAY_STEPS;
    this.ratio = this.initNewTokenRatio;
    if (config.kvEvents) this.kvEventLog = new VllmKvEventLog(config.kvEvents, this.pageSize);
    const listens = config.kvEvents !== undefined || config.cacheEvents === true;
    this.cache = new RadixCache(config.numGpuBlocks * this.pageSize, this.pageSize, {
      hashPages: listens,
      listener: listens ? { stored: (node) => this.onStored(node), removed: (node) => this.onRemoved(node) } : undefined,
    });
    this.random = mulberry32(config.seed);
  }

  /** The share of the running requests' remaining output (up to the clip) each admission reserves. */
  get newTokenRatio(): number {
    return this.ratio;
  }

  /** Dynamo's `active_decode_blocks`: the pool's used slots (cached ones too) plus partly filled pages, in blocks. */
  get activeDecodeBlocks(): number {
    return Math.ceil((this.cache.totalTokens - this.cache.availableTokens + this.extraReserved) / this.pageSize);
  }

  /** Why this request can never run here, or null. */
  rejection(promptTokens: number, maxOutputTokens: number): string | null {
    if (promptTokens < 1) return 'the prompt is empty';
    if (maxOutputTokens < 1) return 'the request asks for no output tokens';
    // Admission asks for fewer tokens (what is left to prefill plus the outputs) than the pool can free.
    const total = this.cache.totalTokens;
    if (promptTokens + maxOutputTokens >= total) {
      return `the request needs ${promptTokens + maxOutputTokens} KV cache tokens (${promptTokens} prompt + ${maxOutputTokens} output tokens) but SGLang admits only requests needing fewer than the ${total} the cache holds (${this.config.numGpuBlocks} blocks of ${this.pageSize})`;
    }
    return null;
  }

  /** Queues a request (at the back of the waiting queue). */
  add(request: CoreRequest): void {
    const why = this.rejection(request.promptTokenIds.length, request.maxOutputTokens);
    if (why) throw new Error(why);
    if (this.requests.has(request.id)) throw new Error(`request ${request.id} is already in the engine`);
    if (this.held.has(request.id)) throw new Error(`request ${request.id} still holds KV`);
    const state = new SglangRequest(request);
    this.requests.set(request.id, state);
    this.waiting.pushBack(state);
  }

  /** Drops a request at once, freeing the KV it holds (what it cached in the tree stays there). */
  abort(id: string): void {
    if (this.releaseHeld(id)) return;
    const state = this.requests.get(id);
    if (!state) return;
    this.waiting.remove(state);
    this.running = this.running.filter((r) => r !== state);
    if (this.chunked === state) this.chunked = null;
    this.releaseKv(state);
    this.requests.delete(id);
  }

  /** The vLLM KV events since the last call (none unless `kvEvents` is configured). */
  takeKvEvents(): VllmKvEvent[] {
    return this.kvEventLog?.take() ?? [];
  }

  /** The radix tree's events in chained page hashes since the last call (none unless `cacheEvents`). */
  takeCacheEvents(): CacheEvent[] {
    const events = this.cacheEvents;
    this.cacheEvents = [];
    return events;
  }

  /** The KV trace entries since the last call (none unless `kvTrace`). */
  takeKvTrace(): KvTraceEntry[] {
    const entries = this.kvTrace;
    this.kvTrace = [];
    return entries;
  }

  /** Event hashes of every page in the tree (needs `kvEvents`): what a subscriber's index should hold. */
  cachedBlockEventHashes(): bigint[] {
    if (!this.kvEventLog) return [];
    const pages: number[] = [];
    this.cache.forEachNode((node) => {
      for (const hash of node.pageHashes!) pages.push(hash);
    });
    return this.kvEventLog.eventHashes(pages);
  }

  /** Frees the KV a finished request kept for a remote decode (caching it); false when it holds none. */
  releaseHeld(id: string): boolean {
    const state = this.held.get(id);
    if (!state) return false;
    this.held.delete(id);
    this.cacheFinished(state);
    return true;
  }

  /** How many blocks a finished request still holds for a remote decode (0: none). */
  heldBlocks(id: string): number {
    const state = this.held.get(id);
    return state ? Math.ceil(state.kvLength / this.pageSize) : 0;
  }

  /**
   * sglang's flush_cache: empties the radix tree. Fails (false) while requests hold KV, unless
   * `resetRunningRequests`, which first retracts them all (they prefill again later); KV held for a remote
   * decode always makes it fail.
   */
  resetPrefixCache(resetRunningRequests = false): boolean {
    if (this.held.size > 0) return false;
    if ((this.running.length > 0 || this.chunked !== null) && !resetRunningRequests) return false;
    if (this.chunked !== null) {
      this.retract(this.chunked);
      this.waiting.pushFront(this.chunked);
      this.chunked = null;
    }
    while (this.running.length > 0) {
      const victim = this.running.pop()!;
      this.retract(victim);
      this.waiting.pushFront(victim);
    }
    this.cache.clear();
    this.kvEventLog?.record({ kind: 'cleared' });
    if (this.config.cacheEvents) this.cacheEvents.push({ kind: 'cleared' });
    return true;
  }

  get isIdle(): boolean {
    return this.requests.size === 0;
  }

  view(id: string): RequestView | undefined {
    const r = this.requests.get(id);
    if (!r) return undefined;
    return {
      status: r.status,
      numComputedTokens: r.kvLength,
      numAllocatedTokens: r.allocatedTokens,
      generated: r.outputLength,
      length: r.length,
      numPreemptions: r.retractions,
    };
  }

  waitingIds(): string[] {
    return [...this.waiting].map((r) => r.id);
  }

  /** The running requests, then the one being chunk-prefilled. */
  runningIds(): string[] {
    const ids = this.running.map((r) => r.id);
    if (this.chunked !== null) ids.push(this.chunked.id);
    return ids;
  }

  /**
   * The shared stats, in blocks of `blockSize` tokens: active = what requests hold (locked tree pages, their own
   * slots, partly filled pages), inactive = unlocked tree pages (evictable, vLLM's cached-but-free blocks),
   * free = the rest (never below 0: partly filled pages are reserved, not taken, so they can overbook the pool
   * by less than a page per request). Preemptions count retractions; the prefix-cache counters count each
   * admission's sequence and matched prefix.
   */
  engineStats(): EngineStats {
    const cache = this.cache;
    const used = cache.totalTokens - cache.availableTokens;
    const activeBlocks = Math.ceil((used - cache.evictableSize + this.extraReserved) / this.pageSize);
    const inactiveBlocks = cache.evictableSize / this.pageSize;
    return {
      running: this.running.length + (this.chunked !== null ? 1 : 0),
      waiting: this.waiting.size,
      waitingForRemoteKvs: 0,
      activeBlocks,
      inactiveBlocks,
      freeBlocks: Math.max(0, this.config.numGpuBlocks - activeBlocks - inactiveBlocks),
      totalBlocks: this.config.numGpuBlocks,
      blockSize: this.pageSize,
      ...this.stats,
    };
  }

  /** One scheduler iteration at time `now` (ms): admit prefills, then decode one token per running request. */
  executePass(now: number): PassResult {
    this.stats.passes++;
    const pass = new PassTally();
    if (this.schedulePolicy === 'lpm') this.applyLpm();
    if (this.prefill(pass)) this.ratio = this.initNewTokenRatio;
    const prefillMs = pass.prefillMs(this.config.timing);
    this.stats.prefillMs += prefillMs;
    const decodeStart = now + prefillMs;
    const { decodeMs, wakeAtMs } = this.decode(decodeStart, prefillMs, pass);
    if (pass.preempted.length > 0) this.ratio = this.initNewTokenRatio;
    this.ratio = Math.max(this.ratio - this.newTokenRatioDecay, this.minNewTokenRatio);
    return {
      startMs: now,
      prefillMs,
      decodeMs,
      endMs: decodeStart + decodeMs,
      tokens: pass.tokens,
      admitted: pass.admitted,
      preempted: pass.preempted,
      scheduledTokens: pass.scheduledTokens,
      promptTokens: pass.promptTokens,
      wakeAtMs,
    };
  }

  /**
   * Problems in the KV bookkeeping (empty when sound): every pool slot is free, in the tree or a request's own,
   * exactly once; the tree's sizes and lock counts match the requests holding it; each request's slots and
   * reservation fit its state. Walks everything: for tests and debugging.
   */
  kvAudit(): string[] {
    const problems: string[] = [];
    const cache = this.cache;
    const total = cache.totalTokens;
    const owned = new Uint8Array(total);
    let claimed = 0;
    const claim = (slots: Int32Array, from: number, to: number, what: string) => {
      for (let i = from; i < to; i++) {
        const slot = slots[i];
        if (!(slot >= 0 && slot < total) || owned[slot]++ !== 0) {
          problems.push(`${what}: slot ${slot} outside the pool or owned twice`);
          return;
        }
      }
      claimed += to - from;
    };
    const free = cache.pool.freeSlots();
    claim(free, 0, free.length, 'free list');
    // Lock counts the requests' paths call for (only nodes on some path).
    const holders = new Map<RadixNode, number>();
    let extra = 0;
    const audit = (r: SglangRequest) => {
      const what = `request ${r.id}`;
      extra += r.extraReserved;
      if (r.kvLength > r.length) problems.push(`${what}: ${r.kvLength} materialized of ${r.length} tokens`);
      if (r.cachedTokens > r.kvLength || r.cachedTokens % this.pageSize !== 0) problems.push(`${what}: ${r.cachedTokens} cached of ${r.kvLength} materialized`);
      if (r.allocatedTokens % this.pageSize !== 0 || r.extraReserved < 0 || r.extraReserved >= this.pageSize)
        problems.push(`${what}: ${r.allocatedTokens} allocated for ${r.kvLength}`);
      if (r.kvLength === 0) {
        if (r.lastNode !== null) problems.push(`${what}: holds a tree lock with nothing materialized`);
        return;
      }
      const kv = r.kv!;
      claim(kv, r.cachedTokens, r.kvLength, what);
      const last = r.lastNode;
      if (last === null || last.evicted || last.depth !== r.cachedTokens) {
        problems.push(`${what}: its tree node does not end at its ${r.cachedTokens} cached tokens`);
        return;
      }
      const tokens = r.tokens;
      for (let node: RadixNode = last; node !== cache.root; node = node.parent!) {
        holders.set(node, (holders.get(node) ?? 0) + 1);
        const { key, value } = node;
        const start = node.depth - value.length;
        for (let i = 0; i < value.length; i++) {
          if (kv[start + i] !== value[i] || tokens[start + i] !== key[i]) {
            problems.push(`${what}: token ${start + i} differs from its cached prefix in the tree`);
            break;
          }
        }
      }
    };
    for (const r of this.requests.values()) audit(r);
    for (const r of this.held.values()) audit(r);
    let evictable = 0;
    let protectedTokens = 0;
    cache.forEachNode((node) => {
      claim(node.value, 0, node.value.length, `tree node ${node.id}`);
      if (node.lockRef > 0) protectedTokens += node.key.length;
      else evictable += node.key.length;
      if (node.key.length % this.pageSize !== 0) problems.push(`tree node ${node.id} holds ${node.key.length} tokens, not whole pages`);
      if (node.lockRef !== (holders.get(node) ?? 0))
        problems.push(`tree node ${node.id}: lock count ${node.lockRef}, held by ${holders.get(node) ?? 0} requests`);
    });
    if (claimed !== total) problems.push(`${total - claimed} slots lost (neither free nor owned)`);
    if (evictable !== cache.evictableSize) problems.push(`evictable size ${cache.evictableSize}, but ${evictable} unlocked tokens in the tree`);
    if (protectedTokens !== cache.protectedSize) problems.push(`protected size ${cache.protectedSize}, but ${protectedTokens} locked tokens in the tree`);
    if (extra !== this.extraReserved) problems.push(`reserved page overhead ${this.extraReserved}, but the requests reserve ${extra}`);
    if (this.chunked !== null && this.chunked.kvLength >= this.chunked.length) problems.push(`chunked request ${this.chunked.id} is fully materialized`);
    for (const r of this.running) if (r.kvLength !== r.length) problems.push(`running request ${r.id}: ${r.kvLength} of ${r.length} tokens materialized`);
    return problems;
  }

  private applyLpm(): void {
    const order = lpmOrder(this.waiting, this.config.enablePrefixCaching ? this.cache : null, this.pageSize);
    if (order === null) return;
    for (const r of order) {
      this.waiting.remove(r);
      this.waiting.pushBack(r);
    }
  }

  /**
   * get_new_batch_prefill (engine-reference §2.3 step 2): the chunked request continues, then waiting requests
   * are admitted in order while the reservation and the budgets allow. Returns whether an allocation failed.
   */
  private prefill(pass: PassTally): boolean {
    const cache = this.cache;
    const clip = this.clipMaxNewTokens;
    let reservedDecode = 0;
    for (const r of this.running) reservedDecode += Math.min(r.remainingOutput, clip) * this.ratio;
    let remTotal = Math.max(0, cache.availableTokens + cache.evictableSize - this.extraReserved) - reservedDecode;
    let remInput = this.maxPrefillTokens;
    let remChunk = this.chunkedPrefillSize;
    let newChunked: SglangRequest | null = null;

    const chunked = this.chunked;
    if (chunked !== null) {
      // sglang's add_chunked_req: it runs even when the reservation is spent (its progress holds memory).
      let budget = this.pageFloor(Math.min(remChunk, Math.floor(remTotal)));
      if (budget <= 0) budget = this.pageFloor(remChunk);
      const start = chunked.kvLength;
      const allocatedBefore = chunked.allocatedTokens;
      if (!this.allocatePrefill(chunked, Math.min(chunked.extendLength, budget))) return true;
      const complete = chunked.kvLength === chunked.length;
      remTotal -= chunked.allocatedTokens - allocatedBefore + (complete ? Math.min(chunked.remainingOutput, clip) : 0);
      const charged = this.ceilPage(chunked.kvLength - start);
      remInput -= charged;
      remChunk -= charged;
      pass.prefilled(chunked, start, chunked.kvLength);
      if (complete) {
        this.chunked = null;
        this.running.push(chunked);
      } else newChunked = chunked;
    }

    let outOfMemory = false;
    while (remChunk > 0) {
      const r = this.waiting.front();
      if (!r) break;
      const length = r.length;
      // sglang matches at most length - 1 tokens: the last one is computed for its logits.
      const node = this.config.enablePrefixCaching ? cache.matchPrefix(r.tokens, length - 1) : cache.root;
      const prefix = node.depth;
      remTotal -= cache.lock(node);
      const extend = length - prefix;
      // KV pulled from a prefill engine arrives whole and costs no prefill budget (SGLang's decode side
      // preallocates the whole prompt).
      const pulled = r.remoteKv;
      const chunk = pulled || extend <= this.chunkedPrefillSize ? extend : Math.min(this.pageFloor(remChunk), extend);
      const charged = pulled ? 0 : this.ceilPage(chunk);
      if (extend + Math.min(r.remainingOutput, clip) >= remTotal || chunk === 0 || charged > remInput || charged > remChunk) {
        cache.unlock(node);
        break;
      }
      r.lastNode = node;
      r.cachedTokens = prefix;
      this.takePrefixSlots(r, node);
      if (!this.allocatePrefill(r, chunk)) {
        this.releaseKv(r);
        outOfMemory = true;
        break;
      }
      this.waiting.remove(r);
      r.status = 'running';
      pass.admitted.push({ id: r.id, cachedTokens: prefix });
      if (this.config.enablePrefixCaching) {
        this.stats.prefixCacheQueries += length;
        this.stats.prefixCacheHits += prefix;
      }
      const complete = r.kvLength === length;
      remTotal -= r.allocatedTokens - prefix + (complete ? Math.min(r.remainingOutput, clip) : 0);
      remInput -= charged;
      remChunk -= charged;
      pass.prefilled(r, prefix, r.kvLength);
      if (complete) this.running.push(r);
      else {
        if (newChunked !== null) throw new Error(`SGLang scheduler: ${r.id} chunked while ${newChunked.id} still is`);
        newChunked = r;
      }
    }
    if (newChunked !== null) {
      this.chunked = newChunked;
      this.cacheMaterializedPrefix(newChunked);
    }
    return outOfMemory;
  }

  /** Copies the slots of the tree path ending at `node` into the request's first `node.depth` slots. */
  private takePrefixSlots(r: SglangRequest, node: RadixNode): void {
    const kv = r.slots();
    for (let n = node; n !== this.cache.root; n = n.parent!) kv.set(n.value, n.depth - n.value.length);
    this.setKv(r, node.depth, node.depth);
  }

  /** Materializes `count` more tokens of `r` (evicting cached ones if the pool lacks slots); false when it cannot. */
  private allocatePrefill(r: SglangRequest, count: number): boolean {
    const shortBy = count - this.cache.availableTokens;
    if (shortBy > 0) this.evict(shortBy);
    if (!this.cache.pool.allocate(r.slots(), r.kvLength, count)) return false;
    const materialized = r.kvLength + count;
    this.setKv(r, materialized, this.ceilPage(materialized));
    this.trace('allocation');
    return true;
  }

  /**
   * The decode step (engine-reference §2.3 step 5, Dynamo's `simulate_decode_step`): the time for the whole
   * running batch, retraction if the pool runs short, then one token per running request.
   */
  private decode(start: number, prefillMs: number, pass: PassTally): { decodeMs: number; wakeAtMs: number | null } {
    if (this.running.length === 0) return { decodeMs: 0, wakeAtMs: null };
    const cache = this.cache;
    const timing = this.config.timing;
    let contextSum = 0;
    for (const r of this.running) contextSum += r.length;
    const totalKv = cache.totalTokens;
    // A prefill engine's token comes out when its prefill ends (as in EngineCore), as with latency knobs.
    const decodeMs =
      (this.config.workerType === 'prefill' || timing.prefillCoversPass) && prefillMs > 0
        ? 0
        : timing.decodeMs(this.running.length, Math.min(contextSum, totalKv), Math.floor(contextSum / this.running.length), totalKv);
    const decodeEnd = start + decodeMs;
    this.checkDecodeMemory(pass);
    const running = this.running;
    const shortBy = running.length - cache.availableTokens;
    if (shortBy > 0) this.evict(shortBy);

    let wakeAtMs: number | null = null;
    const completed: number[] = [];
    for (let i = 0; i < running.length; i++) {
      const r = running[i];
      const notBefore = timing.honoursCapturedTimes ? r.request.notBeforeMs?.[r.outputLength] : undefined;
      if (notBefore !== undefined && notBefore > decodeEnd) {
        wakeAtMs = wakeAtMs === null ? notBefore : Math.min(wakeAtMs, notBefore);
        continue;
      }
      if (cache.availableTokens === 0) this.evict(1);
      const crossesPage = r.length + 1 > r.allocatedTokens;
      if (!cache.pool.allocate(r.slots(), r.kvLength, 1)) continue;
      this.setKv(r, r.kvLength + 1, crossesPage ? r.allocatedTokens + this.pageSize : r.allocatedTokens);
      this.trace('allocation');
      r.appendOutput(r.request.outputTokenIds?.[r.outputLength] ?? this.random());
      pass.scheduledTokens++;
      const done = r.outputLength >= r.maxOutput;
      pass.tokens.push({ id: r.id, generated: r.outputLength, completed: done });
      if (done) {
        completed.push(i);
        this.finish(r);
      } else this.cacheMaterializedPrefix(r);
    }
    for (let k = completed.length - 1; k >= 0; k--) swapRemove(running, completed[k]);
    return { decodeMs, wakeAtMs };
  }

  /**
   * check_decode_mem: while the pool (free plus evictable) cannot give every running request a slot and the
   * page each needs next, retract the running request with the fewest output tokens (the first on ties),
   * keeping at least one. The retracted go back to the front of waiting, in retraction order.
   */
  private checkDecodeMemory(pass: PassTally): void {
    const cache = this.cache;
    const running = this.running;
    let reserved = 0;
    let growth = 0;
    for (const r of running) {
      reserved += r.extraReserved;
      if (r.length + 1 > r.allocatedTokens) growth += this.pageSize;
    }
    const retracted: SglangRequest[] = [];
    for (;;) {
      const actual = cache.availableTokens + cache.evictableSize;
      if (actual >= running.length && Math.max(0, actual - reserved) - growth > 0) break;
      if (running.length <= 1) break;
      let victim = 0;
      for (let i = 1; i < running.length; i++) if (running[i].outputLength < running[victim].outputLength) victim = i;
      const r = running[victim];
      reserved -= r.extraReserved;
      if (r.length + 1 > r.allocatedTokens) growth -= this.pageSize;
      swapRemove(running, victim);
      this.retract(r);
      retracted.push(r);
    }
    // The last running request cannot get a slot while the chunked prefill holds the rest: it gives way.
    if (this.chunked !== null && cache.availableTokens + cache.evictableSize < running.length) {
      this.retract(this.chunked);
      retracted.push(this.chunked);
      this.chunked = null;
    }
    for (let k = retracted.length - 1; k >= 0; k--) this.waiting.pushFront(retracted[k]);
    for (const r of retracted) pass.preempted.push(r.id);
  }

  /** A retracted request gives back its own slots and its lock, keeps its outputs, and prefills again later. */
  private retract(r: SglangRequest): void {
    this.releaseKv(r);
    // Its slot array backs tree nodes: a re-admission must not write over it.
    r.kv = null;
    // Pulled KV is gone too: it prefills here next time.
    r.remoteKv = false;
    r.status = 'preempted';
    r.retractions++;
    this.stats.preemptions++;
  }

  /** Frees the request's own slots and unlocks its cached prefix (which stays in the tree). */
  private releaseKv(r: SglangRequest): void {
    if (r.kvLength > 0) this.cache.pool.release(r.kv!, r.cachedTokens, r.kvLength);
    if (r.lastNode !== null) this.cache.unlock(r.lastNode);
    r.lastNode = null;
    r.cachedTokens = 0;
    this.setKv(r, 0, 0);
  }

  /** The last output is out: hold the KV for a remote decode, or cache the sequence and free the rest. */
  private finish(r: SglangRequest): void {
    this.requests.delete(r.id);
    if (!r.request.holdBlocksOnFinish) {
      this.cacheFinished(r);
      return;
    }
    // Held: the KV of every token but the one just sampled (its slot is the request's own).
    this.cache.pool.release(r.kv!, r.kvLength - 1, r.kvLength);
    this.setKv(r, r.kvLength - 1, this.ceilPage(r.kvLength - 1));
    this.held.set(r.id, r);
  }

  /**
   * cache_finished_req: the page-aligned sequence goes into the tree (its path's access refreshed), the
   * unaligned tail back to the pool, and the request's lock is released.
   */
  private cacheFinished(r: SglangRequest): void {
    const cache = this.cache;
    const kv = r.kv;
    if (kv !== null && r.lastNode !== null) {
      const aligned = this.config.enablePrefixCaching ? this.pageFloor(r.kvLength) : 0;
      cache.pool.release(kv, Math.max(aligned, r.cachedTokens), r.kvLength);
      if (aligned > r.cachedTokens) {
        const last = cache.insert(r.lastNode, r.tokens, aligned, kv);
        cache.touchPath(last);
      } else if (this.config.enablePrefixCaching) cache.touchPath(r.lastNode);
      cache.unlock(r.lastNode);
    }
    r.lastNode = null;
    r.cachedTokens = 0;
    this.setKv(r, 0, 0);
  }

  /** cache_unfinished_req: the page-aligned materialized prefix goes into the tree and the lock moves down to it. */
  private cacheMaterializedPrefix(r: SglangRequest): void {
    if (!this.config.enablePrefixCaching) return;
    const aligned = this.pageFloor(r.kvLength);
    if (aligned <= r.cachedTokens) return;
    const from = r.lastNode!;
    const last = this.cache.insert(from, r.tokens, aligned, r.kv!);
    this.cache.lock(last, from);
    r.lastNode = last;
    r.cachedTokens = aligned;
  }

  private evict(tokens: number): void {
    if (this.cache.evict(tokens) > 0) this.trace('eviction');
  }

  private setKv(r: SglangRequest, materialized: number, allocated: number): void {
    this.extraReserved += allocated - materialized - r.extraReserved;
    r.kvLength = materialized;
    r.allocatedTokens = allocated;
  }

  private pageFloor(tokens: number): number {
    return tokens - (tokens % this.pageSize);
  }

  private ceilPage(tokens: number): number {
    return Math.ceil(tokens / this.pageSize) * this.pageSize;
  }

  private onStored(node: RadixNode): void {
    const blocks = node.pageHashes as number[];
    const parent = node.parent!.lastPageHash();
    if (this.config.cacheEvents) this.cacheEvents.push({ kind: 'stored', blocks, parent });
    if (this.kvEventLog) {
      const key = node.key;
      const page = this.pageSize;
      const event: KvCacheEvent = {
        kind: 'stored',
        blocks,
        parent,
        origin: { tokens: { blockTokens: (i) => Array.from(key.subarray(i * page, (i + 1) * page)) }, index: 0 },
      };
      this.kvEventLog.record(event);
    }
  }

  private onRemoved(node: RadixNode): void {
    const blocks = node.pageHashes as number[];
    if (this.config.cacheEvents) this.cacheEvents.push({ kind: 'removed', blocks });
    this.kvEventLog?.record({ kind: 'removed', blocks });
  }

  /** Occupancy in blocks, as `engineStats` counts it. */
  private trace(event: KvTraceEntry['event']): void {
    if (!this.config.kvTrace) return;
    const { activeBlocks, inactiveBlocks, freeBlocks } = this.engineStats();
    this.kvTrace.push({ event, activeBlocks, inactiveBlocks, freeBlocks });
  }
}

/** Rust's Vec::swap_remove (Dynamo's order of the running batch after removals). */
function swapRemove<T>(items: T[], index: number): void {
  const last = items.pop()!;
  if (index < items.length) items[index] = last;
}
