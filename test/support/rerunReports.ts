/**
 * Rerun reports built by hand for the tests of their views (JUnit, HTML): what each holds is known here, so the
 * views' output is checked against these values, not against what the rerun code computes.
 */
import type { ExchangeComparison, PromptComparison, RerunReport, TimingComparison } from '../../src/rerun/report.js';

/**
 * Untrusted text at its worst: markup that runs script if inserted as HTML, a CDATA end, an entity, C0 controls
 * XML 1.0 forbids (U+0001, U+0008, U+000B, U+001F), an unpaired high and low surrogate, and U+FFFF.
 */
export const HOSTILE = '</script><img src=x onerror="window.pwned=1">]]>&amp;\u0001\u0008\u000b\u001f|\ud800|\udc00|\uffff end';
/** HOSTILE as XML can hold it: each character XML 1.0 forbids is U+FFFD. */
export const HOSTILE_IN_XML = '</script><img src=x onerror="window.pwned=1">]]>&amp;\ufffd\ufffd\ufffd\ufffd|\ufffd|\ufffd|\ufffd end';

/**
 * A chat template change: the golden template calls the user's role `user`, the candidate's `human`. The texts
 * repeat `<|im_end|>\n<|im_start|>`, so only the excerpt after it places the difference.
 */
export const TEMPLATE_CHANGE: PromptComparison = {
  goldenLength: 24,
  candidateLength: 24,
  observed: true,
  difference: {
    position: 9,
    goldenToken: 872,
    candidateToken: 25312,
    before: '<|im_end|>\n<|im_start|>',
    goldenText: 'user\nSay hi &',
    candidateText: 'human\nSay hi &',
    // Both after `<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>`: 12 + 7 + 14 + 10 + 1 + 12 characters.
    goldenOffset: 56,
    candidateOffset: 56,
    part: { kind: 'message', message: 1, role: 'user' },
    partLabel: 'message 1 (user)',
  },
  goldenText: '<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nSay hi & </script><|im_end|>\n<|im_start|>assistant\n',
  candidateText: '<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>human\nSay hi & </script><|im_end|>\n<|im_start|>assistant\n',
};

const SAME_PROMPT: PromptComparison = {
  goldenLength: 5,
  candidateLength: 5,
  observed: true,
  difference: null,
  goldenText: 'Once upon a time',
  candidateText: 'Once upon a time',
};

function timing(golden: number[], candidate: number[], pValue: number | null, beyondNoise: boolean): TimingComparison {
  const at = (values: number[], q: number) => values[Math.min(values.length - 1, Math.floor(q * values.length))];
  const percentiles = (values: number[]) => ({ count: values.length, p50: at(values, 0.5), p90: at(values, 0.9), p99: at(values, 0.99) });
  const g = percentiles(golden);
  const c = percentiles(candidate);
  return { golden: g, candidate: c, shift: { p50: c.p50 - g.p50, p90: c.p90 - g.p90, p99: c.p99 - g.p99 }, pValue, beyondNoise, cdf: { golden, candidate } };
}

