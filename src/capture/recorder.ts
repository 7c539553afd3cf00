import type { IncomingHttpHeaders } from 'node:http';
import { poolingInputs, poolingKey } from '../generation/poolingKey.js';
import { anthropicMessagesRequest, messagesChatBody } from '../api/anthropicRequest.js';
import { translateResponsesRequest } from '../api/responsesRequest.js';
import { parseBody } from '../api/schemas.js';
import { requestShape } from '../generation/shape.js';
import type { CaptureStore, Exchange, PoolingKind, TokenSource } from '../store/captureStore.js';
import type { Generation } from '../store/generation.js';
import type { ModelTokenizer } from '../tokenizer/index.js';
import { parseAgentResponse } from './agentEvents.js';
import { parseResponse, streamedPieces, withOutputIds } from './extract.js';
import { redactHeaders, type ExchangeSink, type RawExchange } from './forward.js';
import type { TokenizeDialect } from './upstreamEngine.js';
import { UpstreamPool } from './upstreamHttp.js';
import type { UpstreamTls } from '../wire/tls.js';

type Json = Record<string, unknown>;

/**
 * The upstream's own tokenizer endpoints, each asked in its own shape. An endpoint that does not exist (404/405)
 * is not asked again; an empty id list for non-empty text (llama.cpp's answer to vLLM's shape) is no answer.
 */
class UpstreamTokenizer {
  private readonly missing = new Set<string>();

  /** The proxy's own client to the upstream (its CA too). */
  private readonly pool: UpstreamPool;

  constructor(
    private readonly upstream: URL,
    tls: UpstreamTls,
  ) {
    this.pool = new UpstreamPool(upstream, 10_000, tls);
  }

  private async post(path: string, body: Json, headers: IncomingHttpHeaders): Promise<Json | null> {
    if (this.missing.has(path)) return null;
    const target = this.upstream.pathname.replace(/\/$/, '') + path;
    const auth: Record<string, string> = headers.authorization ? { authorization: String(headers.authorization) } : {};
    try {
      const res = await this.pool.text('POST', target, { 'content-type': 'application/json', ...auth }, Buffer.from(JSON.stringify(body)));
      if (res.status === 404 || res.status === 405) this.missing.add(path);
      if (res.status < 200 || res.status > 299) return null;
      const json = JSON.parse(res.text) as unknown;
      return json !== null && typeof json === 'object' ? (json as Json) : null;
    } catch {
      return null;
    }
  }

  /** `POST /tokenize`, vLLM's shape (`prompt` or `messages`) or llama.cpp's (`content`, `add_special`). */
  async tokenize(body: Json, text: string | null, headers: IncomingHttpHeaders): Promise<number[] | null> {
    const tokens = (await this.post('/tokenize', body, headers))?.tokens;
    if (!Array.isArray(tokens) || !tokens.every((t) => typeof t === 'number')) return null;
    if (tokens.length === 0 && text !== '') return null;
    return tokens as number[];
  }

  /** `text`'s ids from the upstream's `/tokenize`, asked in the shapes its dialect speaks, or null. */
  async tokenizeText(dialect: TokenizeDialect, text: string, addSpecial: boolean, model: Json, headers: IncomingHttpHeaders): Promise<number[] | null> {
    const vllmShape = dialect === 'vllm' || dialect === 'sglang' || dialect === 'probe';
    const llamaShape = dialect === 'llama.cpp' || dialect === 'probe';
    return (
      (vllmShape ? await this.tokenize({ ...model, prompt: text, add_special_tokens: addSpecial }, text, headers) : null) ??
      (llamaShape ? await this.tokenize({ content: text, add_special: addSpecial }, text, headers) : null)
    );
  }

  /** llama.cpp's `POST /apply-template`: the chat rendered by the server's own template. */
  async applyTemplate(body: Json, headers: IncomingHttpHeaders): Promise<string | null> {
    const prompt = (await this.post('/apply-template', body, headers))?.prompt;
    return typeof prompt === 'string' ? prompt : null;
  }
}

/** Pieces sent to be tokenized at once: an engine's tokenizer is asked in bounded bursts, not a request per token at once. */
const PIECES_AT_ONCE = 32;

