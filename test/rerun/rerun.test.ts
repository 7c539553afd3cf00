/**
 * `mocker rerun`, spawned as a user runs it: a golden capture of an engine double (made by the spawned
 * `mocker capture`, traffic from the real `openai` client) sent again to a target, and what the report says.
 * The oracles: the requests this file sent (how many, which kind), the doubles' own templates and tokenizer
 * (where a changed template or tokenizer first changes a prompt), and what each double was told to change.
 */
import { mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import { Template } from '@huggingface/jinja';
import Database from 'better-sqlite3';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { launchChromium, openHtmlFile } from '../support/chromiumPage.js';
import { startEngineDouble, type EngineName } from '../support/engineDoubles.js';
import { schemaErrors } from '../support/junitSchema.js';
import { listenOnLoopback } from '../support/loopback.js';
import { mockerProcesses, runMockerToExit } from '../support/mockerProcess.js';
import { startSglangUpstream } from '../support/sglangUpstream.js';
import { CHAT_TEMPLATE, encode, MODEL, promptIds, startUpstream, type Answer, type Upstream, type UpstreamOptions } from '../support/vllmUpstream.js';
import { testTmpdir } from '../support/tempRoot.js';

type Json = Record<string, unknown>;

const tmp = mkdtempSync(join(testTmpdir(), 'rerun-'));
const mockers = mockerProcesses();
const closers: (() => Promise<void>)[] = [];
let counter = 0;
const file = (name: string) => join(tmp, `${name}-${++counter}.db`);

const mocker = (...args: string[]) => mockers.start(args);

afterAll(async () => {
  await mockers.stopAll();
  await Promise.all(closers.map((close) => close()));
});

const client = (url: string) => new OpenAI({ baseURL: `${url}/v1`, apiKey: 'GOLDEN-SECRET', maxRetries: 0, defaultHeaders: { 'X-Team': 'blue' } });

const TOOLS = [
  {
    type: 'function' as const,
    function: { name: 'get_weather', description: 'The weather in a city', parameters: { type: 'object', properties: { city: { type: 'string' } } } },
  },
];

function lastUser(body: Json): string {
  if (typeof body.prompt === 'string') return body.prompt;
  const messages = (body.messages ?? []) as { content?: unknown }[];
  return String(messages[messages.length - 1]?.content ?? '');
}

/** The vLLM double's model: reasoning and a tool call for the weather, a story that changes between builds, else a greeting. */
const script =
  (story: string, fable = GOLDEN_FABLE) =>
  (body: Json): Answer => {
    const text = lastUser(body);
    if (text.includes('fable')) return { content: fable };
    if (text.includes('fail')) return { errorStatus: 400 };
    if (text.includes('weather'))
      return { reasoning: 'The user wants the weather. I call the tool.', toolCall: { name: 'get_weather', arguments: '{"city": "Paris"}' } };
    if (text.includes('story')) return { content: story };
    return { content: 'Hello! How can I help you today?' };
  };
const GOLDEN_STORY = 'Once upon a time there was a cat.';
const GOLDEN_FABLE = 'The fox and the grapes.';

/** The chats of the golden run, by name (each its own request, so pairing is by request). */
const CHATS: Record<string, Json> = {
  tools: {
    model: MODEL,
    messages: [
      { role: 'system', content: 'You are a weather bot.' },
      { role: 'user', content: 'What is the weather in Paris?' },
    ],
    tools: TOOLS,
    max_tokens: 64,
    temperature: 0,
  },
  'tools streamed': {
    model: MODEL,
    messages: [
      { role: 'system', content: 'You are a weather bot.' },
      { role: 'user', content: 'And the weather in Rome?' },
    ],
    tools: TOOLS,
    max_tokens: 64,
    temperature: 0,
    stream: true,
  },
  system: {
    model: MODEL,
    messages: [
      { role: 'system', content: 'Be brief.' },
      { role: 'user', content: 'Say hello' },
    ],
    max_tokens: 32,
    temperature: 0,
    stream: true,
  },
  sampled: { model: MODEL, messages: [{ role: 'user', content: 'Tell me a story' }], max_tokens: 32 },
  seeded: { model: MODEL, messages: [{ role: 'user', content: 'Tell me a fable' }], max_tokens: 32, temperature: 0.8, seed: 7 },
};
const COMPLETIONS: Json[] = [
  { model: MODEL, prompt: 'The capital of France is', max_tokens: 16, temperature: 0 },
  { model: MODEL, prompt: 'Count to three:', max_tokens: 16, temperature: 0, stream: true },
];
const EMBEDDINGS: Json = { model: MODEL, input: ['a cat', 'a dog'], encoding_format: 'float' };
const SENT = Object.keys(CHATS).length + COMPLETIONS.length + 1;
/** Qwen3's <|im_start|> (tokenizer.json's added_tokens). */
const IM_START = 151644;

async function post(url: string, path: string, body: Json): Promise<void> {
  const res = await fetch(`${url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-team': 'blue', authorization: 'Bearer GOLDEN-SECRET' },
    body: JSON.stringify(body),
  });
  expect(res.status, `${path} ${JSON.stringify(body).slice(0, 80)}`).toBe(200);
  await res.text();
}

/** Sends the golden traffic through a capture proxy (the openai client for chats, plain POSTs for the rest). */
async function captureVllmGolden(upstream: Upstream): Promise<string> {
  const golden = file('golden');
  const capture = await mocker('capture', '--upstream', upstream.url, '--captures', golden);
  const url = `http://127.0.0.1:${capture.port}`;
  for (const body of Object.values(CHATS)) {
    if (body.stream) for await (const _ of await client(url).chat.completions.create(body as unknown as OpenAI.ChatCompletionCreateParamsStreaming));
    else await client(url).chat.completions.create(body as unknown as OpenAI.ChatCompletionCreateParamsNonStreaming);
  }
  for (const body of COMPLETIONS) await post(url, '/v1/completions', body);
  await client(url).embeddings.create(EMBEDDINGS as unknown as OpenAI.EmbeddingCreateParams);
  // Failed in the capture: listed as not compared, never sent again.
  await client(url)
    .chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'please fail' }], max_tokens: 8 })
    .catch(() => undefined);
  await capture.stop();
  return golden;
}

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** `mocker rerun GOLDEN --target URL [flags]` in a fresh working directory (its default output lands there). */
async function rerun(golden: string, target: string, ...flags: string[]): Promise<Run & { cwd: string }> {
  const cwd = mkdtempSync(join(tmp, 'cwd-'));
  return { ...(await runMockerToExit(['rerun', golden, '--target', target, ...flags], { cwd })), cwd };
}

