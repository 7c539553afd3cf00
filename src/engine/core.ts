import { KvBlockManager, type BlockId, type KvCacheEvent, type MoveBlock } from './kv/blockManager.js';
import { VllmKvEventLog, type VllmKvEvent, type VllmKvEventOptions } from './kv/vllmKvEvents.js';
import { ActiveSequence } from './sequence.js';
import { PrefillBatch, type PassTiming } from './timingModels.js';
import { mulberry32 } from '../util/mulberry32.js';
import type {
  Admission,
  CacheEvent,
  CoreRequest,
  EngineStats,
  KvTraceEntry,
  PassResult,
  RequestStatus,
  RequestView,
  SchedulerCore,
  TokenOut,
} from './contract.js';
import { WaitQueue } from './waitQueue.js';

export type PreemptionMode = 'lifo' | 'fifo';

/**
 * Whose admission and preemption rules the core follows (Dynamo's `SchedulingPolicy` seam, PR #10193): vLLM's
 * optimistic admission with recompute preemption, or TensorRT-LLM's GUARANTEED_NO_EVICT, which admits a request
 * only when its whole `prompt + max_output` footprint fits beside every running request's and never preempts.
 */
export type SchedulingPolicy = 'vllm' | 'trtllm-guaranteed-no-evict';

/** The vLLM-flavour scheduler's settings (vLLM/Dynamo flag names in the comments): all given, no defaults here. */
export interface VllmSchedulerSettings {
  /** --num-gpu-blocks-override */
  numGpuBlocks: number;
  /** --block-size */
  blockSize: number;
  /** --max-num-seqs; null = unlimited */
  maxNumSeqs: number | null;
  /** --max-num-batched-tokens; null = unlimited */
  maxNumBatchedTokens: number | null;
  enablePrefixCaching: boolean;
  enableChunkedPrefill: boolean;
  preemptionMode: PreemptionMode;
  /** --watermark: fraction of the blocks kept free when admitting a waiting request. */
  watermark: number;
  /** --long-prefill-token-threshold: tokens one request computes in a pass at most (0: no cap). */
  longPrefillTokenThreshold: number;
}

/** The vLLM-flavour scheduler's configuration: its settings and what the server running it adds. */
export interface SchedulerConfig extends VllmSchedulerSettings {
  timing: PassTiming;
  /** Seeds the tokens generated for requests that bring no output ids. */
  seed: number;
  /**
   * Disaggregated prefill (engine-reference §5.1): the token comes out at the end of the prefill, with no
   * decode step charged.
   */
  workerType?: 'aggregated' | 'prefill';
  /** Pulling a remote prefill's KV (decode role, §5.2): bytes per token and link bandwidth in GB/s (0: instant). */
  kvTransfer?: { bytesPerToken: number; bandwidthGBps: number };
  /** vLLM KV events (--kv-events-config): hash stored blocks the way vLLM does. */
  kvEvents?: VllmKvEventOptions;
  /** Dynamo's DYN_MOCKER_KV_CACHE_TRACE: note the cache occupancy at every store and eviction. */
  kvTrace?: boolean;
  /** Keep the block manager's own events (block ids, not vLLM hashes) for `takeCacheEvents`: a simulated router's index. */
  cacheEvents?: boolean;
  /** --max-loras (LoRA enabled): at most this many distinct adapters in one pass's batch. */
  maxLoras?: number;
  /** `--engine-type trtllm`: TensorRT-LLM's GUARANTEED_NO_EVICT (absent: vLLM's). */
  schedulingPolicy?: SchedulingPolicy;
}

interface RequestState {
  request: CoreRequest;
  seq: ActiveSequence;
  status: RequestStatus;
  numComputed: number;
  numPreemptions: number;
  /** Set when the request completed or was aborted. */
  done: boolean;
  /** Its prompt KV is (being) pulled from a prefill engine and was not lost since: no prefill compute. */
  remoteKv: boolean;
  /** When the pull completes (engine clock, ms). */
  kvReadyAtMs: number;
  /** What it was scheduled in pass `scheduledPass` (kept on the request: no per-pass allocation). */
  scheduledPass: number;
  scheduledTotal: number;
  scheduledPromptTokens: number;
  scheduledPrefix: number;
}

type ScheduleOutcome = number | 'blocked' | 'current-preempted';