const CHAT_TEMPLATE_FIELDS = ['add_generation_prompt', 'continue_final_message', 'add_special_tokens', 'chat_template', 'chat_template_kwargs', 'tools'];

function pick(request: Json, fields: readonly string[]): Json {
  const out: Json = {};
  for (const k of fields) if (request[k] !== undefined) out[k] = request[k];
  return out;
}

/**
 * The stop as vLLM's `stop_reason` says it (what a replay answers): a stop string, a `stop_token_ids` hit, or
 * null for the model's own EOS, which SGLang's `matched_stop` names by its id.
 */
function vllmStopReason(stop: string | number | null, request: Json): string | number | null {
  if (typeof stop !== 'number') return stop;
  return Array.isArray(request.stop_token_ids) && request.stop_token_ids.includes(stop) ? stop : null;
}

/** A generate request's `token_ids`: the engine's prompt as is (vLLM applies no template to them). */
function generatePromptIds(request: Json): { ids: number[]; source: TokenSource } | null {
  const ids = request.token_ids;
  return Array.isArray(ids) && ids.every((t) => Number.isInteger(t)) ? { ids: ids as number[], source: 'engine' } : null;
}

/** What the recorder needs of a tokenizer (only for engines that send no token ids). */
export type RecorderTokenizer = Pick<ModelTokenizer, 'renderChatGuarded' | 'encode' | 'eosTokenIds'>;

/**
 * Turns proxied exchanges into stored ones: prompt and output token ids, timing, redacted headers. Runs on
 * the thread that calls `sink`; `mocker capture` runs it in a worker thread (see recorderThread.ts).
 */
/** A completions request with a list of several prompts (strings or token-id lists): vLLM's batched completions. */
export function isPromptBatch(endpoint: string, request: Json): boolean {
  const prompt = request.prompt;
  return endpoint === 'completion' && Array.isArray(prompt) && prompt.length > 1 && prompt.every((p) => typeof p === 'string' || Array.isArray(p));
}

/**
 * `capture --redact-bodies`: the exchange's token ids, timing, status and usage, without anything that holds
 * its text (request body and its shape, response bytes, output text and chunk deltas); a replay renders the
 * text from the ids.
 */
export function withoutBodies(ex: Exchange): Exchange {
  return {
    ...ex,
    bodiesRedacted: true,
    requestBody: Buffer.alloc(0),
    responseBody: Buffer.alloc(0),
    requestShape: null,
    generations: ex.generations.map((g) => ({ ...g, text: '', chunkDeltas: [] })),
  };
}

export class Recorder {
  constructor(
    private readonly store: CaptureStore,
    private readonly runId: number,
    private readonly tokenizer: RecorderTokenizer,
    upstream: { url: URL; tls: UpstreamTls },
    private readonly redacted: ReadonlySet<string>,
    private readonly redactBodies = false,
  ) {
    this.upstreamTokenizer = new UpstreamTokenizer(upstream.url, upstream.tls);
  }

  private readonly upstreamTokenizer: UpstreamTokenizer;

  /** Stores generation and pooling exchanges; everything else the proxy forwards (health checks, /v1/models…) is not recorded. */
  readonly sink: ExchangeSink = async (raw) => {
    if (!raw.endpoint) return;
    const ex = await this.build(raw);
    await this.commit(this.redactBodies ? withoutBodies(ex) : ex);
  };

  /** Built exchanges waiting for the next group commit, each with what settles its sink. */
  private queued: { ex: Exchange; resolve(): void; reject(err: unknown): void }[] = [];

  /**
   * Group commit: the exchanges built in one turn of the event loop (several ended while the recorder was busy)
   * are saved in one transaction; each sink still resolves only once its own exchange is committed.
   */
  private commit(ex: Exchange): Promise<void> {
    return new Promise((resolve, reject) => {
      this.queued.push({ ex, resolve, reject });
      if (this.queued.length === 1) setImmediate(() => this.flush());
    });
  }

