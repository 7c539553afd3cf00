/**
 * The client matrix: the TypeScript clients, SDKs and agent frameworks people point at vLLM, each scenario run as
 * their users run it, through the built CLI over loopback HTTP, against every target (test/support/clientMatrix.ts
 * names the cells; scripts/client-matrix.ts turns a run into docs/client-matrix.md). A cell asserts what the client
 * observes from a vLLM server serving a reasoning model (Qwen3 with the reasoning and Hermes tool parsers): an
 * answer of `max_tokens` tokens (random outputs have no EOS before it), reasoning text apart from the content, a
 * tool call when `tool_choice` requires one, and the second step of a tool loop answered; a typed answer the
 * client's own schema accepts. The replay column must also observe exactly what the capture column did.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { ChatOpenAI } from '@langchain/openai';
import { HumanMessage, ToolMessage } from '@langchain/core/messages';
import { tool as langchainTool } from '@langchain/core/tools';
import { Agent, OpenAIChatCompletionsModel, run, setTracingDisabled, tool as agentTool } from '@openai/agents';
import { generateObject, generateText, stepCountIs, streamText, tool as aiTool } from 'ai';
import OpenAI from 'openai';
import { zodFunction, zodResponseFormat } from 'openai/helpers/zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { type CLIENTS, cellTitle, matrixCells, TARGETS, type Client, type Scenario, type Target } from '../support/clientMatrix.js';
import { mockerProcesses, type MockerProcess, type MockerProcesses } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';

const MODEL = 'Qwen/Qwen3-0.6B';
/** Every server: a reasoning model (a thinking span of a quarter of the answer) calling tools only when required. */
const MODEL_FLAGS = ['--reasoning', '{"thinking_ratio":0.25}', '--tool-call-rate', '0'];
/** Short answers: plain, streamed and reasoning cells. */
const SHORT = 24;
/** Room for a tool call or a typed answer after the thinking span. */
const LONG = 200;

const Weather = z.object({ city: z.string(), sunny: z.boolean() });
const CityArgs = z.object({ city: z.string() });
const forecast = ({ city }: { city: string }) => `It is sunny in ${city}.`;

// The Agents SDK exports traces to OpenAI by default: nothing leaves the machine.
setTracingDisabled(true);

/** A cell's run: what it observed (compared between the capture and the replay), after asserting on it. */
type CellRun = (baseURL: string, prompt: string) => Promise<string>;

function openaiClient(baseURL: string): OpenAI {
  return new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0 });
}

/** vLLM 0.11's reasoning field, which OpenAI's types do not have. */
type VllmMessage = { reasoning_content?: string | null };

