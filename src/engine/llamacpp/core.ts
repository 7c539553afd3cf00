import type { Admission, CacheEvent, CoreRequest, EngineStats, KvTraceEntry, PassResult, RequestView, SchedulerCore, TokenOut } from '../contract.js';
import type { VllmKvEvent } from '../kv/vllmKvEvents.js';
import { PrefillBatch, type PassTiming } from '../timingModels.js';
import { WaitQueue } from '../waitQueue.js';
import { mulberry32 } from '../../util/mulberry32.js';
import { chooseSlot, commonPrefix, type Slot } from './slots.js';

/** llama-server's scheduling settings (its flag names in the comments): all given, no defaults here. */
export interface LlamaCppSchedulerConfig {
  /** -np: the slots, each running one request at a time (mocker's --max-num-seqs). */
  slots: number;
  /** -b: tokens of one decode call, the slots' sampled tokens and prompt chunks together (--max-num-batched-tokens). */
  nBatch: number;
  /** -c: cells of the unified KV cache, counted here as numGpuBlocks × blockSize tokens. */
  numGpuBlocks: number;
  /** Only the unit of the block counts in stats: llama.cpp's cache is per token. */
  blockSize: number;
  /** `cache_prompt` (on by default): a slot's new request reuses the prefix its cache shares with it. */
  cachePrompt: boolean;
  timing: PassTiming;
  /** Seeds the tokens generated for requests that bring no output ids. */
  seed: number;
  /** A prefill engine's token comes out when its prefill ends, with no decode step charged. */
  workerType?: 'aggregated' | 'prefill';
  /**
   * What the servers ask of every core; llama.cpp publishes no KV events, so there are none of these (serve
   * refuses --kv-events-config with this flavour; a simulated KV router sees no cache).
   */
  kvEvents?: unknown;
  kvTrace?: boolean;
  cacheEvents?: boolean;
}

interface LlamaRequest {
  request: CoreRequest;
  maxOutput: number;
  outputs: number[];
  slot: Slot | null;
}

/** A prompt chunk of one decode call: `take` tokens of `request`'s prompt from `start`. */
interface Chunk {
  request: LlamaRequest;
  start: number;
  take: number;
}

/**
 * llama.cpp's server scheduling (tools/server/server-context.cpp, `update_slots`), pure and clock-free like the
 * other cores. A fixed number of slots share one unified KV cache. A request waits (llama.cpp defers the task)
 * until a slot is idle, takes the idle slot whose cache best matches its prompt or else the least recently used
 * one (`get_available_slot`), and reuses the prefix it shares with that slot's cache (all but its last prompt
 * token, which is evaluated for the logits). Each pass is one `llama_decode` of at most `n_batch` tokens: first
 * one sampled token per generating slot, then prompt tokens of the slots still reading theirs, in slot order
 * (continuous batching). A slot keeps its prompt and output (but the last token, never decoded) after the
 * request ends. When the cache is full, idle slots' caches are dropped one by one (`try_clear_idle_slots`);
 * if that is not enough, the prompt part of the batch shrinks (llama.cpp halves the batch and retries); if not
 * even the sampled tokens fit, llama.cpp fails every processing slot ("Context size has been exceeded"): their
 * requests end here with what they produced. It never preempts. Not modelled: `--cache-ram` (the RAM prompt
 * cache of slots' old prompts), `--cache-reuse` (KV shifting), `n_ubatch`, context shift, speculative
 * decoding; no KV events (llama.cpp publishes none).
 */
export class LlamaCppCore implements SchedulerCore {
  readonly kvEventVisibility = 'pass-end' as const;
  private readonly slots: Slot[];
  private readonly capacity: number;
  private readonly requests = new Map<string, LlamaRequest>();
  private readonly waiting = new WaitQueue<LlamaRequest>();
  private readonly random: () => number;
  private releases = 0;
  private stats = { prefixCacheQueries: 0, prefixCacheHits: 0, passes: 0, prefillMs: 0 };

