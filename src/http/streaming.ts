import type { OutgoingHttpHeaders, ServerResponse } from 'node:http';
import { randomUUID } from 'node:crypto';
import { hideTokenIds } from '../capture/forward.js';
import { EngineRejection, type EngineStream, type TokenEvent } from '../engine/index.js';
import type { ChoicePlan } from '../generation/plan.js';
import { PlanRenderer } from '../api/planRenderer.js';
import { restamp, type RenderContext } from '../api/render.js';
import { prefillResponseParams } from '../pd/kvTransfer.js';
import type { StoredExchange } from '../store/captureStore.js';
import { LoopSlice } from '../util/loopSlice.js';
import { badRequest } from '../wire/errors.js';
import { sendJson } from '../wire/http.js';
import type { Prepared } from './prompts.js';
import type { ServeAppConfig } from './serveConfig.js';
import { eventReleases, renderCapturedStream } from './verbatimStream.js';

const SSE_HEADERS: OutgoingHttpHeaders = { 'content-type': 'text/event-stream; charset=utf-8' };
/** Captured response headers that describe the transfer, not the content: regenerated per response. */
const TRANSFER_HEADERS = new Set(['date', 'content-length', 'transfer-encoding', 'connection', 'keep-alive', 'x-request-id']);

/** A capture's response headers, those of the transfer left out. */
export function capturedHeaders(ex: StoredExchange): OutgoingHttpHeaders {
  const out: OutgoingHttpHeaders = {};
  for (const [k, v] of Object.entries(ex.responseHeaders)) if (!TRANSFER_HEADERS.has(k)) out[k] = v;
  return out;
}

/** Several engine streams' token events as they come, each with the index of its stream (vLLM's merge_async_iterators). */
async function* mergeStreams(streams: EngineStream[]): AsyncGenerator<[number, TokenEvent[]]> {
  if (streams.length === 1) {
    for await (const batch of streams[0]) yield [0, batch];
    return;
  }
  const ready: [number, TokenEvent[]][] = [];
  let open = streams.length;
  let failure: unknown = null;
  let wake: (() => void) | null = null;
  const notify = () => {
    const w = wake;
    wake = null;
    w?.();
  };
  streams.forEach((stream, i) => {
    void (async () => {
      for await (const batch of stream) {
        ready.push([i, batch]);
        notify();
      }
    })()
      .catch((err: unknown) => (failure ??= err))
      .finally(() => {
        open--;
        notify();
      });
  });
  let next = 0;
  while (open > 0 || next < ready.length) {
    if (failure) throw failure;
    if (next === ready.length) {
      ready.length = next = 0;
      await new Promise<void>((resolve) => (wake = resolve));
      continue;
    }
    yield ready[next++];
  }
  if (failure) throw failure;
}

/** The tokens a request's sequences have emitted in all, after each of the engine's batches. */
async function* emittedCounts(events: AsyncIterable<TokenEvent[]>, sequences: number): AsyncGenerator<number> {
  const perSequence = new Array<number>(sequences).fill(0);
  let emitted = 0;
  for await (const batch of events) {
    for (const { sequence, emitted: n } of batch) {
      emitted += n - perSequence[sequence];
      perSequence[sequence] = n;
    }
    yield emitted;
  }
}

/**
 * A prepared request through the engine, answered as it emits tokens: rendered from its plans in vLLM's format,
 * or a capture's own bytes released token by token.
 */
export class EngineResponses {
  /** Block ids named in `remote_block_ids`: opaque to the decode side, distinct while held. */
  private nextBlockId = 1;

  constructor(private readonly config: ServeAppConfig) {}

  /** Submits one prompt's plans; `part` numbers the prompts of a batch (vLLM's engine request `<id>-<i>`), null alone. */
  run(ctx: RenderContext, p: Prepared, part: number | null, plans: ChoicePlan[], arrivalMs: number, signal: AbortSignal, remotePrefill = false): EngineStream {
    const params = p.params[part ?? 0];
    try {
      const stream = this.config.engine.submit(
        {
          requestId: part === null ? ctx.id : `${ctx.id}-${part}`,
          arrivalMs,
          promptTokenIds: ctx.promptTokenIds,
          sequences: plans.map((plan) => ({ outputTokenIds: plan.tokenIds, capturedTimesMs: plan.capturedTimesMs, finishReason: plan.finishReason })),
          dataParallelRank: p.dataParallelRank,
          maxTokensParam: params.maxTokensRequested ? params.maxTokens : null,
          // Named by a random id: a decode engine (or the proxy) that was told it frees the blocks, nobody else.
          holdKv: part === null && p.kvTransfer?.do_remote_decode === true ? randomUUID() : undefined,
          remotePrefill,
          lora: p.lora,
        },
        signal,
      );
      return p.breaker ? p.breaker.watch(stream) : stream;
    } catch (err) {
      if (err instanceof EngineRejection) throw badRequest(err.message);
      throw err;
    }
  }

