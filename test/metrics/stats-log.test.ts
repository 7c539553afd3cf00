import { describe, expect, it } from 'vitest';
import type { PassStats } from '../../src/engine/index.js';
import { StatsLog } from '../../src/metrics/statsLog.js';

const pass = (p: Partial<PassStats>): PassStats => ({
  running: 0,
  waiting: 0,
  activeBlocks: 0,
  totalBlocks: 100,
  prefixCacheQueries: 0,
  prefixCacheHits: 0,
  preemptions: 0,
  promptTokens: 0,
  generationTokens: 0,
  timesToFirstTokenS: [],
  interTokenLatenciesS: [],
  ...p,
});

describe("vLLM's periodic stats line", () => {
  it('reports the interval in LoggingStatLogger format, per rank, and nothing while idle', () => {
    const log = new StatsLog(2, 0);
    log.onPass(0, pass({ promptTokens: 500, generationTokens: 100, running: 3, waiting: 1, activeBlocks: 25, prefixCacheQueries: 400, prefixCacheHits: 100 }));
    log.onPass(0, pass({ generationTokens: 50, running: 2, waiting: 0, activeBlocks: 20 }));
    expect(log.lines(10_000)).toEqual([
      'Engine 000: Avg prompt throughput: 50.0 tokens/s, Avg generation throughput: 15.0 tokens/s, Running: 2 reqs, Waiting: 0 reqs, GPU KV cache usage: 20.0%, Prefix cache hit rate: 25.0%',
    ]);
    // Still running but no tokens this interval: still busy, zero throughput.
    expect(log.lines(20_000)[0]).toMatch(/^Engine 000: Avg prompt throughput: 0\.0 tokens\/s, .*Running: 2 reqs/);
    log.onPass(0, pass({ generationTokens: 10 }));
    log.lines(25_000);
    expect(log.lines(30_000)).toEqual([]);
  });
});