  constructor(readonly config: LlamaCppSchedulerConfig) {
    for (const [value, what] of [
      [config.slots, 'the number of slots (--max-num-seqs)'],
      [config.nBatch, 'n_batch (--max-num-batched-tokens)'],
      [config.numGpuBlocks, 'the number of GPU blocks'],
      [config.blockSize, 'the block size'],
    ] as const) {
      if (!Number.isInteger(value) || value < 1) throw new Error(`${what} must be a positive integer, got ${value}`);
    }
    this.slots = Array.from({ length: config.slots }, (_, id) => ({ id, cache: [], lastUsed: -1, busyWith: null }));
    this.capacity = config.numGpuBlocks * config.blockSize;
    this.random = mulberry32(config.seed);
  }

  /** llama.cpp refuses a prompt that fills the context ("the request exceeds the available context size"). */
  rejection(promptTokens: number, maxOutputTokens: number): string | null {
    if (promptTokens < 1) return 'the prompt is empty';
    if (maxOutputTokens < 1) return 'the request asks for no output tokens';
    if (promptTokens >= this.capacity)
      return `the request exceeds the available context size: a ${promptTokens}-token prompt in a KV cache of ${this.capacity} tokens`;
    return null;
  }

  /** Output stops where the context is full (llama.cpp without context shift). */
  outputLimit(promptTokens: number, maxOutputTokens: number): number {
    return Math.min(maxOutputTokens, this.capacity - promptTokens);
  }

  /** Queues a request. */
  add(request: CoreRequest): void {
    const why = this.rejection(request.promptTokenIds.length, request.maxOutputTokens);
    if (why) throw new Error(why);
    if (this.requests.has(request.id)) throw new Error(`request ${request.id} is already in the engine`);
    const state: LlamaRequest = {
      request,
      maxOutput: this.outputLimit(request.promptTokenIds.length, request.maxOutputTokens),
      outputs: [],
      slot: null,
    };
    this.requests.set(request.id, state);
    this.waiting.pushBack(state);
  }

  /** A cancelled request frees its slot; the slot keeps what its cache holds (llama.cpp's `release`). */
  abort(id: string): void {
    const state = this.requests.get(id);
    if (!state) return;
    this.waiting.remove(state);
    if (state.slot) this.release(state);
    this.requests.delete(id);
  }

  get isIdle(): boolean {
    return this.requests.size === 0;
  }

  view(id: string): RequestView | undefined {
    const s = this.requests.get(id);
    if (!s) return undefined;
    const computed = s.slot ? s.slot.cache.length : 0;
    return {
      status: s.slot ? 'running' : 'waiting',
      numComputedTokens: computed,
      numAllocatedTokens: computed,
      generated: s.outputs.length,
      length: s.request.promptTokenIds.length + s.outputs.length,
      numPreemptions: 0,
    };
  }

  waitingIds(): string[] {
    return [...this.waiting].map((s) => s.request.id);
  }

  runningIds(): string[] {
    return this.slots.flatMap((slot) => (slot.busyWith === null ? [] : [slot.busyWith]));
  }

  /** Cells in blocks of `blockSize`: a slot's count as active while it runs a request, inactive when idle. */
  engineStats(): EngineStats {
    let activeCells = 0;
    let idleCells = 0;
    for (const slot of this.slots) {
      if (slot.busyWith === null) idleCells += slot.cache.length;
      else activeCells += slot.cache.length;
    }
    const { numGpuBlocks, blockSize } = this.config;
    const activeBlocks = Math.ceil(activeCells / blockSize);
    const inactiveBlocks = Math.min(numGpuBlocks - activeBlocks, Math.ceil(idleCells / blockSize));
    return {
      running: this.runningIds().length,
      waiting: this.waiting.size,
      waitingForRemoteKvs: 0,
      activeBlocks,
      inactiveBlocks,
      freeBlocks: numGpuBlocks - activeBlocks - inactiveBlocks,
      totalBlocks: this.config.numGpuBlocks,
      blockSize: this.config.blockSize,
      preemptions: 0,
      ...this.stats,
    };
  }

