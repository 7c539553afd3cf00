/**
 * Which engine a capture proxies, told from what it answers, and how to speak to it: each engine has its own
 * way (or none) to report token ids and its own tokenizer endpoint.
 */
import { UpstreamPool } from './upstreamHttp.js';
import type { UpstreamTls } from '../wire/tls.js';

/** The engines mocker knows how to capture from; `openai` is any other OpenAI-compatible server. */
export type EngineKind = 'vllm' | 'sglang' | 'llama.cpp' | 'transformers' | 'openai' | 'unknown';

/** How the recorder gets token ids the engine did not send: its own endpoints, else the local tokenizer. */
export type TokenizeDialect =
  /** vLLM's `POST /tokenize` with `prompt` or `messages`. */
  | 'vllm'
  /** The same shape: SGLang's `/tokenize` has taken `messages` since 2026 (an older one refuses them: the local template then). */
  | 'sglang'
  /** llama.cpp's `POST /apply-template` for chats, then `POST /tokenize {"content", "add_special"}`. */
  | 'llama.cpp'
  /** No tokenizer endpoint: the local tokenizer and the model's chat template. */
  | 'none'
  /** Not known yet: vLLM's shape, then llama.cpp's, then the local tokenizer. */
  | 'probe';

export interface EngineDialect {
  /** `return_token_ids: true` is injected into generation requests (vLLM ≥ 0.10.2, SGLang since mid-2026 answer with the ids). */
  injectTokenIds: boolean;
  /** A streamed chat may carry it too: SGLang refuses that pair with a 400, so its streamed chats never get it. */
  streamedChatIds: boolean;
  /** What the engine writes for the token-id fields when not asked: vLLM nulls, SGLang leaves them out. */
  unaskedIds: 'null' | 'absent';
  tokenize: TokenizeDialect;
}

export function dialectOf(kind: EngineKind): EngineDialect {
  switch (kind) {
    case 'vllm':
      return { injectTokenIds: true, streamedChatIds: true, unaskedIds: 'null', tokenize: 'vllm' };
    case 'sglang':
      // An SGLang older than the field ignores it, as it ignores every field it does not know.
      return { injectTokenIds: true, streamedChatIds: false, unaskedIds: 'absent', tokenize: 'sglang' };
    case 'llama.cpp':
      // llama.cpp accepts the field and ignores it: injecting would change nothing but the bytes it receives.
      return { injectTokenIds: false, streamedChatIds: false, unaskedIds: 'null', tokenize: 'llama.cpp' };
    case 'transformers':
      // `transformers serve` refuses unknown fields with a 422.
      return { injectTokenIds: false, streamedChatIds: false, unaskedIds: 'null', tokenize: 'none' };
    case 'openai':
    case 'unknown':
      // Worth asking: a server that refuses the field is asked again without it (see forward.ts).
      return { injectTokenIds: true, streamedChatIds: true, unaskedIds: 'null', tokenize: 'probe' };
  }
}

export interface EngineIdentity {
  kind: EngineKind;
  versionJson?: string;
  engineVersion?: string;
  modelsJson?: string;
  maxModelLen?: number;
  /** The first served model's `root` (its path or HF id), to find its tokenizer locally. */
  modelRoot?: string;
}

/** A capture run's columns for what its upstream said it is. */
export function runColumns(identity: EngineIdentity) {
  return {
    engine: identity.kind,
    engineVersion: identity.engineVersion,
    versionJson: identity.versionJson,
    modelsJson: identity.modelsJson,
    maxModelLen: identity.maxModelLen,
  };
}

/** "vllm 0.11.0", "llama.cpp", or that it is not known yet. */
export function describeEngine(identity: EngineIdentity): string {
  return identity.kind === 'unknown' ? 'engine not identified yet' : `${identity.kind}${identity.engineVersion ? ` ${identity.engineVersion}` : ''}`;
}

interface Probe {
  status: number;
  server: string;
  text: string;
}

/** How long a probe may wait for bytes before the upstream counts as not answering. */
const PROBE_TIMEOUT_MS = 5000;

async function probe(pool: UpstreamPool, url: URL): Promise<Probe | null> {
  try {
    const res = await pool.text('GET', url.pathname + url.search);
    return { status: res.status, server: String(res.headers.server ?? ''), text: res.text };
  } catch {
    return null;
  }
}