interface ReportJson {
  regression: boolean;
  timing: { itlMs: { shift: { p50: number }; pValue: number | null; beyondNoise: boolean } };
  totals: { compared: number; same: number; regressions: number; sampled: number; promptChanges: number; outputChanges: number };
  exchanges: {
    golden: number;
    endpoint: string;
    verdict: string;
    request: string;
    prompt: { difference: { position: number; partLabel: string } | null } | null;
    output: { differences: { field: string }[] };
  }[];
}

async function rerunJson(golden: string, target: string): Promise<Run & { report: ReportJson }> {
  const run = await rerun(golden, target, '--json');
  return { ...run, report: JSON.parse(run.stdout) as ReportJson };
}

/** The summary line's counts: "N exchanges compared: S same, R regression(s), …". */
function summary(stdout: string): { compared: number; same: number; regressions: number; sampled: number } {
  const m = /(\d+) exchanges compared: (\d+) same, (\d+) regression\(s\), (\d+) sampled/.exec(stdout);
  expect(m, stdout).not.toBeNull();
  return { compared: Number(m![1]), same: Number(m![2]), regressions: Number(m![3]), sampled: Number(m![4]) };
}

describe('mocker rerun of a vLLM capture', () => {
  let golden: string;
  let upstream: Upstream;

  beforeAll(async () => {
    upstream = await startUpstream(script(GOLDEN_STORY));
    closers.push(() => upstream.close());
    golden = await captureVllmGolden(upstream);
  }, 60_000);

  it('against the same engine, with no flag but the file and target: every exchange the same, exit 0, the answers kept as a new capture', async () => {
    const run = await rerun(golden, upstream.url);
    expect(run.code, run.stderr).toBe(0);
    expect(summary(run.stdout)).toEqual({ compared: SENT, same: SENT, regressions: 0, sampled: 0 });
    const made = readdirSync(join(run.cwd, 'captures')).filter((f) => /^rerun-\d{8}-\d{6}\.db$/.test(f));
    expect(made).toHaveLength(1);
    // One run, labelled with the golden file, holding what the target said it is (the double's /version).
    const db = new Database(join(run.cwd, 'captures', made[0]), { readonly: true });
    try {
      expect(db.prepare('SELECT label, engine, engine_version AS version FROM runs').all()).toEqual([
        { label: `rerun of ${golden}`, engine: 'vllm', version: '0.11.0' },
      ]);
    } finally {
      db.close();
    }
  });

  it('against a replay of its own capture: every exchange the same, exit 0', async () => {
    const replay = await mocker('serve', '--mode', 'replay', '--captures', golden);
    const run = await rerun(golden, `http://127.0.0.1:${replay.port}`);
    expect(run.code, run.stderr).toBe(0);
    expect(summary(run.stdout)).toEqual({ compared: SENT, same: SENT, regressions: 0, sampled: 0 });
    await replay.stop();
  });

  /** Each chat's first differing prompt position between the golden template and `template`, rendered and tokenized by the double's own code. */
  async function templateOracle(template: string): Promise<Map<string, number>> {
    const out = new Map<string, number>();
    for (const [name, body] of Object.entries(CHATS)) {
      const a = await promptIds(body, true);
      const b = await promptIds(body, true, { template: new Template(template), encode });
      const n = Math.min(a.length, b.length);
      let i = 0;
      while (i < n && a[i] === b[i]) i++;
      if (i < n || a.length !== b.length) out.set(name, i);
    }
    return out;
  }

  async function withTemplate(template: string): Promise<ReportJson & { code: number | null }> {
    expect(template).not.toBe(CHAT_TEMPLATE);
    const changed = await startUpstream(script(GOLDEN_STORY), { chatTemplate: template });
    try {
      const run = await rerunJson(golden, changed.url);
      return { ...run.report, code: run.code };
    } finally {
      await changed.close();
    }
  }

  /** The golden exchanges are the requests in the order sent (one at a time): the chats first. */
  const chatExchange = (report: ReportJson, name: string) => {
    const exchange = report.exchanges[Object.keys(CHATS).indexOf(name)];
    expect(exchange.endpoint).toBe('chat');
    return exchange;
  };

  it('a changed generation prompt in the chat template: each chat a preprocessing regression at its first differing token, in the generation prompt; exit 1', async () => {
    const template = CHAT_TEMPLATE.replace("{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}");
    const oracle = await templateOracle(template);
    expect(oracle.size).toBe(Object.keys(CHATS).length);
    const report = await withTemplate(template);
    expect(report.code).toBe(1);
    expect(report.totals.promptChanges).toBe(oracle.size);
    for (const [name, position] of oracle) {
      const e = chatExchange(report, name);
      expect(e?.verdict, name).toBe('regression');
      expect(e?.prompt?.difference, name).toEqual(expect.objectContaining({ position, partLabel: 'generation prompt' }));
    }
    // Completions and embeddings do not go through the template.
    expect(report.exchanges.filter((e) => e.endpoint !== 'chat').every((e) => e.verdict === 'same')).toBe(true);
  });

  it('a changed system-prompt rendering is placed in the system prompt, a changed tool rendering in the tool definitions', async () => {
    const system = CHAT_TEMPLATE.replace(
      "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}",
      "{{- '<|im_start|>system\\nYou are Qwen.\\n' + messages[0].content + '<|im_end|>\\n' }}",
    );
    const systemOracle = await templateOracle(system);
    expect([...systemOracle.keys()]).toEqual(['system']);
    const bySystem = await withTemplate(system);
    expect(bySystem.code).toBe(1);
    expect(chatExchange(bySystem, 'system')?.prompt?.difference).toEqual(
      expect.objectContaining({ position: systemOracle.get('system'), partLabel: 'system prompt' }),
    );

    const tools = CHAT_TEMPLATE.replace('{{- tool | tojson }}', '{{- tool.function | tojson }}');
    const toolsOracle = await templateOracle(tools);
    expect([...toolsOracle.keys()].sort()).toEqual(['tools', 'tools streamed']);
    const byTools = await withTemplate(tools);
    expect(byTools.code).toBe(1);
    for (const name of ['tools', 'tools streamed']) {
      expect(chatExchange(byTools, name)?.prompt?.difference, name).toEqual(
        expect.objectContaining({ position: toolsOracle.get(name), partLabel: 'tool definitions' }),
      );
    }
  });

  /** The rerun's JSON report against a double started with `options` (closed after). */
  async function against(options: UpstreamOptions, answers = script(GOLDEN_STORY)): Promise<ReportJson & { code: number | null }> {
    const changed = await startUpstream(answers, options);
    try {
      const run = await rerunJson(golden, changed.url);
      return { ...run.report, code: run.code };
    } finally {
      await changed.close();
    }
  }

  it('a changed tokenizer (another id for <|im_start|>): each chat a preprocessing regression at that token, in the message it opens; exit 1', async () => {
    const report = await against({ tokenizerIdChanges: { [IM_START]: IM_START + 100 } });
    expect(report.code).toBe(1);
    for (const [name, body] of Object.entries(CHATS)) {
      const position = (await promptIds(body, true)).indexOf(IM_START);
      const first = (body.messages as { role: string }[])[0];
      const part = first.role === 'system' ? 'system prompt' : `message 0 (${first.role})`;
      expect(chatExchange(report, name)?.prompt?.difference, name).toEqual(expect.objectContaining({ position, partLabel: part }));
    }
    // Completion prompts hold no <|im_start|>.
    expect(report.exchanges.filter((e) => e.endpoint !== 'chat').every((e) => e.verdict === 'same')).toBe(true);
  });

  it('a changed detokenizer (same ids, other text) is an output change of the greedy requests: text, not token ids; exit 1', async () => {
    const report = await against({ detokenize: (piece) => piece.replaceAll('o', '0') });
    expect(report.code).toBe(1);
    const greeting = chatExchange(report, 'system')!;
    expect(greeting.verdict).toBe('regression');
    expect(greeting.prompt?.difference).toBeNull();
    expect(greeting.output.differences.map((d) => d.field)).toEqual(['text']);
    // The tool calls' reasoning and arguments are not text the detokenizer writes: unchanged.
    expect(chatExchange(report, 'tools')?.verdict).toBe('same');
  });

  it('tool-call arguments are compared as JSON values: other spacing is the same call, another value is an output change; exit 1', async () => {
    const spacing = await against({ toolArguments: (args) => JSON.stringify(JSON.parse(args)) });
    expect(spacing.code).toBe(0);
    expect(spacing.totals.same).toBe(SENT);
    const value = await against({ toolArguments: (args) => args.replace('Paris', 'paris') });
    expect(value.code).toBe(1);
    for (const name of ['tools', 'tools streamed']) {
      expect(
        chatExchange(value, name)?.output.differences.map((d) => d.field),
        name,
      ).toEqual(['tool_calls']);
    }
  });

  it("--junit writes JUnit XML the CI systems' schema accepts, --report-html a page Chromium renders with its tables and charts", async () => {
    const changed = await startUpstream(script(GOLDEN_STORY), {
      chatTemplate: CHAT_TEMPLATE.replace("{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>assistant\\n\\n' }}"),
    });
    closers.push(() => changed.close());
    const junit = join(tmp, `junit-${++counter}.xml`);
    const html = join(tmp, `report-${counter}.html`);
    const run = await rerun(golden, changed.url, '--junit', junit, '--report-html', html);
    expect(run.code, run.stderr).toBe(1);
    const xml = readFileSync(junit, 'utf8');
    expect(await schemaErrors(xml)).toEqual([]);
    // The exchange that failed in the capture is a skipped test case.
    expect(xml.match(/<testcase /g)).toHaveLength(SENT + 1);
    expect(xml.match(/<skipped>/g)).toHaveLength(1);
    // Every chat's prompt changed: one failure each.
    expect(xml.match(/<failure /g)).toHaveLength(Object.keys(CHATS).length);
    const browser = await launchChromium();
    try {
      const { page, errors } = await openHtmlFile(browser, html, readFileSync(html, 'utf8'));
      expect(await page.locator('#verdict').textContent()).toContain(`Regression: ${Object.keys(CHATS).length} of ${SENT}`);
      expect(await page.locator('mark.first-difference').count()).toBe(2 * Object.keys(CHATS).length);
      for (const chart of ['chart-ttft', 'chart-itl', 'chart-e2e']) expect(await page.locator(`#${chart} canvas`).count(), chart).toBeGreaterThan(0);
      const shot = await page.screenshot({ fullPage: true });
      expect(shot.length).toBeGreaterThan(20_000);
      expect(errors).toEqual([]);
    } finally {
      await browser.close();
    }
  });

  it('sends each request as its client did (stored headers, body byte for byte), with the key from --api-key, never one from the file', async () => {
    const target = await startUpstream(script(GOLDEN_STORY));
    closers.push(() => target.close());
    const { OPENAI_API_KEY: _, ...env } = process.env;
    const cwd = mkdtempSync(join(tmp, 'cwd-'));
    const output = join(cwd, 'rerun.db');
    const keyed = await runMockerToExit(
      ['rerun', golden, '--target', target.url, '--api-key', 'NEW-KEY', '--header', 'X-Build: 42', '--header', 'X-Secret: s3cr3t-value', '-o', output],
      { cwd, env },
    );
    expect(keyed.code, keyed.stderr).toBe(0);
    const generations = target.received.filter((r) => r.path !== '/version' && r.path !== '/v1/models' && r.headers['x-team'] !== undefined);
    expect(generations).toHaveLength(SENT);
    for (const r of generations) {
      expect(r.headers.authorization).toBe('Bearer NEW-KEY');
      expect(r.headers['x-build']).toBe('42');
      expect(r.headers['x-team']).toBe('blue');
      expect(r.headers['x-secret']).toBe('s3cr3t-value');
    }
    // What --header and --api-key add may be secrets: the rerun's file holds neither.
    const stored = readFileSync(output);
    expect(stored.includes('s3cr3t-value')).toBe(false);
    expect(stored.includes('NEW-KEY')).toBe(false);
    // The bodies the client sent, byte for byte (the proxy adds return_token_ids to generations, as capture does: not here).
    const sentBodies = upstream.received
      .filter((r) => r.headers['x-team'] !== undefined)
      .slice(0, SENT)
      .map((r) => r.raw.toString('utf8').replace('{"return_token_ids":true,', '{'));
    const rerunBodies = generations.map((r) => r.raw.toString('utf8').replace('{"return_token_ids":true,', '{'));
    expect(rerunBodies.sort()).toEqual(sentBodies.sort());
    target.received.length = 0;
    const keyless = await runMockerToExit(['rerun', golden, '--target', target.url], { cwd, env });
    expect(keyless.code, keyless.stderr).toBe(0);
    expect(target.received.filter((r) => r.headers['x-team'] !== undefined).every((r) => r.headers.authorization === undefined)).toBe(true);
  });

  it('--concurrency N keeps N requests in flight; the default one at a time', async () => {
    let inFlight = 0;
    let most = 0;
    const waiting: (() => void)[] = [];
    // A server that holds each answer until three are in flight (or 300 ms have passed); the capture proxy's
    // questions (what are you, /tokenize) are not the requests sent, and get a 404 at once.
    const gate = http.createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        if (req.method !== 'POST' || !['/v1/chat/completions', '/v1/completions', '/v1/embeddings'].includes(req.url ?? ''))
          return void res.writeHead(404).end();
        most = Math.max(most, ++inFlight);
        const answer = () => {
          inFlight--;
          res
            .writeHead(200, { 'content-type': 'application/json' })
            .end('{"id":"x","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}');
        };
        waiting.push(answer);
        if (waiting.length >= 3) waiting.splice(0).forEach((release) => release());
        else setTimeout(() => waiting.includes(answer) && (waiting.splice(waiting.indexOf(answer), 1), answer()), 300);
      });
    });
    const { url, close } = await listenOnLoopback(gate);
    closers.push(close);
    const parallel = await rerun(golden, url, '--concurrency', '3');
    expect(parallel.code).toBe(1);
    expect(most).toBe(3);
    most = 0;
    const serial = await rerun(golden, url);
    expect(serial.code).toBe(1);
    expect(most).toBe(1);
  });

  it("the rerun's file replays: serve --mode replay on it answers the requests as the target did", async () => {
    const output = join(tmp, `rerun-out-${++counter}.db`);
    const run = await rerun(golden, upstream.url, '-o', output);
    expect(run.code, run.stderr).toBe(0);
    const replay = await mocker('serve', '--mode', 'replay', '--captures', output);
    const url = `http://127.0.0.1:${replay.port}`;
    const tools = await client(url).chat.completions.create(CHATS.tools as unknown as OpenAI.ChatCompletionCreateParamsNonStreaming);
    const message = tools.choices[0].message as OpenAI.ChatCompletionMessage & { reasoning_content?: string };
    // The double's script: reasoning, then the weather tool called for Paris.
    expect(message.reasoning_content).toBe('The user wants the weather. I call the tool.');
    expect(message.tool_calls?.map((c) => (c.type === 'function' ? [c.function.name, JSON.parse(c.function.arguments)] : null))).toEqual([
      ['get_weather', { city: 'Paris' }],
    ]);
    const greeting = await client(url).chat.completions.create({
      ...(CHATS.system as unknown as OpenAI.ChatCompletionCreateParamsNonStreaming),
      stream: false,
    });
    expect(greeting.choices[0].message.content).toBe('Hello! How can I help you today?');
    // And the whole file against its own replay: nothing differs.
    const again = await rerun(output, url);
    expect(again.code, again.stderr).toBe(0);
    expect(summary(again.stdout)).toEqual({ compared: SENT, same: SENT, regressions: 0, sampled: 0 });
    await replay.stop();
  });

  it('--as-captured sends each request at its captured arrival time, divided by --speedup', async () => {
    const spaced = file('spaced');
    const capture = await mocker('capture', '--upstream', upstream.url, '--captures', spaced);
    const url = `http://127.0.0.1:${capture.port}`;
    for (const [i, body] of COMPLETIONS.entries()) {
      if (i > 0) await new Promise((r) => setTimeout(r, 800));
      await post(url, '/v1/completions', { ...body, prompt: `${String(body.prompt)} (spaced)` });
    }
    await capture.stop();
    const target = await startUpstream(script(GOLDEN_STORY));
    closers.push(() => target.close());
    const run = await rerun(spaced, target.url, '--as-captured', '--speedup', '2');
    expect(run.code, run.stderr).toBe(0);
    const arrivals = target.received.filter((r) => r.path === '/v1/completions').map((r) => r.startedMs);
    expect(arrivals).toHaveLength(COMPLETIONS.length);
    // At least 800 ms apart when captured, so at least 400 ms apart now (less what the two hops may shift).
    expect(arrivals[1] - arrivals[0]).toBeGreaterThan(300);
    const refused = await rerun(spaced, target.url, '--speedup', '2');
    expect(refused.code).toBe(2);
    expect(refused.stderr).toContain('--speedup divides the captured arrival times: it needs --as-captured');
  });

  it('a sampled request (no temperature, no seed) whose output differs is reported, not failed: exit 0', async () => {
    const changed = await startUpstream(script('A different story, about a dog.'));
    closers.push(() => changed.close());
    const run = await rerun(golden, changed.url);
    expect(run.code, run.stdout).toBe(0);
    expect(summary(run.stdout)).toEqual({ compared: SENT, same: SENT - 1, regressions: 0, sampled: 1 });
    expect(run.stdout).toMatch(
      /^sampled #\d+ chat \/v1\/chat\/completions \(Qwen\/Qwen3-0\.6B\): the output of a sampled request \(no seed\) differs \(token_ids, text/m,
    );
  });

  it('a sampled request with a seed whose output differs is a regression: exit 1', async () => {
    const report = await against({}, script(GOLDEN_STORY, 'The tortoise and the hare.'));
    expect(report.code).toBe(1);
    expect(chatExchange(report, 'seeded').verdict).toBe('regression');
    expect(report.totals).toEqual(expect.objectContaining({ compared: SENT, same: SENT - 1, regressions: 1, sampled: 0 }));
  });

  it('a slower target is a timing shift beyond noise, reported and never failed: exit 0', async () => {
    const slow = (body: Json): Answer => ({ ...script(GOLDEN_STORY)(body), gapMs: () => 40 });
    const report = await against({}, slow);
    expect(report.code).toBe(0);
    expect(report.totals.same).toBe(SENT);
    // The double's own gaps are a few ms: each of the target's is 40 ms, so every ITL sample moved up.
    expect(report.timing.itlMs.shift.p50).toBeGreaterThan(30);
    expect(report.timing.itlMs.beyondNoise).toBe(true);
    expect(report.timing.itlMs.pValue).toBeLessThan(0.01);
  });

  it('pairs by the request as sent: a request without a model pairs with the answer of a target serving another name', async () => {
    const golden = file('no-model');
    const capture = await mocker('capture', '--upstream', upstream.url, '--captures', golden);
    await post(`http://127.0.0.1:${capture.port}`, '/v1/completions', { prompt: 'No model named here', max_tokens: 8 });
    await capture.stop();
    // Its answers name `my-new-alias`, the golden's `Qwen/Qwen3-0.6B`: the same request all the same.
    const renamed = await mocker('serve', '--served-model-name', 'my-new-alias');
    const run = await rerun(golden, `http://127.0.0.1:${renamed.port}`);
    expect(run.code, run.stdout + run.stderr).toBe(0);
    expect(summary(run.stdout)).toEqual({ compared: 1, same: 0, regressions: 0, sampled: 1 });
    // Not streamed: no first token or gaps on either side, so those figures are absent (n/a), not zeros.
    expect(run.stdout).toMatch(/TTFT ms \(golden 0 \/ target 0 samples\): p50 n\/a -> n\/a \(n\/a\), p90 n\/a -> n\/a \(n\/a\), p99 n\/a -> n\/a \(n\/a\)/);
    expect(run.stdout).toMatch(/ITL ms \(golden 0 \/ target 0 samples\): p50 n\/a/);
    expect(run.stdout).toMatch(/E2E ms \(golden 1 \/ target 1 samples\): p50 \d+\.\d\d -> \d+\.\d\d/);
    await renamed.stop();
  });

  it('refuses to run, exit 2: no target, a file that is not a capture, a target that answers nothing', async () => {
    const noTarget = await runMockerToExit(['rerun', golden], { cwd: tmp });
    expect(noTarget.code).toBe(2);
    expect(noTarget.stderr).toMatch(/--target/);
    const notCapture = await runMockerToExit(['rerun', join(tmp, 'missing.db'), '--target', upstream.url], { cwd: tmp });
    expect(notCapture.code).toBe(2);
    expect(notCapture.stderr).toContain('missing.db');
    const down = await startUpstream(script(GOLDEN_STORY));
    const url = down.url;
    await down.close();
    const unreachable = await rerun(golden, url);
    expect(unreachable.code).toBe(2);
    expect(unreachable.stderr).toMatch(/answered none of the \d+ request/);
    // A target that wants a key it was not given: not a regression, a run that could not happen.
    const locked = await listenOnLoopback(
      http.createServer((req, res) => req.resume().on('end', () => res.writeHead(401, { 'content-type': 'application/json' }).end('{"error":"Unauthorized"}'))),
    );
    closers.push(locked.close);
    const refused = await rerun(golden, locked.url);
    expect(refused.code).toBe(2);
    expect(refused.stderr).toContain('refused every request (401): give its key with --api-key or --header');
    const badHeader = await rerun(golden, upstream.url, '--header', 'Bad Name: x');
    expect(badHeader.code).toBe(2);
    expect(badHeader.stderr).toContain('--header "Bad Name: x"');
    expect(readdirSync(badHeader.cwd)).toEqual([]);
  });
});

