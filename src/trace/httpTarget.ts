/**
 * Real servers as trace replay workers (`mocker trace --target`, engine-reference §8.6): each request is an
 * OpenAI completions request with a token-id prompt, streamed; the server's KV events (vLLM's ZMQ stream,
 * vllm-wire-reference §5) feed the router in its local block hashes, and its Prometheus cache gauges feed
 * the charts. Nothing here assumes the server is vLLM: a field it refuses is no longer sent, and what it
 * does not report (cached tokens, output ids, metrics) stays unknown.
 */
import http, { type IncomingMessage } from 'node:http';
import https from 'node:https';
import { createParser } from 'eventsource-parser';
import { Subscriber } from 'zeromq';
import { decodeKvEventBatch } from '../events/decoding.js';
import type { PassSample } from './collector.js';
import { KvEventBridge } from './kvBridge.js';
import type { OnlineAnswer, OnlineRequest, OnlineSink, OnlineWorker } from './online.js';
import type { RouterKvEvent } from './router.js';

export interface HttpTarget {
  /** The server's base URL (`http://host:port`). */
  url: string;
  /** Its KV events PUB endpoint (`tcp://host:5557`); one with `*` as host is bound here, for publishers that connect. */
  kvEvents?: string;
}

export interface TargetOptions {
  /** The model to ask for; else the first one the server lists. */
  model?: string;
  /** The router's block size: KV events of other block sizes cannot match its hashes. */
  routerBlockSize: number;
  /** A request with no byte from the server for this long is given up (ms; null: wait for ever). */
  stallTimeoutMs: number | null;
}

/** vLLM extensions a server may refuse (400/422 naming the field): then sent to it no more. */
const OPTIONAL_FIELDS = ['return_token_ids', 'ignore_eos'] as const;
type OptionalField = (typeof OPTIONAL_FIELDS)[number];

const METRICS_EVERY_MS = 500;
const LOOKUP_TIMEOUT_MS = 10_000;
const HANDSHAKE_TIMEOUT_MS = 5_000;
/** A subscription reaches the publisher a little after the handshake (ZMQ's slow joiner). */
const SUBSCRIPTION_SETTLE_MS = 200;

type Json = Record<string, unknown>;

const isJson = (value: unknown): value is Json => value !== null && typeof value === 'object' && !Array.isArray(value);
const messageOf = (err: unknown) => (err instanceof Error ? err.message : String(err));
const failure = (error: string): OnlineAnswer => ({ error });

async function readText(res: IncomingMessage): Promise<string> {
  res.setEncoding('utf8');
  let text = '';
  for await (const chunk of res) text += chunk as string;
  return text;
}

/** The message of an error body in the shapes OpenAI-compatible servers use, else the body itself. */
function serverMessage(body: string): string {
  try {
    const json: unknown = JSON.parse(body);
    if (isJson(json)) {
      const message = isJson(json.error) ? json.error.message : (json.message ?? json.error ?? json.detail);
      if (typeof message === 'string') return message;
      if (message !== undefined) return JSON.stringify(message);
    }
  } catch {
    // Not JSON: the text is the message.
  }
  return body.trim().slice(0, 500) || '(empty body)';
}

