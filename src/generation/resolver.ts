import { ApiError, badRequest } from '../wire/errors.js';
import { wireOfEngine, type WireShape } from '../wire/shapes.js';
import { promptKey, type AgentApi, type CaptureStore, type PoolingKind, type RecordedEndpoint, type StoredExchange } from '../store/captureStore.js';
import type { ModelTokenizer } from '../tokenizer/index.js';
import { extendPlan, PartialHit, planFromCapture } from './captured.js';
import { DEFAULT_MIN_PREFIX_RATIO, type MatchMode } from './matching.js';
import type { ChoicePlan, OutputParams } from './plan.js';
import { poolingInputs, poolingKey, routePath } from './poolingKey.js';
import { planRandom } from './random.js';
import { shapeWithout } from './shape.js';
import type { SyntheticConfig } from './synthetic.js';

export type OutputsMode = 'captured' | 'random';
export type MissPolicy = 'error' | 'random' | 'passthrough' | 'record';

/** The engine's part in a prefill/decode deployment (`--disaggregation-mode`). */
export type PdRole = 'agg' | 'prefill' | 'decode';

export interface ResolverConfig {
  outputs: OutputsMode;
  /** Which captured hop answers: a prefill engine prefers prefill hops, a decode engine decode hops. Default agg. */
  role?: PdRole;
  onMiss: MissPolicy;
  /** `--seed`: random outputs are a function of (prompt, seed, request seed, choice). */
  seed: number;
  store?: CaptureStore;
  tokenizer: ModelTokenizer;
  /** Random answers as a reasoning model's with tools (`--reasoning`, `--tool-call-rate`); absent: plain tokens. */
  synthetic?: SyntheticConfig;
  /** Default exact. */
  match?: MatchMode;
  /** `--match prefix`: the least share of the request's prompt a capture must share with it. Default DEFAULT_MIN_PREFIX_RATIO. */
  minPrefixRatio?: number;
  /** `--ignore-field`: request fields left out of the comparison that decides whether captured bytes are served verbatim. */
  ignoreFields?: readonly string[];
}

/**
 * What looking the prompt up in the captures found: a hit (`prefix_hit`: a capture of another prompt sharing a
 * long enough prefix, `--match prefix`), or why it missed (null: no lookup, random outputs).
 */
export type CaptureLookup = 'hit' | 'prefix_hit' | 'no_match' | 'too_short' | null;

export type Resolution = (
  | {
      type: 'plans';
      plans: ChoicePlan[];
      verbatim: StoredExchange | null;
      source: 'captured' | 'random';
      /** The response shape of the engine the plans were captured from (null: random, or an engine without one here). */
      wire: WireShape | null;
    }
  | { type: 'forward' }
  | { type: 'error'; error: ApiError }
) & { lookup: CaptureLookup };

/** Where an embeddings or rerank answer comes from: a capture's bytes, the synthetic answer, the upstream, or an error. */
export type PoolingResolution = (
  | { type: 'captured'; exchange: StoredExchange }
  | { type: 'synthetic' }
  | { type: 'forward' }
  | { type: 'error'; error: ApiError }
) & { lookup: CaptureLookup };

type DistributiveOmit<T, K extends PropertyKey> = T extends unknown ? Omit<T, K> : never;

/** Which hop of a PD deployment a captured exchange was, from its request's `kv_transfer_params` (null: not PD). */
const hops = new WeakMap<StoredExchange, 'prefill' | 'decode' | null>();
function pdHop(ex: StoredExchange): 'prefill' | 'decode' | null {
  let hop = hops.get(ex);
  if (hop !== undefined) return hop;
  hop = null;
  try {
    const params = (JSON.parse(ex.requestBody.toString('utf8')) as { kv_transfer_params?: Record<string, unknown> | null }).kv_transfer_params;
    if (params?.do_remote_decode === true) hop = 'prefill';
    else if (params?.do_remote_prefill === true) hop = 'decode';
  } catch {
    // A body that is not JSON was never a PD hop.
  }
  hops.set(ex, hop);
  return hop;
}