/**
 * The simulated engine core (engine-reference §1.2–§1.5: Dynamo's vLLM-flavour `VllmCore`): a unified
 * waiting/running scheduler over a KV block manager. Pure: no I/O, no clock — `executePass(now)` is given
 * the time and returns when the pass ends and which tokens come out then.
 */
export class EngineCore implements SchedulerCore {
  readonly kvEventVisibility = 'pass-start' as const;
  readonly kv: KvBlockManager;
  private readonly requests = new Map<string, RequestState>();
  private readonly waiting = new WaitQueue<RequestState>();
  private running: RequestState[] = [];
  /** Finished requests whose blocks wait for a remote decode to pull them. */
  private readonly held = new Map<string, ActiveSequence>();
  /** vLLM's WAITING_FOR_REMOTE_KVS: blocks allocated, KV in flight, in arrival order. */
  private transferring: RequestState[] = [];
  private nextUniqueBlock = -1;
  /** Ids of partial and unshared blocks, for every sequence (one function, not one per request). */
  private readonly uniqueBlockId = () => this.nextUniqueBlock--;
  private readonly random: () => number;
  private readonly watermarkBlocks: number;
  private readonly noEvict: boolean;
  private stats = {
    preemptions: 0,
    prefixCacheQueries: 0,
    prefixCacheHits: 0,
    preemptedPrefixCacheQueries: 0,
    preemptedPrefixCacheHits: 0,
    passes: 0,
    prefillMs: 0,
  };
  private readonly kvEventLog?: VllmKvEventLog;
  private kvTrace: KvTraceEntry[] = [];
  private cacheEvents: CacheEvent[] = [];
  /**
   * The requests that emit a token this pass, a snapshot (emitting can preempt running requests) in an array
   * kept across passes, so a pass allocates no list of its requests; emptied (null) after each pass.
   */
  private readonly ready: (RequestState | null)[] = [];

  constructor(readonly config: SchedulerConfig) {
    if (!Number.isInteger(config.blockSize) || config.blockSize < 2) throw new Error(`block size must be an integer >= 2, got ${config.blockSize}`);
    if (!Number.isInteger(config.numGpuBlocks) || config.numGpuBlocks < 1)
      throw new Error(`the number of GPU blocks must be a positive integer, got ${config.numGpuBlocks}`);
    if (config.maxNumSeqs !== null && !(config.maxNumSeqs >= 1)) throw new Error(`max_num_seqs must be >= 1, got ${config.maxNumSeqs}`);
    if (config.maxNumBatchedTokens !== null && !(config.maxNumBatchedTokens >= 1))
      throw new Error(`max_num_batched_tokens must be >= 1, got ${config.maxNumBatchedTokens}`);
    if (!(config.watermark >= 0 && config.watermark < 1)) throw new Error(`watermark must be in [0, 1), got ${config.watermark}`);
    if (config.maxLoras !== undefined && !(Number.isInteger(config.maxLoras) && config.maxLoras >= 1))
      throw new Error(`max_loras must be an integer >= 1, got ${config.maxLoras}`);
    if (config.kvEvents) this.kvEventLog = new VllmKvEventLog(config.kvEvents, config.blockSize);
    this.kv = new KvBlockManager(config.numGpuBlocks, config.kvEvents || config.kvTrace || config.cacheEvents ? (event) => this.onKvEvent(event) : undefined);
    this.random = mulberry32(config.seed);
    this.watermarkBlocks = Math.floor(config.watermark * config.numGpuBlocks);
    this.noEvict = config.schedulingPolicy === 'trtllm-guaranteed-no-evict';
  }

  /** Why this request can never run here (prompt plus output beyond the whole cache), or null. */
  rejection(promptTokens: number, maxOutputTokens: number): string | null {
    if (promptTokens < 1) return 'the prompt is empty';
    if (maxOutputTokens < 1) return 'the request asks for no output tokens';
    const budget = this.config.maxNumBatchedTokens;
    if (!this.config.enableChunkedPrefill && budget !== null && promptTokens > budget) {
      return `without chunked prefill a ${promptTokens}-token prompt never fits the ${budget}-token batch budget (max_num_batched_tokens)`;
    }
    // TRT-LLM's enqueue normalization: only a prompt that leaves no room for output is refused; a longer
    // output is clamped to the room left (see `add`).
    if (this.noEvict) {
      return promptTokens >= this.capacityTokens
        ? `the ${promptTokens}-token prompt leaves no room for output in the KV cache of ${this.capacityTokens} tokens (${this.config.numGpuBlocks} blocks of ${this.config.blockSize})`
        : null;
    }
    const blocks = Math.ceil((promptTokens + maxOutputTokens) / this.config.blockSize);
    const usable = this.config.numGpuBlocks - this.watermarkBlocks;
    if (blocks > usable) {
      const watermark = this.watermarkBlocks > 0 ? ` (${usable} after the ${this.watermarkBlocks}-block watermark)` : '';
      return `the request needs ${blocks} KV cache blocks of ${this.config.blockSize} tokens (${promptTokens} prompt + ${maxOutputTokens} output tokens) but the cache holds only ${this.config.numGpuBlocks}${watermark}`;
    }
    return null;
  }

