import type { EngineObserver, PassStats } from '../engine/index.js';

interface RankWindow {
  promptTokens: number;
  generationTokens: number;
  queries: number;
  hits: number;
  running: number;
  waiting: number;
  kvUsage: number;
}

const emptyWindow = (): RankWindow => ({ promptTokens: 0, generationTokens: 0, queries: 0, hits: 0, running: 0, waiting: 0, kvUsage: 0 });

/**
 * vLLM's periodic stats line (`LoggingStatLogger`, every VLLM_LOG_STATS_INTERVAL seconds):
 * "Engine 000: Avg prompt throughput: … tokens/s, Avg generation throughput: … tokens/s, Running: … reqs,
 * Waiting: … reqs, GPU KV cache usage: …%, Prefix cache hit rate: …%" — one per rank, only while busy. The hit
 * rate covers the interval's prefix-cache queries.
 */
export class StatsLog implements EngineObserver {
  private readonly windows: RankWindow[];
  private lastMs: number;

  constructor(ranks: number, startMs: number) {
    this.windows = Array.from({ length: ranks }, emptyWindow);
    this.lastMs = startMs;
  }

  onPass(rank: number, stats: PassStats): void {
    const w = this.windows[rank];
    w.promptTokens += stats.promptTokens;
    w.generationTokens += stats.generationTokens;
    w.queries += stats.prefixCacheQueries;
    w.hits += stats.prefixCacheHits;
    w.running = stats.running;
    w.waiting = stats.waiting;
    w.kvUsage = stats.totalBlocks > 0 ? stats.activeBlocks / stats.totalBlocks : 0;
  }

  /** The lines for the interval ending at `nowMs` (none for an idle rank), and a new interval. */
  lines(nowMs: number): string[] {
    const seconds = Math.max(1e-9, (nowMs - this.lastMs) / 1000);
    this.lastMs = nowMs;
    const out: string[] = [];
    this.windows.forEach((w, rank) => {
      const busy = w.promptTokens + w.generationTokens > 0 || w.running + w.waiting > 0;
      if (busy) {
        const hitRate = w.queries > 0 ? (100 * w.hits) / w.queries : 0;
        out.push(
          `Engine ${String(rank).padStart(3, '0')}: Avg prompt throughput: ${(w.promptTokens / seconds).toFixed(1)} tokens/s, ` +
            `Avg generation throughput: ${(w.generationTokens / seconds).toFixed(1)} tokens/s, Running: ${w.running} reqs, ` +
            `Waiting: ${w.waiting} reqs, GPU KV cache usage: ${(100 * w.kvUsage).toFixed(1)}%, Prefix cache hit rate: ${hitRate.toFixed(1)}%`,
        );
      }
      this.windows[rank] = { ...emptyWindow(), running: w.running, waiting: w.waiting, kvUsage: w.kvUsage };
    });
    return out;
  }
}
