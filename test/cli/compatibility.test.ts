/**
 * The command lines users bring, as typed: every `python -m dynamo.mocker` line of Dynamo's mocker docs
 * (docs/mocker/mocker.md and the component's README) and every `aiperf-mock-server` line of AIPerf's mock-server
 * README, with the program replaced by `mocker serve` and the port made free (`--port 0` appended: the last value
 * wins). Each starts and answers a chat request through the `openai` client, or exits with one line: the refusal
 * naming what to use instead, or the error naming what is not on this machine (a model that cannot be downloaded,
 * a profile file of the user's).
 */
import OpenAI from 'openai';
import { mkdtempSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { mockerProcesses, runMockerToExit } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';

type Outcome = 'answers' | { exitsWith: RegExp };

/** Dynamo's mocker docs: the quick start, KV cache, speedup, disaggregation, workers, profile, AIC and reasoning examples. */
const DYNAMO: [string, Outcome][] = [
  ['python -m dynamo.mocker --model-path Qwen/Qwen3-0.6B', 'answers'],
  ['python -m dynamo.mocker --model-path Qwen/Qwen3-0.6B --num-gpu-blocks-override 8192 --block-size 64 --max-num-seqs 256', 'answers'],
  ['python -m dynamo.mocker --model-path Qwen/Qwen3-0.6B --speedup-ratio 10.0', 'answers'],
  [
    'python -m dynamo.mocker --model-path Qwen/Qwen3-0.6B --disaggregation-mode prefill --bootstrap-ports 50100',
    { exitsWith: /^mocker: --bootstrap-ports is not supported: .*pd-proxy/ },
  ],
  ['python -m dynamo.mocker --model-path Qwen/Qwen3-0.6B --disaggregation-mode decode', 'answers'],
  ['python -m dynamo.mocker --model-path Qwen/Qwen3-0.6B --num-workers 4', 'answers'],
  [
    'python -m dynamo.mocker --model-path nvidia/Llama-3.1-8B-Instruct-FP8 --planner-profile-data components/src/dynamo/planner/tests/data/profiling_results/H200_TP1P_TP1D --speedup-ratio 1.0',
    { exitsWith: /^mocker: --planner-profile-data: .*H200_TP1P_TP1D' not found/ },
  ],
  [
    'python -m dynamo.mocker --model-path nvidia/Llama-3.1-8B-Instruct-FP8 --engine-type vllm --aic-perf-model --aic-system h200_sxm',
    { exitsWith: /^mocker: --aic-perf-model is not supported: .*--planner-profile-data/ },
  ],
  [
    `python -m dynamo.mocker --model-path Qwen/Qwen3-0.6B --reasoning '{"start_thinking_token_id":123,"end_thinking_token_id":456,"thinking_ratio":0.6}'`,
    'answers',
  ],
  [
    'python -m dynamo.mocker --model-path TinyLlama/TinyLlama-1.1B-Chat-v1.0 --num-gpu-blocks-override 8192 --block-size 16 --speedup-ratio 10.0 --max-num-seqs 512 --num-workers 4 --enable-prefix-caching',
    { exitsWith: /TinyLlama\/TinyLlama-1\.1B-Chat-v1\.0/ },
  ],
  [
    'python -m dynamo.mocker --model-path nvidia/Llama-3.1-8B-Instruct-FP8 --planner-profile-data mocker_perf_data/perf_data.npz',
    { exitsWith: /^mocker: --planner-profile-data: .*perf_data\.npz' not found/ },
  ],
];

const AIPERF_SCHEDULER = /^mocker: --scheduler-enabled is not supported: .*--max-num-seqs/;
const AIPERF_ACCURACY = /^mocker: --accuracy-dataset is not supported: .*--mode replay/;

/** AIPerf's mock-server README: quick start, accuracy, scheduler, jitter, recording and the examples section. */
const AIPERF: [string, Outcome][] = [
  ['aiperf-mock-server', 'answers'],
  ['aiperf-mock-server --fast', 'answers'],
  ['aiperf-mock-server --port 8080 --ttft 50 --itl 10', 'answers'],
  ['aiperf-mock-server -v', 'answers'],
  [
    'aiperf-mock-server --fast --no-tokenizer --accuracy-dataset dataset.jsonl --accuracy-format mmlu --accuracy-correct-rate 0.5 --random-seed 7',
    { exitsWith: AIPERF_ACCURACY },
  ],
  [
    'aiperf-mock-server --fast --no-tokenizer --accuracy-dataset dataset.jsonl --accuracy-format exact_match --accuracy-correct-rate 1.0 --accuracy-cot-rate 1.0 --accuracy-reasoning-field --random-seed 7',
    { exitsWith: AIPERF_ACCURACY },
  ],
  [
    'aiperf-mock-server --scheduler-enabled --scheduler-step-ms 5 --scheduler-max-batch-size 256 --scheduler-max-prefill-chunks-per-step 8 --scheduler-prefill-chunk-tokens 512',
    { exitsWith: AIPERF_SCHEDULER },
  ],
  [
    'aiperf-mock-server --scheduler-enabled --scheduler-max-batch-size 64 --scheduler-goodput-collapse-enabled --scheduler-goodput-collapse-threshold 1.5 --scheduler-goodput-collapse-slope 0.5 --scheduler-goodput-collapse-floor 0.3',
    { exitsWith: AIPERF_SCHEDULER },
  ],
  ['aiperf-mock-server --ttft-jitter-cv 0.2 --itl-jitter-cv 0.15', { exitsWith: /^mocker: --ttft-jitter-cv is not supported: .*--ttft-std/ }],
  ['aiperf-mock-server --record-requests /tmp/req.jsonl --fast', { exitsWith: /^mocker: --record-requests is not supported: .*mocker capture/ }],
  ['aiperf-mock-server --embedding-base-latency 50 --embedding-per-input-latency 10', 'answers'],
  ['aiperf-mock-server --ranking-base-latency 5 --ranking-per-passage-latency 0.5', 'answers'],
  ['aiperf-mock-server --error-rate 10 --random-seed 42', 'answers'],
  ['aiperf-mock-server --dcgm-num-gpus 8 --dcgm-gpu-name a100', 'answers'],
  ['aiperf-mock-server --fast --accuracy-dataset dataset.jsonl --accuracy-format mmlu', { exitsWith: AIPERF_ACCURACY }],
];

/** A command line's words, single-quoted parts kept whole (the docs quote their JSON). */
const words = (line: string) => [...line.matchAll(/'([^']*)'|(\S+)/g)].map((m) => m[1] ?? m[2]);

/** The line with its program replaced by `mocker serve`. */
const asMocker = (line: string) => ['serve', ...words(line.replace(/^python -m dynamo\.mocker|^aiperf-mock-server/, ''))];

describe('the command lines of the tools mocker replaces work as typed', () => {
  const mockers = mockerProcesses();
  const cwd = mkdtempSync(join(testTmpdir(), 'compat-'));
  afterAll(mockers.stopAll);

  it.each([...DYNAMO, ...AIPERF])('%s', async (line, outcome) => {
    const args = asMocker(line);
    if (outcome === 'answers') {
      const mocker = await mockers.start(args, { cwd });
      // --error-rate 10 fails one request in ten with a 500, which the client retries as it would a real server's.
      const client = new OpenAI({ baseURL: `${mocker.url}/v1`, apiKey: 'none', maxRetries: 5 });
      const models = await client.models.list();
      const answer = await client.chat.completions.create({ model: models.data[0].id, messages: [{ role: 'user', content: 'Hello!' }], max_tokens: 4 });
      expect(answer.choices[0].message.content).toEqual(expect.any(String));
      expect(answer.usage!.completion_tokens).toBeGreaterThan(0);
      await mocker.stop();
      return;
    }
    const run = await runMockerToExit([...args, '--port', '0'], { cwd });
    expect(run.code).not.toBe(0);
    expect(run.code).not.toBeNull();
    const lines = run.stderr.trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(outcome.exitsWith);
  });

  it('an alias sets its setting (--model-name is --served-model-name), and refuses to disagree with it', async () => {
    const mocker = await mockers.start(['serve', '--model-path', 'Qwen/Qwen3-0.6B', '--model-name', 'my-mocker'], { cwd });
    const client = new OpenAI({ baseURL: `${mocker.url}/v1`, apiKey: 'none', maxRetries: 0 });
    expect((await client.models.list()).data.map((m) => m.id)).toEqual(['my-mocker']);
    await mocker.stop();
    const both = await runMockerToExit(['serve', '--model-path', 'Qwen/Qwen3-0.6B', '--model', 'other/model', '--port', '0'], { cwd });
    expect(both.code).not.toBe(0);
    expect(both.stderr.trim()).toBe('mocker: --model-path and --model ask for different values: give one');
  });

  it("--no-tokenizer counts prompts in AIPerf's character chunks and answers in them; refused with replay", async () => {
    const mocker = await mockers.start(['serve', '--fast', '--no-tokenizer'], { cwd });
    const client = new OpenAI({ baseURL: `${mocker.url}/v1`, apiKey: 'none', maxRetries: 0 });
    // AIPerf's chunks (4 characters, 6 when the 5th ends a word and the 6th is its space), by hand:
    // "Hello " "worl" "d, h" "ow a" "re y" "ou?" — 6 tokens.
    const answer = await client.completions.create({ model: 'Qwen/Qwen3-0.6B', prompt: 'Hello world, how are you?', max_tokens: 5 });
    expect(answer.usage).toMatchObject({ prompt_tokens: 6, completion_tokens: 5 });
    // The answer is 5 tokens of its base vocabulary, words with their space.
    expect(answer.choices[0].text).toMatch(/^([a-z]{4} ){5}$/);
    await mocker.stop();
    const replay = await runMockerToExit(['serve', '--no-tokenizer', '--mode', 'replay', '--port', '0'], { cwd });
    expect(replay.code).not.toBe(0);
    expect(replay.stderr.trim()).toMatch(/^mocker: --no-tokenizer counts character chunks: a capture's token ids never match them/);
  });
});
