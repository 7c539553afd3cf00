/**
 * vLLM's token-in/token-out `POST /inference/v1/generate` on `mocker serve` (the spawned CLI, raw fetch): the
 * GenerateResponse and its stream as vLLM's `scale_out/token_in_token_out` serving writes them, run by the same
 * engine as `/v1/completions` (random and simulate modes), and vLLM's errors for bad bodies.
 */
import parsePrometheusTextFormat from 'parse-prometheus-text-format';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mockerProcesses } from '../support/mockerProcess.js';
import { MODEL } from '../support/vllmUpstream.js';

const mockers = mockerProcesses();
let random: string;
let simulate: string;
let short: string;
/** A short context, for the default max_tokens (the context's room, not SamplingParams' 16). */
const SHORT_CONTEXT = 48;

beforeAll(async () => {
  [random, simulate, short] = await Promise.all(
    [
      ['--mode', 'random', '--timing', 'none'],
      ['--mode', 'simulate'],
      ['--mode', 'random', '--timing', 'none', '--max-model-len', String(SHORT_CONTEXT)],
    ].map(async (flags) => (await mockers.start(['serve', ...flags])).url),
  );
}, 60_000);
afterAll(mockers.stopAll);

const post = (url: string, body: unknown, headers: Record<string, string> = {}) =>
  fetch(`${url}/inference/v1/generate`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });

/** "Hello world, how are" in Qwen3's vocabulary. */
const PROMPT = [9707, 1879, 11, 1246, 525];

interface Choice {
  index: number;
  finish_reason: string | null;
  token_ids: number[];
}
interface Chunk {
  request_id: string;
  choices: Choice[];
  usage: { prompt_tokens: number; total_tokens: number; completion_tokens: number } | null;
}

/** The SSE body's `data:` payloads; every event is a lone `data: ` line (no `event:`). */
function dataLines(text: string): string[] {
  const events = text.split('\n\n');
  expect(events.pop()).toBe('');
  for (const e of events) expect(e).toMatch(/^data: [^\n]*$/);
  return events.map((e) => e.slice('data: '.length));
}

