import type { EngineStream, TokenEvent } from '../engine/index.js';
import { mulberry32 } from '../util/mulberry32.js';
import { ApiError, errorJson, modelNotFound } from '../wire/errors.js';

/** Failures `--error-types` can inject. All but the last two answer at once; those two break an answer after some tokens. */
export const FAULT_TYPES = [
  'rate_limit',
  'invalid_api_key',
  'context_length',
  'server_error',
  'invalid_request',
  'model_not_found',
  'timeout',
  'midstream',
  'disconnect',
] as const;
export type FaultType = (typeof FAULT_TYPES)[number];
/** AIPerf's mock server injects only a 500. */
export const DEFAULT_FAULT_TYPES: readonly FaultType[] = ['server_error'];
export const DEFAULT_MIDSTREAM_AFTER_TOKENS = 10;
/** The request header that forces a failure of its type on one request. */
export const FAULT_HEADER = 'x-mocker-error';
/** Marks every injected failure's response, so a test or a log can tell it from a real one. */
export const INJECTED_HEADER = 'x-mocker-injected-error';
/** Seconds a 429 asks the client to wait. */
const RETRY_AFTER_S = 1;

export interface FaultSettings {
  /** Percentage (0–100) of generation requests that fail. */
  errorRate: number;
  /** The types an injected failure is drawn from (uniformly). */
  errorTypes: FaultType[];
  /** The next N generation requests fail whatever the rate (from the start: the first N). */
  failFirst: number;
  /** A `midstream` or `disconnect` failure breaks the answer after this many tokens (before its last, if shorter). */
  midstreamAfterTokens: number;
}

/** `--error-types` / `error_types` as a list; an unknown name is an error naming `what` and the known ones. */
export function parseFaultTypes(value: string | readonly unknown[], what: string): FaultType[] {
  const names = typeof value === 'string' ? value.split(',').map((s) => s.trim()) : value;
  if (names.length === 0) throw new Error(`${what} must name at least one of ${FAULT_TYPES.join(', ')}`);
  for (const name of names) {
    if (!FAULT_TYPES.includes(name as FaultType)) throw new Error(`${what}: unknown error type ${JSON.stringify(name)} (known: ${FAULT_TYPES.join(', ')})`);
  }
  return [...new Set(names as FaultType[])];
}

/** The first setting out of range, as [its key (`error_rate`…), a message naming it], else null. */
export function badFaultSetting(s: Partial<FaultSettings>): [string, string] | null {
  const count = (v: unknown) => typeof v === 'number' && Number.isInteger(v) && v >= 0;
  if (s.errorRate !== undefined && !(typeof s.errorRate === 'number' && s.errorRate >= 0 && s.errorRate <= 100))
    return ['error_rate', `error_rate must be a number from 0 to 100, got ${JSON.stringify(s.errorRate)}`];
  if (s.errorTypes !== undefined && s.errorTypes.length === 0) return ['error_types', `error_types must name at least one of ${FAULT_TYPES.join(', ')}`];
  if (s.failFirst !== undefined && !count(s.failFirst)) return ['fail_first', `fail_first must be a non-negative integer, got ${JSON.stringify(s.failFirst)}`];
  if (s.midstreamAfterTokens !== undefined && !count(s.midstreamAfterTokens)) {
    return ['midstream_after_tokens', `midstream_after_tokens must be a non-negative integer, got ${JSON.stringify(s.midstreamAfterTokens)}`];
  }
  return null;
}

/**
 * Decides which generation requests fail, reproducibly: request i (in arrival order, from 0) draws from its
 * own generator seeded by (seed, i), so the same requests fail on every run whatever the rate was before.
 */
export class FaultInjector {
  private arrivals = 0;

  constructor(
    readonly settings: FaultSettings,
    readonly seed: number,
  ) {}

  /** The failure of the next generation request, or null; `forced` is its `X-Mocker-Error` header. */
  draw(forced: string | undefined): FaultType | null {
    const sequence = this.arrivals++;
    if (forced !== undefined) {
      if (FAULT_TYPES.includes(forced as FaultType)) return forced as FaultType;
      throw new ApiError(400, `Invalid X-Mocker-Error header: ${JSON.stringify(forced)} is not one of ${FAULT_TYPES.join(', ')}.`, 'BadRequestError');
    }
    const s = this.settings;
    const next = mulberry32((this.seed ^ Math.imul(sequence + 1, 0x9e3779b1)) >>> 0);
    const uniform = () => next() / 2 ** 32;
    // Both draws are made either way: a request's type does not depend on whether it failed first.
    const rateFails = uniform() * 100 < s.errorRate;
    const type = s.errorTypes[Math.floor(uniform() * s.errorTypes.length)];
    if (s.failFirst > 0) {
      s.failFirst--;
      return type;
    }
    return rateFails ? type : null;
  }
}

