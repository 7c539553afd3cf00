import { textField, type ChoicePlan } from '../generation/plan.js';
import type { ChunkDelta } from '../store/generation.js';
import type { DecodeStream, ModelTokenizer } from '../tokenizer/index.js';
import { chunkEvent, DONE_EVENT, fullResponse, roleEvent, usageEvent, type RenderContext } from './render.js';

/**
 * Plans and their token ids as response text in the context's wire shape (`serve --wire`, or the replayed
 * capture's engine's): the pure half of serving a rendered answer (no engine, no
 * socket), shared by `serve` and `mocker captures verify`. `plansByPrompt[i]` answers the i-th prompt (one, or a
 * batched completion's several); its choice j is the response's choice i * n + j (vLLM's numbering), and usage
 * sums them. Chunks without a delta are detokenized incrementally, per choice, as they go out.
 */
export class PlanRenderer {
  readonly plans: ChoicePlan[];
  private readonly contexts: RenderContext[];
  private readonly firstChoice: number[];
  private readonly promptOf: number[];
  private readonly decoders: DecodeStream[];
  private readonly nextChunk: number[];
  /** Only a non-streamed answer needs the text once every token is out; a stream keeps nothing it has sent. */
  private readonly deltas: ChunkDelta[][] | null;

  constructor(
    /** Held, not copied: the caller may still set its `kvTransferParams` before `body`. */
    private readonly ctx: RenderContext,
    private readonly prompts: readonly (readonly number[])[],
    plansByPrompt: ChoicePlan[][],
    tokenizer: ModelTokenizer,
    skipSpecialTokens: boolean,
    private readonly stream: boolean,
  ) {
    this.contexts = plansByPrompt.map((_, i) => ({ ...ctx, promptTokenIds: prompts[i] }));
    let choices = 0;
    this.firstChoice = plansByPrompt.map((plans) => (choices += plans.length) - plans.length);
    this.plans = plansByPrompt.flat();
    this.promptOf = plansByPrompt.flatMap((prompt, i) => prompt.map(() => i));
    this.decoders = this.plans.map(() => tokenizer.decodeStream(skipSpecialTokens));
    this.nextChunk = this.plans.map(() => 0);
    this.deltas = stream ? null : this.plans.map(() => []);
  }

  /** The response's choice index of sequence `sequence` of prompt `prompt`. */
  choiceOf(prompt: number, sequence: number): number {
    return this.firstChoice[prompt] + sequence;
  }

  /** What a stream sends before the first chunk: the chat stream's role chunk of every choice. */
  opening(): string {
    if (!this.stream || this.ctx.kind !== 'chat') return '';
    return this.plans.map((_, s) => roleEvent(this.ctx, s)).join('');
  }

  /** Choice `s` has `emitted` tokens out: the chunks that completes (SSE events when streaming, else kept for `body`). */
  async advance(s: number, emitted: number): Promise<string> {
    const plan = this.plans[s];
    let out = '';
    for (const { delta, k, start, end } of await this.completed(s, emitted)) {
      this.deltas?.[s].push(delta);
      if (this.stream) {
        const finish = k === plan.chunks.length - 1 ? { reason: plan.finishReason, stopReason: plan.stopReason } : null;
        out += chunkEvent(this.contexts[this.promptOf[s]], s, delta, plan.tokenIds.slice(start, end), finish, k === 0);
      }
    }
    return out;
  }

  /** The chat deltas of the chunks choice `s` completes with `emitted` tokens out, for APIs that render chat deltas their own way. */
  async chatDeltas(s: number, emitted: number): Promise<ChunkDelta[]> {
    return (await this.completed(s, emitted)).map((c) => c.delta);
  }

  /** The chunks choice `s` completes with `emitted` tokens out (chunk k spans tokens start to end), each once. */
  private async completed(s: number, emitted: number): Promise<{ delta: ChunkDelta; k: number; start: number; end: number }[]> {
    const plan = this.plans[s];
    const done: { delta: ChunkDelta; k: number; start: number; end: number }[] = [];
    while (this.nextChunk[s] < plan.chunks.length && plan.chunks[this.nextChunk[s]].end <= emitted) {
      const k = this.nextChunk[s];
      const start = k === 0 ? 0 : plan.chunks[k - 1].end;
      const end = plan.chunks[k].end;
      done.push({ delta: await this.deltaOf(s, start, end), k, start, end });
      this.nextChunk[s]++;
    }
    return done;
  }

  private async deltaOf(s: number, start: number, end: number): Promise<ChunkDelta> {
    const plan = this.plans[s];
    const chunk = plan.chunks[this.nextChunk[s]];
    if (chunk.delta) return chunk.delta;
    let text = '';
    for (let i = start; i < end; i++) text += (await this.decoders[s].step(plan.tokenIds[i])) ?? '';
    return { [textField(this.ctx.kind)]: text };
  }

  private promptTokens(): number {
    return this.prompts.reduce((n, ids) => n + ids.length, 0);
  }

  /** A stream's last events: the usage chunk when asked for, then `[DONE]`. */
  streamEnd(includeUsage: boolean, cachedTokens: number | null): string {
    const tokens = this.plans.reduce((n, plan) => n + plan.tokenIds.length, 0);
    return (includeUsage ? usageEvent(this.ctx, this.promptTokens(), tokens, cachedTokens) : '') + DONE_EVENT;
  }

  /** The non-streamed response body, once every chunk has been advanced. */
  body(cachedTokens: number | null): string {
    const choices = this.plans.map((plan, s) => ({ plan, deltas: this.deltas![s], promptTokenIds: this.prompts[this.promptOf[s]] }));
    return fullResponse(this.ctx, choices, this.promptTokens(), cachedTokens);
  }
}