  /**
   * Renders plans through the engine in vLLM's format: `plans[i]` answers the i-th prompt (one, or a batched
   * completion's several), its choice j is the response's choice i * n + j (vLLM's numbering), and usage sums them.
   */
  async rendered(
    res: ServerResponse,
    ctx: RenderContext,
    p: Prepared,
    plansByPrompt: ChoicePlan[][],
    arrivalMs: number,
    abort: AbortController,
    remotePrefill: boolean,
    slice = new LoopSlice(),
  ): Promise<void> {
    const signal = abort.signal;
    const batched = plansByPrompt.length > 1;
    const renderer = new PlanRenderer(ctx, p.prompts, plansByPrompt, this.config.tokenizer, p.params[0].skipSpecialTokens, p.stream);
    // A batch's prompts each get a signal of their own, all aborted with the request's: an AbortSignal's listeners
    // are added in time linear in their number, so 10,000 on one signal took 0.85 s.
    const promptSignals = batched ? plansByPrompt.map(() => new AbortController()) : null;
    if (promptSignals) signal.addEventListener('abort', () => promptSignals.forEach((c) => c.abort()), { once: true });
    const streams: EngineStream[] = [];
    try {
      for (const [i, prompt] of plansByPrompt.entries()) {
        streams.push(
          this.run({ ...ctx, promptTokenIds: p.prompts[i] }, p, batched ? i : null, prompt, arrivalMs, promptSignals?.[i].signal ?? signal, remotePrefill),
        );
        if (batched) await slice.pause();
      }
    } catch (err) {
      abort.abort(); // the prompts already submitted leave the engine
      throw err;
    }
    // vLLM's prompt_tokens_details: the first prompt's engine output to arrive when streaming, the last prompt's otherwise.
    let cachedFrom = streams.length - 1;

    if (p.stream) res.writeHead(200, SSE_HEADERS);
    let started = false;
    for await (const [prompt, batch] of mergeStreams(streams)) {
      if (!started && p.stream) cachedFrom = prompt;
      let out = started ? '' : renderer.opening();
      started = true;
      for (const { sequence, emitted } of batch) out += await renderer.advance(renderer.choiceOf(prompt, sequence), emitted);
      if (out && !signal.aborted) res.write(out);
    }
    const hold = batched ? null : streams[0].kvHold;
    // vLLM hands the blocks to a remote decode only after a length-capped finish, in a non-streamed answer.
    if (hold && !signal.aborted && !p.stream && renderer.plans[0].finishReason === 'length') {
      ctx.kvTransferParams = prefillResponseParams(
        this.config.pd.endpoint(),
        hold.holdId,
        Array.from({ length: hold.blocks }, () => this.nextBlockId++),
      );
      // An answer its client never got whole names blocks no decode engine will pull: freed at once, not after the timeout.
      res.once('close', () => void (res.writableFinished || this.config.engine.releaseKvHold(hold.holdId)));
    } else if (hold) this.config.engine.releaseKvHold(hold.holdId);
    if (signal.aborted) return;
    const cachedTokens = this.config.promptTokensDetails ? streams[cachedFrom].cachedPromptTokens : null;
    if (p.stream) res.end(renderer.streamEnd(p.includeUsage, cachedTokens));
    else sendJson(res, 200, renderer.body(cachedTokens));
  }

  /** Serves a capture's own bytes (same request shape), released as the engine emits their tokens. */
  async verbatim(
    res: ServerResponse,
    ctx: RenderContext,
    p: Prepared,
    ex: StoredExchange,
    plans: ChoicePlan[],
    arrivalMs: number,
    signal: AbortSignal,
    remotePrefill: boolean,
  ): Promise<void> {
    const hide = ex.injected.includes('return_token_ids') && !p.returnTokenIds;
    const events = this.run(ctx, p, null, plans, arrivalMs, signal, remotePrefill);
    const headers = capturedHeaders(ex);
    if (!ex.stream) {
      for await (const batch of events) void batch;
      if (signal.aborted) return;
      const stamped = restamp(ex.responseBody.toString('utf8'), ctx.id, ctx.created);
      const body = hide ? hideTokenIds(stamped) : stamped;
      res.writeHead(ex.status ?? 200, { ...headers, 'content-length': Buffer.byteLength(body) }).end(body);
      return;
    }
    res.writeHead(ex.status ?? 200, headers);
    // The headers go at once: with the first events when the engine releases them within this turn (one write).
    const flushHeaders = setImmediate(() => res.flushHeaders());
    const stream = renderCapturedStream(ex, hide, ctx.id, ctx.created);
    let released = 0;
    try {
      for await (const due of eventReleases(ex, emittedCounts(events, plans.length), arrivalMs, this.config.capturedDuration, signal)) {
        if (signal.aborted) break;
        clearImmediate(flushHeaders);
        res.write(stream.slice(released, due));
        released = due;
      }
    } finally {
      clearImmediate(flushHeaders);
    }
    if (signal.aborted) return;
    res.end(stream.slice(released, stream.events));
  }
}
