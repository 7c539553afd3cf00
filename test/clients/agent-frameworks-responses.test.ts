/**
 * Agent frameworks over the OpenAI Responses API (issue 39 item 4): the Vercel AI SDK's OpenAI provider
 * (`openai.responses(model)`) and the OpenAI Agents SDK's `OpenAIResponsesModel` each drive a two-turn tool loop
 * against the spawned CLI in simulate mode — the first turn must call the tool (`tool_choice` required), the
 * framework runs it and sends its output back as a `function_call_output` item, the second turn answers. What is
 * asserted is what the framework observes: its steps, the tool it ran with the model's arguments, the final text,
 * and usage that adds up.
 */
import { createOpenAI } from '@ai-sdk/openai';
import { Agent, OpenAIResponsesModel, run, setTracingDisabled, tool as agentTool } from '@openai/agents';
import { generateText, stepCountIs, tool as aiTool } from 'ai';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { mockerProcesses } from '../support/mockerProcess.js';
import { MODEL } from '../support/vllmUpstream.js';

// The Agents SDK exports traces to OpenAI by default: nothing leaves the machine.
setTracingDisabled(true);

const CityArgs = z.object({ city: z.string() });
const forecast = ({ city }: { city: string }) => `It is sunny in ${city}.`;
const PROMPT = 'What is the weather in Lisbon? Use the tool, then answer in one sentence.';

describe('agent frameworks drive a two-turn tool loop over /v1/responses (simulate mode)', () => {
  const mockers = mockerProcesses();
  let baseURL = '';
  beforeAll(async () => {
    // Random answers call a tool only when tool_choice requires one: the first turn; the second answers in text.
    baseURL = `${(await mockers.start(['serve', '--tool-call-rate', '0'])).url}/v1`;
  });
  afterAll(mockers.stopAll);

  it('ai 5 with @ai-sdk/openai 2 (openai.responses): a tool call, its result sent back, a text answer', async () => {
    const calls: string[] = [];
    const result = await generateText({
      model: createOpenAI({ baseURL, apiKey: 'unused' }).responses(MODEL),
      // As against vLLM: the SDK sends the conversation's items themselves, not references to stored ones (which
      // vLLM does not resolve).
      providerOptions: { openai: { store: false } },
      prompt: PROMPT,
      maxOutputTokens: 64,
      maxRetries: 0,
      tools: {
        get_weather: aiTool({ description: 'The weather in a city', inputSchema: CityArgs, execute: async (args) => (calls.push(args.city), forecast(args)) }),
      },
      prepareStep: ({ stepNumber }) => (stepNumber === 0 ? { toolChoice: 'required' } : { toolChoice: 'none' }),
      stopWhen: stepCountIs(2),
    });
    expect(result.steps).toHaveLength(2);
    expect(result.steps[0].toolCalls.map((c) => c.toolName)).toEqual(['get_weather']);
    expect(result.steps[0].toolResults.map((r) => r.output)).toEqual([forecast({ city: calls[0] })]);
    expect(calls).toHaveLength(1);
    // The second request carried the call and its output back.
    const second = result.steps[1].request.body as { input: { type?: string }[] };
    expect(second.input.map((item) => item.type)).toEqual(expect.arrayContaining(['function_call', 'function_call_output']));
    expect(result.text).toMatch(/\S/);
    for (const step of result.steps) {
      const { inputTokens, outputTokens, totalTokens } = step.usage;
      expect(inputTokens).toBeGreaterThan(0);
      expect(totalTokens).toBe(inputTokens! + outputTokens!);
    }
    // The second turn's prompt holds the first's, its call and the tool's answer.
    expect(result.steps[1].usage.inputTokens).toBeGreaterThan(result.steps[0].usage.inputTokens!);
  });

  it("ai 5's default (store true) sends the first turn's items as references: a 400 naming the item type and what to send", async () => {
    const request = generateText({
      model: createOpenAI({ baseURL, apiKey: 'unused' }).responses(MODEL),
      prompt: PROMPT,
      maxOutputTokens: 64,
      maxRetries: 0,
      tools: { get_weather: aiTool({ description: 'The weather in a city', inputSchema: CityArgs, execute: async (args) => forecast(args) }) },
      prepareStep: ({ stepNumber }) => (stepNumber === 0 ? { toolChoice: 'required' } : { toolChoice: 'none' }),
      stopWhen: stepCountIs(2),
    });
    await expect(request).rejects.toThrow(/Input items of type "item_reference" are not supported.*store: false/);
  });

  it('@openai/agents 0.14 with OpenAIResponsesModel: the agent runs the tool, then answers', async () => {
    const calls: string[] = [];
    const agent = new Agent({
      name: 'weather',
      instructions: 'Answer briefly.',
      model: new OpenAIResponsesModel(new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0 }), MODEL),
      tools: [
        agentTool({
          name: 'get_weather',
          description: 'The weather in a city',
          parameters: CityArgs,
          execute: async (args) => (calls.push(args.city), forecast(args)),
        }),
      ],
      // The SDK resets tool_choice to auto once the tool has run: the second turn answers in text.
      modelSettings: { maxTokens: 64, toolChoice: 'required' },
    });
    const result = await run(agent, PROMPT, { maxTurns: 2 });
    expect(calls).toHaveLength(1);
    expect(result.finalOutput).toEqual(expect.stringMatching(/\S/));
    expect(result.newItems.map((item) => item.type)).toEqual(['tool_call_item', 'tool_call_output_item', 'message_output_item']);
  });
});
