/**
 * Output token ids are the engine's own, or marked as not. llama.cpp returns no ids: the recorder tokenizes the
 * text, and a model's tokens do not always re-merge as they came out (random weights: 37 ids for 32 tokens).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CaptureStore, type StoredExchange } from '../../src/store/captureStore.js';
import { type EngineDouble, startEngineDouble } from '../support/engineDoubles.js';
import { mockerProcesses, runMockerToExit } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';
import { encode } from '../support/vllmUpstream.js';

/**
 * Tokens of Qwen3's vocabulary, each its own text's one token, that re-merge otherwise side by side (found with the
 * tokenizer: " automáticamente" + "filesystem" is 6 tokens as one text).
 */
const PIECES = [' automáticamente', 'filesystem', 'done', 'szed', ' tốt', 'oky', 'closest', 'même'];
const MESSAGES = [{ role: 'user' as const, content: 'Say something.' }];

describe('output ids of a llama.cpp capture whose text re-tokenizes to more tokens than were generated', () => {
  const mockers = mockerProcesses();
  const dir = mkdtempSync(join(testTmpdir(), 'mocker-output-ids-'));
  const file = join(dir, 'capture.db');
  let engine: EngineDouble;
  let exchanges: StoredExchange[];
  /** What the client was told was generated, per request: usage.completion_tokens. */
  const generated: number[] = [];

  beforeAll(async () => {
    engine = await startEngineDouble('llama.cpp', 0, { outputPieces: PIECES });
    const capture = await mockers.start(['capture', '--upstream', engine.url, '--captures', file]);
    const client = new OpenAI({ baseURL: `${capture.url}/v1`, apiKey: 'sk-test', maxRetries: 0 });
    const streamed = await client.chat.completions.create({
      model: engine.model,
      messages: MESSAGES,
      max_tokens: 8,
      stream: true,
      stream_options: { include_usage: true },
    });
    for await (const chunk of streamed) if (chunk.usage) generated.push(chunk.usage.completion_tokens);
    const text = await client.completions.create({
      model: engine.model,
      prompt: 'Say something.',
      max_tokens: 8,
      stream: true,
      stream_options: { include_usage: true },
    });
    for await (const chunk of text) if (chunk.usage) generated.push(chunk.usage.completion_tokens);
    const whole = await client.chat.completions.create({ model: engine.model, messages: MESSAGES, max_tokens: 8 });
    generated.push(whole.usage!.completion_tokens);
    await mockers.stopAll();
    const store = CaptureStore.open(file, { readonly: true });
    exchanges = store
      .exchangeIds()
      .map((id) => store.getExchange(id)!)
      .filter((ex) => ex.endpoint !== null);
    for (const ex of exchanges) void ex.generations;
    store.close();
  });
  afterAll(async () => {
    await mockers.stopAll();
    await engine?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('the text as one tokenizes to more tokens than the engine generated (the case under test)', async () => {
    expect(generated).toEqual([8, 8, 8]);
    expect((await encode(PIECES.join(''), false)).length).toBeGreaterThan(8);
  });

  it('streamed: stores exactly the generated count, one id per streamed piece, and each event counts its own token', async () => {
    const pieceIds = (await Promise.all(PIECES.map((p) => encode(p, false)))).flat();
    for (const ex of exchanges.filter((e) => e.stream)) {
      const [choice] = ex.generations;
      expect(choice.outputIds, ex.path).toEqual(pieceIds);
      expect(choice.chunkTokens.every((n) => n === 1)).toBe(true);
      // The finish chunk and usage llama.cpp sends after its last token carry none.
      expect(ex.eventTokens[ex.eventTokens.length - 1]).toBe(8);
    }
  });

  it("captures show and verify say whose ids they are; a non-streamed answer whose text re-tokenizes otherwise is marked as not the engine's", async () => {
    const whole = exchanges.find((e) => !e.stream)!;
    const stream = exchanges.find((e) => e.stream)!;
    const shownWhole = await runMockerToExit(['captures', 'show', file, String(whole.id)]);
    expect(shownWhole.stdout).toMatch(/output ids: NOT the engine's — \d+ stored, the engine generated 8/);
    const shownStream = await runMockerToExit(['captures', 'show', file, String(stream.id)]);
    expect(shownStream.stdout).toContain('output ids: tokenized from the text, as many as the engine generated (8)');
    const verified = await runMockerToExit(['captures', 'verify', file]);
    expect(verified.stdout).toContain(`1 not the engine's (exchanges ${whole.id})`);
    expect(verified.stdout).toContain('2 tokenized as many as generated');
  });
});