function json(p: Probe | null): Record<string, unknown> | undefined {
  if (p?.status !== 200) return undefined;
  try {
    const value = JSON.parse(p.text) as unknown;
    return value !== null && typeof value === 'object' && !Array.isArray(value) ? (value as Record<string, unknown>) : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Asks the upstream what it is: vLLM answers `/version` and owns its models (`owned_by: "vllm"`); llama.cpp's
 * server says so in its `Server` header and answers `/props`; SGLang answers `/get_model_info` (deprecated in
 * 2026 for `/model_info`) and owns its models (`owned_by: "sglang"`); `transformers
 * serve` is a FastAPI app without `/version` (`{"detail":"Not Found"}`). Anything else that answers is a plain
 * OpenAI-compatible server; nothing answering at all is `unknown` (asked again once it answers).
 */
export async function identifyEngine(upstream: URL, tls: UpstreamTls = {}): Promise<EngineIdentity> {
  const base = upstream.pathname.replace(/\/$/, '');
  const at = (path: string) => new URL(`${base}${path}`, upstream);
  // The proxy's own client (with its CA), as the exchanges will be sent.
  const pool = new UpstreamPool(upstream, PROBE_TIMEOUT_MS, tls);
  const paths = ['/version', '/v1/models', '/props', '/get_model_info'];
  const [version, models, props, sglangInfo] = await Promise.all(paths.map((path) => probe(pool, at(path)))).finally(() => pool.close());
  const identity: EngineIdentity = { kind: 'unknown' };
  if (!version && !models && !props && !sglangInfo) return identity;

  const versionBody = json(version);
  const modelsBody = json(models);
  if (version?.status === 200) identity.versionJson = version.text;
  if (models?.status === 200) identity.modelsJson = models.text;
  if (typeof versionBody?.version === 'string') identity.engineVersion = versionBody.version;
  const first = Array.isArray(modelsBody?.data)
    ? (modelsBody.data[0] as { id?: unknown; root?: unknown; max_model_len?: unknown; owned_by?: unknown } | undefined)
    : undefined;
  if (typeof first?.max_model_len === 'number') identity.maxModelLen = first.max_model_len;
  const root = typeof first?.root === 'string' ? first.root : typeof first?.id === 'string' ? first.id : undefined;
  if (root !== undefined) identity.modelRoot = root;

  const servers = [version, models, props, sglangInfo].map((p) => p?.server.toLowerCase() ?? '');
  if (servers.some((s) => s.includes('llama.cpp')) || json(props)?.default_generation_settings !== undefined) identity.kind = 'llama.cpp';
  else if (json(sglangInfo)?.model_path !== undefined || first?.owned_by === 'sglang') identity.kind = 'sglang';
  else if (first?.owned_by === 'vllm' || (identity.engineVersion !== undefined && servers[0].includes('uvicorn'))) identity.kind = 'vllm';
  else if (version?.status === 404 && version.text.trim() === '{"detail":"Not Found"}') identity.kind = 'transformers';
  else identity.kind = 'openai';
  return identity;
}

/**
 * What a proxy knows of its upstream, learnt as it goes: an engine that was down at the start is identified
 * when it first answers, and a field it refuses is never injected again.
 */
export class UpstreamEngine {
  private dialectNow: EngineDialect;
  private asking: Promise<void> | null = null;
  private listener: (identity: EngineIdentity) => void = () => undefined;

  private constructor(
    readonly url: URL,
    private identityNow: EngineIdentity,
    /** How its certificate is checked (https:). */
    readonly tls: UpstreamTls,
  ) {
    this.dialectNow = dialectOf(identityNow.kind);
  }

  static async identify(url: URL, tls: UpstreamTls = {}): Promise<UpstreamEngine> {
    return new UpstreamEngine(url, await identifyEngine(url, tls), tls);
  }

  /** An engine another process of the same proxy has identified (or not yet: it is then asked when it first answers). */
  static known(url: URL, identity: EngineIdentity, tls: UpstreamTls): UpstreamEngine {
    return new UpstreamEngine(url, identity, tls);
  }

  /** `listener` is told once when an engine unknown at the start has been identified. */
  onIdentified(listener: (identity: EngineIdentity) => void): void {
    this.listener = listener;
  }

  get identity(): EngineIdentity {
    return this.identityNow;
  }

  get dialect(): EngineDialect {
    return this.dialectNow;
  }

  /** The upstream answered something: if it was unknown, ask again what it is (once at a time). */
  answered(): void {
    if (this.identityNow.kind !== 'unknown' || this.asking) return;
    this.asking = identifyEngine(this.url, this.tls).then((identity) => {
      this.asking = null;
      this.learn(identity);
    });
  }

  /** What the engine is, found here or by another process of the proxy: taken (and told) when it was unknown. */
  learn(identity: EngineIdentity): void {
    if (identity.kind === 'unknown' || this.identityNow.kind !== 'unknown') return;
    this.identityNow = identity;
    // A refusal already seen stays remembered.
    this.dialectNow = { ...dialectOf(identity.kind), injectTokenIds: this.dialectNow.injectTokenIds && dialectOf(identity.kind).injectTokenIds };
    this.listener(identity);
  }

  /** The engine refused a field the proxy added: never add it again. */
  refused(fields: string[]): void {
    if (!this.dialectNow.injectTokenIds) return;
    console.warn(`mocker: ${this.url.origin} (${this.identityNow.kind}) refuses ${fields.join(', ')}: no longer added to its requests`);
    this.dialectNow = { ...this.dialectNow, injectTokenIds: false };
  }
}
