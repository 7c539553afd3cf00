/**
 * An agent session in simulate mode (issue 39 item 3): five turns of a tool loop — each turn resends the history,
 * its tool calls and their results — through the spawned CLI with the openai client. Every turn's prompt extends
 * what the engine computed for the turns before, so the simulated prefix cache must find that shared prefix: vLLM
 * caches the full blocks of the tokens it computed (a finished request's prompt and its output but the last
 * token, whose KV is never computed) and a lookup hits at most `length − 1` tokens, in whole blocks. The oracle
 * is the token ids the server returned (`return_token_ids`: prompt and output ids per turn), compared block by
 * block here; the engine's answer is `usage.prompt_tokens_details.cached_tokens`.
 */
import OpenAI from 'openai';
import type { ChatCompletion, ChatCompletionMessageParam, ChatCompletionTool } from 'openai/resources/chat/completions';
import { afterAll, describe, expect, it } from 'vitest';
import { mockerProcesses } from '../support/mockerProcess.js';
import { MODEL } from '../support/vllmUpstream.js';

const BLOCK = 16;
const mockers = mockerProcesses();
afterAll(mockers.stopAll);

const TOOLS: ChatCompletionTool[] = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'The weather in a city',
      parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    },
  },
];

type VllmCompletion = ChatCompletion & {
  prompt_token_ids: number[];
  choices: (ChatCompletion.Choice & { token_ids: number[] })[];
  usage: { prompt_tokens_details: { cached_tokens: number } | null };
};

const commonPrefix = (a: number[], b: number[]) => {
  let n = 0;
  while (n < a.length && n < b.length && a[n] === b[n]) n++;
  return n;
};

describe('a five-turn agent session in simulate mode: the prefix cache finds each turn’s history', () => {
  it('turns 2–5 hit the tokens computed before them that their prompt shares, in whole blocks', async () => {
    const server = await mockers.start(['serve', '--block-size', String(BLOCK), '--enable-prompt-tokens-details', '--tool-call-rate', '1']);
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    const messages: ChatCompletionMessageParam[] = [
      { role: 'system', content: 'You are a travel agent. Use the tools you are given.' },
      { role: 'user', content: 'What is the weather in Paris, Rome, Berlin and Madrid? Then summarise.' },
    ];
    /** Per turn: what the engine computed (prompt and output but the last token). */
    const computed: number[][] = [];
    for (let turn = 1; turn <= 5; turn++) {
      const last = turn === 5;
      const completion = (await client.chat.completions.create({
        model: MODEL,
        messages,
        tools: TOOLS,
        tool_choice: last ? 'none' : 'auto',
        max_tokens: 48,
        // vLLM's extension: the prompt's and the output's token ids.
        ...({ return_token_ids: true } as object),
      })) as VllmCompletion;
      const choice = completion.choices[0];
      const prompt = completion.prompt_token_ids;
      const shared = Math.max(0, ...computed.map((ids) => commonPrefix(prompt, ids)));
      const expected = Math.min(Math.floor(shared / BLOCK), Math.floor((prompt.length - 1) / BLOCK)) * BLOCK;
      expect(completion.usage.prompt_tokens_details?.cached_tokens, `turn ${turn}`).toBe(expected);
      if (turn > 1) expect(expected, `turn ${turn} shares its history`).toBeGreaterThanOrEqual(computed[turn - 2].length - 2 * BLOCK);
      computed.push([...prompt, ...choice.token_ids.slice(0, -1)]);

      if (last) {
        expect(choice.finish_reason).not.toBe('tool_calls');
        expect(choice.message.content).toBeTruthy();
        break;
      }
      expect(choice.finish_reason).toBe('tool_calls');
      const call = choice.message.tool_calls![0] as { id: string; function: { name: string; arguments: string } };
      messages.push({ role: 'assistant', content: null, tool_calls: choice.message.tool_calls });
      messages.push({ role: 'tool', tool_call_id: call.id, content: JSON.stringify({ temperature_c: 10 + turn, sky: 'clear' }) });
    }
  });
});
