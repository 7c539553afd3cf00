/**
 * Invariants of the engine core over seeded random workloads: every pass keeps the KV cache and the
 * budgets consistent, and every request ends with exactly its tokens and nothing left held.
 */
import { describe, expect, it } from 'vitest';
import { EngineCore, type SchedulerConfig } from '../../src/engine/core.js';
import { runOffline, type TimedRequest } from '../../src/engine/offlineDriver.js';
import { polynomialPerfModel } from '../../src/engine/perf/perfModel.js';
import { modelTiming } from '../../src/engine/timingModels.js';
import { prng } from '../support/prng.js';

const WORKLOADS = 240;

function workload(seed: number): { config: SchedulerConfig; requests: TimedRequest[] } {
  const r = prng(seed);
  const blockSize = r.pick([2, 4, 16, 64]);
  const requests: TimedRequest[] = [];
  const prefixes = Array.from({ length: r.int(1, 4) }, () => Array.from({ length: r.int(0, 300) }, () => r.int(1, 50_000)));
  const count = r.int(5, 60);
  let longest = 0;
  for (let i = 0; i < count; i++) {
    const prefix = r.next() < 0.6 ? r.pick(prefixes) : [];
    // Some requests repeat an earlier prompt whole: the prefix cache can hold all of it.
    const repeated = requests.length > 0 && r.next() < 0.15 ? r.pick(requests).request.promptTokenIds : null;
    const prompt = repeated ?? [...prefix, ...Array.from({ length: r.int(1, 200) }, () => r.int(1, 50_000))];
    const maxOutputTokens = r.int(1, 120);
    longest = Math.max(longest, Math.ceil((prompt.length + maxOutputTokens) / blockSize));
    requests.push({ arrivalMs: r.pick([0, r.int(0, 50), r.int(0, 5000)]), request: { id: `r${i}`, promptTokenIds: prompt, maxOutputTokens } });
  }
  // From barely enough for the largest request to plenty.
  const numGpuBlocks = r.pick([longest + 1, longest + r.int(1, 20), longest * r.int(2, 8), 16384]);
  const chunked = r.next() < 0.5;
  const longestPrompt = Math.max(...requests.map((q) => q.request.promptTokenIds.length));
  const budget = r.pick([null, 8192, r.int(8, 512)]);
  const config: SchedulerConfig = {
    numGpuBlocks,
    blockSize,
    maxNumSeqs: r.pick([null, 256, r.int(1, 16)]),
    // Without chunked prefill every prompt must fit one pass (else the engine rejects it).
    maxNumBatchedTokens: budget === null || chunked ? budget : Math.max(budget, longestPrompt),
    enablePrefixCaching: r.next() < 0.5,
    enableChunkedPrefill: chunked,
    preemptionMode: r.pick(['lifo', 'fifo'] as const),
    watermark: numGpuBlocks > 2 * longest ? r.pick([0, 0.01]) : 0,
    longPrefillTokenThreshold: 0,
    timing: modelTiming(polynomialPerfModel, r.pick([0, 1, 100]), 1),
    seed,
  };
  // A third of the workloads run on a decode worker: some requests' prompts are pulled from a prefill engine
  // (allocated at once, computed nowhere, landing after the transfer time; instant with bandwidth 0).
  if (r.next() < 1 / 3) {
    config.kvTransfer = { bytesPerToken: r.pick([1_000, 1_000_000]), bandwidthGBps: r.pick([0, 1, 64]) };
    for (const q of requests) if (r.next() < 0.5) q.request = { ...q.request, remotePrefill: true };
  }
  return { config, requests };
}

describe(`engine invariants over ${WORKLOADS} random workloads`, () => {
  it('hold after every pass, and every request completes with exactly its tokens', () => {
    let preemptions = 0;
    let prefixHits = 0;
    let cappedHits = 0;
    let pulled = 0;
    for (let seed = 1; seed <= WORKLOADS; seed++) {
      const { config, requests } = workload(seed);
      const core = new EngineCore(config);
      const where = `workload ${seed}`;
      // Plain checks per pass (expect() per block would dominate the run time); any violation fails below.
      const violations: string[] = [];
      const promptLength = new Map(requests.map(({ request }) => [request.id, request.promptTokenIds.length]));
      const admittedBefore = new Set<string>();
      const result = runOffline(core, requests, (pass) => {
        // vLLM's prefix-hit rule: whole blocks, never a request's last token (a first admission: its prompt's).
        for (const { id, cachedTokens } of pass.admitted) {
          const length = promptLength.get(id)!;
          const first = !admittedBefore.has(id);
          admittedBefore.add(id);
          if (cachedTokens % config.blockSize !== 0) violations.push(`${id} hit ${cachedTokens} tokens, not whole blocks of ${config.blockSize}`);
          if (first && cachedTokens >= length) violations.push(`${id} hit ${cachedTokens} tokens of its ${length}-token prompt`);
          if (!config.enablePrefixCaching && cachedTokens > 0) violations.push(`${id} hit ${cachedTokens} tokens without prefix caching`);
          // A block-aligned prompt that hit all but its last block: where the rule keeps a block out.
          if (first && length % config.blockSize === 0 && cachedTokens > 0 && cachedTokens === length - config.blockSize) cappedHits++;
        }
        pulled += core.engineStats().waitingForRemoteKvs;
        const kv = core.kv;
        if (kv.numActive + kv.numInactive > config.numGpuBlocks)
          violations.push(`pass at ${pass.startMs}: ${kv.numActive} active + ${kv.numInactive} inactive > ${config.numGpuBlocks}`);
        for (const [block, count] of kv.activeBlocks()) if (!(count > 0)) violations.push(`block ${block} active with count ${count}`);
        for (const block of kv.inactiveBlocks()) if (kv.isActive(block)) violations.push(`block ${block} both active and inactive`);
        if (pass.scheduledTokens > (config.maxNumBatchedTokens ?? Infinity)) violations.push(`${pass.scheduledTokens} tokens scheduled over the budget`);
        if (core.runningIds().length > (config.maxNumSeqs ?? Infinity)) violations.push(`${core.runningIds().length} running over max_num_seqs`);
        if (pass.endMs < pass.startMs) violations.push('a pass ending before it started');
      });
      expect(violations.slice(0, 5), where).toEqual([]);
      for (const { request } of requests) {
        const record = result.records.get(request.id)!;
        expect(record.tokenTimesMs.length, `${where}: ${request.id}`).toBe(request.maxOutputTokens);
        // Tokens come out in time order, none before the request arrived.
        record.tokenTimesMs.forEach((t, i) => expect(t, where).toBeGreaterThanOrEqual(i === 0 ? record.arrivalMs : record.tokenTimesMs[i - 1]));
      }
      expect(core.kv.numActive, where).toBe(0);
      expect(core.isIdle, where).toBe(true);
      preemptions += core.engineStats().preemptions;
      prefixHits += core.engineStats().prefixCacheHits;
    }
    // The workloads really exercise preemption, the prefix cache and pulled KV.
    expect(preemptions).toBeGreaterThan(0);
    expect(prefixHits).toBeGreaterThan(0);
    expect(cappedHits).toBeGreaterThan(0);
    expect(pulled).toBeGreaterThan(0);
  });
});