  /** GUARANTEED_NO_EVICT clamps the output to the room the prompt leaves in the whole cache (vLLM's is never clamped). */
  outputLimit(promptTokens: number, maxOutputTokens: number): number {
    return this.noEvict ? Math.min(maxOutputTokens, this.capacityTokens - promptTokens) : maxOutputTokens;
  }

  /** Queues a request (at the back of the waiting queue). */
  add(given: CoreRequest): void {
    const why = this.rejection(given.promptTokenIds.length, given.maxOutputTokens);
    if (why) throw new Error(why);
    const request = this.noEvict ? { ...given, maxOutputTokens: this.outputLimit(given.promptTokenIds.length, given.maxOutputTokens) } : given;
    if (this.requests.has(request.id)) throw new Error(`request ${request.id} is already in the engine`);
    if (this.held.has(request.id)) throw new Error(`request ${request.id} still holds blocks`);
    const seq = new ActiveSequence(
      request.promptTokenIds,
      request.maxOutputTokens,
      this.config.blockSize,
      this.config.enablePrefixCaching,
      this.uniqueBlockId,
      request.holdBlocksOnFinish,
      request.lora,
    );
    const state: RequestState = {
      request,
      seq,
      status: 'waiting',
      numComputed: 0,
      numPreemptions: 0,
      done: false,
      remoteKv: request.remotePrefill === true,
      kvReadyAtMs: 0,
      scheduledPass: -1,
      scheduledTotal: 0,
      scheduledPromptTokens: 0,
      scheduledPrefix: 0,
    };
    this.requests.set(request.id, state);
    this.waiting.pushBack(state);
  }

  /** Drops a request at once, freeing every block it holds (client disconnect). */
  abort(id: string): void {
    // A prefill that finished in the pass its client left during keeps nothing for a decode that never comes.
    if (this.releaseHeld(id)) return;
    const state = this.requests.get(id);
    if (!state) return;
    this.waiting.remove(state);
    this.running = this.running.filter((r) => r !== state);
    this.transferring = this.transferring.filter((r) => r !== state);
    this.apply(state.seq.reset());
    state.done = true;
    this.requests.delete(id);
  }

  private onKvEvent(event: KvCacheEvent): void {
    this.kvEventLog?.record(event);
    if (this.config.cacheEvents) this.cacheEvents.push(event.kind === 'stored' ? { kind: 'stored', blocks: event.blocks, parent: event.parent } : event);
    if (this.config.kvTrace && event.kind !== 'cleared') {
      this.kvTrace.push({
        event: event.kind === 'stored' ? 'allocation' : 'eviction',
        activeBlocks: this.kv.numActive,
        inactiveBlocks: this.kv.numInactive,
        freeBlocks: this.kv.numFree,
      });
    }
  }

  /** The vLLM KV events since the last call (none unless `kvEvents` is configured). */
  takeKvEvents(): VllmKvEvent[] {
    return this.kvEventLog?.take() ?? [];
  }

  /** The block manager's events since the last call (none unless `cacheEvents`). */
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

  /** Event hashes of every cached full block, active or not (needs `kvEvents`): what a subscriber's index should hold. */
  cachedBlockEventHashes(): bigint[] {
    if (!this.kvEventLog) return [];
    return this.kvEventLog.eventHashes([...this.kv.activeBlocks()].map(([block]) => block).concat([...this.kv.inactiveBlocks()]));
  }

  /** Frees the blocks a finished request kept for a remote decode; false when it holds none (unknown or released). */
  releaseHeld(id: string): boolean {
    const seq = this.held.get(id);
    if (!seq) return false;
    this.held.delete(id);
    this.apply(seq.reset());
    return true;
  }