const openaiCells: Record<keyof (typeof CLIENTS)['openai 6']['cells'], CellRun> = {
  plain: async (baseURL, prompt) => {
    const completion = await openaiClient(baseURL).chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: prompt }], max_tokens: SHORT });
    const [choice] = completion.choices;
    expect(choice.finish_reason).toBe('length');
    expect(completion.usage?.completion_tokens).toBe(SHORT);
    expect(choice.message.content).toEqual(expect.stringMatching(/\S/));
    return choice.message.content!;
  },
  streamed: async (baseURL, prompt) => {
    const stream = await openaiClient(baseURL).chat.completions.create({
      model: MODEL,
      messages: [{ role: 'user', content: prompt }],
      max_tokens: SHORT,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = '';
    const finishes: (string | null)[] = [];
    let completionTokens = 0;
    for await (const chunk of stream) {
      if (chunk.usage) completionTokens = chunk.usage.completion_tokens;
      const choice = chunk.choices[0];
      if (!choice) continue;
      text += choice.delta.content ?? '';
      if (choice.finish_reason) finishes.push(choice.finish_reason);
    }
    expect(finishes).toEqual(['length']);
    expect(completionTokens).toBe(SHORT);
    expect(text).toMatch(/\S/);
    return text;
  },
  'tool loop': async (baseURL, prompt) => {
    const calls: string[] = [];
    const runner = openaiClient(baseURL).chat.completions.runTools(
      {
        model: MODEL,
        messages: [{ role: 'user', content: prompt }],
        max_tokens: LONG,
        tool_choice: 'required',
        tools: [
          zodFunction({
            name: 'get_weather',
            description: 'The weather in a city',
            parameters: CityArgs,
            function: (args) => (calls.push(args.city), forecast(args)),
          }),
        ],
      },
      { maxChatCompletions: 2 },
    );
    // The runner sends the assistant's tool call (content null) and the tool's answer back: the second completion.
    await runner.done();
    expect(runner.allChatCompletions()).toHaveLength(2);
    expect(calls).toHaveLength(2);
    return JSON.stringify(calls);
  },
  structured: async (baseURL, prompt) => {
    const completion = await openaiClient(baseURL).chat.completions.parse({
      model: MODEL,
      messages: [{ role: 'user', content: prompt }],
      max_tokens: LONG,
      response_format: zodResponseFormat(Weather, 'weather'),
    });
    const [choice] = completion.choices;
    expect(choice.finish_reason).toBe('stop');
    expect(Weather.parse(choice.message.parsed)).toEqual(choice.message.parsed);
    return JSON.stringify(choice.message.parsed);
  },
  reasoning: async (baseURL, prompt) => {
    const completion = await openaiClient(baseURL).chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: prompt }], max_tokens: SHORT });
    const message = completion.choices[0].message as (typeof completion.choices)[0]['message'] & VllmMessage;
    expect(message.reasoning_content).toEqual(expect.stringMatching(/\S/));
    expect(message.reasoning_content).not.toContain('<think>');
    expect(message.content).not.toContain('</think>');
    return message.reasoning_content!;
  },
};

function aiModel(baseURL: string) {
  return createOpenAICompatible({ name: 'mocker', baseURL, apiKey: 'unused', supportsStructuredOutputs: true, includeUsage: true }).chatModel(MODEL);
}

const aiCells: Record<keyof (typeof CLIENTS)['ai 5 + @ai-sdk/openai-compatible 1']['cells'], CellRun> = {
  plain: async (baseURL, prompt) => {
    const result = await generateText({ model: aiModel(baseURL), prompt, maxOutputTokens: SHORT, maxRetries: 0 });
    expect(result.finishReason).toBe('length');
    expect(result.usage.outputTokens).toBe(SHORT);
    expect(result.text).toMatch(/\S/);
    return result.text;
  },
  streamed: async (baseURL, prompt) => {
    const errors: unknown[] = [];
    const result = streamText({ model: aiModel(baseURL), prompt, maxOutputTokens: SHORT, maxRetries: 0, onError: ({ error }) => void errors.push(error) });
    let text = '';
    for await (const delta of result.textStream) text += delta;
    expect(errors).toEqual([]);
    expect(await result.finishReason).toBe('length');
    expect((await result.usage).outputTokens).toBe(SHORT);
    expect(text).toMatch(/\S/);
    return text;
  },
  'tool loop': async (baseURL, prompt) => {
    const calls: string[] = [];
    const result = await generateText({
      model: aiModel(baseURL),
      prompt,
      maxOutputTokens: LONG,
      maxRetries: 0,
      tools: {
        get_weather: aiTool({ description: 'The weather in a city', inputSchema: CityArgs, execute: async (args) => (calls.push(args.city), forecast(args)) }),
      },
      // Step 1 must call the tool; step 2 (auto) answers with the tool's result in the conversation.
      prepareStep: ({ stepNumber }) => (stepNumber === 0 ? { toolChoice: 'required' } : {}),
      stopWhen: stepCountIs(2),
    });
    expect(result.steps).toHaveLength(2);
    expect(result.steps[0].toolCalls.map((c) => c.toolName)).toEqual(['get_weather']);
    expect(calls).toHaveLength(1);
    expect(result.steps[1].finishReason).toBe('length');
    expect(result.text).toMatch(/\S/);
    return JSON.stringify([calls, result.text]);
  },
  structured: async (baseURL, prompt) => {
    const result = await generateObject({ model: aiModel(baseURL), schema: Weather, prompt, maxOutputTokens: LONG, maxRetries: 0 });
    expect(result.finishReason).toBe('stop');
    expect(Weather.parse(result.object)).toEqual(result.object);
    return JSON.stringify(result.object);
  },
  reasoning: async (baseURL, prompt) => {
    const result = await generateText({ model: aiModel(baseURL), prompt, maxOutputTokens: SHORT, maxRetries: 0 });
    expect(result.reasoningText).toEqual(expect.stringMatching(/\S/));
    expect(result.text).not.toContain('</think>');
    return result.reasoningText!;
  },
};

