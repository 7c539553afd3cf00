/**
 * The client matrix's cells, named once: test/clients/client-matrix.test.ts runs each cell against each target,
 * scripts/client-matrix.ts turns a run's results into docs/client-matrix.md, and test/docs/client-matrix-doc.test.ts
 * checks that the committed table lists exactly these cells.
 */

export const TARGETS = ['simulate', 'random', 'capture', 'replay'] as const;
export type Target = (typeof TARGETS)[number];

/** What each target is, as the table's legend says it. */
export const TARGET_COMMANDS: Record<Target, string> = {
  simulate: '`mocker serve` (default mode simulate; no captures, so every answer is a random one)',
  random: '`mocker serve --mode random --timing none`',
  capture: '`mocker capture` in front of `mocker serve --mode random --timing none`',
  replay: '`mocker serve --mode replay` of the capture file the capture column wrote (asserted identical to it)',
};

export const SCENARIOS = ['plain', 'streamed', 'tool loop', 'structured', 'reasoning'] as const;
export type Scenario = (typeof SCENARIOS)[number];

/** Per client: the API each scenario runs, or why a scenario has no cell. */
interface ClientCells {
  cells: Partial<Record<Scenario, string>>;
  notApplicable: Partial<Record<Scenario, string>>;
}

export const CLIENTS = {
  'openai 6': {
    cells: {
      plain: '`chat.completions.create`',
      streamed: '`chat.completions.create({stream: true})`',
      'tool loop': '`chat.completions.runTools` (`tool_choice: "required"`, 2 completions)',
      structured: '`chat.completions.parse` + `zodResponseFormat`',
      reasoning: '`message.reasoning_content`',
    },
    notApplicable: {},
  },
  'ai 5 + @ai-sdk/openai-compatible 1': {
    cells: {
      plain: '`generateText`',
      streamed: '`streamText`',
      'tool loop': '`generateText` + `tools`, `stopWhen: stepCountIs(2)`, step 1 `toolChoice: "required"`',
      structured: '`generateObject` + zod (`supportsStructuredOutputs`)',
      reasoning: '`generateText` → `reasoningText`',
    },
    notApplicable: {},
  },
  '@langchain/openai 1.5': {
    cells: {
      plain: '`ChatOpenAI.invoke`',
      streamed: '`ChatOpenAI.stream`',
      'tool loop': '`bindTools` (`tool_choice: "required"`), `ToolMessage`, `invoke` again',
      structured: '`withStructuredOutput(zod, {method: "jsonSchema"})`',
      reasoning: '`additional_kwargs.reasoning_content`',
    },
    notApplicable: {},
  },
  '@openai/agents 0.14': {
    cells: {
      plain: '`run(agent)` with `OpenAIChatCompletionsModel`',
      streamed: '`run(agent, input, {stream: true})`',
      'tool loop': '`Agent` + `tool()`, `toolChoice: "required"` (reset to auto after the call)',
      structured: '`Agent` with a zod `outputType`',
    },
    notApplicable: {
      reasoning: "reads a message's `reasoning` (later vLLM releases); mocker sends vLLM 0.11's `reasoning_content`",
    },
  },
} as const satisfies Record<string, ClientCells>;
export type Client = keyof typeof CLIENTS;

/** Clients the matrix does not run yet, with the reason (a row without cells). */
export const NOT_YET: Record<string, string> = {
  '@ai-sdk/openai 2': 'not yet (no Responses API in mocker)',
};

export interface Cell {
  client: Client;
  scenario: Scenario;
}

export function matrixCells(): Cell[] {
  return (Object.keys(CLIENTS) as Client[]).flatMap((client) =>
    SCENARIOS.filter((scenario) => scenario in CLIENTS[client].cells).map((scenario) => ({ client, scenario })),
  );
}

/** A cell's test name (under its target's describe block). */
export function cellTitle(cell: Cell): string {
  return `${cell.client} › ${cell.scenario}`;
}

/** A cell's outcome in one run: passed, or the error it failed with. */
export type Outcome = { passed: true } | { passed: false; error: string };

const PASS = '✓';
const FAIL = '✗';

/** docs/client-matrix.md from a run's outcomes (keyed by target, then cell title). */
export function renderMatrixDoc(outcomes: Record<Target, Record<string, Outcome>>): string {
  const header = `| client | scenario | API | ${TARGETS.join(' | ')} |\n|---|---|---|${TARGETS.map(() => '---|').join('')}`;
  const failures: string[] = [];
  const rows: string[] = [];
  for (const client of Object.keys(CLIENTS) as Client[]) {
    const { cells, notApplicable } = CLIENTS[client] as ClientCells;
    for (const scenario of SCENARIOS) {
      const api = cells[scenario];
      if (api === undefined) {
        const why = notApplicable[scenario];
        if (why !== undefined) rows.push(`| ${client} | ${scenario} | n/a: ${why} |${TARGETS.map(() => ' — |').join('')}`);
        continue;
      }
      const marks = TARGETS.map((target) => {
        const outcome = outcomes[target]?.[cellTitle({ client, scenario })];
        if (outcome === undefined) throw new Error(`no result for ${target} / ${cellTitle({ client, scenario })}`);
        if (outcome.passed) return PASS;
        failures.push(`- ${target} / ${client} / ${scenario}: ${outcome.error}`);
        return FAIL;
      });
      rows.push(`| ${client} | ${scenario} | ${api} | ${marks.join(' | ')} |`);
    }
  }
  for (const [client, why] of Object.entries(NOT_YET)) rows.push(`| ${client} | — | ${why} |${TARGETS.map(() => ' — |').join('')}`);
  return [
    '# Client matrix',
    '',
    'The TypeScript clients people point at a vLLM server, run against mocker by `test/clients/client-matrix.test.ts`',
    "(each through the built CLI over loopback HTTP). This page is generated from that test's results:",
    '`npx tsc -p . && npx tsx scripts/client-matrix.ts` (`test/docs/client-matrix-doc.test.ts` checks that it lists',
    "exactly the matrix's cells). ✓: the client observed what it observes from vLLM; ✗: it did not (errors below).",
    '',
    'Targets (every server with `--reasoning \'{"thinking_ratio":0.25}\' --tool-call-rate 0`: a reasoning model that',
    'calls a tool only when `tool_choice` requires it):',
    '',
    ...TARGETS.map((target) => `- **${target}**: ${TARGET_COMMANDS[target]}`),
    '',
    header,
    ...rows,
    '',
    '## Failing cells',
    '',
    ...(failures.length === 0 ? ['None.'] : failures),
    '',
  ].join('\n');
}

/** The cells a rendered table lists: `target / client / scenario` for every ✓ or ✗, and the not-yet rows. */
export function tableCells(markdown: string): { cells: string[]; notYet: string[] } {
  const cells: string[] = [];
  const notYet: string[] = [];
  const headerLine = markdown.split('\n').find((line) => line.startsWith('| client | scenario |'));
  if (headerLine === undefined) return { cells, notYet };
  const columns = headerLine
    .split('|')
    .slice(1, -1)
    .map((c) => c.trim());
  for (const line of markdown.split('\n')) {
    if (!line.startsWith('| ') || line === headerLine) continue;
    const fields = line
      .split('|')
      .slice(1, -1)
      .map((c) => c.trim());
    const [client, scenario] = fields;
    if (scenario === '—') notYet.push(client);
    fields.forEach((mark, i) => {
      if (mark === PASS || mark === FAIL) cells.push(`${columns[i]} / ${client} / ${scenario}`);
    });
  }
  return { cells, notYet };
}