/**
 * The output tokens one request may plan, all its choices (and all the prompts of a batch) together. Plans are
 * held in memory until the request ends, so a request whose outputs would not even fit the KV cache at once
 * (`n` = 16384 with `max_tokens` = 1000) is refused with a 400 as soon as its plans outgrow this.
 */
export class OutputBudget {
  private planned = 0;
  constructor(
    readonly tokens: number,
    /** What the budget is, for the refusal (e.g. the KV cache size). */
    private readonly source: string,
  ) {}

  /** Counts planned tokens; throws the 400 once the request's plans outgrow the budget. */
  spend(tokens: number): void {
    this.check(tokens);
    this.planned += tokens;
  }

  /** Throws the 400 now if `tokens` more would outgrow the budget (plans whose length is known before they are made). */
  check(tokens: number): void {
    if (this.planned + tokens > this.tokens) {
      throw badRequest(
        `This request cannot be served: its choices need more than ${this.tokens} output tokens in all, more than ${this.source}. Lower n or max_tokens.`,
        'n',
      );
    }
  }
}

/** Tokens of context shown on each side of a divergence. */
const CONTEXT_TOKENS = 12;

/**
 * Of several captures of one prompt, those long enough for the request (each choice ended other than by length,
 * or holds max_tokens), when there are any: a capture made with a smaller max_tokens must not turn a request
 * that another capture answers into a partial hit. A capture cut by length may still cover the request through
 * a stop found in its tokens: with none of the plain kind, all stay candidates.
 */
function covering(matches: StoredExchange[], params: OutputParams): StoredExchange[] {
  if (matches.length < 2 || !params.maxTokensRequested) return matches;
  const long = matches.filter((ex) => ex.generations.every((g) => g.finishReason !== 'length' || g.outputIds.length >= params.maxTokens));
  return long.length > 0 ? long : matches;
}

/** The endpoints whose captures a request is looked up among: its own, or (generate, the agents' APIs) its API's. */
export type LookupEndpoint = 'chat' | 'completion' | AgentApi;

/** Whether a capture recorded at `captured` answers a request looked up as `endpoint`. */
function answers(captured: RecordedEndpoint | null, endpoint: LookupEndpoint): boolean {
  return captured === endpoint || ((endpoint === 'responses' || endpoint === 'messages') && captured === 'chat');
}

/** Decides where each request's output comes from: a capture, random tokens, or the upstream. */
export class OutputResolver {
  /** `--match sequence`: per endpoint and prompt, how many captures earlier requests took. */
  private readonly sequence = new Map<string, number>();
  private readonly runWires = new Map<number, WireShape | null>();

  constructor(private readonly config: ResolverConfig) {}