  takeKvEvents(): VllmKvEvent[] {
    return [];
  }

  takeCacheEvents(): CacheEvent[] {
    return [];
  }

  takeKvTrace(): KvTraceEntry[] {
    return [];
  }

  cachedBlockEventHashes(): bigint[] {
    return [];
  }

  /** Nothing is held for a remote decode: llama.cpp has no disaggregated serving. */
  releaseHeld(): boolean {
    return false;
  }

  heldBlocks(): number {
    return 0;
  }

  /** Erases every idle slot's cache (llama.cpp's slot erase); fails while a slot runs a request. */
  resetPrefixCache(): boolean {
    if (this.slots.some((slot) => slot.busyWith !== null)) return false;
    for (const slot of this.slots) slot.cache = [];
    return true;
  }

  /** One `update_slots` iteration at time `now` (ms): launch waiting requests, one decode call, sample. */
  executePass(now: number): PassResult {
    this.stats.passes++;
    const admitted = this.launchWaiting();
    const decodes: LlamaRequest[] = [];
    for (const slot of this.slots) {
      const r = this.busyRequest(slot);
      if (r && r.outputs.length > 0 && slot.cache.length === this.lengthOf(r) - 1) decodes.push(r);
    }
    const chunks = this.promptChunks(this.config.nBatch - decodes.length);
    if (!this.makeRoom(decodes.length, chunks)) return this.failProcessing(now, admitted);

    const timing = this.config.timing;
    const prefill = new PrefillBatch();
    let promptTokens = 0;
    for (const { request, start, take } of chunks) {
      const cache = request.slot!.cache;
      const prompt = request.request.promptTokenIds;
      for (let i = start; i < start + take; i++) cache.push(prompt[i]);
      prefill.add(start, start + take);
      promptTokens += take;
    }
    for (const r of decodes) r.slot!.cache.push(r.outputs[r.outputs.length - 1]);
    const prefillMs = prefill.prefillMs(timing);
    this.stats.prefillMs += prefillMs;
    const { decodeMs, tokens, wakeAtMs } = this.sample(now + prefillMs, prefillMs);
    return {
      startMs: now,
      prefillMs,
      decodeMs,
      endMs: now + prefillMs + decodeMs,
      tokens,
      admitted,
      preempted: [],
      scheduledTokens: promptTokens + decodes.length,
      promptTokens,
      wakeAtMs,
    };
  }

  private lengthOf(r: LlamaRequest): number {
    return r.request.promptTokenIds.length + r.outputs.length;
  }

  private busyRequest(slot: Slot): LlamaRequest | undefined {
    return slot.busyWith === null ? undefined : this.requests.get(slot.busyWith);
  }

  /**
   * Deferred tasks in arrival order take the idle slots. The slot's cache is cut to the prefix it shares with
   * the prompt (`cache_prompt`), but at least the last prompt token is evaluated (`n_past--`).
   */
  private launchWaiting(): Admission[] {
    const admitted: Admission[] = [];
    for (let next = this.waiting.front(); next; next = this.waiting.front()) {
      const prompt = next.request.promptTokenIds;
      const slot = chooseSlot(this.slots, prompt);
      if (!slot) break;
      this.waiting.remove(next);
      const reused = this.config.cachePrompt ? Math.min(commonPrefix(slot.cache, prompt), prompt.length - 1) : 0;
      slot.cache.length = reused;
      slot.busyWith = next.request.id;
      next.slot = slot;
      this.stats.prefixCacheQueries += prompt.length;
      this.stats.prefixCacheHits += reused;
      admitted.push({ id: next.request.id, cachedTokens: reused });
    }
    return admitted;
  }

