/**
 * `--engine-type trtllm` and `--engine-type llamacpp` as users run them: the built CLI's `serve` answering an
 * OpenAI client, and `trace` replaying a trace and a synthetic load through each, with a fitted perf profile.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import { afterAll, describe, expect, it } from 'vitest';
import { mockerProcesses, runMockerToExit } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';

const dir = mkdtempSync(join(testTmpdir(), 'flavours-cli-'));
const mockers = mockerProcesses();
afterAll(async () => {
  await mockers.stopAll();
  rmSync(dir, { recursive: true, force: true });
});

const MODEL = 'Qwen/Qwen3-0.6B';
const TRACE = join(import.meta.dirname, '..', 'fixtures', 'traces', 'conversation_trace_200.jsonl');
/** llama-server's defaults: -np 4 (auto), -b 2048. */
const LLAMA_ARGS = ['--max-num-seqs', '4', '--max-num-batched-tokens', '2048'];

const engineConfig = async (url: string) => ((await (await fetch(`${url}/mocker/engine`)).json()) as { config: Record<string, unknown> }).config;

describe('serve --engine-type trtllm | llamacpp', () => {
  it.each([
    ['trtllm', [], 'TRT-LLM scheduler (GUARANTEED_NO_EVICT)'],
    // No slot or batch flags: llama-server's own defaults, not vLLM's 256 sequences and 8,192 tokens.
    ['llamacpp', [], 'llama.cpp scheduler (4 slots, n_batch 2048)'],
    ['llamacpp', ['--max-num-seqs', '2', '--max-num-batched-tokens', '512'], 'llama.cpp scheduler (2 slots, n_batch 512)'],
  ])('%s: says which scheduler it simulates and answers a chat request, streamed and not', async (type, extra, head) => {
    const p = await mockers.start(['serve', '--engine-type', type, ...extra, '--timing', 'none'], { cwd: dir });
    expect(p.stdout()).toContain(head);
    expect((await engineConfig(p.url)).engine_type).toBe(type);
    const client = new OpenAI({ baseURL: `${p.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    const messages = [{ role: 'user' as const, content: 'Name three colours.' }];
    const answer = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 12 });
    expect(answer.choices[0].message.content?.length).toBeGreaterThan(0);
    expect(answer.usage?.completion_tokens).toBeGreaterThan(0);
    let pieces = 0;
    let finish: string | null = null;
    for await (const chunk of await client.chat.completions.create({ model: MODEL, messages, max_tokens: 12, stream: true })) {
      if (chunk.choices[0]?.delta.content) pieces++;
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    expect(pieces).toBeGreaterThan(0);
    expect(finish).not.toBeNull();
  });

  it.each([
    ['trtllm', []],
    ['llamacpp', LLAMA_ARGS],
  ])('%s: max_tokens beyond the room the prompt leaves in a 64-token cache is a 400 that says how much room there is', async (type, extra) => {
    const p = await mockers.start(['serve', '--engine-type', type, ...extra, '--num-gpu-blocks-override', '4', '--block-size', '16', '--timing', 'none'], {
      cwd: dir,
    });
    const res = await fetch(`${p.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, prompt: Array.from({ length: 10 }, (_, i) => 1000 + i), max_tokens: 60 }),
    });
    expect(res.status).toBe(400);
    const body = (await res.json()) as { error: { message: string } };
    expect(body.error.message).toContain('after its 10-token prompt the KV cache has room for 54 output tokens, not 60');
  });

  it.each([
    [['--extra-engine-args', '{"max_num_seqs":null}'], "--engine-type llamacpp needs a number of slots (--max-num-seqs, llama-server's -np)"],
    [['--disaggregation-mode', 'prefill'], '--disaggregation-mode prefill: llama.cpp has no disaggregated prefill'],
    [['--zmq-kv-events-ports', '5999'], 'llama.cpp publishes no KV events'],
    [['--enable-lora'], 'LoRA adapters are simulated with --engine-type vllm or trtllm, not llamacpp'],
  ])('llamacpp refuses at startup what llama-server does not have: %j', async (args, message) => {
    const { code, stderr } = await runMockerToExit(['serve', '--engine-type', 'llamacpp', ...args], { cwd: dir });
    expect(code).toBe(1);
    expect(stderr).toContain(message);
  });
});

describe('trace with trtllm and llamacpp workers', () => {
  it.each(['trtllm', 'llamacpp'])('%s: replays the 200-row conversation trace to completion', async (type) => {
    const json = join(dir, `trace-${type}.json`);
    const args = JSON.stringify({ engine_type: type, max_num_seqs: 4, max_num_batched_tokens: 2048 });
    const { code, stderr } = await runMockerToExit(['trace', TRACE, '--extra-engine-args', args, '--report-json', json, '--no-progress'], { cwd: dir });
    expect(stderr).toBe('');
    expect(code).toBe(0);
    const report = JSON.parse(readFileSync(json, 'utf8')) as Record<string, number>;
    expect(report.completed_requests).toBe(200);
    // Rows share leading hash ids: the prefix cache (vLLM's blocks, llama.cpp's slots) finds some.
    expect(report.prefix_cache_reused_ratio).toBeGreaterThan(0);
  });

  it.each(['vllm', 'trtllm', 'llamacpp'])('%s: a fitted profile (planner_profile_data) times the passes: TTFT 60 + 7 ms, ITL 7 ms', async (type) => {
    // Raw profiler data: prefill 20 ms at 100 tokens, 60 ms at 1000; decode 7 ms wherever it is asked.
    const profile = mkdtempSync(join(dir, 'profile-'));
    writeFileSync(join(profile, 'prefill_raw_data.json'), JSON.stringify({ prefill_isl: [100, 1000], prefill_ttft: [20, 60] }));
    writeFileSync(
      join(profile, 'decode_raw_data.json'),
      JSON.stringify({ x_kv_usage: [0.1, 0.9], y_context_length: [100, 1000], z_itl: [7, 7], max_kv_tokens: 100_000 }),
    );
    const json = join(dir, `profile-${type}.json`);
    const args = JSON.stringify({ engine_type: type, planner_profile_data: profile, max_num_seqs: 4, max_num_batched_tokens: 2048 });
    const { code, stderr } = await runMockerToExit(
      ['trace', '--input-tokens', '1000', '--output-tokens', '3', '--request-count', '1', '--extra-engine-args', args, '--report-json', json, '--no-progress'],
      { cwd: dir },
    );
    expect(stderr).toBe('');
    expect(code).toBe(0);
    const report = JSON.parse(readFileSync(json, 'utf8')) as Record<string, number>;
    expect([report.completed_requests, report.mean_ttft_ms, report.mean_itl_ms]).toEqual([1, 67, 7]);
  });
});