  /** How many blocks a finished request still holds for a remote decode (0: none). */
  heldBlocks(id: string): number {
    const seq = this.held.get(id);
    return seq ? Math.ceil(seq.numAllocatedTokens / this.config.blockSize) : 0;
  }

  /**
   * vLLM's reset_prefix_cache: forgets every cached block. Like vLLM it fails (false) while requests hold
   * blocks, unless `resetRunningRequests`, which first preempts them all (they recompute later).
   */
  resetPrefixCache(resetRunningRequests = false): boolean {
    if (this.kv.numActive > 0 && !resetRunningRequests) return false;
    // KV held for a remote decode, or arriving from a prefill engine, is not running requests': with any, the
    // reset fails before it preempts anyone.
    if (this.held.size > 0 || this.transferring.length > 0) return false;
    while (this.running.length > 0) {
      const victim = this.running.pop()!;
      this.requeue(victim);
      this.waiting.pushFront(victim);
    }
    this.kv.clearInactive();
    return true;
  }

  get isIdle(): boolean {
    return this.requests.size === 0;
  }

  view(id: string): RequestView | undefined {
    const s = this.requests.get(id);
    if (!s) return undefined;
    return {
      status: s.status,
      numComputedTokens: s.numComputed,
      numAllocatedTokens: s.seq.numAllocatedTokens,
      generated: s.seq.generated,
      length: s.seq.length,
      numPreemptions: s.numPreemptions,
    };
  }

  waitingIds(): string[] {
    return [...this.waiting].map((s) => s.request.id);
  }

  runningIds(): string[] {
    return this.running.map((s) => s.request.id);
  }

  engineStats(): EngineStats {
    return {
      running: this.running.length,
      waiting: this.waiting.size + this.transferring.length,
      waitingForRemoteKvs: this.transferring.length,
      activeBlocks: this.kv.numActive,
      inactiveBlocks: this.kv.numInactive,
      freeBlocks: this.kv.numFree,
      totalBlocks: this.config.numGpuBlocks,
      blockSize: this.config.blockSize,
      ...this.stats,
      ...(this.config.maxLoras === undefined
        ? {}
        : { runningLoraAdapters: adapterNames(this.running), waitingLoraAdapters: adapterNames([...this.waiting, ...this.transferring]) }),
    };
  }

  /** One scheduler iteration at time `now` (ms): schedule, then emit one token per ready request. */
  executePass(now: number): PassResult {
    this.stats.passes++;
    const pass = new PassBuilder(this.stats.passes, this.config.maxNumBatchedTokens ?? Infinity);
    const maxSeqs = this.config.maxNumSeqs ?? Infinity;
    this.landTransfers(now, maxSeqs);
    // Phase A: running requests first, in admission order (a positional index, as Dynamo's loop).
    let i = 0;
    while (i < this.running.length && pass.budget > 0) {
      const outcome = this.schedule(this.running[i], false, pass);
      if (outcome === 'blocked') break;
      if (outcome !== 'current-preempted') i++;
    }
    // Phase B: FIFO admission, none after a preemption in this pass, and none without budget: every admitted
    // request computes at least its last prompt token (vLLM's waiting loop also stops at an empty budget).
    // vLLM's max_loras: a request whose adapter would make one too many in this pass's batch is skipped, keeping
    // its place in the queue, and those behind it may go first.
    const loras = this.config.maxLoras === undefined ? null : this.scheduledLoras();
    const skipped: RequestState[] = [];
    while (!pass.preemptedAny && this.running.length < maxSeqs && pass.budget > 0) {
      const next = this.waiting.front();
      if (!next) break;
      const lora = next.request.lora?.name;
      if (loras && lora !== undefined && loras.size >= this.config.maxLoras! && !loras.has(lora)) {
        this.waiting.remove(next);
        skipped.push(next);
        continue;
      }
      if (this.noEvict && this.blocksToFinish(next) > this.unreservedBlocks()) break;
      if (next.remoteKv) {
        if (!this.admitRemote(next, now, pass)) break;
      } else if (typeof this.schedule(next, true, pass) !== 'number') break;
      if (lora !== undefined) loras?.add(lora);
    }
    for (let s = skipped.length - 1; s >= 0; s--) this.waiting.pushFront(skipped[s]);

    const timing = this.config.timing;
    const prefillMs = pass.prefillMs(timing);
    const decodeStart = now + prefillMs;
    this.stats.prefillMs += prefillMs;
    const { decodeMs, tokens, wakeAtMs: tokenWake } = this.emitReadyTokens(decodeStart, prefillMs, pass);
    let wakeAtMs = tokenWake;
    // A landed transfer kept out by --max-num-seqs waits for a running request to finish (a pass that emits
    // tokens), not for a time: waking for it would spin.
    const canLand = this.running.length < maxSeqs;
    for (const t of this.transferring) if (canLand || t.kvReadyAtMs > now) wakeAtMs = wakeAtMs === null ? t.kvReadyAtMs : Math.min(wakeAtMs, t.kvReadyAtMs);
    return {
      startMs: now,
      prefillMs,
      decodeMs,
      endMs: decodeStart + decodeMs,
      tokens,
      admitted: pass.admitted,
      preempted: pass.preempted,
      scheduledTokens: pass.scheduledTokens,
      promptTokens: pass.promptTokens,
      wakeAtMs,
    };
  }