export const breaksMidstream = (type: FaultType): type is 'midstream' | 'disconnect' => type === 'midstream' || type === 'disconnect';

/** What an immediate failure's answer needs to know of its request. */
export interface FaultContext {
  model: string;
  maxModelLen: number;
  promptTokens: number;
  authorization: string | undefined;
}

/** An API key as OpenAI's 401 shows it: the first 3 and last 4 characters. */
const maskKey = (key: string) => (key.length > 8 ? `${key.slice(0, 3)}${'*'.repeat(key.length - 7)}${key.slice(-4)}` : key);

/**
 * The answer of an immediate failure: as the server that sends it would. vLLM never rate-limits nor checks keys
 * per request, so 429 and 401 are OpenAI's (string `code`, OpenAI's `type`); the others are vLLM's format.
 */
export function faultResponse(
  type: Exclude<FaultType, 'midstream' | 'disconnect'>,
  ctx: FaultContext,
): { status: number; headers: Record<string, string>; body: string } {
  const openai = (status: number, message: string, errorType: string, code: string) => ({
    status,
    headers: {},
    body: JSON.stringify({ error: { message, type: errorType, param: null, code } }),
  });
  const vllm = (err: ApiError) => ({ status: err.status, headers: {}, body: err.body() });
  switch (type) {
    case 'rate_limit': {
      const message = `Rate limit reached for ${ctx.model} in organization org-mocker on requests per min (RPM): Limit 3, Used 3, Requested 1. Please try again in ${RETRY_AFTER_S}s.`;
      const answer = openai(429, message, 'requests', 'rate_limit_exceeded');
      return {
        ...answer,
        headers: {
          'retry-after': String(RETRY_AFTER_S),
          'x-ratelimit-limit-requests': '3',
          'x-ratelimit-remaining-requests': '0',
          'x-ratelimit-reset-requests': `${RETRY_AFTER_S}s`,
        },
      };
    }
    case 'invalid_api_key': {
      const key = maskKey(ctx.authorization?.replace(/^Bearer\s+/i, '') ?? '');
      return openai(
        401,
        `Incorrect API key provided: ${key}. You can find your API key at https://platform.openai.com/account/api-keys.`,
        'invalid_request_error',
        'invalid_api_key',
      );
    }
    case 'context_length':
      return vllm(
        new ApiError(
          400,
          `This model's maximum context length is ${ctx.maxModelLen} tokens. However, your request has ${ctx.maxModelLen + ctx.promptTokens} input tokens. Please reduce the length of the input messages.`,
        ),
      );
    case 'server_error':
      // vLLM's EngineDeadError, which its server answers with a 500.
      return vllm(new ApiError(500, 'EngineCore encountered an issue. See stack trace (above) for the root cause.', 'InternalServerError'));
    case 'invalid_request':
      return vllm(new ApiError(400, 'Invalid request: refused by mocker failure injection (invalid_request).', 'BadRequestError'));
    case 'model_not_found':
      return vllm(modelNotFound(ctx.model));
    case 'timeout':
      // What a gateway in front of vLLM answers when the engine is too slow (vLLM itself has no request timeout).
      return { status: 504, headers: {}, body: errorJson(504, 'Request timed out.') };
  }
}

/** The in-stream error of a `midstream` failure: vLLM's for a request its engine failed (finish reason `error`, a 500). */
export const midstreamError = () => new ApiError(500, 'EngineCore encountered an issue while generating this response.', 'InternalServerError');

/**
 * Lets `afterTokens` tokens of one request (all its choices and prompts together) through, then calls `onBreak`
 * once (which aborts the engine request and breaks the answer) and ends, or throws what `onBreak` returns.
 */
export class StreamBreaker {
  private left: number;
  private broken = false;

  constructor(
    afterTokens: number,
    private readonly onBreak: () => Error | null,
  ) {
    this.left = afterTokens;
  }

  watch(stream: EngineStream): EngineStream {
    const breaker = this;
    return {
      get cachedPromptTokens() {
        return stream.cachedPromptTokens;
      },
      get kvHold() {
        return stream.kvHold;
      },
      async *[Symbol.asyncIterator](): AsyncIterator<TokenEvent[]> {
        const passed = new Map<number, number>();
        for await (const batch of stream) {
          const out: TokenEvent[] = [];
          for (const { sequence, emitted } of batch) {
            const before = passed.get(sequence) ?? 0;
            const allowed = Math.min(emitted - before, breaker.left);
            breaker.left -= allowed;
            if (allowed > 0) out.push({ sequence, emitted: before + allowed });
            passed.set(sequence, before + allowed);
          }
          if (out.length > 0) yield out;
          // Resumed once the tokens let through are written: the break comes after them.
          if (breaker.left === 0) {
            const error = breaker.break();
            if (error) throw error;
            return;
          }
        }
      },
    };
  }

  private break(): Error | null {
    if (this.broken) return null;
    this.broken = true;
    return this.onBreak();
  }
}