  private flush(): void {
    const batch = this.queued;
    this.queued = [];
    try {
      this.store.saveExchanges(batch.map((q) => q.ex));
      for (const q of batch) q.resolve();
    } catch (err) {
      if (batch.length === 1) return batch[0].reject(err);
      // The batch was rolled back: saved one by one, only the exchange at fault fails.
      for (const q of batch) {
        try {
          this.store.saveExchange(q.ex);
          q.resolve();
        } catch (one) {
          q.reject(one);
        }
      }
    }
  }

  private async promptIds(kind: 'chat' | 'completion', request: Json, raw: RawExchange): Promise<{ ids: number[]; source: TokenSource } | null> {
    const headers = raw.requestHeaders;
    const dialect = raw.tokenize;
    const model = request.model === undefined ? {} : { model: request.model };
    const asks = (shape: 'vllm' | 'llama.cpp') => dialect === shape || dialect === 'probe' || (shape === 'vllm' && dialect === 'sglang');
    if (kind === 'chat') {
      if (asks('vllm')) {
        const ids = await this.upstreamTokenizer.tokenize({ ...model, messages: request.messages, ...pick(request, CHAT_TEMPLATE_FIELDS) }, null, headers);
        if (ids && ids.length > 0) return { ids, source: 'tokenize-endpoint' };
      }
      if (asks('llama.cpp')) {
        // llama.cpp renders the chat with its own template, then tokenizes it with special tokens, as its chat endpoint does.
        const prompt = await this.upstreamTokenizer.applyTemplate({ messages: request.messages, ...pick(request, ['tools', 'chat_template_kwargs']) }, headers);
        const ids = prompt === null ? null : await this.upstreamTokenizer.tokenize({ content: prompt, add_special: true }, prompt, headers);
        if (ids) return { ids, source: 'tokenize-endpoint' };
      }
      try {
        // A template sent with the request may be hostile: it must not stall the recording of every other exchange.
        const prompt = await this.tokenizer.renderChatGuarded(request as never);
        return { ids: await this.tokenizer.encode(prompt, request.add_special_tokens === true), source: 'local' };
      } catch {
        return null;
      }
    }
    const prompt = request.prompt;
    if (Array.isArray(prompt) && prompt.every((t) => typeof t === 'number')) return { ids: prompt as number[], source: 'local' };
    if (typeof prompt !== 'string') return null;
    const addSpecial = request.add_special_tokens !== false;
    const ids = await this.upstreamTokenizer.tokenizeText(dialect, prompt, addSpecial, model, headers);
    if (ids) return { ids, source: 'tokenize-endpoint' };
    return { ids: await this.tokenizer.encode(prompt, addSpecial), source: 'local' };
  }

  /** A text's ids: the upstream's /tokenize where it has one, else the local tokenizer. */
  private async textIds(text: string, raw: RawExchange, model: Json): Promise<{ ids: number[]; source: TokenSource }> {
    const upstreamIds = await this.upstreamTokenizer.tokenizeText(raw.tokenize, text, false, model, raw.requestHeaders);
    return upstreamIds ? { ids: upstreamIds, source: 'tokenize-endpoint' } : { ids: await this.tokenizer.encode(text, false), source: 'local' };
  }

  /**
   * One id per streamed piece, when the engine sent one token per chunk: each piece tokenized alone, or after the
   * piece before it (a piece may tokenize otherwise at the start of a text). Null when a piece does not come out
   * as exactly one token: the engine's ids cannot be recovered from its text.
   */
  private async pieceIds(pieces: string[], raw: RawExchange, model: Json): Promise<number[] | null> {
    const ids: number[] = [];
    for (let start = 0; start < pieces.length; start += PIECES_AT_ONCE) {
      const batch = pieces.slice(start, start + PIECES_AT_ONCE);
      const alone = await Promise.all(batch.map((piece) => this.textIds(piece, raw, model)));
      for (const [k, { ids: own }] of alone.entries()) {
        const i = start + k;
        if (own.length === 1) ids.push(own[0]);
        else if (i === 0) return null;
        else {
          const { ids: inContext } = await this.textIds(pieces[i - 1] + pieces[i], raw, model);
          if (inContext.length !== 2 || inContext[0] !== ids[i - 1]) return null;
          ids.push(inContext[1]);
        }
      }
    }
    return ids;
  }

