/**
 * Invariants of the SGLang-flavour core over seeded random workloads: after every pass the KV pool and the
 * radix tree account for every slot exactly once, cache events rebuild the tree, retraction frees what it
 * says while keeping outputs, and every request ends with exactly its tokens within a bounded number of passes.
 */
import { describe, expect, it } from 'vitest';
import type { EngineCore } from '../../src/engine/core.js';
import type { CacheEvent } from '../../src/engine/contract.js';
import { runOffline, type TimedRequest } from '../../src/engine/offlineDriver.js';
import { polynomialPerfModel } from '../../src/engine/perf/perfModel.js';
import { SglangCore, type SglangSchedulerConfig } from '../../src/engine/sglang/core.js';
import { modelTiming } from '../../src/engine/timingModels.js';
import { prng } from '../support/prng.js';

const WORKLOADS = 240;

function workload(seed: number): { config: SglangSchedulerConfig; requests: TimedRequest[] } {
  const r = prng(seed);
  const pageSize = r.pick([1, 1, 2, 4, 16, 64]);
  const requests: TimedRequest[] = [];
  const prefixes = Array.from({ length: r.int(1, 4) }, () => Array.from({ length: r.int(0, 300) }, () => r.int(1, 50_000)));
  const count = r.int(5, 40);
  let longest = 0;
  for (let i = 0; i < count; i++) {
    const prefix = r.next() < 0.6 ? r.pick(prefixes) : [];
    // Some requests repeat an earlier prompt whole: the tree can hold all of it.
    const repeated = requests.length > 0 && r.next() < 0.15 ? r.pick(requests).request.promptTokenIds : null;
    const prompt = repeated ?? [...prefix, ...Array.from({ length: r.int(1, 200) }, () => r.int(1, 50_000))];
    const maxOutputTokens = r.int(1, 64);
    longest = Math.max(longest, prompt.length + maxOutputTokens);
    // A few bring their output (captured), a few keep their KV for a remote decode, a few pull their prompt.
    const extra = r.next();
    const request = {
      id: `r${i}`,
      promptTokenIds: prompt,
      maxOutputTokens,
      ...(extra < 0.1 ? { outputTokenIds: Array.from({ length: maxOutputTokens }, () => r.int(1, 50)) } : {}),
      ...(extra >= 0.1 && extra < 0.15 ? { holdBlocksOnFinish: true } : {}),
      ...(extra >= 0.15 && extra < 0.2 ? { remotePrefill: true } : {}),
    };
    requests.push({ arrivalMs: r.pick([0, r.int(0, 50), r.int(0, 5000)]), request });
  }
  // From barely enough for the largest request (which must need fewer tokens than the pool) to plenty.
  const minBlocks = Math.floor(longest / pageSize) + 1;
  const numGpuBlocks = r.pick([minBlocks, minBlocks + r.int(1, 20), minBlocks * r.int(2, 8), minBlocks * r.int(8, 12)]);
  const chunkedPrefillSize = pageSize * r.pick([1, r.int(1, 16), r.int(16, 128), Math.ceil(8192 / pageSize)]);
  const config: SglangSchedulerConfig = {
    numGpuBlocks,
    pageSize,
    enablePrefixCaching: r.next() < 0.75,
    schedulePolicy: r.pick(['fifo', 'lpm'] as const),
    chunkedPrefillSize,
    maxPrefillTokens: chunkedPrefillSize * r.pick([1, 2]),
    clipMaxNewTokens: r.pick([1, 16, 4096]),
    scheduleConservativeness: r.pick([0, 0.3, 1]),
    timing: modelTiming(polynomialPerfModel, r.pick([0, 1, 100]), 1),
    seed,
    cacheEvents: true,
  };
  return { config, requests };
}

/** Applies cache events to a set of page hashes, refusing what a router's index would flag; returns the pages removed. */
function applyEvents(index: Set<number>, events: readonly CacheEvent[], problems: string[]): number {
  let removed = 0;
  for (const event of events) {
    if (event.kind === 'cleared') index.clear();
    else if (event.kind === 'stored') {
      if (event.parent !== null && !index.has(event.parent)) problems.push(`stored under unknown parent ${event.parent}`);
      for (const block of event.blocks) {
        if (index.has(block)) problems.push(`block ${block} stored twice`);
        index.add(block);
      }
    } else {
      for (const block of event.blocks) if (!index.delete(block)) problems.push(`removal of unknown block ${block}`);
      removed += event.blocks.length;
    }
  }
  return removed;
}