  /** The adapters of the running requests scheduled in this pass (vLLM's scheduled_loras). */
  private scheduledLoras(): Set<string> {
    const loras = new Set<string>();
    for (const r of this.running) if (r.request.lora && r.scheduledPass === this.stats.passes) loras.add(r.request.lora.name);
    return loras;
  }

  /** Pulled KV has landed: the request runs, with only its last prompt token left to compute (vLLM ≥ 0.11). */
  private landTransfers(now: number, maxSeqs: number): void {
    while (this.transferring.length > 0 && this.running.length < maxSeqs) {
      const i = this.transferring.findIndex((t) => t.kvReadyAtMs <= now);
      if (i < 0) return;
      const [state] = this.transferring.splice(i, 1);
      this.apply(state.seq.landRemote());
      state.status = 'running';
      this.running.push(state);
    }
  }

  /**
   * Admits a request whose prompt KV a prefill engine holds: allocates every prompt block (locally cached
   * ones are hits and need no transfer) without computing anything, and parks it until the pull completes.
   * Like vLLM it never preempts for this; false when the blocks are not there.
   */
  private admitRemote(state: RequestState, now: number, pass: PassBuilder): boolean {
    const { seq } = state;
    const blockSize = this.config.blockSize;
    const cached = this.cachedPrefixTokens(seq);
    const hitBlocks = cached / blockSize;
    if (this.watermarkBlocks > 0 && !this.keepsWatermark(seq.blocks, seq.blocks.length)) return false;
    const move = seq.prepareRemoteAllocation(seq.promptLength, hitBlocks);
    if (move) {
      const obtained = this.kv.process(move);
      if (obtained < move.blocks.length) {
        const previousBlocks = Math.ceil(seq.numAllocatedTokens / blockSize);
        seq.commitAllocation(Math.min((previousBlocks + obtained) * blockSize, seq.promptLength));
        this.apply(seq.reset());
        return false;
      }
    }
    seq.commitAllocation(seq.promptLength);
    state.numComputed = seq.promptLength - 1;
    state.status = 'waiting_for_remote_kvs';
    state.kvReadyAtMs = now + this.transferMs(seq.promptLength - cached);
    this.waiting.remove(state);
    this.transferring.push(state);
    pass.admitted.push({ id: state.request.id, cachedTokens: cached });
    this.recordLookup(state, cached);
    return true;
  }

  /**
   * vLLM's get_computed_blocks: the leading cached blocks, but at most `length - 1` tokens (the prompt, plus
   * what a preempted request had generated), so the last token is always computed for its logits. A prompt of
   * k full blocks, all cached, hits k - 1 blocks: its last block is recomputed. (Dynamo's mocker credits all k.)
   * Without prefix caching nothing is looked up, not even a preempted request's own blocks.
   */
  private cachedPrefixTokens(seq: ActiveSequence): number {
    if (!this.config.enablePrefixCaching) return 0;
    const blockSize = this.config.blockSize;
    return Math.min(this.kv.prefixHits(seq.blocks), Math.floor((seq.length - 1) / blockSize)) * blockSize;
  }

  /**
   * vLLM's prefix-cache stats (PrefixCacheStats.record in vllm/v1/metrics/stats.py): a lookup queries all the
   * request's tokens, counted apart when the request was preempted before (it finds its own earlier KV, not a
   * shared prefix); without prefix caching none is made.
   */
  private recordLookup(state: RequestState, cached: number): void {
    if (!this.config.enablePrefixCaching) return;
    if (state.numPreemptions > 0) {
      this.stats.preemptedPrefixCacheQueries += state.seq.length;
      this.stats.preemptedPrefixCacheHits += cached;
    } else {
      this.stats.prefixCacheQueries += state.seq.length;
      this.stats.prefixCacheHits += cached;
    }
  }