function chatOpenAI(baseURL: string, maxTokens: number): ChatOpenAI {
  return new ChatOpenAI({ model: MODEL, apiKey: 'unused', configuration: { baseURL }, maxTokens, maxRetries: 0 });
}

const langchainCells: Record<keyof (typeof CLIENTS)['@langchain/openai 1.5']['cells'], CellRun> = {
  plain: async (baseURL, prompt) => {
    const message = await chatOpenAI(baseURL, SHORT).invoke(prompt);
    expect(message.response_metadata.finish_reason).toBe('length');
    expect(message.usage_metadata?.output_tokens).toBe(SHORT);
    expect(message.text).toMatch(/\S/);
    return message.text;
  },
  streamed: async (baseURL, prompt) => {
    let text = '';
    let chunks = 0;
    for await (const chunk of await chatOpenAI(baseURL, SHORT).stream(prompt)) {
      text += chunk.text;
      chunks += 1;
    }
    expect(chunks).toBeGreaterThan(1);
    expect(text).toMatch(/\S/);
    return text;
  },
  'tool loop': async (baseURL, prompt) => {
    const calls: string[] = [];
    const getWeather = langchainTool(async (args: { city: string }) => (calls.push(args.city), forecast(args)), {
      name: 'get_weather',
      description: 'The weather in a city',
      schema: CityArgs,
    });
    const model = chatOpenAI(baseURL, LONG);
    const question = new HumanMessage(prompt);
    const call = await model.bindTools([getWeather], { tool_choice: 'required' }).invoke([question]);
    expect(call.tool_calls?.map((c) => c.name)).toEqual(['get_weather']);
    const toolCall = call.tool_calls![0];
    const answer = new ToolMessage({ content: String(await getWeather.invoke(toolCall.args as { city: string })), tool_call_id: toolCall.id! });
    const final = await model.bindTools([getWeather]).invoke([question, call, answer]);
    expect(final.tool_calls).toEqual([]);
    expect(final.text).toMatch(/\S/);
    expect(calls).toHaveLength(1);
    return JSON.stringify([calls, final.text]);
  },
  structured: async (baseURL, prompt) => {
    const answer = await chatOpenAI(baseURL, LONG).withStructuredOutput(Weather, { method: 'jsonSchema' }).invoke(prompt);
    expect(Weather.parse(answer)).toEqual(answer);
    return JSON.stringify(answer);
  },
  reasoning: async (baseURL, prompt) => {
    const message = await chatOpenAI(baseURL, SHORT).invoke(prompt);
    const reasoning = message.additional_kwargs.reasoning_content;
    expect(reasoning).toEqual(expect.stringMatching(/\S/));
    expect(message.text).not.toContain('</think>');
    return String(reasoning);
  },
};

function agent<T extends z.ZodObject | undefined>(baseURL: string, options: { maxTokens: number; outputType?: T; withTool?: (city: string) => void }) {
  const model = new OpenAIChatCompletionsModel(openaiClient(baseURL), MODEL);
  const { withTool } = options;
  const tools = withTool
    ? [
        agentTool({
          name: 'get_weather',
          description: 'The weather in a city',
          parameters: CityArgs,
          execute: async (args) => (withTool(args.city), forecast(args)),
        }),
      ]
    : [];
  return new Agent({
    name: 'matrix',
    instructions: 'Answer briefly.',
    model,
    tools,
    outputType: options.outputType,
    modelSettings: { maxTokens: options.maxTokens, ...(withTool ? { toolChoice: 'required' } : {}) },
  });
}