describe(`SGLang core invariants over ${WORKLOADS} random workloads`, () => {
  it('hold after every pass, and every request completes with exactly its tokens in bounded passes', () => {
    let retractions = 0;
    let prefixHits = 0;
    let chunkedPasses = 0;
    let evictedPages = 0;
    for (let seed = 1; seed <= WORKLOADS; seed++) {
      const { config, requests } = workload(seed);
      const core = new SglangCore(config);
      const where = `workload ${seed}`;
      // Plain checks per pass (expect() per pass would dominate the run time); any violation fails below.
      const problems: string[] = [];
      const byId = new Map(requests.map(({ request }) => [request.id, request]));
      const received = new Map<string, number>();
      const index = new Set<number>();
      // Each pass costs a prefill chunk or emits a token for every running request, and retractions are
      // bounded by the outputs: a generous multiple of the work bounds the passes of a run that never starves.
      let work = 0;
      for (const { request } of requests)
        work += request.maxOutputTokens + Math.ceil((request.promptTokenIds.length + request.maxOutputTokens) / config.chunkedPrefillSize!) + 1;
      const passBound = 3 * work;
      let passes = 0;
      const result = runOffline(core as unknown as EngineCore, requests, (pass) => {
        if (++passes > passBound) throw new Error(`${where}: more than ${passBound} passes`);
        problems.push(...core.kvAudit());
        evictedPages += applyEvents(index, core.takeCacheEvents(), problems);
        let pages = 0;
        let unknown = 0;
        core.cache.forEachNode((node) => {
          pages += node.pageHashes!.length;
          for (const hash of node.pageHashes!) if (!index.has(hash)) unknown++;
        });
        if (pages !== index.size || unknown > 0) problems.push(`pass at ${pass.startMs}: the event index and the tree differ`);
        for (const { id, cachedTokens } of pass.admitted) {
          const length = byId.get(id)!.promptTokenIds.length + (received.get(id) ?? 0);
          if (cachedTokens % config.pageSize! !== 0) problems.push(`${id} hit ${cachedTokens} tokens, not whole pages`);
          if (cachedTokens >= length) problems.push(`${id} hit ${cachedTokens} of its ${length} tokens`);
          if (!config.enablePrefixCaching && cachedTokens > 0) problems.push(`${id} hit ${cachedTokens} tokens without prefix caching`);
        }
        for (const token of pass.tokens) {
          received.set(token.id, token.generated);
          if (token.completed && byId.get(token.id)!.holdBlocksOnFinish) {
            if (core.heldBlocks(token.id) === 0) problems.push(`${token.id} finished holding nothing`);
            core.releaseHeld(token.id);
          }
        }
        // A retracted request holds nothing and keeps its outputs (none of its tokens come back).
        for (const id of pass.preempted) {
          const view = core.view(id);
          if (view?.status !== 'preempted' || view.numComputedTokens !== 0 || view.numAllocatedTokens !== 0)
            problems.push(`${id} retracted but holds ${JSON.stringify(view)}`);
          else if (view.generated !== (received.get(id) ?? 0)) problems.push(`${id} retracted with ${view.generated} outputs, ${received.get(id) ?? 0} sent`);
        }
        const prefilled = pass.scheduledTokens - pass.tokens.length;
        if (prefilled > config.chunkedPrefillSize!) problems.push(`${prefilled} tokens prefilled in a pass, over the ${config.chunkedPrefillSize} chunk`);
        if (pass.endMs < pass.startMs) problems.push('a pass ending before it started');
        if (pass.admitted.length === 0 && prefilled > 0) chunkedPasses++;
      });
      expect(problems.slice(0, 5), where).toEqual([]);
      for (const { request } of requests) expect(result.records.get(request.id)!.tokenTimesMs.length, `${where}: ${request.id}`).toBe(request.maxOutputTokens);
      expect(core.isIdle, where).toBe(true);
      const stats = core.engineStats();
      expect(stats.activeBlocks, where).toBe(0);
      expect(core.cache.protectedSize, where).toBe(0);
      // Nothing is lost: the pool's free slots and the tree's cached ones are all of it.
      expect(core.cache.availableTokens + core.cache.evictableSize, where).toBe(core.cache.totalTokens);
      retractions += stats.preemptions;
      prefixHits += stats.prefixCacheHits;
    }
    // The workloads really exercise retraction, the prefix cache, eviction and chunked prefill.
    expect(retractions).toBeGreaterThan(0);
    expect(prefixHits).toBeGreaterThan(0);
    expect(evictedPages).toBeGreaterThan(0);
    expect(chunkedPasses).toBeGreaterThan(0);
  });
});