  /** §5.2: tokens × bytes per token ÷ bandwidth. */
  private transferMs(tokens: number): number {
    const transfer = this.config.kvTransfer;
    if (!transfer || !(transfer.bandwidthGBps > 0)) return 0;
    return ((tokens * transfer.bytesPerToken) / (transfer.bandwidthGBps * 1e9)) * 1000;
  }

  private apply(moves: readonly MoveBlock[]): void {
    for (const move of moves) this.kv.process(move);
  }

  /** engine-reference §1.2 `schedule`: returns the tokens scheduled, or why nothing was. */
  private schedule(state: RequestState, fromWaiting: boolean, pass: PassBuilder): ScheduleOutcome {
    const { seq } = state;
    // Steady decode, every running request every pass: one token whose block is already allocated. The general
    // path below gives the same outcome; this one skips its lookups.
    const computed = state.numComputed;
    if (!fromWaiting && computed >= seq.promptLength && computed + 1 === seq.length && computed < seq.numAllocatedTokens && pass.budget >= 1) {
      state.numComputed = computed + 1;
      pass.schedule(state, 1, 0, seq.promptLength);
      return 1;
    }
    const blockSize = this.config.blockSize;
    // Fewer free blocks than the watermark: no admission can keep it, so skip the prefix lookup.
    if (fromWaiting && this.watermarkBlocks > 0 && this.kv.capacity - this.kv.numActive < this.watermarkBlocks) return 'blocked';
    const firstScheduling = state.numComputed === 0;
    const cached = firstScheduling ? this.cachedPrefixTokens(seq) : 0;
    const before = state.numComputed + cached;
    const promptBefore = Math.min(before, seq.promptLength);
    const remaining = seq.length - before;
    const promptRemaining = seq.promptLength - promptBefore;
    // vLLM's scheduler caps a request's new tokens at long_prefill_token_threshold before the budget.
    const threshold = this.config.longPrefillTokenThreshold;
    const wanted = threshold > 0 && threshold < remaining ? threshold : remaining;
    if (promptRemaining > 0 && !this.config.enableChunkedPrefill && Math.min(promptRemaining, wanted) > pass.budget) return 'blocked';
    const desired = Math.min(wanted, pass.budget);
    if (desired === 0 && remaining > 0) return 'blocked';
    const target = before + desired;
    if (fromWaiting && this.watermarkBlocks > 0 && !this.keepsWatermark(seq.blocks, Math.ceil(target / blockSize))) return 'blocked';

    let after = target;
    for (;;) {
      if (target <= seq.numAllocatedTokens) {
        state.numComputed = after;
        break;
      }
      const move = seq.prepareAllocation(target);
      if (!move) {
        seq.commitAllocation(target);
        state.numComputed = after;
        break;
      }
      const previousBlocks = Math.ceil(seq.numAllocatedTokens / blockSize);
      const obtained = this.kv.process(move);
      const complete = obtained === move.blocks.length;
      const committed = complete ? target : (previousBlocks + obtained) * blockSize;
      seq.commitAllocation(Math.min(committed, target));
      state.numComputed = Math.min(after, committed);
      if (complete) break;
      if (fromWaiting && state.numPreemptions > 0) {
        // A request preempted before comes back only when its whole chunk fits, and never preempts in turn:
        // otherwise two requests can take each other's blocks on every pass and livelock (upstream later
        // stopped all admission-time preemption; a fresh request still preempts here as in §1.2).
        this.apply(seq.reset());
        state.numComputed = 0;
        return 'blocked';
      }
      const victim = this.preempt(pass);
      if (!victim) {
        after = state.numComputed;
        break;
      }
      if (victim === state) return 'current-preempted';
    }

    const used = after - before;
    if (used === 0 && after < seq.length) {
      // A waiting request holds no blocks: what this attempt took (cached blocks) goes back.
      if (fromWaiting) {
        this.apply(seq.reset());
        state.numComputed = 0;
      }
      return 'blocked';
    }
    const promptTokens = Math.min(after, seq.promptLength) - promptBefore;
    pass.schedule(state, used, promptTokens, promptBefore);
    if (fromWaiting) {
      this.waiting.remove(state);
      this.running.push(state);
      state.status = 'running';
      pass.admitted.push({ id: state.request.id, cachedTokens: cached });
      this.recordLookup(state, cached);
    }
    return used;
  }