const agentsCells: Record<keyof (typeof CLIENTS)['@openai/agents 0.14']['cells'], CellRun> = {
  plain: async (baseURL, prompt) => {
    const result = await run(agent(baseURL, { maxTokens: SHORT }), prompt);
    expect(result.finalOutput).toEqual(expect.stringMatching(/\S/));
    return String(result.finalOutput);
  },
  streamed: async (baseURL, prompt) => {
    const result = await run(agent(baseURL, { maxTokens: SHORT }), prompt, { stream: true });
    let text = '';
    for await (const delta of result.toTextStream()) text += delta;
    await result.completed;
    expect(result.error).toBeNull();
    expect(text).toMatch(/\S/);
    expect(result.finalOutput).toBe(text);
    return text;
  },
  'tool loop': async (baseURL, prompt) => {
    const calls: string[] = [];
    // The SDK resets tool_choice to auto once the tool has run: the second turn answers in text.
    const result = await run(agent(baseURL, { maxTokens: LONG, withTool: (city) => calls.push(city) }), prompt, { maxTurns: 2 });
    expect(calls).toHaveLength(1);
    expect(result.finalOutput).toEqual(expect.stringMatching(/\S/));
    return JSON.stringify([calls, result.finalOutput]);
  },
  structured: async (baseURL, prompt) => {
    const result = await run(agent(baseURL, { maxTokens: LONG, outputType: Weather }), prompt);
    expect(Weather.parse(result.finalOutput)).toEqual(result.finalOutput);
    return JSON.stringify(result.finalOutput);
  },
};

const RUNS: Record<Client, Partial<Record<Scenario, CellRun>>> = {
  'openai 6': openaiCells,
  'ai 5 + @ai-sdk/openai-compatible 1': aiCells,
  '@langchain/openai 1.5': langchainCells,
  '@openai/agents 0.14': agentsCells,
};

/** The prompt of a cell: its own, so a capture holds one exchange per cell step and a replay finds it. */
function promptOf(client: Client, scenario: Scenario): string {
  return `Client matrix, ${client}, ${scenario}: what is the weather in Lisbon?`;
}

const directory = mkdtempSync(join(testTmpdir(), 'mocker-client-matrix-'));
const captures = join(directory, 'matrix.db');
afterAll(() => rmSync(directory, { recursive: true, force: true }));

/** What the capture column observed, per cell title: the replay column must observe the same. */
const captured = new Map<string, string>();

/** Starts the servers a target runs, in order: the last, returned, is the one clients talk to. */
async function startTarget(target: Target, servers: MockerProcesses): Promise<MockerProcess> {
  // `serve`'s default capture file (captures/mocker.db) is looked for in the working directory: an empty one.
  const start = (args: string[]) => servers.start(args, { cwd: directory });
  // vLLM 0.11's shape: the matrix records which clients read its `reasoning_content`.
  const random = ['serve', '--mode', 'random', '--timing', 'none', '--wire', 'vllm-0.11', ...MODEL_FLAGS];
  switch (target) {
    case 'simulate':
      return start(['serve', '--wire', 'vllm-0.11', ...MODEL_FLAGS]);
    case 'random':
      return start(random);
    case 'capture': {
      const upstream = await start(random);
      return start(['capture', '--upstream', upstream.url, '--captures', captures]);
    }
    case 'replay':
      return start(['serve', '--mode', 'replay', '--captures', captures]);
  }
}

for (const target of TARGETS) {
  describe(target, () => {
    const servers = mockerProcesses();
    let baseURL = '';
    beforeAll(async () => {
      baseURL = `${(await startTarget(target, servers)).url}/v1`;
    });
    // The capture stops (its file closed) before the replay opens it.
    afterAll(servers.stopAll);

    for (const cell of matrixCells()) {
      it(cellTitle(cell), async () => {
        const observed = await RUNS[cell.client][cell.scenario]!(baseURL, promptOf(cell.client, cell.scenario));
        if (target === 'capture') captured.set(cellTitle(cell), observed);
        if (target === 'replay') expect(observed).toBe(captured.get(cellTitle(cell)));
      });
    }
  });
}