  /**
   * The ids of a generation whose engine sent none. Its text re-tokenized gives other ids than the engine made
   * when the model's tokens do not re-merge as they came out (llama.cpp's random-weight outputs: 37 ids for 32
   * tokens); so when the engine's own count (one token per chunk) disagrees, the pieces are tokenized one by one.
   */
  private async outputIds(gen: Generation, raw: RawExchange, model: Json): Promise<{ generation: Generation; source: TokenSource }> {
    // The token that stopped generation is in the engine's ids but not in the text: a stop_token_ids hit (or
    // SGLang's matched_stop) names it; an EOS stop vLLM does not name is the model's EOS.
    const stopToken =
      typeof gen.stopReason === 'number'
        ? gen.stopReason
        : gen.stopReason === null && gen.finishReason !== 'length'
          ? this.tokenizer.eosTokenIds[0]
          : undefined;
    const endsOnStopToken = stopToken !== undefined && gen.finishReason !== null && gen.finishReason !== 'abort';
    const whole = await this.textIds(gen.text, raw, model);
    let ids = whole.ids;
    const pieces = raw.stream ? streamedPieces(raw.endpoint === 'chat' ? 'chat' : 'completion', gen, endsOnStopToken) : null;
    if (pieces && pieces.length !== ids.length) ids = (await this.pieceIds(pieces, raw, model)) ?? ids;
    if (endsOnStopToken) ids = [...ids, stopToken];
    return { generation: withOutputIds(gen, ids), source: whole.source };
  }

  /** The first model the upstream's `/v1/models` listed when the run started (null: not known). */
  private servedModel(): string | null {
    try {
      const models = JSON.parse(this.store.getRun(this.runId)?.modelsJson ?? 'null') as { data?: { id?: unknown }[] } | null;
      const id = models?.data?.[0]?.id;
      return typeof id === 'string' ? id : null;
    } catch {
      return null;
    }
  }

  /**
   * A Responses or Messages exchange's prompt ids, as for the chat vLLM runs it as (its translation rendered by the
   * upstream's /tokenize, else the local template), and its output ids from its text: looked up by them, a replay
   * answers it with its own bytes. Without a translation (a `previous_response_id` names a turn the engine stored;
   * a request vLLM refuses) it is kept with no ids, never replayed.
   */
  private async agentExchange(ex: Exchange, api: 'responses' | 'messages', raw: RawExchange): Promise<Exchange> {
    const chat = raw.request && ex.outcome === 'complete' ? agentChatBody(api, raw.request) : null;
    if (!chat) return ex;
    const prompt = await this.promptIds('chat', chat, raw);
    const outputs = await Promise.all(ex.generations.map((g) => this.outputIds(g, raw, ex.model === null ? {} : { model: ex.model })));
    const sources = [prompt?.source ?? 'local', ...outputs.map((o) => o.source)];
    return {
      ...ex,
      promptIds: prompt?.ids ?? null,
      requestShape: requestShape(api, raw.request!),
      generations: outputs.map((o) => o.generation),
      tokenSource: leastExact(sources),
    };
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
    if (raw.endpoint === 'embeddings' || raw.endpoint === 'rerank') return withPoolingAnswer(ex, raw.endpoint, raw.request);
    if (raw.endpoint === 'responses' || raw.endpoint === 'messages') return this.agentExchange(withAgentAnswer(ex, raw.endpoint, raw), raw.endpoint, raw);
    // vLLM's generate answers as a completion would with return_token_ids, less the text: read as one.
    const kind = raw.endpoint === 'generate' ? 'completion' : raw.endpoint;
    const parsed = parseResponse(kind, raw.stream, raw.responseBody, raw.eventEnds, raw.eventTimes, raw.totalMs);
    // Replays are looked up by the model clients ask for (`transformers serve` answers with another name).
    // A generate stream names no model, nor need its request: the engine's (it serves one) is the one that answered.
    ex.model = ex.model ?? parsed.model ?? (raw.endpoint === 'generate' ? this.servedModel() : null);
    ex.usage = parsed.usage;
    ex.eventTokens = parsed.eventTokens;
    try {
      ex.requestShape = requestShape(raw.endpoint, raw.request);
    } catch {
      // Too deeply nested to canonicalise (an engine answered it all the same): rendered on replay, never verbatim.
      ex.requestShape = null;
    }
    if (parsed.error) {
      ex.outcome = 'failed';
      ex.error = parsed.error;
    }
    const modelField = ex.model === null ? {} : { model: ex.model };
    const prompt = parsed.promptIds
      ? { ids: parsed.promptIds, source: 'engine' as const }
      : raw.endpoint === 'generate'
        ? generatePromptIds(raw.request)
        : await this.promptIds(raw.endpoint, raw.request, raw);
    ex.promptIds = prompt?.ids ?? null;
    if (isPromptBatch(raw.endpoint, raw.request)) {
      // Its choices belong to different prompts: keyed by one of them, a replay of that prompt would serve the
      // others' answers. Kept whole, without a lookup key, until batches are stored per prompt.
      ex.promptIds = null;
      ex.error = 'a batch of prompts is stored whole, not per prompt: never replayed';
    }
    const sources: TokenSource[] = [prompt?.source ?? 'local'];
    if (parsed.outputIdsFromEngine) ex.generations = parsed.generations;
    else {
      const outputs = await Promise.all(parsed.generations.map((g) => this.outputIds(g, raw, modelField)));
      ex.generations = outputs.map((o) => o.generation);
      sources.push(...outputs.map((o) => o.source));
    }
    const request = raw.request;
    ex.generations = ex.generations.map((g) => ({ ...g, stopReason: vllmStopReason(g.stopReason, request) }));
    // The capture is only as exact as its least exact token ids.
    ex.tokenSource = leastExact(sources);
    if (ex.generations.length === 0 && ex.outcome === 'complete') {
      ex.outcome = 'failed';
      ex.error = 'the response held no choices';
    }
    return ex;
  }
}