  /** Whether taking the first `blockCount` blocks still leaves `--watermark` of the cache free. */
  private keepsWatermark(blocks: readonly BlockId[], blockCount: number): boolean {
    const free = this.kv.capacity - this.kv.numActive;
    // Counting the blocks actually needed only matters near the limit.
    if (free - blockCount >= this.watermarkBlocks) return true;
    // Blocks are chained hashes and every holder holds a prefix of its own: of a waiting request's blocks, the
    // active ones are a prefix, and the first inactive one ends the count.
    const counted = Math.min(blockCount, blocks.length);
    let active = 0;
    while (active < counted && this.kv.isActive(blocks[active])) active++;
    return free - (counted - active) >= this.watermarkBlocks;
  }

  private get capacityTokens(): number {
    return this.config.numGpuBlocks * this.config.blockSize;
  }

  /**
   * GUARANTEED_NO_EVICT: the blocks a request still has to reserve to run to completion, ceil((prompt +
   * max_output) / block_size), less what it holds (running) or, for a waiting one, its prefix blocks that are
   * active (cached and in use: inactive cached blocks cost capacity again when reactivated).
   */
  private blocksToFinish(state: RequestState): number {
    const { seq } = state;
    const full = Math.ceil((seq.promptLength + seq.maxOutput) / this.config.blockSize);
    if (seq.numAllocatedTokens > 0) return Math.max(0, full - Math.ceil(seq.numAllocatedTokens / this.config.blockSize));
    let active = 0;
    if (this.config.enablePrefixCaching) while (active < seq.blocks.length && this.kv.isActive(seq.blocks[active])) active++;
    return Math.max(0, full - active);
  }

  /**
   * GUARANTEED_NO_EVICT: the free blocks left once the to-completion footprint of every request holding blocks
   * (running, or pulling its prompt's KV from a prefill engine) is reserved.
   */
  private unreservedBlocks(): number {
    let reserved = 0;
    for (const r of this.running) reserved += this.blocksToFinish(r);
    for (const r of this.transferring) reserved += this.blocksToFinish(r);
    return Math.max(0, this.config.numGpuBlocks - this.kv.numActive - reserved);
  }

  /**
   * Recompute preemption (§1.4): the newest (lifo) or oldest (fifo) running request goes back to the front of
   * waiting. GUARANTEED_NO_EVICT never preempts (its reservations leave no need to; Dynamo declines too).
   */
  private preempt(pass: PassBuilder): RequestState | undefined {
    if (this.noEvict) return undefined;
    const victim = this.config.preemptionMode === 'lifo' ? this.running.pop() : this.running.shift();
    if (!victim) return undefined;
    pass.unschedule(victim);
    this.requeue(victim);
    this.waiting.pushFront(victim);
    pass.preempted.push(victim.request.id);
    pass.preemptedAny = true;
    return victim;
  }

  /** A preempted request gives back its blocks and will recompute from its first token. */
  private requeue(victim: RequestState): void {
    victim.status = 'preempted';
    victim.numComputed = 0;
    // Its pulled KV is gone: it recomputes the prompt here.
    victim.remoteKv = false;
    victim.numPreemptions++;
    this.stats.preemptions++;
    this.apply(victim.seq.reset());
  }