/** Regression (prompt and output), sampled, not compared, same, regression (tool call arguments): in that order. */
export function sampleReport(): RerunReport {
  const exchanges: ExchangeComparison[] = [
    {
      golden: 1,
      candidate: 101,
      endpoint: 'chat',
      path: '/v1/chat/completions',
      model: HOSTILE,
      stream: true,
      greedy: true,
      seeded: false,
      verdict: 'regression',
      note: 'prompt changed in message 1 (user); output text changed',
      request: JSON.stringify({
        model: HOSTILE,
        temperature: 0,
        messages: [
          { role: 'system', content: 'You are terse.' },
          { role: 'user', content: `Say hi & ${HOSTILE}` },
        ],
      }),
      status: { golden: 200, candidate: 200 },
      prompt: TEMPLATE_CHANGE,
      output: {
        differences: [{ field: 'text', choice: 0, position: 2, golden: 'Hi!', candidate: `Hey ${HOSTILE}` }],
        golden: [{ index: 0, tokenIds: [13048, 0], text: 'Hi!', reasoning: 'The user greets.', toolCalls: [], finishReason: 'stop', stopReason: null }],
        candidate: [
          { index: 0, tokenIds: [19182, 220, 1], text: `Hey ${HOSTILE}`, reasoning: 'The user greets.', toolCalls: [], finishReason: 'stop', stopReason: null },
        ],
      },
      timing: { golden: { ttftMs: 12, e2eMs: 80 }, candidate: { ttftMs: 30, e2eMs: 1500 } },
    },
    {
      golden: 2,
      candidate: 102,
      endpoint: 'completion',
      path: '/v1/completions',
      model: 'Qwen/Qwen3-0.6B',
      stream: false,
      greedy: false,
      seeded: false,
      verdict: 'sampled',
      note: 'sampled output differs (temperature 1, no seed)',
      request: JSON.stringify({ model: 'Qwen/Qwen3-0.6B', prompt: 'Once upon a time', temperature: 1, max_tokens: 4 }),
      status: { golden: 200, candidate: 200 },
      prompt: SAME_PROMPT,
      output: {
        differences: [{ field: 'text', choice: 0, position: 1, golden: ' there was', candidate: ' the king' }],
        golden: [{ index: 0, tokenIds: [1052, 572], text: ' there was', reasoning: null, toolCalls: [], finishReason: 'length', stopReason: null }],
        candidate: [{ index: 0, tokenIds: [279, 11477], text: ' the king', reasoning: null, toolCalls: [], finishReason: 'length', stopReason: null }],
      },
      timing: { golden: { ttftMs: null, e2eMs: 40 }, candidate: { ttftMs: null, e2eMs: 250 } },
    },
    {
      golden: 3,
      candidate: null,
      endpoint: 'embeddings',
      path: '/v1/embeddings',
      model: 'intfloat/e5-small',
      stream: false,
      greedy: false,
      seeded: false,
      verdict: 'not-compared',
      note: `the target answered 404: model ${HOSTILE} does not exist`,
      request: JSON.stringify({ model: 'intfloat/e5-small', input: 'hello' }),
      status: { golden: 200, candidate: 404 },
      prompt: null,
      output: { differences: [], golden: [], candidate: [] },
      timing: { golden: { ttftMs: null, e2eMs: 9 }, candidate: null },
    },
    {
      golden: 4,
      candidate: 104,
      endpoint: 'chat',
      path: '/v1/chat/completions',
      model: 'Qwen/Qwen3-0.6B',
      stream: true,
      greedy: true,
      seeded: false,
      verdict: 'same',
      note: null,
      request: JSON.stringify({ model: 'Qwen/Qwen3-0.6B', temperature: 0, messages: [{ role: 'user', content: 'Same here' }] }),
      status: { golden: 200, candidate: 200 },
      prompt: { ...SAME_PROMPT, goldenText: '<|im_start|>user\nSame here<|im_end|>\n', candidateText: '<|im_start|>user\nSame here<|im_end|>\n' },
      output: {
        differences: [],
        golden: [{ index: 0, tokenIds: [9454], text: 'Same', reasoning: null, toolCalls: [], finishReason: 'stop', stopReason: null }],
        candidate: [{ index: 0, tokenIds: [9454], text: 'Same', reasoning: null, toolCalls: [], finishReason: 'stop', stopReason: null }],
      },
      timing: { golden: { ttftMs: 10, e2eMs: 50 }, candidate: { ttftMs: 11, e2eMs: 55 } },
    },
    {
      golden: 5,
      candidate: 105,
      endpoint: 'chat',
      path: '/v1/chat/completions',
      model: 'Qwen/Qwen3-0.6B',
      stream: false,
      greedy: false,
      seeded: true,
      verdict: 'regression',
      note: 'tool call arguments changed',
      request: JSON.stringify({
        model: 'Qwen/Qwen3-0.6B',
        seed: 7,
        tools: [{ type: 'function', function: { name: 'get_weather' } }],
        messages: [{ role: 'user', content: 'Weather in Paris?' }],
      }),
      status: { golden: 200, candidate: 200 },
      prompt: { ...SAME_PROMPT, goldenText: 'tools…', candidateText: 'tools…' },
      output: {
        differences: [{ field: 'tool_calls', choice: 0, golden: '{"city":"Paris"}', candidate: '{"city":"paris"}' }],
        golden: [
          {
            index: 0,
            tokenIds: null,
            text: '',
            reasoning: null,
            toolCalls: [{ name: 'get_weather', arguments: { city: 'Paris' } }],
            finishReason: 'tool_calls',
            stopReason: null,
          },
        ],
        candidate: [
          {
            index: 0,
            tokenIds: null,
            text: '',
            reasoning: null,
            toolCalls: [{ name: 'get_weather', arguments: { city: 'paris' } }],
            finishReason: 'tool_calls',
            stopReason: null,
          },
        ],
      },
      timing: { golden: { ttftMs: null, e2eMs: 60 }, candidate: { ttftMs: null, e2eMs: 62.5 } },
    },
  ];
  return {
    golden: 'captures/golden.db',
    candidate: 'captures/rerun.db',
    target: `http://127.0.0.1:8000/${HOSTILE}`,
    targetEngine: 'vllm',
    targetVersion: '0.11.0',
    exchanges,
    skipped: [
      { reason: 'failed', count: 2 },
      { reason: 'bodies redacted', count: 1 },
    ],
    totals: { compared: 5, same: 1, regressions: 2, sampled: 1, notCompared: 1, promptChanges: 1, outputChanges: 3 },
    timing: {
      ttftMs: timing([10, 12, 15, 20, 30], [11, 14, 18, 25, 40], 0.42, false),
      itlMs: timing([5, 5.5, 6, 6.5, 7, 8], [9, 9.5, 10, 11, 12, 14], 0.002, true),
      e2eMs: timing([40, 50, 60, 80, 90], [55, 62.5, 250, 1500, 1600], 0.03, true),
    },
    alpha: 0.05,
    regression: true,
  };
}
