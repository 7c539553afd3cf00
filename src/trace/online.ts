/**
 * Online trace replay (engine-reference §8.6): requests go out in real time — at their arrival times, or
 * closed-loop under a concurrency cap — to workers that answer in real time: simulated engines in this
 * process (live drivers, durations divided by `--speedup-ratio`) or servers over HTTP (`--target`). What
 * the client sees is measured in wall-clock ms since the start.
 */
import { createSchedulerCore, EngineRejection, LiveDriver, type AnySchedulerConfig } from '../engine/index.js';
import type { PassSample, ReplayCollector } from './collector.js';
import type { Dispatch, WorkloadDriver } from './driver.js';
import type { Router, RouterKvEvent } from './router.js';
import { syntheticTokenId } from './workload.js';

export interface OnlineRequest {
  uuid: string;
  prompt: readonly number[];
  maxTokens: number;
}

/** What a worker reports while it answers. */
export interface OnlineSink {
  /** First admission, with the prompt tokens the prefix cache supplied (when the worker can tell). */
  admitted(cachedTokens: number): void;
  /** `count` more output tokens arrived now. */
  tokens(count: number): void;
}

/** How a request ended: a load generator counts failures, it does not read the answers. */
export interface OnlineAnswer {
  /** Why the request failed (status and message), or null. */
  error: string | null;
}

export interface OnlineWorker {
  readonly name: string;
  send(request: OnlineRequest, sink: OnlineSink): Promise<OnlineAnswer>;
  /** The worker's KV events in the router's block hashes (only when it publishes any). */
  onKvEvents(listener: (events: RouterKvEvent[]) => void): void;
  /** Its cache state now, for the charts (null: unknown). */
  sample(): PassSample | null;
  close(): Promise<void>;
}

/** A simulated engine core in this process, driven in real time. */
export class LocalWorker implements OnlineWorker {
  private readonly driver: LiveDriver;
  private listener: ((events: RouterKvEvent[]) => void) | null = null;
  private sequence = 0;

  constructor(
    readonly name: string,
    config: AnySchedulerConfig,
    speedupRatio: number,
  ) {
    this.driver = new LiveDriver(createSchedulerCore({ ...config, cacheEvents: true }), speedupRatio, 0, {
      onCacheEvents: (_rank, events) => this.listener?.(events),
    });
  }

  async send(request: OnlineRequest, sink: OnlineSink): Promise<OnlineAnswer> {
    // The engine needs the outputs it will produce: Dynamo's synthetic ids, distinct per request.
    const n = this.sequence++;
    const outputTokenIds = Array.from({ length: request.maxTokens }, (_, i) => syntheticTokenId(n, request.prompt.length + i));
    let stream;
    try {
      stream = this.driver.submit(
        { requestId: request.uuid, arrivalMs: performance.now(), promptTokenIds: request.prompt, sequences: [{ outputTokenIds, finishReason: 'length' }] },
        new AbortController().signal,
      );
    } catch (err) {
      if (err instanceof EngineRejection) return { error: err.message };
      throw err;
    }
    let emitted = 0;
    let admitted = false;
    for await (const batch of stream) {
      if (!admitted) {
        admitted = true;
        sink.admitted(stream.cachedPromptTokens);
      }
      const last = batch[batch.length - 1].emitted;
      sink.tokens(last - emitted);
      emitted = last;
    }
    return { error: null };
  }

  onKvEvents(listener: (events: RouterKvEvent[]) => void): void {
    this.listener = listener;
  }

  sample(): PassSample {
    return this.driver.stats();
  }

  async close(): Promise<void> {}
}

export interface OnlineOptions {
  /** Called when a request finished (completed, failed or rejected). */
  onAnswer?: (answer: OnlineAnswer) => void;
  onProgress?: (finished: number, elapsedMs: number) => void;
  /** Wall-clock ms between chart samples of each worker. */
  sampleEveryMs?: number;
}

/** Runs the workload to the end; resolves with the wall time it took (ms). */
export async function runOnline(
  workers: readonly OnlineWorker[],
  router: Router,
  driver: WorkloadDriver,
  collector: ReplayCollector,
  options: OnlineOptions = {},
): Promise<number> {
  const start = performance.now();
  const now = () => performance.now() - start;
  workers.forEach((worker, index) => worker.onKvEvents((events) => router.applyKvEvents(index, events)));
  let wake: (() => void) | null = null;
  const notify = () => {
    const w = wake;
    wake = null;
    w?.();
  };
  let finished = 0;
  const sampler = setInterval(() => {
    workers.forEach((worker, index) => {
      const sample = worker.sample();
      if (sample) collector.onPass(index, now(), () => sample, 0);
    });
  }, options.sampleEveryMs ?? 100);

  const send = (dispatch: Dispatch, prompt: readonly number[], worker: number) => {
    collector.onRouted(dispatch.uuid, worker);
    let first = true;
    const sink: OnlineSink = {
      admitted: (cachedTokens) => collector.onAdmit(dispatch.uuid, now(), cachedTokens),
      tokens: (count) => {
        if (count <= 0) return;
        collector.onTokens(dispatch.uuid, now(), count);
        if (first) {
          first = false;
          router.markPrefillCompleted(dispatch.uuid, now());
        }
      },
    };
    workers[worker]
      .send({ uuid: dispatch.uuid, prompt, maxTokens: Math.max(1, dispatch.turn.outputLength) }, sink)
      .then(
        (answer) => options.onAnswer?.(answer),
        (err: unknown) => {
          options.onAnswer?.({ error: err instanceof Error ? err.message : String(err) });
        },
      )
      .finally(() => {
        router.free(dispatch.uuid, now());
        driver.onComplete(dispatch.uuid, now());
        finished++;
        options.onProgress?.(finished, now());
        for (const { request, worker: next } of router.released(now())) {
          const parked = pending.get(request.uuid)!;
          pending.delete(request.uuid);
          send(parked.dispatch, parked.prompt, next);
        }
        notify();
      });
  };

  const pending = new Map<string, { dispatch: Dispatch; prompt: readonly number[] }>();
  try {
    while (!driver.done) {
      for (const dispatch of driver.popReady(now())) {
        const ids = dispatch.turn.prompt();
        // Workers send prompts as JSON arrays: a packed one is unpacked once, here.
        const prompt = ids instanceof Uint32Array ? Array.from(ids) : ids;
        // Trace mode stamps the scheduled time; the request goes out now, a timer's lateness later.
        collector.onArrival(dispatch.uuid, dispatch.arrivalMs, dispatch.turn.inputLength, dispatch.turn.outputLength, dispatch);
        const worker = router.admit({ uuid: dispatch.uuid, tokens: prompt, arrivalMs: dispatch.arrivalMs }, now());
        if (worker === null) pending.set(dispatch.uuid, { dispatch, prompt });
        else send(dispatch, prompt, worker);
      }
      if (driver.done) break;
      const nextReady = driver.nextReadyMs();
      let timer: NodeJS.Timeout | undefined;
      await new Promise<void>((resolve) => {
        wake = resolve;
        if (nextReady !== null) timer = setTimeout(notify, Math.max(0, nextReady - now()));
      });
      clearTimeout(timer);
    }
  } finally {
    clearInterval(sampler);
  }
  return now();
}
