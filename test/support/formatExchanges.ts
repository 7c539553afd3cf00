/**
 * The exchanges in test/fixtures/captures/encoding-<N>.db: files written by earlier versions of mocker (encodings 1
 * and 2 of the capture file, see src/store/schema.ts) from exactly these values, so that a later version can be
 * checked to read them back as they were written. Changing anything here breaks that check: leave it as it is.
 */
import type { Exchange } from '../../src/store/captureStore.js';
import { benchExchange } from './benchExchange.js';

const MODEL = 'Qwen/Qwen3-0.6B';

/** SSE bytes of `events` (each JSON-serialized) with [DONE], and where each event ends. */
function sse(events: unknown[]): { body: Buffer; ends: number[] } {
  const texts = [...events.map((e) => `data: ${JSON.stringify(e)}\n\n`), 'data: [DONE]\n\n'];
  const ends: number[] = [];
  let at = 0;
  for (const t of texts) ends.push((at += Buffer.byteLength(t)));
  return { body: Buffer.from(texts.join('')), ends };
}

const chatChunk = (delta: Record<string, unknown>, finish: string | null, ids: number[]) => ({
  id: 'chatcmpl-fixture',
  object: 'chat.completion.chunk',
  created: 1763800000,
  model: MODEL,
  choices: [{ index: 0, delta, logprobs: null, finish_reason: finish, stop_reason: null, token_ids: ids }],
});

export function formatExchanges(runId: number): Exchange[] {
  const chatPrompt = [151644, 872, 198, 9707, 0, 2 ** 32 - 1, 151645, 198, 151644, 77091, 198];
  const streamed = sse([
    chatChunk({ role: 'assistant', content: '' }, null, []),
    chatChunk({ reasoning_content: 'Think é' }, null, [40, 41]),
    chatChunk({ content: 'Hi 🚀' }, null, [13048, 11162]),
    chatChunk({ tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'get', arguments: '{}' } }] }, null, [151657]),
    chatChunk({}, 'stop', [151645]),
  ]);
  const chat: Exchange = {
    runId,
    startedAt: 1_763_800_000_000,
    requestId: 'chatcmpl-fixture',
    method: 'POST',
    path: '/v1/chat/completions',
    endpoint: 'chat',
    outcome: 'complete',
    error: null,
    status: 200,
    model: MODEL,
    stream: true,
    requestHeaders: { 'content-type': 'application/json', 'x-many': ['a', 'b'] },
    requestBody: Buffer.from(JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'Hello!' }], stream: true })),
    responseHeaders: { 'content-type': 'text/event-stream; charset=utf-8' },
    responseBody: streamed.body,
    eventEnds: streamed.ends,
    eventTimes: [12.5, 20.25, 31, 40.125, 40.5, 40.75],
    eventTokens: [0, 2, 4, 5, 6, 6],
    totalMs: 41,
    tokenSource: 'engine',
    promptIds: chatPrompt,
    requestShape: '{"endpoint":"chat","stream":true}',
    injected: ['return_token_ids'],
    usage: undefined,
    generations: [
      {
        choiceIndex: 0,
        outputIds: [40, 41, 13048, 11162, 151657, 151645],
        tokenTimes: [20.25, 20.25, 31, 31, 40.125, 40.5],
        chunkTokens: [2, 2, 1, 1],
        chunkDeltas: [
          { reasoning_content: 'Think é' },
          { content: 'Hi 🚀' },
          { tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'get', arguments: '{}' } }] },
          {},
        ],
        text: 'Hi 🚀',
        finishReason: 'stop',
        stopReason: null,
      },
    ],
  };
  const whole = Buffer.from(
    JSON.stringify({
      id: 'cmpl-2',
      object: 'text_completion',
      created: 1763800001,
      model: MODEL,
      choices: [
        { index: 0, text: ' a', logprobs: null, finish_reason: 'length', stop_reason: null, token_ids: [264] },
        { index: 1, text: ' b', logprobs: null, finish_reason: 'stop', stop_reason: 151645, token_ids: [293, 151645] },
      ],
    }),
  );
  const twoChoices: Exchange = {
    ...chat,
    startedAt: 1_763_800_001_000,
    requestId: 'cmpl-2',
    path: '/v1/completions',
    endpoint: 'completion',
    stream: false,
    requestBody: Buffer.from(JSON.stringify({ model: MODEL, prompt: [1, 2, 3], n: 2, max_tokens: 1 })),
    responseHeaders: { 'content-type': 'application/json' },
    responseBody: whole,
    eventEnds: [],
    eventTimes: [],
    eventTokens: [],
    totalMs: 9.75,
    promptIds: [1, 2, 3],
    requestShape: '{"endpoint":"completion","n":2}',
    usage: { prompt_tokens: 3, completion_tokens: 3, total_tokens: 6 },
    generations: [
      {
        choiceIndex: 0,
        outputIds: [264],
        tokenTimes: [9.75],
        chunkTokens: [1],
        chunkDeltas: [{ text: ' a' }],
        text: ' a',
        finishReason: 'length',
        stopReason: null,
      },
      {
        choiceIndex: 1,
        outputIds: [293, 151645],
        tokenTimes: [9.75, 9.75],
        chunkTokens: [2],
        chunkDeltas: [{ text: ' b' }],
        text: ' b',
        finishReason: 'stop',
        stopReason: 151645,
      },
    ],
  };
  const redacted: Exchange = {
    ...chat,
    startedAt: 1_763_800_002_000,
    requestId: null,
    bodiesRedacted: true,
    requestBody: Buffer.alloc(0),
    responseBody: Buffer.alloc(0),
    generations: chat.generations.map((g) => ({ ...g, chunkDeltas: [], text: '' })),
  };
  const failed: Exchange = {
    ...chat,
    startedAt: 1_763_800_003_000,
    requestId: null,
    outcome: 'failed',
    error: 'upstream closed the connection',
    status: null,
    model: null,
    promptIds: null,
    requestShape: null,
    responseBody: Buffer.alloc(0),
    eventEnds: [],
    eventTimes: [],
    eventTokens: [],
    generations: [],
  };
  return [
    { ...benchExchange(runId, 0), startedAt: 1_763_799_999_000, responseHeaders: { 'content-type': 'text/event-stream; charset=utf-8' } },
    chat,
    twoChoices,
    redacted,
    failed,
  ];
}