  /**
   * `endpoint`: whose captures answer (vLLM's generate runs as a completion, the agents' APIs as a chat, but each
   * replays its own captures; an agent API's request is answered from chat captures of its prompt too).
   */
  async resolve(
    params: OutputParams,
    model: string,
    promptIds: readonly number[],
    shape: string,
    budget?: OutputBudget,
    endpoint: LookupEndpoint = params.kind,
  ): Promise<Resolution> {
    const { store, outputs } = this.config;
    if (outputs === 'random' || !store) return { ...(await this.random(params, promptIds, budget)), lookup: null };
    const exact = store.findByPrompt(model, promptIds).filter((ex) => answers(ex.endpoint, endpoint));
    const byPrefix = exact.length === 0 && this.config.match === 'prefix';
    const found = byPrefix ? this.prefixMatches(store, endpoint, model, promptIds) : exact;
    if (found.length === 0) return { ...(await this.miss(params, model, promptIds, budget)), lookup: 'no_match' };
    // Capture order: the order the requests were sent (`captures list --exchanges`).
    const matches = this.sameShaped(covering(this.forRole(found), params), byPrefix, shape).sort((a, b) => a.startedAt - b.startedAt || a.id - b.id);

    // Chosen before the first await: concurrent requests of a sequence each take their own captures.
    const sequenceKey = this.config.match === 'sequence' ? `${endpoint}\0${promptKey(model, promptIds)}` : null;
    const first = sequenceKey === null ? this.pick(matches.length, params.seed) : (this.sequence.get(sequenceKey) ?? 0) % matches.length;
    const chosen: { exchange: StoredExchange; choice: number }[] = [];
    let taken = 0;
    for (; chosen.length < params.n && taken < matches.length; taken++) {
      const exchange = matches[(first + taken) % matches.length];
      for (let c = 0; c < exchange.generations.length && chosen.length < params.n; c++) chosen.push({ exchange, choice: c });
    }
    if (sequenceKey !== null) this.sequence.set(sequenceKey, first + taken);
    for (let k = 0; chosen.length < params.n; k++) chosen.push(chosen[k % chosen.length]);

    const plans: ChoicePlan[] = [];
    let extended = false;
    for (const [i, { exchange, choice }] of chosen.entries()) {
      const plan = await planFromCapture(exchange.generations[choice], params, this.config.tokenizer, exchange.stream);
      if (plan instanceof PartialHit) {
        if (this.config.onMiss === 'random') {
          const rest = { ...params, maxTokens: plan.requested - plan.captured };
          const captured = await planFromCapture(exchange.generations[choice], { ...params, maxTokens: plan.captured }, this.config.tokenizer, exchange.stream);
          if (captured instanceof PartialHit) throw new Error('unreachable: a capture always covers its own length');
          plans.push(extendPlan(captured, await planRandom([...promptIds, ...captured.tokenIds], rest, this.config.tokenizer, this.config.seed, i)));
          budget?.spend(plans[plans.length - 1].tokenIds.length);
          extended = true;
          continue;
        }
        if (this.config.onMiss === 'passthrough' || this.config.onMiss === 'record') return { type: 'forward', lookup: 'too_short' };
        return {
          type: 'error',
          lookup: 'too_short',
          error: new ApiError(
            404,
            `Partial capture hit: capture #${exchange.id} holds ${plan.captured} output tokens (it ended by length) but the request asks for up to ${plan.requested}. Lower max_tokens, recapture, or serve with --on-miss random to extend it with random tokens.`,
            'NotFoundError',
            'max_tokens',
          ),
        };
      }
      plans.push(plan);
      budget?.spend(plan.tokenIds.length);
    }
    // An aggregated engine answering from a PD capture: the client waited for the prefill hop, then the decode hop.
    const offsetMs = (this.config.role ?? 'agg') === 'agg' && pdHop(chosen[0].exchange) === 'decode' ? prefillHopMs(found, chosen[0].exchange) : 0;
    if (offsetMs > 0) {
      for (const [i, plan] of plans.entries()) if (plan.capturedTimesMs) plans[i] = { ...plan, capturedTimesMs: plan.capturedTimesMs.map((t) => t + offsetMs) };
    }
    const single = chosen.every((c) => c.exchange === chosen[0].exchange);
    const exchange = chosen[0].exchange;
    // A capture of another prompt is rendered: its bytes would report that prompt's usage and token ids.
    const verbatim = !byPrefix && single && this.sameShape(exchange.requestShape, shape) && exchange.generations.length === params.n ? exchange : null;
    // Extended with random tokens past a too-short capture: still a miss by that reason.
    return {
      type: 'plans',
      plans,
      verbatim,
      source: 'captured',
      wire: this.wireOfRun(store, exchange.runId),
      lookup: extended ? 'too_short' : byPrefix ? 'prefix_hit' : 'hit',
    };
  }

  /** The response shape of the engine a capture run recorded, looked up once per run. */
  private wireOfRun(store: CaptureStore, runId: number): WireShape | null {
    let wire = this.runWires.get(runId);
    if (wire === undefined) {
      const run = store.getRun(runId);
      wire = wireOfEngine(run?.engine, run?.engineVersion);
      this.runWires.set(runId, wire);
    }
    return wire;
  }

