/**
 * `mocker serve --engine-type sglang` as users run it: the built CLI with Dynamo's --sglang-* flags, its prefix
 * reuse in whole pages (SGLang's radix cache), its KV events on vLLM's ZMQ wire in page-size blocks, and
 * `mocker trace` with SGLang workers.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { EventSubscriber, freePorts } from '../support/kvEventsClient.js';
import { mockerProcesses, runMockerToExit } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';

const dir = mkdtempSync(join(testTmpdir(), 'sglang-serve-'));
const mockers = mockerProcesses();
const subscribers: EventSubscriber[] = [];
afterAll(async () => {
  subscribers.forEach((s) => s.close());
  await mockers.stopAll();
  rmSync(dir, { recursive: true, force: true });
});

/** Ordinary Qwen3 token ids. */
const PROMPT = Array.from({ length: 150 }, (_, i) => 1000 + i);

const SERVE = ['serve', '--engine-type', 'sglang', '--timing', 'none', '--enable-prompt-tokens-details'];

async function cachedTokens(url: string, prompt: number[]): Promise<number> {
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'Qwen/Qwen3-0.6B', prompt, max_tokens: 2 }),
  });
  expect(res.status).toBe(200);
  const body = (await res.json()) as { usage: { prompt_tokens: number; prompt_tokens_details: { cached_tokens: number } } };
  expect(body.usage.prompt_tokens).toBe(prompt.length);
  return body.usage.prompt_tokens_details.cached_tokens;
}

const engineConfig = async (url: string) => ((await (await fetch(`${url}/mocker/engine`)).json()) as { config: Record<string, unknown> }).config;

describe('serve --engine-type sglang', () => {
  it('reuses a repeated prompt in whole pages of the block size (64 by default), never its last token', async () => {
    const url = (await mockers.start([...SERVE], { cwd: dir })).url;
    const config = await engineConfig(url);
    expect([config.engine_type, config.block_size, config.sglang_page_size, config.sglang_schedule_policy]).toEqual(['sglang', 64, 64, 'fifo']);
    expect(await cachedTokens(url, PROMPT)).toBe(0);
    // 149 matchable tokens (the last is always computed) in pages of 64: 128.
    expect(await cachedTokens(url, PROMPT)).toBe(128);
  });

  it('--sglang-page-size sets the block size when --block-size is not given; pages of 16 reuse 144 of the same prompt', async () => {
    const url = (
      await mockers.start([...SERVE, '--sglang-page-size', '16', '--sglang-schedule-policy', 'lpm', '--sglang-chunked-prefill-size', '4096'], { cwd: dir })
    ).url;
    const config = await engineConfig(url);
    expect([config.block_size, config.sglang_page_size, config.sglang_schedule_policy, config.sglang_chunked_prefill_size]).toEqual([16, 16, 'lpm', 4096]);
    await cachedTokens(url, PROMPT);
    expect(await cachedTokens(url, PROMPT)).toBe(144);
  });

  it('publishes the radix cache on vLLM ZMQ wire: BlockStored events of page-size blocks holding the cached tokens', async () => {
    const [port] = await freePorts(1);
    const url = (await mockers.start([...SERVE, '--sglang-page-size', '16', '--zmq-kv-events-ports', String(port)], { cwd: dir })).url;
    const sub = await EventSubscriber.connect(`tcp://127.0.0.1:${port}`);
    subscribers.push(sub);
    await cachedTokens(url, PROMPT);
    const events = (await sub.settle()).flatMap((b) => b.payload[1] as unknown[][]);
    const stored = events.filter((e) => e[0] === 'BlockStored');
    expect(stored.length).toBeGreaterThan(0);
    for (const e of stored) expect(e[4]).toBe(16);
    // 150 prompt + 2 output tokens: 9 full pages (144 tokens), all of them prompt.
    expect(stored.flatMap((e) => e[3] as number[])).toEqual(PROMPT.slice(0, 144));
  });

  it.each([
    [
      'a page size other than the block size',
      ['--block-size', '32', '--sglang-page-size', '16'],
      /page size \(--sglang-page-size\) 16 and the block size \(--block-size\) 32 must be equal/,
    ],
    [
      'a chunk that is not whole pages',
      ['--sglang-page-size', '64', '--sglang-chunked-prefill-size', '100'],
      /--sglang-chunked-prefill-size 100 must be a multiple of the page size 64/,
    ],
    ['an unknown policy', ['--sglang-schedule-policy', 'random'], /argument 'random' is invalid/],
  ])('refuses %s', async (_label, args, message) => {
    const { code, stderr } = await runMockerToExit(['serve', '--engine-type', 'sglang', ...args, '--port', '0'], { cwd: dir });
    expect(code).toBe(1);
    expect(stderr).toMatch(message);
  });
});

describe('mocker trace with SGLang workers', () => {
  const TRACE = join(import.meta.dirname, '..', 'fixtures', 'traces', 'conversation_trace_200.jsonl');

  it('replays the trace through SGLang engines, alone and behind the KV router', async () => {
    for (const args of [[], ['--num-workers', '2', '--router-mode', 'kv_router']]) {
      const json = join(dir, `trace-${args.length}.json`);
      const { code, stderr } = await runMockerToExit(
        ['trace', TRACE, '--extra-engine-args', '{"engine_type":"sglang","sglang":{"page_size":16}}', ...args, '--report-json', json, '--no-progress'],
        { cwd: dir },
      );
      expect(stderr).toBe('');
      expect(code).toBe(0);
      const report = JSON.parse(readFileSync(json, 'utf8')) as Record<string, number>;
      expect(report.completed_requests).toBe(200);
      // The trace's rows share leading hash ids: the radix cache finds them.
      expect(report.prefix_cache_reused_ratio).toBeGreaterThan(0);
    }
  });
});
