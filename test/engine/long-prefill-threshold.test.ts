/**
 * `--long-prefill-token-threshold`, vLLM's `long_prefill_token_threshold`: the scheduler caps a request's new
 * tokens in one step at the threshold when it is > 0 (vllm-wire-reference §8, from `vllm/v1/core/sched/scheduler.py`:
 * "capped by long_prefill_token_threshold (if >0), the remaining budget…"). The setting was added to mocker as one
 * entry of the settings table (src/config/serveSettings.ts) plus its use in the vLLM core.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { EngineCore } from '../../src/engine/core.js';
import { polynomialPerfModel } from '../../src/engine/perf/perfModel.js';
import { modelTiming } from '../../src/engine/timingModels.js';
import { startMockerProcess, type MockerProcess } from '../support/mockerProcess.js';

const tokens = (n: number, from = 1) => Array.from({ length: n }, (_, i) => from + i);

describe('long_prefill_token_threshold in the vLLM core', () => {
  it('a 1,000-token prompt under a threshold of 256 computes 256, 512, 768, then 1,000 tokens and answers in the 4th pass; a short prompt beside it is not held back', () => {
    const core = new EngineCore({
      numGpuBlocks: 1024,
      blockSize: 16,
      maxNumSeqs: 256,
      maxNumBatchedTokens: 8192,
      enablePrefixCaching: false,
      enableChunkedPrefill: true,
      preemptionMode: 'lifo',
      watermark: 0,
      longPrefillTokenThreshold: 256,
      timing: modelTiming(polynomialPerfModel, 0, 1),
      seed: 1,
    });
    core.add({ id: 'long', promptTokenIds: tokens(1000), maxOutputTokens: 1 });
    core.add({ id: 'short', promptTokenIds: tokens(100, 5000), maxOutputTokens: 2 });
    const computed: number[] = [];
    const firstTokenPass: Record<string, number> = {};
    let now = 0;
    for (let pass = 1; pass <= 4; pass++) {
      const result = core.executePass(now);
      now = result.endMs;
      for (const t of result.tokens) if (t.generated === 1) firstTokenPass[t.id] ??= pass;
      if (pass < 4) computed.push(core.view('long')!.numComputedTokens);
    }
    expect(computed).toEqual([256, 512, 768]);
    expect(firstTokenPass).toEqual({ short: 1, long: 4 });
  });
});

describe('mocker serve --long-prefill-token-threshold', () => {
  const servers: MockerProcess[] = [];
  afterAll(async () => {
    for (const s of servers) await s.stop();
  });

  /** The engine passes one 1,000-token prompt (token ids, max_tokens 1) takes, and the setting the server reports. */
  async function passesFor(flags: string[], env?: NodeJS.ProcessEnv): Promise<{ passes: number; setting: unknown }> {
    const serve = await startMockerProcess(['serve', '--host', '127.0.0.1', '--fast', ...flags], 0, env ? { env: { ...process.env, ...env } } : {});
    servers.push(serve);
    const base = `http://127.0.0.1:${serve.port}`;
    const answer = await fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'Qwen/Qwen3-0.6B', prompt: tokens(1000, 1000), max_tokens: 1 }),
    });
    expect(answer.status).toBe(200);
    const engine = (await (await fetch(`${base}/mocker/engine`)).json()) as { ranks: { passes: number }[]; config: Record<string, unknown> };
    await serve.stop();
    return { passes: engine.ranks[0].passes, setting: engine.config.long_prefill_token_threshold };
  }

  it('by default (0, no cap) the prompt is prefilled in one pass', async () => {
    expect(await passesFor([])).toEqual({ passes: 1, setting: 0 });
  }, 30_000);

  it('--long-prefill-token-threshold 256: ceil(1000 / 256) = 4 passes', async () => {
    expect(await passesFor(['--long-prefill-token-threshold', '256'])).toEqual({ passes: 4, setting: 256 });
  }, 30_000);

  it('MOCKER_LONG_PREFILL_TOKEN_THRESHOLD=100: ceil(1000 / 100) = 10 passes', async () => {
    expect(await passesFor([], { MOCKER_LONG_PREFILL_TOKEN_THRESHOLD: '100' })).toEqual({ passes: 10, setting: 100 });
  }, 30_000);
});