  /** Of several captures of the prompt, those that can be served verbatim (the request's shape) when there are any. */
  private sameShaped(matches: StoredExchange[], byPrefix: boolean, shape: string): StoredExchange[] {
    if (byPrefix || matches.length < 2) return matches;
    const same = matches.filter((ex) => this.sameShape(ex.requestShape, shape));
    return same.length > 0 ? same : matches;
  }

  /** Whether a capture's request shape is the request's, the `--ignore-field` fields aside. */
  private sameShape(captured: string | null, shape: string): boolean {
    const ignored = this.config.ignoreFields ?? [];
    return captured !== null && (captured === shape || (ignored.length > 0 && shapeWithout(captured, ignored) === shapeWithout(shape, ignored)));
  }

  /** `--match prefix`: the fewest prompt tokens a capture must share with a prompt of `length` tokens. */
  private leastShared(length: number): number {
    // Less a rounding error: 0.7 × 10 is 7.000000000000001 in floating point.
    return Math.max(1, Math.ceil((this.config.minPrefixRatio ?? DEFAULT_MIN_PREFIX_RATIO) * length - 1e-9));
  }

  /**
   * `--match prefix`, no capture of the prompt itself: the captures of the longest captured prompt that is a
   * prefix of it, else those of the captured prompt sharing the longest prefix with it; either only when the
   * shared prefix holds at least `--min-prefix-ratio` of the request's prompt tokens.
   */
  private prefixMatches(store: CaptureStore, kind: LookupEndpoint, model: string, promptIds: readonly number[]): StoredExchange[] {
    const least = this.leastShared(promptIds.length);
    const prefix = store.findByLongestPrefix(model, kind, promptIds, least).filter((ex) => ex.endpoint === kind);
    if (prefix.length > 0) return prefix;
    const nearest = store.nearest(model, promptIds);
    if (!nearest || nearest.commonPrefix < least) return [];
    return store.findByPrompt(model, nearest.promptIds).filter((ex) => answers(ex.endpoint, kind));
  }

  /**
   * An embeddings or rerank request (`url` as requested): the newest capture of the same route, named model and
   * inputs; else what `--on-miss` says, the synthetic answer for `random`.
   */
  resolvePooling(url: string, kind: PoolingKind, request: Record<string, unknown>): PoolingResolution {
    const { store, outputs } = this.config;
    if (outputs === 'random' || !store) return { type: 'synthetic', lookup: null };
    const inputs = poolingInputs(kind, request);
    const found = store.findByKey(poolingKey(url, inputs)).filter((ex) => ex.endpoint === kind);
    if (found.length > 0) return { type: 'captured', exchange: found[found.length - 1], lookup: 'hit' };
    switch (this.config.onMiss) {
      case 'random':
        return { type: 'synthetic', lookup: 'no_match' };
      case 'passthrough':
      case 'record':
        return { type: 'forward', lookup: 'no_match' };
      case 'error': {
        const route = `POST ${routePath(url)}`;
        const model = inputs.model === null ? 'no model' : `model \`${inputs.model}\``;
        const captured = store.completeAt(routePath(url));
        const held =
          captured === 0
            ? `The capture file holds no complete capture of ${route}.`
            : `The capture file holds ${captured} complete capture(s) of ${route}, none with this model and these inputs.`;
        const message = `No capture matches this request: ${route}, ${model}, ${inputs.items} ${kind === 'embeddings' ? 'input(s)' : 'document(s)'}. ${held}`;
        return { type: 'error', lookup: 'no_match', error: new ApiError(404, message, 'NotFoundError') };
      }
    }
  }

  /**
   * The captures this engine answers from: its own hop's when there are any (a PD capture holds both hops of
   * a prompt), else the aggregated ones, else whatever matched.
   */
  private forRole(found: StoredExchange[]): StoredExchange[] {
    const role = this.config.role ?? 'agg';
    const own = found.filter((ex) => pdHop(ex) === (role === 'agg' ? null : role));
    if (own.length > 0) return own;
    // A prefill hop holds one token: only a prefill engine answers from it.
    const fallback = found.filter((ex) => (role === 'prefill' ? pdHop(ex) === null : pdHop(ex) !== 'prefill'));
    return fallback.length > 0 ? fallback : found;
  }

