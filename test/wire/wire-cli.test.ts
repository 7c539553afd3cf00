/**
 * `mocker serve --wire` as a user runs it: the built CLI, the official `openai` client. vLLM 0.11 answers with
 * `reasoning_content`, an empty `tool_calls` list and usage for `stream_options: {}`; the default (vLLM main)
 * with `reasoning`, no `tool_calls` when there is none, and usage only when `include_usage` is true
 * (shared/spec/vllm-wire-reference.md §1.3, §1.4 and §9).
 */
import OpenAI from 'openai';
import { afterAll, describe, expect, it } from 'vitest';
import { mockerProcesses, runMockerToExit } from '../support/mockerProcess.js';

const mockers = mockerProcesses();
afterAll(mockers.stopAll);

const MODEL = 'Qwen/Qwen3-0.6B';
const SERVE = ['serve', '--mode', 'random', '--timing', 'none', '--reasoning', '{"thinking_ratio":0.5}'];
const client = (url: string) => new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0 });

/** What vLLM adds to the openai client's message type (either release's name of the reasoning). */
type Message = OpenAI.ChatCompletionMessage & { reasoning_content?: string | null; reasoning?: string | null };

/** The release `/version` names (vllm-wire-reference.md Appendix A: 0.12 added `reasoning`; `reasoning_content` went in 0.17.1). */
async function versionOf(url: string): Promise<string> {
  return ((await (await fetch(`${url}/version`)).json()) as { version: string }).version;
}

async function ask(to: OpenAI): Promise<{ message: Message; usageChunks: number }> {
  const completion = await to.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Why?' }], max_tokens: 8 });
  const stream = await to.chat.completions.create({
    model: MODEL,
    messages: [{ role: 'user', content: 'Why?' }],
    max_tokens: 4,
    stream: true,
    stream_options: {},
  });
  let usageChunks = 0;
  for await (const chunk of stream) if (chunk.usage) usageChunks++;
  return { message: completion.choices[0].message as Message, usageChunks };
}

describe('serve --wire', () => {
  it('vllm-0.11: the reasoning as reasoning_content, tool_calls [], usage for stream_options {}', async () => {
    const { url } = await mockers.start([...SERVE, '--wire', 'vllm-0.11']);
    expect(await versionOf(url)).toBe('0.11.0');
    const { message, usageChunks } = await ask(client(url));
    expect(typeof message.reasoning_content).toBe('string');
    expect(message.reasoning_content!.length).toBeGreaterThan(0);
    expect('reasoning' in message).toBe(false);
    expect(message.tool_calls).toEqual([]);
    expect(usageChunks).toBe(1);
  });

  it('by default vLLM main: the reasoning as reasoning, no tool_calls, no usage unless include_usage is true', async () => {
    const { url } = await mockers.start(SERVE);
    // A release without reasoning_content, so that a capture of this server replays in this shape.
    expect(Number((await versionOf(url)).split('.')[1])).toBeGreaterThanOrEqual(17);
    const { message, usageChunks } = await ask(client(url));
    expect(typeof message.reasoning).toBe('string');
    expect(message.reasoning!.length).toBeGreaterThan(0);
    expect('reasoning_content' in message).toBe(false);
    expect('tool_calls' in message).toBe(false);
    expect(usageChunks).toBe(0);
  });

  it('an unknown shape is refused at start, naming the flag and the shapes there are', async () => {
    const run = await runMockerToExit(['serve', '--host', '127.0.0.1', '--port', '0', '--wire', 'vllm-0.9']);
    expect(run.code).not.toBe(0);
    expect(run.stderr).toContain('--wire');
    for (const shape of ['vllm-0.11', 'vllm-0.12', 'vllm-main', 'sglang']) expect(run.stderr).toContain(shape);
  });
});
