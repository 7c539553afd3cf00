/**
 * The exchange bench/store.ts stores (and test/capture/store-format.test.ts sizes): a streamed completion of a 1,000-token
 * prompt and 256 output tokens as vLLM sends it with return_token_ids (~78 KB of SSE). Prompt ids are a function
 * of the exchange number, so any stored prompt can be rebuilt without keeping them.
 */
import type { Exchange } from '../../src/store/captureStore.js';

export const PROMPT_LEN = 1000;
export const OUTPUT_LEN = 256;
export const MODEL = 'Qwen/Qwen3-0.6B';

/** Deterministic prompt ids of exchange `i` (xorshift32 seeded by i). */
export function promptIds(i: number): number[] {
  let x = ((i + 1) * 2654435761) >>> 0 || 1;
  const ids = new Array<number>(PROMPT_LEN);
  for (let k = 0; k < PROMPT_LEN; k++) {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    // As small integers, as ids parsed from JSON are (x is a double here: the remainder would be one too).
    ids[k] = (x % 151_000) | 0;
  }
  return ids;
}

const OUTPUT_IDS = Array.from({ length: OUTPUT_LEN }, (_, k) => 1000 + ((k * 7919) % 50_000));
const PIECES = Array.from({ length: OUTPUT_LEN }, (_, k) => [' the', ' model', ' answers', ',', ' slowly', '.'][k % 6]);
const TOKEN_TIMES = Array.from({ length: OUTPUT_LEN }, (_, k) => 45.3 + k * 21.7);

const HEAD = '{"id":"cmpl-0123456789abcdef0123456789abcdef","object":"text_completion","created":1763800000,"model":"Qwen/Qwen3-0.6B"';
const event = (k: number, promptJson: string) =>
  `data: ${HEAD},"choices":[{"index":0,"text":${JSON.stringify(PIECES[k])},"logprobs":null,"finish_reason":${k === OUTPUT_LEN - 1 ? '"length"' : 'null'},"stop_reason":null,` +
  `"prompt_token_ids":${promptJson},"token_ids":[${OUTPUT_IDS[k]}]}],"usage":null}\n\n`;
/** Every event after the first, the same in every exchange: built once (bench/store.ts builds 100,000 exchanges). */
const LATER = [...Array.from({ length: OUTPUT_LEN - 1 }, (_, k) => event(k + 1, 'null')), 'data: [DONE]\n\n'];
const LATER_EVENTS = Buffer.from(LATER.join(''));
const LATER_ENDS = (() => {
  let at = 0;
  return LATER.map((e) => (at += Buffer.byteLength(e)));
})();

/** The upstream's SSE bytes as captured (completion chunks with token ids, first one with the prompt ids). */
export function sseBody(prompt: number[]): { body: Buffer; ends: number[] } {
  return sseOf(prompt.join(','));
}

function sseOf(promptList: string): { body: Buffer; ends: number[] } {
  const first = Buffer.from(event(0, `[${promptList}]`));
  return { body: Buffer.concat([first, LATER_EVENTS]), ends: [first.length, ...LATER_ENDS.map((end) => first.length + end)] };
}

// What every exchange shares (bench/store.ts builds 100,000 of them): built once.
const EVENT_TIMES = [...TOKEN_TIMES, TOKEN_TIMES[OUTPUT_LEN - 1] + 0.2];
const EVENT_TOKENS = EVENT_TIMES.map((_, k) => Math.min(k + 1, OUTPUT_LEN));
const CHUNK_TOKENS = OUTPUT_IDS.map(() => 1);
const CHUNK_DELTAS = PIECES.map((text) => ({ text }));
const TEXT = PIECES.join('');

export function benchExchange(runId: number, i: number): Exchange {
  const prompt = promptIds(i);
  // The ids as JSON lists them, once for both bodies; the request body is JSON.stringify's of
  // { model, prompt, max_tokens, stream }.
  const promptList = prompt.join(',');
  const { body, ends } = sseOf(promptList);
  return {
    runId,
    startedAt: Date.now(),
    requestId: null,
    method: 'POST',
    path: '/v1/completions',
    endpoint: 'completion',
    outcome: 'complete',
    error: null,
    status: 200,
    model: MODEL,
    stream: true,
    requestHeaders: { 'content-type': 'application/json', 'user-agent': 'OpenAI/Python 1.99.0', accept: 'application/json' },
    requestBody: Buffer.from(`{"model":${JSON.stringify(MODEL)},"prompt":[${promptList}],"max_tokens":${OUTPUT_LEN},"stream":true}`),
    responseHeaders: { 'content-type': 'text/event-stream; charset=utf-8', server: 'uvicorn', date: new Date().toUTCString() },
    responseBody: body,
    eventEnds: ends,
    eventTimes: EVENT_TIMES,
    eventTokens: EVENT_TOKENS,
    totalMs: TOKEN_TIMES[OUTPUT_LEN - 1] + 0.3,
    tokenSource: 'engine',
    promptIds: prompt,
    requestShape: '{"endpoint":"completion","max_tokens":256,"stream":true}',
    injected: ['return_token_ids'],
    usage: undefined,
    generations: [
      {
        choiceIndex: 0,
        outputIds: OUTPUT_IDS,
        tokenTimes: TOKEN_TIMES,
        chunkTokens: CHUNK_TOKENS,
        chunkDeltas: CHUNK_DELTAS,
        text: TEXT,
        finishReason: 'length',
        stopReason: null,
      },
    ],
  };
}
