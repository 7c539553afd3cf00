/**
 * Nothing recorded is lost or reordered at production concurrency: 256 streamed completions at once through the
 * spawned `mocker capture` in front of the vLLM double, each stored exchange compared with what its client
 * received (text, events, the engine's own usage) and with what the double was asked to generate; with one event
 * loop, and with `--threads 2` (a forwarding process, its exchanges recorded by the proxy's one recorder).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { childrenOf, cpuTicks } from '../../bench/lib/procStat.js';
import { CaptureStore, type StoredExchange } from '../../src/store/captureStore.js';
import { startMockerProcess, type MockerProcess } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';
import { encode, MODEL, startUpstream, type Upstream } from '../support/vllmUpstream.js';

const STREAMS = 256;
const WORDS = [' amber', ' basalt', ' cedar', ' delta', ' ember', ' fjord', ' garnet', ' harbor'];
/** A different answer per request: its number spelled in words, so a mix-up between streams shows. */
const answerOf = (i: number) => `Stream ${i}:${[...String(i)].map((d) => WORDS[Number(d) % WORDS.length]).join('')} and the end.`;
const promptOf = (i: number) => `request number ${i}`;

interface Received {
  text: string;
  events: number;
  completionTokens: number;
}

/** One streamed completion as its client sees it: the text pieces in order, every `data:` event, the usage. */
async function streamCompletion(url: string, i: number): Promise<Received> {
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, prompt: promptOf(i), max_tokens: 64, stream: true, stream_options: { include_usage: true } }),
  });
  expect(res.status).toBe(200);
  const body = await res.text();
  const data = body
    .split('\n\n')
    .filter((block) => block.startsWith('data: '))
    .map((block) => block.slice('data: '.length));
  const chunks = data.filter((d) => d !== '[DONE]').map((d) => JSON.parse(d) as { choices: { text: string }[]; usage: { completion_tokens: number } | null });
  return {
    text: chunks.flatMap((c) => c.choices.map((choice) => choice.text)).join(''),
    events: data.length,
    completionTokens: chunks.find((c) => c.usage !== null)!.usage!.completion_tokens,
  };
}

describe.each([1, 2])(`mocker capture with ${STREAMS} streams at once, --threads %i`, (threads) => {
  const dir = mkdtempSync(join(testTmpdir(), 'mocker-capture-256-'));
  const file = join(dir, 'capture.db');
  let upstream: Upstream;
  let capture: MockerProcess;
  let received: Received[];
  let stored: Map<string, StoredExchange>;
  /** CPU ticks each forwarding process spent on the load (none with one thread). */
  let forwarderTicks: number[];

  beforeAll(async () => {
    upstream = await startUpstream((body) => {
      const i = Number(String(body.prompt).replace(promptOf(0).slice(0, -1), ''));
      return { content: answerOf(i), finish: 'stop', ttftMs: 5, gapMs: () => 3 };
    });
    capture = await startMockerProcess(['capture', '--upstream', upstream.url, '--captures', file, '--threads', String(threads)]);
    const forwarders = childrenOf(capture.child.pid!);
    const before = forwarders.map((pid) => cpuTicks(pid));
    received = await Promise.all(Array.from({ length: STREAMS }, (_, i) => streamCompletion(`http://127.0.0.1:${capture.port}`, i)));
    forwarderTicks = forwarders.map((pid, k) => cpuTicks(pid) - before[k]);
    await capture.stop();
    const store = CaptureStore.open(file, { readonly: true });
    try {
      stored = new Map(
        store.exchangeIds().map((id) => {
          const ex = store.getExchange(id)!;
          return [String((JSON.parse(ex.requestBody.toString('utf8')) as { prompt: string }).prompt), ex];
        }),
      );
    } finally {
      store.close();
    }
  }, 120_000);

  afterAll(async () => {
    await capture?.stop();
    await upstream?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it(`forwards on ${threads} event loop(s): each forwarding process did part of the work, and the proxy counted every exchange`, () => {
    expect(forwarderTicks).toHaveLength(threads - 1);
    for (const ticks of forwarderTicks) expect(ticks).toBeGreaterThan(0);
    expect(capture.stdout()).toContain(`${STREAMS} exchange(s) recorded (0 aborted)`);
  });

  it('every client got its own answer', () => {
    received.forEach((r, i) => expect(r.text, `stream ${i}`).toBe(answerOf(i)));
  });

  it(`stores ${STREAMS} complete exchanges, one per request`, () => {
    expect(stored.size).toBe(STREAMS);
    for (let i = 0; i < STREAMS; i++) expect(stored.get(promptOf(i))?.outcome, `stream ${i}`).toBe('complete');
  });

  it("stores each stream as its client received it: the text, every event in order, the engine's usage, its output ids", async () => {
    for (let i = 0; i < STREAMS; i++) {
      const ex = stored.get(promptOf(i))!;
      const [generation] = ex.generations;
      expect(generation.text, `stream ${i}`).toBe(received[i].text);
      expect(ex.eventTimes, `stream ${i}`).toHaveLength(received[i].events);
      expect(
        ex.eventTimes.every((t, k) => k === 0 || t >= ex.eventTimes[k - 1]),
        `stream ${i}: event times in order`,
      ).toBe(true);
      expect(generation.outputIds, `stream ${i}`).toHaveLength(received[i].completionTokens);
      // What the double generated: its answer's tokens (Qwen3's tokenizer), then the EOS of a `stop` finish.
      expect(generation.outputIds.slice(0, -1), `stream ${i}`).toEqual(await encode(answerOf(i), false));
    }
  });
});