describe('mocker rerun of captures of other engines, against the same engine and against a replay', () => {
  const CASES: [string, () => Promise<{ url: string; model: string; close(): Promise<void> }>][] = [
    ...(['llama.cpp', 'transformers'] as EngineName[]).map(
      (engine) => [engine, () => startEngineDouble(engine)] as [string, () => Promise<{ url: string; model: string; close(): Promise<void> }>],
    ),
    ['sglang', async () => ({ ...(await startSglangUpstream(() => 'Привет, мир!')), model: MODEL })],
  ];
  for (const [engine, start] of CASES) {
    it(`${engine}: 0 differences, exit 0, both ways`, async () => {
      const double = await start();
      closers.push(() => double.close());
      const golden = file(engine);
      const capture = await mocker('capture', '--upstream', double.url, '--captures', golden);
      const url = `http://127.0.0.1:${capture.port}`;
      const chat = { model: double.model, messages: [{ role: 'user', content: 'Hello there' }], max_tokens: 6, temperature: 0 };
      const completion = { model: double.model, prompt: 'Once upon a time', max_tokens: 6, temperature: 0 };
      for (const stream of [false, true]) {
        await post(url, '/v1/chat/completions', { ...chat, stream });
        await post(url, '/v1/completions', { ...completion, stream });
      }
      await capture.stop();
      const same = await rerun(golden, double.url);
      expect(same.code, same.stdout + same.stderr).toBe(0);
      expect(summary(same.stdout)).toEqual({ compared: 4, same: 4, regressions: 0, sampled: 0 });
      const replay = await mocker('serve', '--mode', 'replay', '--captures', golden);
      const replayed = await rerun(golden, `http://127.0.0.1:${replay.port}`);
      expect(replayed.code, replayed.stdout + replayed.stderr).toBe(0);
      expect(summary(replayed.stdout)).toEqual({ compared: 4, same: 4, regressions: 0, sampled: 0 });
      await replay.stop();
    });
  }
});