/** A capture is only as exact as its least exact token ids. */
function leastExact(sources: readonly TokenSource[]): TokenSource {
  return sources.includes('local') ? 'local' : sources.includes('tokenize-endpoint') ? 'tokenize-endpoint' : 'engine';
}

/** The chat body vLLM runs for an agent API's request, or null when the request alone does not give it. */
function agentChatBody(api: 'responses' | 'messages', request: Json): Json | null {
  try {
    if (api === 'messages') return messagesChatBody(parseBody(anthropicMessagesRequest, request));
    return translateResponsesRequest(
      request,
      () => {
        throw new Error('the previous turn is the engine’s');
      },
      false,
    ).chat;
  } catch {
    return null;
  }
}

/**
 * A Responses or Messages exchange: its answer read into one chat-shaped choice (text, reasoning, tool calls), its
 * model and usage (the engine returns no ids: `agentExchange` works them out).
 */
function withAgentAnswer(ex: Exchange, api: 'responses' | 'messages', raw: RawExchange): Exchange {
  const parsed = parseAgentResponse(api, raw.stream, raw.responseBody, raw.eventEnds);
  const failed = parsed.error !== null ? { outcome: 'failed' as const, error: parsed.error } : {};
  // No token is known to have come with any event.
  const eventTokens = raw.eventEnds.map(() => 0);
  return { ...ex, model: ex.model ?? parsed.model, usage: parsed.usage, eventTokens, generations: [parsed.generation], ...failed };
}

/**
 * A complete embeddings or rerank exchange, keyed by its route, model and inputs; its usage and (when the request
 * names none) the model from the answer. Replayed whole: nothing else is derived from it.
 */
function withPoolingAnswer(ex: Exchange, kind: PoolingKind, request: Json): Exchange {
  let answer: unknown;
  try {
    answer = JSON.parse(ex.responseBody.toString('utf8'));
  } catch {
    return { ...ex, outcome: 'failed', error: 'unparsable JSON response body' };
  }
  // TEI's rerank answers a bare list: no model, no usage.
  const fields = answer !== null && typeof answer === 'object' && !Array.isArray(answer) ? (answer as Json) : {};
  const inputs = poolingInputs(kind, request);
  return {
    ...ex,
    model: ex.model ?? (typeof fields.model === 'string' ? fields.model : null),
    usage: fields.usage,
    poolingKey: poolingKey(ex.path, inputs),
  };
}