describe('POST /inference/v1/generate', () => {
  it("non-streamed: vLLM's GenerateResponse, every field in order with its nulls, max_tokens output ids", async () => {
    const res = await post(random, { token_ids: PROMPT, sampling_params: { max_tokens: 7, ignore_eos: true } });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('application/json');
    const text = await res.text();
    const answer = JSON.parse(text) as Record<string, unknown> & { choices: Choice[]; usage: Record<string, unknown> };
    expect(Object.keys(answer)).toEqual(['request_id', 'model', 'created', 'choices', 'usage', 'prompt_logprobs', 'kv_transfer_params', 'ec_transfer_params']);
    expect(answer.request_id).toMatch(/^generate-tokens-[0-9a-f]{32}$/);
    expect(answer.model).toBe(MODEL);
    expect(Math.abs((answer.created as number) - Date.now() / 1000)).toBeLessThan(60);
    expect(answer.prompt_logprobs).toBeNull();
    expect(answer.kv_transfer_params).toBeNull();
    expect(answer.ec_transfer_params).toBeNull();
    expect(answer.choices).toHaveLength(1);
    const [choice] = answer.choices;
    expect(Object.keys(choice)).toEqual(['index', 'logprobs', 'finish_reason', 'token_ids', 'routed_experts', 'sampling_mask']);
    expect(choice).toMatchObject({ index: 0, logprobs: null, finish_reason: 'length', routed_experts: null, sampling_mask: null });
    expect(choice.token_ids).toHaveLength(7);
    expect(choice.token_ids.every((id) => Number.isInteger(id) && id >= 0)).toBe(true);
    expect(answer.usage).toEqual({ prompt_tokens: PROMPT.length, total_tokens: PROMPT.length + 7, completion_tokens: 7, prompt_tokens_details: null });
    // Starlette's JSONResponse: compact JSON, no text anywhere.
    expect(text).not.toMatch(/": |, "/);
    expect(text).not.toContain('"text"');
  });

  it('the output ids are what /v1/completions generates for the same token-id prompt (the same engine and planner)', async () => {
    const sampling = { max_tokens: 6, ignore_eos: true, seed: 3 };
    const generated = (await (await post(random, { token_ids: PROMPT, sampling_params: sampling })).json()) as { choices: Choice[] };
    const completion = (await (
      await fetch(`${random}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, prompt: PROMPT, return_token_ids: true, ...sampling }),
      })
    ).json()) as { choices: { token_ids: number[] }[] };
    expect(generated.choices[0].token_ids).toEqual(completion.choices[0].token_ids);
  });

  it('streamed (random mode): data lines without model or created, the ids in order, the usage chunk, then [DONE]', async () => {
    const body = { token_ids: PROMPT, sampling_params: { max_tokens: 9, ignore_eos: true }, stream: true, stream_options: { include_usage: true } };
    const res = await post(random, body, { 'x-request-id': 'rollout-7' });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('text/event-stream; charset=utf-8');
    const data = dataLines(await res.text());
    expect(data.pop()).toBe('[DONE]');
    const usage = JSON.parse(data.pop()!) as Chunk;
    expect(usage).toEqual({
      request_id: 'generate-tokens-rollout-7',
      choices: [],
      usage: { prompt_tokens: PROMPT.length, total_tokens: PROMPT.length + 9, completion_tokens: 9 },
    });
    const chunks = data.map((d) => JSON.parse(d) as Chunk);
    expect(chunks.length).toBeGreaterThan(0);
    for (const c of chunks) {
      expect(Object.keys(c)).toEqual(['request_id', 'choices', 'usage']);
      expect(c.request_id).toBe('generate-tokens-rollout-7');
      expect(c.usage).toBeNull();
      expect(c.choices[0].token_ids.length).toBeGreaterThan(0);
    }
    expect(chunks.flatMap((c) => c.choices[0].token_ids)).toHaveLength(9);
    expect(chunks.map((c) => c.choices[0].finish_reason)).toEqual([...chunks.slice(1).map(() => null), 'length']);
  });

  it('streamed (simulate mode): one chunk per decode step, continuous usage, the same ids as the non-streamed answer', async () => {
    const sampling = { max_tokens: 5, ignore_eos: true };
    const stream = { token_ids: PROMPT, sampling_params: sampling, stream: true, stream_options: { continuous_usage_stats: true }, request_id: 'body-id' };
    const data = dataLines(await (await post(simulate, stream)).text());
    expect(data.pop()).toBe('[DONE]');
    const chunks = data.map((d) => JSON.parse(d) as Chunk);
    expect(chunks).toHaveLength(5);
    chunks.forEach((c, i) => {
      expect(c.request_id).toBe('generate-tokens-body-id');
      expect(c.choices[0].token_ids).toHaveLength(1);
      expect(c.choices[0].finish_reason).toBe(i === 4 ? 'length' : null);
      expect(c.usage).toEqual({ prompt_tokens: PROMPT.length, total_tokens: PROMPT.length + i + 1, completion_tokens: i + 1 });
    });
    const whole = (await (await post(simulate, { token_ids: PROMPT, sampling_params: sampling })).json()) as { choices: Choice[] };
    expect(whole.choices[0].token_ids).toEqual(chunks.flatMap((c) => c.choices[0].token_ids));
  });

  it('without max_tokens the output may fill the context (vLLM: max_model_len - prompt length, not 16)', async () => {
    const answer = (await (await post(short, { token_ids: PROMPT, sampling_params: { ignore_eos: true } })).json()) as {
      usage: { completion_tokens: number };
    };
    expect(answer.usage.completion_tokens).toBe(SHORT_CONTEXT - PROMPT.length);
  });

  it("runs in the engine: vLLM's request and prompt token counters grow by the request's", async () => {
    const counters = async () => {
      const families = parsePrometheusTextFormat(await (await fetch(`${simulate}/metrics`)).text());
      const sum = (name: string) => families.find((f) => f.name === name)!.metrics.reduce((n, m) => n + Number(m.value), 0);
      return { success: sum('vllm:request_success_total'), prompt: sum('vllm:prompt_tokens_total') };
    };
    const before = await counters();
    expect((await post(simulate, { token_ids: [1, 2, 3, 4, 5, 6, 7], sampling_params: { max_tokens: 2 } })).status).toBe(200);
    expect(await counters()).toEqual({ success: before.success + 1, prompt: before.prompt + 7 });
  });

  it("refuses bad bodies with vLLM's ErrorResponse: negative or no token ids, no sampling_params, an unknown model, too long a prompt", async () => {
    const cases: [unknown, number, RegExp, string | null][] = [
      [{ token_ids: [1, -2], sampling_params: {} }, 400, /token_ids: Value error, token_ids must not contain negative values/, null],
      [{ token_ids: [], sampling_params: {} }, 400, /token_ids: List should have at least 1 item/, null],
      [{ token_ids: PROMPT }, 400, /sampling_params/, null],
      [{ sampling_params: {} }, 400, /token_ids/, null],
      [{ token_ids: PROMPT, sampling_params: {}, model: 'no-such-model' }, 404, /The model `no-such-model` does not exist/, 'model'],
      [{ token_ids: PROMPT, sampling_params: { max_tokens: SHORT_CONTEXT } }, 400, /maximum context length is 48 tokens/, 'max_tokens'],
      [{ token_ids: Array.from({ length: SHORT_CONTEXT }, () => 1), sampling_params: {} }, 400, /maximum context length is 48 tokens/, null],
    ];
    for (const [body, status, message, param] of cases) {
      const res = await post(short, body);
      const label = JSON.stringify(body);
      expect(res.status, label).toBe(status);
      const answer = (await res.json()) as { error: { message: string; type: string; param: string | null; code: number } };
      expect(Object.keys(answer.error), label).toEqual(['message', 'type', 'param', 'code']);
      expect(answer.error.message, label).toMatch(message);
      expect(answer.error.param, label).toBe(param);
      expect(answer.error.code, label).toBe(status);
    }
  });
});