/** A Prometheus sample line: name, optional labels (quoted values may hold braces), value. */
const SAMPLE_LINE = /^([A-Za-z_:][\w:]*)(?:\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?\s+(\S+)/;

/**
 * The cache state in a `/metrics` text: KV usage (mean over the server's engines) and its prefix cache
 * counters (summed), under vLLM's names or, for versions before them, the deprecated `gpu_` ones.
 */
export function cacheSample(text: string): PassSample | null {
  const sums = new Map<string, { total: number; count: number }>();
  for (const line of text.split('\n')) {
    const m = SAMPLE_LINE.exec(line);
    if (!m) continue;
    const value = Number(m[2]);
    if (!Number.isFinite(value)) continue;
    const sum = sums.get(m[1]) ?? { total: 0, count: 0 };
    sum.total += value;
    sum.count++;
    sums.set(m[1], sum);
  }
  const pick = (...names: string[]) => names.map((n) => sums.get(n)).find((s) => s !== undefined);
  const usage = pick('vllm:kv_cache_usage_perc', 'vllm:gpu_cache_usage_perc');
  if (!usage) return null;
  return {
    activeBlocks: (usage.total / usage.count) * 1000,
    totalBlocks: 1000,
    prefixCacheQueries: pick('vllm:prefix_cache_queries_total', 'vllm:gpu_prefix_cache_queries_total')?.total ?? 0,
    prefixCacheHits: pick('vllm:prefix_cache_hits_total', 'vllm:gpu_prefix_cache_hits_total')?.total ?? 0,
  };
}

/** One server. Made by `connectTargets`, which also finds its model and connects its KV events. */
export class HttpTargetWorker implements OnlineWorker {
  readonly name: string;
  private readonly base: URL;
  private readonly agent: http.Agent;
  private readonly refused = new Set<OptionalField>();
  private listener: ((events: RouterKvEvent[]) => void) | null = null;
  /** Events that arrived before a listener was registered: the cache the run starts from. */
  private early: RouterKvEvent[] = [];
  private socket: Subscriber | null = null;
  private latest: PassSample | null = null;
  private scraper: NodeJS.Timeout | null = null;
  private scraping = false;
  private closed = false;
  private lastSeq: bigint | null = null;
  private readonly warned = new Set<string>();

  /** Set once by `chooseModel`, before any request. */
  private model = '';

  constructor(
    url: string,
    private readonly index: number,
    private readonly bridge: KvEventBridge,
    private readonly routerBlockSize: number,
    private readonly stallTimeoutMs: number | null,
  ) {
    this.base = new URL(url);
    this.name = this.base.href.replace(/\/$/, '');
    // Keep-alive and no socket limit: hundreds of concurrent streams each hold a connection.
    this.agent =
      this.base.protocol === 'https:' ? new https.Agent({ keepAlive: true, maxSockets: Infinity }) : new http.Agent({ keepAlive: true, maxSockets: Infinity });
  }

  private request(method: 'GET' | 'POST', path: string, body: string | null, timeoutMs: number | null): Promise<IncomingMessage> {
    // Below the base URL's own path (a server behind a prefix).
    const url = new URL(this.base.pathname.replace(/\/$/, '') + path, this.base);
    const send = url.protocol === 'https:' ? https.request : http.request;
    return new Promise((resolve, reject) => {
      const headers: http.OutgoingHttpHeaders = body === null ? {} : { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) };
      let response: IncomingMessage | null = null;
      const req = send(url, { method, agent: this.agent, headers }, (res) => resolve((response = res)));
      req.on('error', reject);
      // An idle timeout of the socket: it also ends a stream whose server stops sending after its headers,
      // and the stream's reader is given the reason rather than a bare "aborted".
      if (timeoutMs !== null) {
        req.setTimeout(timeoutMs, () => {
          const stalled = new Error(`nothing received for ${timeoutMs / 1000} s`);
          response?.destroy(stalled);
          req.destroy(stalled);
        });
      }
      req.end(body ?? undefined);
    });
  }

  /** `GET path` as text; throws with the URL, the status and the server's message unless it answers 200. */
  private async getText(path: string, timeoutMs: number): Promise<string> {
    const where = this.name + path;
    let res: IncomingMessage;
    try {
      res = await this.request('GET', path, null, timeoutMs);
    } catch (err) {
      throw new Error(`cannot reach ${where}: ${messageOf(err)}`);
    }
    const text = await readText(res);
    if (res.statusCode !== 200) throw new Error(`GET ${where} answered HTTP ${res.statusCode}: ${serverMessage(text)}`);
    return text;
  }

  /** `model`, else the first model the server lists; throws naming the server when it cannot tell. */
  async chooseModel(model: string | undefined): Promise<void> {
    if (model !== undefined) {
      this.model = model;
      return;
    }
    const body = await this.getText('/v1/models', LOOKUP_TIMEOUT_MS);
    let list: unknown;
    try {
      list = JSON.parse(body);
    } catch {
      throw new Error(`${this.name}/v1/models is not JSON: ${body.slice(0, 200)}`);
    }
    const first: unknown = isJson(list) && Array.isArray(list.data) ? list.data[0] : undefined;
    if (!isJson(first) || typeof first.id !== 'string') throw new Error(`${this.name}/v1/models lists no model: give --model`);
    this.model = first.id;
  }

  async send(request: OnlineRequest, sink: OnlineSink): Promise<OnlineAnswer> {
    for (;;) {
      const sent = OPTIONAL_FIELDS.filter((field) => !this.refused.has(field));
      const body: Json = { model: this.model, prompt: request.prompt, max_tokens: request.maxTokens, stream: true, stream_options: { include_usage: true } };
      for (const field of sent) body[field] = true;
      let res: IncomingMessage;
      try {
        res = await this.request('POST', '/v1/completions', JSON.stringify(body), this.stallTimeoutMs);
      } catch (err) {
        return failure(`${this.name}: ${messageOf(err)}`);
      }
      if (res.statusCode === 200) return this.readStream(res, sink);
      let text: string;
      try {
        text = await readText(res);
      } catch (err) {
        return failure(`HTTP ${res.statusCode}, then the connection broke: ${messageOf(err)}`);
      }
      const refusal = res.statusCode === 400 || res.statusCode === 422 ? sent.filter((field) => text.includes(field)) : [];
      if (refusal.length === 0) return failure(`HTTP ${res.statusCode}: ${serverMessage(text)}`);
      for (const field of refusal) this.refused.add(field);
      this.warnOnce(`refuses ${refusal.join(', ')}`, `${this.name} refuses ${refusal.join(', ')}: no longer sent to it`);
    }
  }

  private async readStream(res: IncomingMessage, sink: OnlineSink): Promise<OnlineAnswer> {
    sink.admitted(0);
    let error: string | null = null;
    let events = 0;
    /** The body's first bytes, to show what the server sent when it was not an event stream. */
    let head = '';
    const parser = createParser({
      onEvent: ({ data }) => {
        events++;
        if (data === '[DONE]' || error !== null) return;
        let chunk: unknown;
        try {
          chunk = JSON.parse(data);
        } catch {
          error = `a stream event is not JSON: ${data.slice(0, 200)}`;
          return;
        }
        if (!isJson(chunk)) return;
        if (chunk.error !== undefined) {
          error = `error in the stream: ${serverMessage(data)}`;
          return;
        }
        const choice = Array.isArray(chunk.choices) ? chunk.choices.find((c: unknown) => isJson(c) && (c.index ?? 0) === 0) : undefined;
        if (isJson(choice)) {
          const count = Array.isArray(choice.token_ids) ? choice.token_ids.length : typeof choice.text === 'string' && choice.text.length > 0 ? 1 : 0;
          if (count > 0) sink.tokens(count);
        }
        const usage = chunk.usage;
        if (isJson(usage) && isJson(usage.prompt_tokens_details) && typeof usage.prompt_tokens_details.cached_tokens === 'number') {
          sink.admitted(usage.prompt_tokens_details.cached_tokens);
        }
      },
    });
    res.setEncoding('utf8');
    try {
      for await (const piece of res) {
        if (head.length < 200) head += (piece as string).slice(0, 200 - head.length);
        parser.feed(piece as string);
      }
    } catch (err) {
      return failure(`${this.name}: the stream broke: ${messageOf(err)}`);
    }
    if (error !== null) return failure(error);
    if (events === 0) return failure(`${this.name} answered 200 without a server-sent event: ${JSON.stringify(head)}`);
    return { error: null };
  }

  onKvEvents(listener: (events: RouterKvEvent[]) => void): void {
    this.listener = listener;
    if (this.early.length > 0) listener(this.early);
    this.early = [];
  }

  /** Subscribes to the server's KV events; a connecting subscriber waits for the publisher's handshake. */
  async subscribe(endpoint: string): Promise<void> {
    const socket = new Subscriber();
    this.socket = socket;
    socket.subscribe();
    if (endpoint.includes('*')) await socket.bind(endpoint);
    else {
      await new Promise<void>((resolve, reject) => {
        const done = () => {
          clearTimeout(timer);
          socket.events.off('handshake', done);
          resolve();
        };
        const timer = setTimeout(() => {
          socket.events.off('handshake', done);
          reject(new Error(`no KV events publisher answered at ${endpoint} (for ${this.name}) within ${HANDSHAKE_TIMEOUT_MS / 1000} s`));
        }, HANDSHAKE_TIMEOUT_MS);
        socket.events.on('handshake', done);
        socket.connect(endpoint);
      });
    }
    void this.readKvEvents(socket, endpoint);
  }

  private async readKvEvents(socket: Subscriber, endpoint: string): Promise<void> {
    try {
      for await (const frames of socket) {
        // [topic, seq (u64 BE), payload]
        const seqFrame = frames.length >= 3 ? frames[frames.length - 2] : null;
        if (seqFrame?.length === 8) {
          const seq = seqFrame.readBigUInt64BE();
          if (this.lastSeq !== null && seq > this.lastSeq + 1n) {
            this.warnOnce(
              'gap',
              `KV events of ${this.name} (${endpoint}): batches ${this.lastSeq + 1n}–${seq - 1n} were lost; the router's view of its cache may be stale`,
            );
          }
          this.lastSeq = seq;
        }
        let batch;
        try {
          batch = decodeKvEventBatch(frames[frames.length - 1]);
        } catch (err) {
          this.warnOnce('undecodable', `KV events of ${this.name} (${endpoint}): ${messageOf(err)}; such batches are skipped`);
          continue;
        }
        const events = this.bridge.translate(this.index, batch.events, this.routerBlockSize);
        if (events.length === 0) continue;
        if (this.listener) this.listener(events);
        else this.early.push(...events);
      }
    } catch (err) {
      if (!this.closed) this.warnOnce('socket', `KV events of ${this.name} (${endpoint}) stopped: ${messageOf(err)}`);
    }
  }

  private warnOnce(key: string, message: string): void {
    if (this.warned.has(key)) return;
    this.warned.add(key);
    console.warn(`mocker trace: ${message}`);
  }

  /** Scrapes `/metrics` in the background; a server without them (404) is not asked again. */
  startScraping(): void {
    const scrape = async () => {
      if (this.scraping || this.closed) return;
      this.scraping = true;
      try {
        const res = await this.request('GET', '/metrics', null, METRICS_EVERY_MS * 4);
        const text = await readText(res);
        if (res.statusCode === 404) this.stopScraping();
        else if (res.statusCode === 200) this.latest = cacheSample(text) ?? this.latest;
      } catch {
        // A missed scrape: the last sample stands.
      } finally {
        this.scraping = false;
      }
    };
    void scrape();
    this.scraper = setInterval(() => void scrape(), METRICS_EVERY_MS);
    this.scraper.unref();
  }

  private stopScraping(): void {
    if (this.scraper) clearInterval(this.scraper);
    this.scraper = null;
  }

  sample(): PassSample | null {
    return this.latest;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.stopScraping();
    this.socket?.close();
    this.agent.destroy();
  }
}

