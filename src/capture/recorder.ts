import type { IncomingHttpHeaders } from 'node:http';
import { requestShape } from '../generation/shape.js';
import type { CaptureStore, Exchange, Generation, TokenSource } from '../store/captureStore.js';
import type { ModelTokenizer } from '../tokenizer/index.js';
import { parseResponse, withOutputIds } from './extract.js';
import { redactHeaders, type ExchangeSink, type RawExchange } from './forward.js';

type Json = Record<string, unknown>;

/** Prompt ids as the upstream's /tokenize reports them (vLLM's shape, then llama.cpp's), or null. */
async function tokenizeUpstream(upstream: URL, body: Json, headers: IncomingHttpHeaders): Promise<number[] | null> {
  const target = new URL(upstream.pathname.replace(/\/$/, '') + '/tokenize', upstream);
  const auth: Record<string, string> = headers.authorization ? { authorization: String(headers.authorization) } : {};
  try {
    const res = await fetch(target, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...auth },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(10_000),
    });
    if (!res.ok) return null;
    const json = (await res.json()) as Json;
    const tokens = json.tokens;
    if (Array.isArray(tokens) && tokens.every((t) => typeof t === 'number')) return tokens as number[];
    return null;
  } catch {
    return null;
  }
}

/** What the recorder needs of a tokenizer (only for engines that send no token ids). */
export type RecorderTokenizer = Pick<ModelTokenizer, 'renderChat' | 'encode' | 'eosTokenIds'>;

/**
 * Turns proxied exchanges into stored ones: prompt and output token ids, timing, redacted headers. Runs on
 * the thread that calls `sink`; `mocker capture` runs it in a worker thread (see recorderThread.ts).
 */
export class Recorder {
  constructor(
    private readonly store: CaptureStore,
    private readonly runId: number,
    private readonly tokenizer: RecorderTokenizer,
    private readonly upstream: URL,
    private readonly redacted: ReadonlySet<string>,
  ) {}

  /** Stores generation exchanges; everything else the proxy forwards (health checks, /v1/models…) is not recorded. */
  readonly sink: ExchangeSink = async (raw) => {
    if (raw.endpoint) this.store.saveExchange(await this.build(raw));
  };

  private async promptIds(kind: 'chat' | 'completion', request: Json, headers: IncomingHttpHeaders): Promise<{ ids: number[]; source: TokenSource } | null> {
    const model = request.model === undefined ? {} : { model: request.model };
    if (kind === 'chat') {
      const body: Json = { ...model, messages: request.messages };
      for (const k of ['add_generation_prompt', 'continue_final_message', 'add_special_tokens', 'chat_template', 'chat_template_kwargs', 'tools']) {
        if (request[k] !== undefined) body[k] = request[k];
      }
      const ids = await tokenizeUpstream(this.upstream, body, headers);
      if (ids) return { ids, source: 'tokenize-endpoint' };
      try {
        const prompt = this.tokenizer.renderChat(request as never);
        return { ids: await this.tokenizer.encode(prompt, request.add_special_tokens === true), source: 'local' };
      } catch {
        return null;
      }
    }
    const prompt = request.prompt;
    if (Array.isArray(prompt) && prompt.every((t) => typeof t === 'number')) return { ids: prompt as number[], source: 'local' };
    if (typeof prompt !== 'string') return null;
    const addSpecial = request.add_special_tokens !== false;
    const ids =
      (await tokenizeUpstream(this.upstream, { ...model, prompt, add_special_tokens: addSpecial }, headers)) ??
      (await tokenizeUpstream(this.upstream, { content: prompt, add_special: addSpecial }, headers));
    if (ids) return { ids, source: 'tokenize-endpoint' };
    return { ids: await this.tokenizer.encode(prompt, addSpecial), source: 'local' };
  }

  private async outputIds(gen: Generation, headers: IncomingHttpHeaders, model: Json): Promise<{ generation: Generation; source: TokenSource }> {
    const upstreamIds = await tokenizeUpstream(this.upstream, { ...model, prompt: gen.text, add_special_tokens: false }, headers);
    const ids = upstreamIds ?? (await this.tokenizer.encode(gen.text, false));
    // The token that stopped generation is in vLLM's token_ids but not in the text: a stop_token_ids hit
    // names it; an EOS stop (no stop_reason) is the model's EOS.
    const stopToken = typeof gen.stopReason === 'number' ? gen.stopReason : gen.stopReason === null && gen.finishReason !== 'length' ? this.tokenizer.eosTokenIds[0] : undefined;
    if (stopToken !== undefined && gen.finishReason !== null && gen.finishReason !== 'abort') ids.push(stopToken);
    return { generation: withOutputIds(gen, ids), source: upstreamIds ? 'tokenize-endpoint' : 'local' };
  }

  private async build(raw: RawExchange): Promise<Exchange> {
    const ex: Exchange = {
      runId: this.runId,
      startedAt: raw.startedAt,
      requestId: (raw.requestHeaders['x-request-id'] as string | undefined) ?? null,
      method: raw.method,
      path: raw.path,
      endpoint: raw.endpoint,
      outcome: raw.outcome,
      error: raw.error,
      status: raw.status,
      model: typeof raw.request?.model === 'string' ? raw.request.model : null,
      stream: raw.stream,
      requestHeaders: redactHeaders(raw.requestHeaders, this.redacted),
      requestBody: raw.requestBody,
      responseHeaders: redactHeaders(raw.responseHeaders, this.redacted),
      responseBody: raw.responseBody,
      eventEnds: raw.eventEnds,
      eventTimes: raw.eventTimes,
      eventTokens: [],
      totalMs: raw.totalMs,
      tokenSource: null,
      promptIds: null,
      requestShape: null,
      injected: raw.injected,
      usage: undefined,
      generations: [],
    };
    if (!raw.endpoint || !raw.request || raw.status === null || raw.status >= 400) return ex;
    const parsed = parseResponse(raw.endpoint, raw.stream, raw.responseBody, raw.eventEnds, raw.eventTimes, raw.totalMs);
    ex.model = parsed.model ?? ex.model;
    ex.usage = parsed.usage;
    ex.eventTokens = parsed.eventTokens;
    ex.requestShape = requestShape(raw.endpoint, raw.request);
    if (parsed.error) {
      ex.outcome = 'failed';
      ex.error = parsed.error;
    }
    const modelField = ex.model === null ? {} : { model: ex.model };
    const prompt = parsed.promptIds
      ? { ids: parsed.promptIds, source: 'engine' as const }
      : await this.promptIds(raw.endpoint, raw.request, raw.requestHeaders);
    ex.promptIds = prompt?.ids ?? null;
    const sources: TokenSource[] = [prompt?.source ?? 'local'];
    if (parsed.outputIdsFromEngine) ex.generations = parsed.generations;
    else {
      const outputs = await Promise.all(parsed.generations.map((g) => this.outputIds(g, raw.requestHeaders, modelField)));
      ex.generations = outputs.map((o) => o.generation);
      sources.push(...outputs.map((o) => o.source));
    }
    // The capture is only as exact as its least exact token ids.
    ex.tokenSource = sources.includes('local') ? 'local' : sources.includes('tokenize-endpoint') ? 'tokenize-endpoint' : 'engine';
    if (ex.generations.length === 0 && ex.outcome === 'complete') {
      ex.outcome = 'failed';
      ex.error = 'the response held no choices';
    }
    return ex;
  }
}
