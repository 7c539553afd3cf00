import type { EngineObserver, KvTraceEntry, VllmKvEvent } from '../engine/index.js';
import { offsetEndpoint, type KvEventsConfig } from './config.js';
import { ZmqKvEventPublisher } from './zmqPublisher.js';

/** One engine's KV event publishers, one per data-parallel rank (port + rank), fed by the engine's passes. */
export class KvEventStreams implements EngineObserver {
  private constructor(private readonly publishers: ZmqKvEventPublisher[]) {}

  /** `portOffset`: added to every rank's port (several workers sharing one `--kv-events-config`). */
  static async open(config: KvEventsConfig, ranks: number, portOffset = 0): Promise<KvEventStreams> {
    const publishers: ZmqKvEventPublisher[] = [];
    try {
      for (let rank = 0; rank < ranks; rank++) {
        publishers.push(
          await ZmqKvEventPublisher.open({
            ...config,
            endpoint: offsetEndpoint(config.endpoint, portOffset + rank),
            replayEndpoint: config.replayEndpoint === null ? null : offsetEndpoint(config.replayEndpoint, portOffset + rank),
            dpRank: rank,
          }),
        );
      }
    } catch (err) {
      publishers.forEach((p) => p.close());
      throw err;
    }
    return new KvEventStreams(publishers);
  }

  onKvEvents(rank: number, events: VllmKvEvent[]): void {
    // vLLM stamps a batch with time.time() when it publishes it.
    this.publishers[rank].publish(events, Date.now() / 1000);
  }

  close(): void {
    this.publishers.forEach((p) => p.close());
  }
}

/**
 * Dynamo's KV cache trace (DYN_MOCKER_KV_CACHE_TRACE=1, engine-reference §3.7): one structured line per
 * store or eviction.
 */
export class KvTraceLog implements EngineObserver {
  constructor(
    private readonly blockSize: number,
    private readonly totalBlocks: number,
    private readonly write: (line: string) => void = (line) => console.log(line),
  ) {}

  onKvTrace(rank: number, entries: KvTraceEntry[]): void {
    const timestampMs = Date.now();
    for (const e of entries) {
      const utilization = (e.activeBlocks + e.inactiveBlocks) / this.totalBlocks;
      this.write(
        `kv_cache_trace engine_type="vllm" event="${e.event}" timestamp_ms=${timestampMs} dp_rank=${rank} block_size=${this.blockSize} ` +
          `free_blocks=${e.freeBlocks} active_blocks=${e.activeBlocks} inactive_blocks=${e.inactiveBlocks} total_blocks=${this.totalBlocks} utilization=${utilization.toFixed(4)}`,
      );
    }
  }
}

/** DYN_MOCKER_KV_CACHE_TRACE=1|true */
export const kvTraceEnabled = (env: NodeJS.ProcessEnv = process.env) => ['1', 'true'].includes((env.DYN_MOCKER_KV_CACHE_TRACE ?? '').toLowerCase());