/**
 * One worker per target, in order (worker i is `targets[i]`): each with its model (`options.model`, else the
 * first listed by `GET /v1/models`), its KV events subscribed and its metrics scraped. Throws naming the
 * target that cannot be reached; nothing stays open then.
 */
export async function connectTargets(targets: HttpTarget[], options: TargetOptions): Promise<HttpTargetWorker[]> {
  const bridge = new KvEventBridge(targets.length);
  const workers: HttpTargetWorker[] = [];
  try {
    for (const [index, target] of targets.entries()) {
      let base: URL;
      try {
        base = new URL(target.url);
      } catch {
        throw new Error(`target ${target.url}: not a URL`);
      }
      if (base.protocol !== 'http:' && base.protocol !== 'https:') throw new Error(`target ${target.url}: not an http(s) URL`);
      const worker = new HttpTargetWorker(target.url, index, bridge, options.routerBlockSize, options.stallTimeoutMs);
      workers.push(worker);
      await worker.chooseModel(options.model);
      if (target.kvEvents !== undefined) await worker.subscribe(target.kvEvents);
      worker.startScraping();
    }
    if (targets.some((t) => t.kvEvents !== undefined)) await new Promise((resolve) => setTimeout(resolve, SUBSCRIPTION_SETTLE_MS));
  } catch (err) {
    await Promise.all(workers.map((w) => w.close()));
    throw err;
  }
  return workers;
}
