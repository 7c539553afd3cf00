/**
 * A stop string that spans two streamed chunks (its first character ends one, the rest starts the next): vLLM
 * answers the text before the stop string and nothing of it, streamed or not — its detokenizer holds back the
 * last (longest stop − 1) characters until the request finishes, so a stop string's start is never sent
 * (`get_next_output_text`, vllm/v1/engine/detokenizer.py). The oracle is the same request without `stop` (random
 * outputs are fixed by prompt and seed): its text cut before the stop string's first occurrence.
 */
import OpenAI from 'openai';
import { afterAll, describe, expect, it } from 'vitest';
import { mockerProcesses } from '../support/mockerProcess.js';
import { MODEL } from '../support/vllmUpstream.js';

const mockers = mockerProcesses();
afterAll(mockers.stopAll);

const REQUEST = { model: MODEL, messages: [{ role: 'user' as const, content: 'Tell me a story.' }], max_tokens: 48, seed: 11 };

describe('a stop string spanning two chunks', () => {
  it('ends the text before it, streamed and not: no character of it is sent', async () => {
    const client = new OpenAI({
      baseURL: `${(await mockers.start(['serve', '--mode', 'random', '--timing', 'none'])).url}/v1`,
      apiKey: 'unused',
      maxRetries: 0,
    });
    const deltas: string[] = [];
    for await (const chunk of await client.chat.completions.create({ ...REQUEST, stream: true })) deltas.push(chunk.choices[0]?.delta?.content ?? '');
    const full = deltas.join('');
    // A boundary whose two sides make a string first seen there (so the stop is found at that boundary).
    let offset = 0;
    let stop: string | undefined;
    for (let k = 0; k + 1 < deltas.length && !stop; k++) {
      offset += deltas[k].length;
      const candidate = deltas[k].slice(-1) + deltas[k + 1].slice(0, 2);
      if (deltas[k].length > 0 && deltas[k + 1].length >= 2 && offset > 4 && full.indexOf(candidate) === offset - 1) stop = candidate;
    }
    expect(stop, `no usable chunk boundary in ${JSON.stringify(deltas)}`).toBeDefined();
    const expected = full.slice(0, full.indexOf(stop!));

    const plain = await client.chat.completions.create({ ...REQUEST, stop: [stop!] });
    expect(plain.choices[0].message.content).toBe(expected);
    expect(plain.choices[0].finish_reason).toBe('stop');
    expect((plain.choices[0] as { stop_reason?: unknown }).stop_reason).toBe(stop);

    const streamed: string[] = [];
    for await (const chunk of await client.chat.completions.create({ ...REQUEST, stop: [stop!], stream: true }))
      streamed.push(chunk.choices[0]?.delta?.content ?? '');
    expect(streamed.join('')).toBe(expected);
  });
});