  /** §1.3: one token for every request whose sequence is fully computed, all out at the pass end. */
  private emitReadyTokens(decodeStart: number, prefillMs: number, pass: PassBuilder): { decodeMs: number; tokens: TokenOut[]; wakeAtMs: number | null } {
    const ready = this.ready;
    let readyCount = 0;
    let contextSum = 0;
    const running = this.running;
    for (let i = 0; i < running.length; i++) {
      const r = running[i];
      if (r.numComputed < r.seq.length || r.seq.generated >= r.seq.maxOutput) continue;
      ready[readyCount++] = r;
      contextSum += r.seq.length;
    }
    const tokens: TokenOut[] = [];
    if (readyCount === 0) return { decodeMs: 0, tokens, wakeAtMs: null };
    const blockSize = this.config.blockSize;
    const timing = this.config.timing;
    // A prefill worker's token comes out when its prefill ends; only a timing that charges the emitting pass
    // rather than the prefill (--timing fixed) makes that pass cost a step. Latency knobs: TTFT is the whole pass.
    const decodeMs =
      (this.config.workerType === 'prefill' || timing.prefillCoversPass) && prefillMs > 0
        ? 0
        : timing.decodeMs(readyCount, this.kv.numActive * blockSize, Math.floor(contextSum / readyCount), this.config.numGpuBlocks * blockSize);
    const decodeEnd = decodeStart + decodeMs;
    let wakeAtMs: number | null = null;
    let anyCompleted = false;
    for (let k = 0; k < readyCount; k++) {
      const r = ready[k]!;
      if (r.status !== 'running') continue;
      const notBefore = timing.honoursCapturedTimes ? r.request.notBeforeMs?.[r.seq.generated] : undefined;
      if (notBefore !== undefined && notBefore > decodeEnd) {
        wakeAtMs = wakeAtMs === null ? notBefore : Math.min(wakeAtMs, notBefore);
        continue;
      }
      if (this.generateOne(r, pass)) {
        const completed = r.seq.generated >= r.seq.maxOutput;
        tokens.push({ id: r.request.id, generated: r.seq.generated, completed });
        if (completed) {
          anyCompleted = true;
          r.done = true;
          this.requests.delete(r.request.id);
          if (r.request.holdBlocksOnFinish) {
            // Held: the KV of every token but the one just sampled.
            r.seq.commitAllocation(r.seq.length - 1);
            this.held.set(r.request.id, r.seq);
          }
        }
      }
    }
    // The snapshot lets go of its requests (finished ones may hold long prompts).
    ready.fill(null, 0, readyCount);
    // Finished requests leave the running set, compacted in place (preempted ones were taken out by `preempt`).
    if (anyCompleted || pass.preemptedAny) {
      let kept = 0;
      for (let i = 0; i < running.length; i++) {
        const r = running[i];
        if (!r.done && r.status === 'running') running[kept++] = r;
      }
      running.length = kept;
    }
    return { decodeMs, tokens, wakeAtMs };
  }

  /** Appends the request's next token, preempting others while its new block cannot be allocated. */
  private generateOne(r: RequestState, pass: PassBuilder): boolean {
    for (;;) {
      const token = r.request.outputTokenIds?.[r.seq.generated] ?? this.random();
      const moves = r.seq.generate(token);
      let allocated = true;
      for (let m = 0; m < moves.length; m++) {
        const move = moves[m];
        const handled = this.kv.process(move);
        if (move.kind === 'use' && handled < move.blocks.length) {
          allocated = false;
          break;
        }
      }
      if (allocated) {
        if (r.seq.generated < r.seq.maxOutput) r.seq.commitAllocation(r.seq.length);
        return true;
      }
      r.seq.pop();
      const victim = this.preempt(pass);
      if (!victim || victim === r) return false;
    }
  }
}

/** The adapters of these requests, each named once, in their order. */
function adapterNames(requests: Iterable<RequestState>): string[] {
  const names = new Set<string>();
  for (const r of requests) if (r.request.lora) names.add(r.request.lora.name);
  return [...names];
}

/** The bookkeeping of one pass: budget, what was scheduled, and (as a PrefillBatch) its prefilling requests. */
class PassBuilder extends PrefillBatch {
  readonly admitted: Admission[] = [];
  readonly preempted: string[] = [];
  preemptedAny = false;
  scheduledTokens = 0;
  promptTokens = 0;

  constructor(
    private readonly id: number,
    public budget: number,
  ) {
    super();
  }

  schedule(state: RequestState, total: number, promptTokens: number, prefix: number): void {
    state.scheduledPass = this.id;
    state.scheduledTotal = total;
    state.scheduledPromptTokens = promptTokens;
    state.scheduledPrefix = prefix;
    this.budget -= total;
    this.scheduledTokens += total;
    this.promptTokens += promptTokens;
    if (promptTokens > 0 && !state.remoteKv) this.add(prefix, prefix + promptTokens);
  }

  /** A preempted request gives back what it was scheduled this pass. */
  unschedule(state: RequestState): void {
    if (state.scheduledPass !== this.id) return;
    state.scheduledPass = -1;
    this.budget += state.scheduledTotal;
    this.scheduledTokens -= state.scheduledTotal;
    this.promptTokens -= state.scheduledPromptTokens;
    if (state.scheduledPromptTokens > 0 && !state.remoteKv) this.add(state.scheduledPrefix, state.scheduledPrefix + state.scheduledPromptTokens, -1);
  }
}
