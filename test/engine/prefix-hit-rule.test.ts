/**
 * vLLM's prefix-hit rule as a user of the built CLI meets it (vllm-wire-reference §6, `get_computed_blocks`: at
 * most num_tokens - 1 tokens hit, in whole blocks): a prompt of 8 full blocks of 16, sent twice, hits 7 blocks.
 */
import OpenAI from 'openai';
import parsePrometheusTextFormat from 'parse-prometheus-text-format';
import { mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EngineState } from '../../src/engine/index.js';
import { startMockerProcess, type MockerProcess } from '../support/mockerProcess.js';
import { MODEL } from '../support/vllmUpstream.js';
import { testTmpdir } from '../support/tempRoot.js';

describe('mocker serve --block-size 16 --enable-prompt-tokens-details: the same 128-token prompt twice', () => {
  let dir: string;
  let mocker: MockerProcess;
  let url: string;
  beforeAll(async () => {
    // The default mode opens captures/mocker.db under the working directory: a temporary one.
    dir = mkdtempSync(join(testTmpdir(), 'mocker-prefix-hit-'));
    mocker = await startMockerProcess(['serve', '--block-size', '16', '--enable-prompt-tokens-details'], 0, { cwd: dir });
    url = `http://127.0.0.1:${mocker.port}`;
  });
  afterAll(async () => {
    await mocker?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  const counter = async (name: string) => {
    const families = parsePrometheusTextFormat(await (await fetch(`${url}/metrics`)).text());
    return Number(families.find((f) => f.name === name)!.metrics[0].value);
  };
  const rank0 = async () => ((await (await fetch(`${url}/mocker/engine`)).json()) as EngineState).ranks[0];

  it('the second reports cached_tokens 112, and /metrics and /mocker/engine count 112 hits', async () => {
    const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0 });
    const prompt = Array.from({ length: 128 }, (_, i) => 3000 + i);
    const hitsBefore = await counter('vllm:prefix_cache_hits_total');
    const queriesBefore = await counter('vllm:prefix_cache_queries_total');
    const engineBefore = await rank0();

    const first = await client.completions.create({ model: MODEL, prompt, max_tokens: 2 });
    expect(first.usage?.prompt_tokens).toBe(128);
    expect(first.usage?.prompt_tokens_details?.cached_tokens).toBe(0);
    const second = await client.completions.create({ model: MODEL, prompt, max_tokens: 2 });
    // 8 full blocks, all cached: vLLM recomputes the last one to sample from the last prompt token.
    expect(second.usage?.prompt_tokens_details?.cached_tokens).toBe(112);

    expect((await counter('vllm:prefix_cache_hits_total')) - hitsBefore).toBe(112);
    expect((await counter('vllm:prefix_cache_queries_total')) - queriesBefore).toBe(256);
    const engineAfter = await rank0();
    expect(engineAfter.prefixCacheHits - engineBefore.prefixCacheHits).toBe(112);
    expect(engineAfter.prefixCacheQueries - engineBefore.prefixCacheQueries).toBe(256);
  });
});