  /** `--match exact` and `prefix`: the same request, the same capture (the request seed's, else the first captured). */
  private pick(count: number, seed: number | null): number {
    return seed === null ? 0 : ((seed % count) + count) % count;
  }

  private async random(
    params: OutputParams,
    promptIds: readonly number[],
    budget?: OutputBudget,
  ): Promise<Omit<Extract<Resolution, { type: 'plans' }>, 'lookup'>> {
    // With max_tokens given and nothing to stop at, every random choice is exactly max_tokens long.
    if (params.maxTokensRequested && params.stop.length === 0 && params.stopTokenIds.length === 0) budget?.check(params.n * params.maxTokens);
    const plans: ChoicePlan[] = [];
    for (let i = 0; i < params.n; i++) {
      plans.push(await planRandom(promptIds, params, this.config.tokenizer, this.config.seed, i, this.config.synthetic));
      budget?.spend(plans[i].tokenIds.length);
    }
    return { type: 'plans', plans, verbatim: null, source: 'random', wire: null };
  }

  private async miss(
    params: OutputParams,
    model: string,
    promptIds: readonly number[],
    budget?: OutputBudget,
  ): Promise<DistributiveOmit<Resolution, 'lookup'>> {
    switch (this.config.onMiss) {
      case 'random':
        return this.random(params, promptIds, budget);
      case 'passthrough':
      case 'record':
        return { type: 'forward' };
      case 'error':
        return { type: 'error', error: new ApiError(404, await this.missMessage(model, promptIds), 'NotFoundError') };
    }
  }

  /** Names the nearest capture, the first diverging token and the text around it on both sides. */
  async missMessage(model: string, promptIds: readonly number[]): Promise<string> {
    const ratio = this.config.minPrefixRatio ?? DEFAULT_MIN_PREFIX_RATIO;
    const prefixRule =
      this.config.match === 'prefix'
        ? ` --match prefix needs a capture sharing at least ${this.leastShared(promptIds.length)} of them (--min-prefix-ratio ${ratio}).`
        : '';
    const head = `No capture matches this request: model \`${model}\`, ${promptIds.length} prompt tokens.${prefixRule}`;
    const nearest = this.config.store?.nearest(model, promptIds);
    if (!nearest) return `${head} The capture file holds no complete capture for this model.`;
    const at = nearest.commonPrefix;
    const tok = this.config.tokenizer;
    const show = async (ids: readonly number[]) => JSON.stringify(await tok.decode(ids.slice(at, at + CONTEXT_TOKENS), false));
    const before = JSON.stringify(await tok.decode(promptIds.slice(Math.max(0, at - CONTEXT_TOKENS), at), false));
    const side = (ids: readonly number[]) => (at < ids.length ? `token id ${ids[at]}` : 'end of prompt');
    return (
      `${head} Nearest capture: #${nearest.exchangeId} (${nearest.promptIds.length} prompt tokens), identical for the first ${at} tokens; ` +
      `they diverge at token position ${at}. Text before: ${before}. ` +
      `Request: ${side(promptIds)}, text ${await show(promptIds)}. Capture: ${side(nearest.promptIds)}, text ${await show(nearest.promptIds)}.`
    );
  }
}

/** How long the prefill hop of a captured PD request took: the one with the decode hop's X-Request-Id, else any of this prompt. */
function prefillHopMs(found: StoredExchange[], decodeHop: StoredExchange): number {
  const prefills = found.filter((ex) => pdHop(ex) === 'prefill');
  const linked = prefills.find((ex) => ex.requestId !== null && ex.requestId === decodeHop.requestId) ?? prefills[0];
  return linked?.totalMs ?? 0;
}