  /** The prompt tokens that fill the rest of the batch, slot by slot in slot order. */
  private promptChunks(room: number): Chunk[] {
    const chunks: Chunk[] = [];
    let left = room;
    for (const slot of this.slots) {
      if (left <= 0) break;
      const r = this.busyRequest(slot);
      if (!r) continue;
      const start = slot.cache.length;
      const take = Math.min(r.request.promptTokenIds.length - start, left);
      if (take <= 0) continue;
      chunks.push({ request: r, start, take });
      left -= take;
    }
    return chunks;
  }

  /**
   * Frees cells for the batch: idle slots' caches go one at a time in slot order, then the prompt chunks shrink
   * from the last. False when not even the sampled tokens fit.
   */
  private makeRoom(decodeTokens: number, chunks: Chunk[]): boolean {
    const used = () => this.slots.reduce((sum, slot) => sum + slot.cache.length, 0);
    const needed = () => decodeTokens + chunks.reduce((sum, c) => sum + c.take, 0);
    for (const slot of this.slots) {
      if (used() + needed() <= this.capacity) return true;
      if (slot.busyWith === null) slot.cache = [];
    }
    let over = used() + needed() - this.capacity;
    while (over > 0 && chunks.length > 0) {
      const last = chunks[chunks.length - 1];
      const cut = Math.min(over, last.take);
      last.take -= cut;
      over -= cut;
      if (last.take === 0) chunks.pop();
    }
    return over <= 0;
  }

  /** llama.cpp's "Context size has been exceeded": every processing slot's request ends where it is. */
  private failProcessing(now: number, admitted: Admission[]): PassResult {
    const tokens: TokenOut[] = [];
    for (const slot of this.slots) {
      const r = this.busyRequest(slot);
      if (!r) continue;
      tokens.push({ id: r.request.id, generated: r.outputs.length, completed: true });
      this.release(r);
      this.requests.delete(r.request.id);
    }
    return { startMs: now, prefillMs: 0, decodeMs: 0, endMs: now, tokens, admitted, preempted: [], scheduledTokens: 0, promptTokens: 0, wakeAtMs: null };
  }

  /** Every slot whose tokens are all in the cache samples one, all out at the end of the decode call. */
  private sample(decodeStart: number, prefillMs: number): { decodeMs: number; tokens: TokenOut[]; wakeAtMs: number | null } {
    const ready: LlamaRequest[] = [];
    let contextSum = 0;
    let activeCells = 0;
    for (const slot of this.slots) {
      const r = this.busyRequest(slot);
      if (!r) continue;
      activeCells += slot.cache.length;
      if (slot.cache.length !== this.lengthOf(r)) continue;
      ready.push(r);
      contextSum += slot.cache.length;
    }
    const tokens: TokenOut[] = [];
    if (ready.length === 0) return { decodeMs: 0, tokens, wakeAtMs: null };
    const timing = this.config.timing;
    const decodeMs =
      (this.config.workerType === 'prefill' || timing.prefillCoversPass) && prefillMs > 0
        ? 0
        : timing.decodeMs(ready.length, activeCells, Math.floor(contextSum / ready.length), this.capacity);
    const decodeEnd = decodeStart + decodeMs;
    let wakeAtMs: number | null = null;
    for (const r of ready) {
      const notBefore = timing.honoursCapturedTimes ? r.request.notBeforeMs?.[r.outputs.length] : undefined;
      if (notBefore !== undefined && notBefore > decodeEnd) {
        wakeAtMs = wakeAtMs === null ? notBefore : Math.min(wakeAtMs, notBefore);
        continue;
      }
      r.outputs.push(r.request.outputTokenIds?.[r.outputs.length] ?? this.random());
      const completed = r.outputs.length >= r.maxOutput;
      tokens.push({ id: r.request.id, generated: r.outputs.length, completed });
      if (completed) {
        this.release(r);
        this.requests.delete(r.request.id);
      }
    }
    return { decodeMs, tokens, wakeAtMs };
  }

  private release(r: LlamaRequest): void {
    const slot = r.slot!;
    slot.busyWith = null;
    slot.lastUsed = this.releases++;
    r.slot = null;
  }
}
