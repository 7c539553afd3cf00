/**
 * `mocker captures …` and `mocker capture --redact-bodies` as a user runs them: a real capture file made by the
 * built CLI in front of the vLLM double, then each command as its own process. Oracles: the requests the test
 * sent, the Python tokenizer's ids (qwen3Oracle), the double's scripted answer, hand-computed statistics.
 */
import { spawnSync } from 'node:child_process';
import {
  closeSync,
  copyFileSync,
  existsSync,
  lstatSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { join } from 'node:path';
import { brotliCompressSync, brotliDecompressSync, constants as zlibConstants } from 'node:zlib';
import Database from 'better-sqlite3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CaptureStore } from '../../src/store/captureStore.js';
import { startMockerProcess, type MockerProcess } from '../support/mockerProcess.js';
import { oracleChat, oracleIds } from '../support/qwen3Oracle.js';
import { testTmpdir } from '../support/tempRoot.js';
import { EOS, MODEL, startUpstream, type Upstream } from '../support/vllmUpstream.js';

type Json = Record<string, unknown>;

const MAIN = join(import.meta.dirname, '..', '..', 'dist', 'cli', 'main.js');
/** The user's environment without the variables that stand in for flags. */
const ENV = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^(VLLM_|DYN_MOCKER_|MOCKER_|PYTHONHASHSEED$|CAPTURE_MODE$)/.test(k)));

/** What the double answers (a text of the tokenizer oracle, so its ids are known), after these delays. */
const ANSWER = 'Привет, мир!';
const ANSWER_IDS = [...oracleIds(ANSWER), EOS];
const TTFT_MS = 40;
const CHAT = oracleChat('Hi there');
const COMPLETION_PROMPT = 'Hello world';

interface Sent {
  name: string;
  path: '/v1/chat/completions' | '/v1/completions';
  body: Json;
}

const REQUESTS: Sent[] = [
  { name: 'chat', path: '/v1/chat/completions', body: { model: MODEL, messages: CHAT.messages, max_tokens: 32 } },
  { name: 'chat stream', path: '/v1/chat/completions', body: { model: MODEL, messages: CHAT.messages, max_tokens: 32, stream: true, return_token_ids: true } },
  { name: 'completion', path: '/v1/completions', body: { model: MODEL, prompt: COMPLETION_PROMPT, max_tokens: 32 } },
  { name: 'completion stream', path: '/v1/completions', body: { model: MODEL, prompt: COMPLETION_PROMPT, max_tokens: 32, stream: true } },
  { name: 'failed', path: '/v1/chat/completions', body: { model: MODEL, messages: [{ role: 'user', content: 'please fail' }], max_tokens: 32 } },
];

/** The answer's text from a response body, streamed or not, chat or completion. */
function answerText(text: string, stream: boolean): string {
  const payloads = stream
    ? text
        .split('\n')
        .filter((l) => l.startsWith('data: {'))
        .map((l) => JSON.parse(l.slice(6)) as Json)
    : [JSON.parse(text) as Json];
  let out = '';
  for (const p of payloads) {
    for (const c of (p.choices ?? []) as Json[]) {
      const message = (c.message ?? c.delta) as Json | undefined;
      out += String(message?.content ?? c.text ?? '');
    }
  }
  return out;
}

async function send(url: string, r: Sent): Promise<{ status: number; text: string }> {
  const res = await fetch(url + r.path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(r.body) });
  return { status: res.status, text: await res.text() };
}

/** `node dist/cli/main.js …` to its exit (`prefix`: a shell line run first, e.g. a ulimit); stdout kept as bytes (multi-byte characters intact). */
function mocker(
  args: string[],
  { input, env = ENV, prefix }: { input?: Buffer; env?: NodeJS.ProcessEnv; prefix?: string } = {},
): { code: number | null; out: Buffer; stdout: string; stderr: string } {
  const [command, argv] =
    prefix === undefined ? [process.execPath, [MAIN, ...args]] : ['sh', ['-c', `${prefix}; exec "$0" "$@"`, process.execPath, MAIN, ...args]];
  const r = spawnSync(command, argv, { env, input, maxBuffer: 1 << 30, timeout: 60_000 });
  return { code: r.status, out: r.stdout, stdout: r.stdout.toString('utf8'), stderr: r.stderr.toString('utf8') };
}

/** `node dist/cli/main.js captures …` to its exit. */
function captures(args: string[], input?: Buffer): { code: number | null; out: Buffer; stdout: string; stderr: string } {
  return mocker(['captures', ...args], { input });
}

function json(args: string[]): Json {
  const r = captures([...args, '--json']);
  expect(r.stderr).toBe('');
  expect(r.code).toBe(0);
  return JSON.parse(r.stdout) as Json;
}

/** A refusal: exit code 1 (or `code`) and one line on stderr naming the problem. */
function refused(args: string[], names: string, code = 1): void {
  const r = args[0] === 'trace' ? mocker(args) : captures(args);
  expect(r.code, r.stderr).toBe(code);
  expect(r.stderr.trim().split('\n')).toHaveLength(1);
  expect(r.stderr).toContain(names);
}

let dir: string;
let upstream: Upstream;
const processes: MockerProcess[] = [];
let golden: string;
let redacted: string;
/** The answers the capture proxy gave (through it, from the double). */
const captured = new Map<string, { status: number; text: string }>();

async function captureInto(file: string, extra: string[] = []): Promise<void> {
  const proxy = await startMockerProcess(['capture', '--upstream', upstream.url, '--captures', file, ...extra], 0, { env: ENV });
  processes.push(proxy);
  for (const r of REQUESTS) captured.set(r.name, await send(`http://127.0.0.1:${proxy.port}`, r));
  await proxy.stop();
}

beforeAll(async () => {
  dir = mkdtempSync(join(testTmpdir(), 'mocker-captures-'));
  upstream = await startUpstream((body) => {
    const messages = body.messages as { content: string }[] | undefined;
    if (messages?.[0].content === 'please fail') return { errorStatus: 500 };
    return { content: ANSWER, ttftMs: TTFT_MS, gapMs: () => 10 };
  });
  golden = join(dir, 'golden.db');
  redacted = join(dir, 'redacted.db');
  await captureInto(golden);
  await captureInto(redacted, ['--redact-bodies']);
});

afterAll(async () => {
  await Promise.all(processes.map((p) => p.stop()));
  await upstream?.close();
});

/** Spawns `serve --mode replay` on a file, asks every request, returns the answers' texts by name. */
async function replayed(file: string): Promise<Map<string, { status: number; text: string }>> {
  const serve = await startMockerProcess(['serve', '--mode', 'replay', '--captures', file, '--timing', 'none'], 0, { env: ENV });
  processes.push(serve);
  const out = new Map<string, { status: number; text: string }>();
  try {
    for (const r of REQUESTS.filter((q) => q.name !== 'failed')) {
      const res = await send(`http://127.0.0.1:${serve.port}`, r);
      out.set(r.name, { status: res.status, text: answerText(res.text, r.body.stream === true) });
    }
  } finally {
    await serve.stop();
  }
  return out;
}

describe('the capture the tests work on', () => {
  it('holds what the double answered through the proxy', () => {
    for (const r of REQUESTS.filter((q) => q.name !== 'failed')) {
      expect(captured.get(r.name)!.status, r.name).toBe(200);
      expect(answerText(captured.get(r.name)!.text, r.body.stream === true), r.name).toBe(ANSWER);
    }
    expect(captured.get('failed')!.status).toBe(500);
  });
});

describe('mocker captures list', () => {
  it('counts what was sent: runs, models, outcomes, endpoints, date range', () => {
    const l = json(['list', golden]);
    expect(l).toMatchObject({ total: 5, models: [MODEL], outcomes: { complete: 4, failed: 1, aborted: 0 }, endpoints: { chat: 3, completion: 2, other: 0 } });
    const runs = l.runs as Json[];
    expect(runs).toHaveLength(1);
    expect(runs[0]).toMatchObject({ id: 1, kind: 'capture', engine: 'vllm', engineVersion: '0.11.0', upstream: `${upstream.url}/`, exchanges: 5 });
    expect(Date.parse(l.from as string)).toBeLessThanOrEqual(Date.parse(l.until as string));
    expect(Date.now() - Date.parse(l.until as string)).toBeLessThan(10 * 60_000);
  });

  it('filters by outcome, endpoint, model and time', () => {
    expect(json(['list', golden, '--outcome', 'failed']).total).toBe(1);
    expect(json(['list', golden, '--endpoint', 'completion']).total).toBe(2);
    expect(json(['list', golden, '--endpoint', 'chat', '--outcome', 'complete']).total).toBe(2);
    expect(json(['list', golden, '--model', 'other/model']).total).toBe(0);
    expect(json(['list', golden, '--since', '1h']).total).toBe(5);
    expect(json(['list', golden, '--until', '1h']).total).toBe(0);
    expect(json(['list', golden, '--since', '2020-01-01', '--until', '2999-01-01T00:00Z']).total).toBe(5);
    const rows = json(['list', golden, '--exchanges']).exchanges as Json[];
    expect(rows.map((e) => [e.endpoint, e.stream, e.outcome])).toEqual(
      REQUESTS.map((r) => [r.path === '/v1/completions' ? 'completion' : 'chat', r.body.stream === true, r.name === 'failed' ? 'failed' : 'complete']),
    );
  });

  it('prints a table without --json', () => {
    const r = captures(['list', golden]);
    expect(r.code).toBe(0);
    expect(r.stdout).toContain('5 exchanges (4 complete, 1 failed, 0 aborted; 3 chat, 2 completion)');
    expect(r.stdout).toMatch(/^1\s+capture\s+vllm\s+0\.11\.0/m);
  });

  it('refuses bad input with one line and exit code 1', () => {
    refused(['list', join(dir, 'missing.db')], 'missing.db: no such file');
    const text = join(dir, 'notes.txt');
    writeFileSync(text, 'not a database at all, just some text that is long enough to be read by SQLite as a header');
    refused(['list', text], 'not a SQLite capture file');
    refused(['list', golden, '--outcome', 'maybe'], '--outcome');
    refused(['list', golden, '--since', 'last tuesday'], '--since');
    refused(['list', golden, '--endpoint', 'images'], '--endpoint');
  });
});

function exchangeIds(file: string): number[] {
  return (json(['list', file, '--exchanges']).exchanges as Json[]).map((e) => e.id as number);
}

describe('mocker captures show', () => {
  it("shows the prompt ids the tokenizer oracle gives and the double's answer, per choice and per chunk", () => {
    const ids = exchangeIds(golden);
    const chat = json(['show', golden, String(ids[0])]);
    expect(chat).toMatchObject({ endpoint: 'chat', stream: false, outcome: 'complete', status: 200, model: MODEL, promptIds: CHAT.ids, bodiesRedacted: false });
    expect(JSON.parse(chat.requestBody as string)).toEqual(REQUESTS[0].body);
    expect(chat.promptText).toContain('Hi there');
    const choices = chat.choices as Json[];
    expect(choices).toHaveLength(1);
    expect(choices[0]).toMatchObject({ text: ANSWER, outputIds: ANSWER_IDS, finishReason: 'stop' });

    const stream = json(['show', golden, String(ids[3])]);
    expect(stream).toMatchObject({ endpoint: 'completion', stream: true, promptIds: oracleIds(COMPLETION_PROMPT) });
    const [choice] = stream.choices as { text: string; outputIds: number[]; chunks: { atMs: number; gapMs: number; tokens: number }[] }[];
    expect(choice.text).toBe(ANSWER);
    expect(choice.outputIds).toEqual(ANSWER_IDS);
    // The double sends one token a chunk: the first after the TTFT, the gaps between them add up to the last time.
    expect(choice.chunks.map((c) => c.tokens)).toEqual(ANSWER_IDS.map(() => 1));
    expect(choice.chunks[0].atMs).toBeGreaterThanOrEqual(TTFT_MS - 1);
    expect(choice.chunks.reduce((sum, c) => sum + c.gapMs, 0)).toBeCloseTo(choice.chunks[choice.chunks.length - 1].atMs, 6);
  });

  it('prints a readable page: request, prompt, choices, chunk timing; a failed exchange says so', () => {
    const ids = exchangeIds(golden);
    const page = captures(['show', golden, String(ids[1])]);
    expect(page.code).toBe(0);
    expect(page.stdout).toContain('POST /v1/chat/completions · stream');
    expect(page.stdout).toContain(`prompt (${CHAT.ids.length} tokens):`);
    expect(page.stdout).toContain(`text: ${JSON.stringify(ANSWER)}`);
    expect(page.stdout).toMatch(/chunk\s+at ms\s+gap ms\s+tokens\s+delta/);
    const failed = captures(['show', golden, String(ids[4])]);
    expect(failed.stdout).toContain('outcome: failed (HTTP 500)');
  });

  it("shows a failed exchange's stored response, headers and body, as the client got them (issue 36)", () => {
    const failedId = String(exchangeIds(golden)[4]);
    // The oracle: the body the client got through the proxy; the double answers errors as JSON from uvicorn.
    const clientBody = captured.get('failed')!.text;
    expect(JSON.parse(clientBody)).toMatchObject({ error: { message: 'scripted upstream error', code: 500 } });
    const page = captures(['show', golden, failedId]);
    expect(page.code).toBe(0);
    expect(page.stdout).toMatch(/^response headers:\n( {2}.+\n)* {2}content-type: application\/json\n/m);
    expect(page.stdout).toMatch(/^ {2}server: uvicorn$/m);
    expect(page.stdout).toContain(`response body:\n  ${clientBody}\n`);
    const shown = json(['show', golden, failedId]);
    expect(shown).toMatchObject({
      outcome: 'failed',
      status: 500,
      responseBody: clientBody,
      responseHeaders: { 'content-type': 'application/json', server: 'uvicorn' },
    });
    // A complete answer's body is what its choices show: not printed twice.
    const complete = captures(['show', golden, String(exchangeIds(golden)[0])]);
    expect(complete.stdout).toContain('response headers:');
    expect(complete.stdout).not.toContain('response body:');
  });

  it('refuses an unknown id or a bad one', () => {
    refused(['show', golden, '999'], 'no exchange 999');
    refused(['show', golden, 'first'], 'the exchange id must be a positive integer');
  });
});

describe('mocker captures export / import', () => {
  it('export | import | export is byte-identical, and the imported file replays the same answers', async () => {
    const first = captures(['export', golden]);
    expect(first.code).toBe(0);
    const lines = first.stdout
      .trimEnd()
      .split('\n')
      .map((l) => JSON.parse(l) as Json);
    // A header, the tokenizer files, then the run and its exchanges.
    const types = lines.map((l) => l.type);
    const blobs = types.filter((t) => t === 'blob').length;
    expect(blobs).toBeGreaterThan(0);
    expect(types).toEqual(['header', ...Array<string>(blobs).fill('blob'), 'run', ...Array<string>(5).fill('exchange')]);
    // Token ids as arrays, bodies as text: reviewable.
    expect(lines.find((l) => l.type === 'exchange')).toMatchObject({ promptIds: CHAT.ids, requestBody: JSON.stringify(REQUESTS[0].body) });

    const copy = join(dir, 'imported.db');
    const imported = captures(['import', '-', '-o', copy], first.out);
    expect(imported.code, imported.stderr).toBe(0);
    const second = captures(['export', copy]);
    expect(second.out.equals(first.out)).toBe(true);
    const viaFile = join(dir, 'golden.jsonl');
    expect(captures(['export', golden, '-o', viaFile]).code).toBe(0);
    expect(readFileSync(viaFile).equals(first.out)).toBe(true);

    const answers = await replayed(copy);
    for (const [name, answer] of answers) expect(answer, name).toEqual({ status: 200, text: ANSWER });
  });

  it('imports into an existing file as new runs', () => {
    const target = join(dir, 'twice.db');
    copyFileSync(golden, target);
    const r = captures(['import', join(dir, 'golden.jsonl'), '-o', target]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain('imported 5 exchanges as run 2');
    expect(json(['list', target])).toMatchObject({ total: 10, outcomes: { complete: 8, failed: 2, aborted: 0 } });
  });

  it('refuses a bad line naming it, and writes nothing', () => {
    const good = readFileSync(join(dir, 'golden.jsonl'), 'utf8').trimEnd().split('\n');
    const broken = [...good];
    const at = good.findIndex((l) => l.includes('"type":"exchange"'));
    broken[at] = broken[at].replace('"promptIds":[', '"promptIds":["x",');
    const input = join(dir, 'broken.jsonl');
    writeFileSync(input, broken.join('\n'));
    const out = join(dir, 'never.db');
    refused(['import', input, '-o', out], `broken.jsonl line ${at + 1}: promptIds.0`);
    expect(existsSync(out)).toBe(false);
    refused(['import', join(dir, 'absent.jsonl'), '-o', out], 'absent.jsonl: no such file');
    // A capture file is no JSONL: its first line (the SQLite header up to the first newline byte, with the page
    // count in it) is refused as not JSON, or as not UTF-8, depending on the file's size.
    refused(['import', golden, '-o', out], 'golden.db line 1: not ');
    expect(existsSync(out)).toBe(false);
  });
});

describe('mocker captures merge', () => {
  it('keeps every exchange, each source run a run, and reports the duplicates', () => {
    const merged = join(dir, 'merged.db');
    const result = json(['merge', golden, join(dir, 'imported.db'), '-o', merged]);
    expect(result).toMatchObject({ runs: 2, exchanges: 10, duplicates: 5 });
    const groups = result.duplicateGroups as { exchanges: { file: string; id: number; mergedId: number }[] }[];
    expect(groups).toHaveLength(5);
    for (const g of groups) expect(g.exchanges.map((e) => e.file)).toEqual([golden, join(dir, 'imported.db')]);
    const l = json(['list', merged]);
    expect(l).toMatchObject({ total: 10, outcomes: { complete: 8, failed: 2, aborted: 0 } });
    expect((l.runs as Json[]).map((r) => r.exchanges)).toEqual([5, 5]);
    // A file whose requests differ from the golden's (redacted: keyed by prompt ids) adds no duplicate of them.
    const table = captures(['merge', golden, redacted, '-o', join(dir, 'merged2.db')]);
    expect(table.stdout).toContain('10 exchanges in 2 runs from 2 files');
  });

  it('refuses to overwrite, and a missing source, leaving nothing', () => {
    const before = readFileSync(golden);
    refused(['merge', redacted, '-o', golden], 'already exists');
    expect(readFileSync(golden).equals(before)).toBe(true);
    const out = join(dir, 'not-merged.db');
    refused(['merge', golden, join(dir, 'nope.db'), '-o', out], 'nope.db: no such file');
    expect(existsSync(out)).toBe(false);
  });
});

describe('mocker captures prune', () => {
  it('removes what it says, dry run first; the file shrinks after VACUUM', () => {
    const file = join(dir, 'prune.db');
    copyFileSync(golden, file);
    const size = statSync(file).size;
    const dry = json(['prune', file, '--outcome', 'failed', '--dry-run']);
    expect(dry).toMatchObject({ dryRun: true, runs: [] });
    expect((dry.exchanges as Json[]).map((e) => e.outcome)).toEqual(['failed']);
    expect(statSync(file).size).toBe(size);
    expect(json(['list', file]).total).toBe(5);

    expect(json(['prune', file, '--older-than', '30d']).exchanges as Json[]).toHaveLength(0);
    const failed = json(['prune', file, '--outcome', 'failed']);
    expect((failed.exchanges as Json[]).map((e) => e.id)).toEqual([exchangeIds(golden)[4]]);
    expect(json(['list', file]).outcomes).toEqual({ complete: 4, failed: 0, aborted: 0 });

    const all = captures(['prune', file, '--run', '1']);
    expect(all.code, all.stderr).toBe(0);
    expect(all.stdout).toContain('removed 4 exchanges and runs 1 (left empty)');
    expect(json(['list', file])).toMatchObject({ total: 0, runs: [] });
    // The run's tokenizer files went with it.
    expect(statSync(file).size).toBeLessThan(size / 4);
  });

  it('refuses no filter, a bad age, a missing file', () => {
    refused(['prune', golden], 'name what to remove');
    refused(['prune', golden, '--older-than', 'ancient'], '--older-than');
    refused(['prune', join(dir, 'gone.db'), '--outcome', 'failed'], 'gone.db: no such file');
    expect(existsSync(join(dir, 'gone.db'))).toBe(false);
  });
});

describe('mocker captures stats', () => {
  it("computes the trace report's statistics from known timing (hand-computed)", () => {
    const exchange = (startedAt: number, tokenTimes: number[]) => ({
      type: 'exchange',
      run: 1,
      startedAt,
      requestId: null,
      method: 'POST',
      path: '/v1/completions',
      endpoint: 'completion',
      outcome: 'complete',
      error: null,
      status: 200,
      model: MODEL,
      stream: true,
      totalMs: tokenTimes[tokenTimes.length - 1],
      tokenSource: 'engine',
      requestShape: null,
      injected: [],
      usage: null,
      requestHeaders: {},
      requestBody: '{}',
      responseHeaders: {},
      responseBody: '',
      eventEnds: [],
      eventTimes: [],
      eventTokens: [],
      promptIds: [1, 2, 3],
      generations: [
        {
          choiceIndex: 0,
          finishReason: 'length',
          stopReason: null,
          text: '',
          outputIds: tokenTimes.map((_, i) => 10 + i),
          tokenTimes,
          chunkTokens: tokenTimes.map(() => 1),
          chunkDeltas: tokenTimes.map(() => ({ text: '' })),
        },
      ],
    });
    const run = {
      type: 'run',
      run: 1,
      startedAt: 0,
      kind: 'capture',
      upstream: null,
      engine: 'vllm',
      engineVersion: null,
      label: 'known',
      versionJson: null,
      modelsJson: null,
      maxModelLen: null,
      tokenizerName: null,
      tokenizerFiles: {},
    };
    const failed = { ...exchange(1_700_000_000_500, [1]), outcome: 'failed', status: 500, generations: [] };
    const lines = [
      { type: 'header', format: 'mocker-captures', version: 1 },
      run,
      exchange(1_700_000_000_000, [100, 110, 130]),
      failed,
      exchange(1_700_000_001_000, [50, 60]),
    ];
    const input = join(dir, 'known.jsonl');
    writeFileSync(input, lines.map((l) => JSON.stringify(l)).join('\n') + '\n');
    const file = join(dir, 'known.db');
    expect(captures(['import', input, '-o', file]).code).toBe(0);
    const [stats] = json(['stats', file]).runs as { report: Record<string, number> }[];
    // TTFT 100 and 50; gaps 10, 20, 10; end-to-end 130 and 60; the run lasts to 1000 + 60 ms.
    const r = stats.report;
    expect([r.num_requests, r.completed_requests, r.total_output_tokens]).toEqual([3, 2, 5]);
    expect([r.mean_ttft_ms, r.min_ttft_ms, r.max_ttft_ms, r.std_ttft_ms]).toEqual([75, 50, 100, 25]);
    // Nearest rank: sorted index round((n − 1) · p / 100).
    expect([r.median_ttft_ms, r.p99_ttft_ms]).toEqual([100, 100]);
    expect(r.mean_itl_ms).toBeCloseTo(40 / 3, 12);
    expect([r.min_itl_ms, r.max_itl_ms, r.median_itl_ms]).toEqual([10, 20, 10]);
    expect(r.std_itl_ms).toBeCloseTo(Math.sqrt(((10 - 40 / 3) ** 2 * 2 + (20 - 40 / 3) ** 2) / 3), 12);
    expect([r.mean_e2e_latency_ms, r.duration_ms]).toEqual([95, 1060]);
    expect(r.request_throughput_rps).toBeCloseTo(2 / 1.06, 12);
    expect(r.output_throughput_tok_s).toBeCloseTo(5 / 1.06, 12);
    for (const key of [
      'prefix_cache_reused_ratio',
      'first_admission_prefix_cache_reused_ratio',
      'total_reused_input_tokens',
      'total_first_admission_reused_input_tokens',
    ])
      expect(r[key], key).toBeUndefined();
  });

  it("on the double's capture: one request per generation exchange, TTFT at least the scripted delay; AIPerf's table", () => {
    const [stats] = json(['stats', golden]).runs as { run: number; report: Record<string, number> }[];
    expect(stats.run).toBe(1);
    expect(stats.report).toMatchObject({ num_requests: 5, completed_requests: 4, total_output_tokens: 4 * ANSWER_IDS.length });
    expect(stats.report.min_ttft_ms).toBeGreaterThanOrEqual(TTFT_MS - 1);
    const table = captures(['stats', golden]);
    expect(table.stdout).toContain('NVIDIA AIPerf | LLM Metrics');
    expect(table.stdout).toMatch(/Request Count \(requests\)\s+┃\s+4\.00/);
    refused(['stats', golden, '--run', '7'], 'no run 7');
  });
});

describe('mocker captures stats: streamed and non-streamed answers (issue 36)', () => {
  /** The double's timing: streamed answers start soon; non-streamed ones only after NOT_STREAMED_TTFT_MS. */
  const STREAMED_TTFT_MS = 30;
  const NOT_STREAMED_TTFT_MS = 400;
  const GAP_MS = 25;
  const streamed = REQUESTS.filter((r) => r.body.stream === true);
  const notStreamed = REQUESTS.filter((r) => r.name !== 'failed' && r.body.stream !== true);
  let mixed: string;
  let onlyNotStreamed: string;
  let timed: Upstream;

  beforeAll(async () => {
    timed = await startUpstream((body) => ({ content: ANSWER, ttftMs: body.stream === true ? STREAMED_TTFT_MS : NOT_STREAMED_TTFT_MS, gapMs: () => GAP_MS }));
    const captureOf = async (file: string, requests: Sent[]) => {
      const proxy = await startMockerProcess(['capture', '--upstream', timed.url, '--captures', file], 0, { env: ENV });
      processes.push(proxy);
      for (const r of requests) expect((await send(`http://127.0.0.1:${proxy.port}`, r)).status).toBe(200);
      await proxy.stop();
    };
    mixed = join(dir, 'mixed.db');
    onlyNotStreamed = join(dir, 'not-streamed.db');
    await captureOf(mixed, [...streamed, ...notStreamed]);
    await captureOf(onlyNotStreamed, notStreamed);
  });

  afterAll(() => timed?.close());

  it('TTFT, ITL and per-user rate come from the streamed exchanges only; latency and counts from all; the split is reported', () => {
    const [stats] = json(['stats', mixed]).runs as { exchanges: Json; report: Record<string, number> }[];
    const r = stats.report;
    expect([r.num_requests, r.completed_requests, r.total_output_tokens]).toEqual([4, 4, 4 * ANSWER_IDS.length]);
    // A non-streamed answer's total (≥ 400 ms) is no first token: every TTFT is a streamed one's, ≥ its 30 ms.
    expect(r.min_ttft_ms).toBeGreaterThanOrEqual(STREAMED_TTFT_MS - 1);
    expect(r.max_ttft_ms).toBeLessThan(NOT_STREAMED_TTFT_MS);
    // Its tokens, all in one body, have no gaps between them (not gaps of 0 ms).
    expect(r.min_itl_ms).toBeGreaterThan(0);
    // It still counts in the request latency: the double answered it after its TTFT and the gaps.
    expect(r.max_e2e_latency_ms).toBeGreaterThanOrEqual(NOT_STREAMED_TTFT_MS + (ANSWER_IDS.length - 1) * GAP_MS - 1);
    expect(stats.exchanges).toEqual({ streamed: 2, notStreamed: 2 });
    const table = captures(['stats', mixed]);
    expect(table.stdout).toContain('2 streamed, 2 not streamed generation exchanges: TTFT, ITL and per-user token rate over the 2 streamed only');
  });

  it('without a streamed exchange there is no TTFT or ITL figure at all (not zeros)', () => {
    const [stats] = json(['stats', onlyNotStreamed]).runs as { exchanges: Json; report: Record<string, number> }[];
    expect(Object.keys(stats.report).filter((k) => /ttft|ttst|tpot|itl|per_user/.test(k))).toEqual([]);
    expect(stats.report.completed_requests).toBe(2);
    expect(stats.report.min_e2e_latency_ms).toBeGreaterThanOrEqual(NOT_STREAMED_TTFT_MS - 1);
    expect(stats.exchanges).toEqual({ streamed: 0, notStreamed: 2 });
    const table = captures(['stats', onlyNotStreamed]);
    expect(table.stdout).toContain('0 streamed, 2 not streamed generation exchanges: no TTFT, ITL or per-user token rate');
    expect(table.stdout).not.toContain('Time to First Token');
    expect(table.stdout).toMatch(/Request Latency \(ms\)/);
  });
});

describe('mocker capture --redact-bodies', () => {
  const texts = [ANSWER, 'Hi there', COMPLETION_PROMPT, 'please fail'];

  /** Every text a capture file holds, decompressed: bodies, output texts and chunk deltas of every exchange. */
  const storedText = (file: string): string => {
    const store = CaptureStore.open(file, { readonly: true });
    try {
      return store
        .exchangeIds()
        .map((id) => {
          const ex = store.getExchange(id)!;
          return [ex.requestBody.toString(), ex.responseBody.toString(), ...ex.generations.map((g) => g.text + JSON.stringify(g.chunkDeltas))].join('\n');
        })
        .join('\n');
    } finally {
      store.close();
    }
  };

  it('stores no prompt or output text (the unredacted capture does), only ids and timing', () => {
    const plain = storedText(golden);
    for (const t of texts) expect(plain.includes(t), t).toBe(true);
    expect(existsSync(`${redacted}-wal`)).toBe(false);
    const stored = storedText(redacted);
    for (const t of texts) expect(stored.includes(t), t).toBe(false);
    const l = json(['list', redacted, '--exchanges']);
    expect(l).toMatchObject({ total: 5, outcomes: { complete: 4, failed: 1, aborted: 0 } });
    expect((l.exchanges as Json[]).every((e) => e.bodiesRedacted === true)).toBe(true);
  });

  it('show says the bodies were redacted and decodes the text from the ids', () => {
    const ids = exchangeIds(redacted);
    const shown = json(['show', redacted, String(ids[0])]);
    expect(shown).toMatchObject({ bodiesRedacted: true, requestBody: null, promptIds: CHAT.ids });
    expect((shown.choices as Json[])[0]).toMatchObject({ text: ANSWER, textDecoded: true, outputIds: ANSWER_IDS });
    expect(captures(['show', redacted, String(ids[0])]).stdout).toContain('bodies: redacted at capture (--redact-bodies)');
  });

  it('replays the same text, rendered from the ids', async () => {
    const answers = await replayed(redacted);
    expect([...answers.keys()]).toHaveLength(4);
    for (const [name, answer] of answers) expect(answer, name).toEqual({ status: 200, text: ANSWER });
  });
});

/** The temporary files a command left in `dir` (outputs are written beside their target, then renamed). */
const leftovers = (where: string) => readdirSync(where).filter((name) => name.endsWith('.tmp') || name.includes('.tmp-'));

describe('the tools never destroy their input', () => {
  let safety: string;
  beforeAll(() => {
    safety = mkdtempSync(join(dir, 'safety-'));
  });

  it('export, import and merge refuse an output that is one of their inputs; the input stays byte for byte', () => {
    const file = join(safety, 'self.db');
    copyFileSync(golden, file);
    const before = readFileSync(file);
    refused(['export', file, '-o', file], `${file}: is also an input`);
    refused(['export', file, '-o', file, '--force'], `${file}: is also an input`);
    refused(['merge', golden, file, '-o', file, '--force'], `${file}: is also an input`);
    expect(readFileSync(file).equals(before)).toBe(true);
    const jsonl = join(safety, 'self.jsonl');
    expect(captures(['export', golden, '-o', jsonl]).code).toBe(0);
    const text = readFileSync(jsonl);
    refused(['import', jsonl, '-o', jsonl, '--force'], `${jsonl}: is also an input`);
    expect(readFileSync(jsonl).equals(text)).toBe(true);
    expect(leftovers(safety)).toEqual([]);
  });

  it('fit -o onto its capture is refused, the capture intact', () => {
    const file = join(safety, 'fit.db');
    copyFileSync(golden, file);
    const before = readFileSync(file);
    refused(['fit', file, '-o', file], `${file}: is also an input`);
    refused(['fit', file, '-o', file, '--force'], `${file}: is also an input`);
    expect(readFileSync(file).equals(before)).toBe(true);
  });

  it('trace --report-json / --report-html onto a capture are refused before the run, the capture intact', () => {
    const file = join(safety, 'traced.db');
    copyFileSync(golden, file);
    const before = readFileSync(file);
    const synthetic = ['trace', '--input-tokens', '16', '--output-tokens', '2', '--request-count', '2', '--no-progress'];
    refused(['trace', '--from-captures', file, '--report-json', file, '--no-progress'], `${file}: is also an input`);
    const json = join(safety, 'never.json');
    // A capture file that is not an input is never replaced, --force or not.
    refused([...synthetic, '--report-json', json, '--report-html', file, '--force'], `${file}: already exists and is a capture file`);
    refused([...synthetic, '--report-json', file], `${file}: already exists and is a capture file`);
    expect(readFileSync(file).equals(before)).toBe(true);
    expect(existsSync(json)).toBe(false);
  });

  it('an existing file is replaced only with --force, and never a capture file the command did not create', () => {
    const notes = join(safety, 'notes.txt');
    writeFileSync(notes, 'my notes\n');
    refused(['export', golden, '-o', notes], `${notes}: already exists (--force replaces it)`);
    expect(readFileSync(notes, 'utf8')).toBe('my notes\n');
    const replaced = captures(['export', golden, '-o', notes, '--force']);
    expect(replaced.code, replaced.stderr).toBe(0);
    expect(readFileSync(notes).equals(captures(['export', golden]).out)).toBe(true);

    const other = join(safety, 'other.db');
    copyFileSync(redacted, other);
    const before = readFileSync(other);
    refused(['export', golden, '-o', other, '--force'], `${other}: already exists and is a capture file`);
    refused(['merge', golden, '-o', other, '--force'], `${other}: already exists and is a capture file`);
    refused(['fit', golden, '-o', other, '--force'], `${other}: already exists and is a capture file`);
    expect(readFileSync(other).equals(before)).toBe(true);
    // A file merge made itself is written in full under its name (the temporary file is gone).
    const merged = join(safety, 'merged.db');
    expect(captures(['merge', golden, redacted, '-o', merged]).code).toBe(0);
    expect(json(['list', merged]).total).toBe(10);
    expect(leftovers(safety)).toEqual([]);
  });

  it('-o through a symbolic link is refused: the link and the file it points to are left alone', () => {
    const target = join(safety, 'target.txt');
    writeFileSync(target, 'pointed at\n');
    const link = join(safety, 'link.jsonl');
    symlinkSync(target, link);
    refused(['export', golden, '-o', link], `${link}: is a symbolic link`);
    refused(['export', golden, '-o', link, '--force'], `${link}: is a symbolic link`);
    refused(['import', join(safety, 'self.jsonl'), '-o', link, '--force'], `${link}: is a symbolic link`);
    expect(readFileSync(target, 'utf8')).toBe('pointed at\n');
    expect(lstatSync(link).isSymbolicLink()).toBe(true);
  });

  it('a write that fails (a file size limit) leaves no partial output and the old file as it was', () => {
    // ulimit -f: at most 64 blocks (32 or 64 KB) per file; the export (the tokenizer files alone) is megabytes.
    const limited = (args: string[]) => mocker(['captures', ...args], { prefix: 'ulimit -f 64' });
    const fresh = join(safety, 'partial.jsonl');
    const r = limited(['export', golden, '-o', fresh]);
    expect(r.code).not.toBe(0);
    expect(r.stderr).toContain(`${fresh}: cannot be written`);
    expect(existsSync(fresh)).toBe(false);
    const old = join(safety, 'old.jsonl');
    writeFileSync(old, 'the old export\n');
    expect(limited(['export', golden, '-o', old, '--force']).code).not.toBe(0);
    expect(readFileSync(old, 'utf8')).toBe('the old export\n');
    const mergedOut = join(safety, 'partial.db');
    expect(limited(['merge', golden, redacted, '-o', mergedOut]).code).not.toBe(0);
    expect(existsSync(mergedOut)).toBe(false);
    expect(leftovers(safety)).toEqual([]);
  });
});

/** The golden capture's JSONL lines (as `export` writes them), parsed. */
const exportedLines = () =>
  captures(['export', golden])
    .stdout.trimEnd()
    .split('\n')
    .map((l) => JSON.parse(l) as Json);

describe('captures import checks what it reads, and streams it', () => {
  it('refuses a blob whose data does not match its sha256, naming the line; nothing is written', () => {
    const lines = exportedLines();
    const at = lines.findIndex((l) => l.type === 'blob');
    const blob = lines[at] as { encoding: string; data: { base64: string } };
    expect(blob.encoding).toBe('brotli');
    // One character of the tokenizer file changed (a hand edit, a bad merge): its hash no longer names it.
    const file = brotliDecompressSync(Buffer.from(blob.data.base64, 'base64')).toString('utf8');
    blob.data.base64 = brotliCompressSync(Buffer.from(file.replace('"', "'")), { params: { [zlibConstants.BROTLI_PARAM_QUALITY]: 1 } }).toString('base64');
    const input = join(dir, 'badhash.jsonl');
    writeFileSync(input, lines.map((l) => JSON.stringify(l)).join('\n'));
    const out = join(dir, 'badhash.db');
    refused(['import', input, '-o', out], `badhash.jsonl line ${at + 1}: sha256`);
    expect(existsSync(out)).toBe(false);
  });

  it('imports a version 1 export (tokenizer files as they are), storing them compressed; refuses a compressed one that inflates past its size', () => {
    const lines = exportedLines();
    const v1 = lines.map((l) => {
      if (l.type === 'header') return { ...l, version: 1 };
      if (l.type !== 'blob') return l;
      const raw = brotliDecompressSync(Buffer.from((l.data as { base64: string }).base64, 'base64'));
      const text = raw.toString('utf8');
      return { type: 'blob', sha256: l.sha256, data: Buffer.from(text, 'utf8').equals(raw) ? text : { base64: raw.toString('base64') } };
    });
    const input = join(dir, 'v1.jsonl');
    writeFileSync(input, v1.map((l) => JSON.stringify(l)).join('\n'));
    expect(statSync(input).size).toBeGreaterThan(11e6);
    const out = join(dir, 'v1.db');
    const r = captures(['import', input, '-o', out]);
    expect(r.code, r.stderr).toBe(0);
    expect(statSync(out).size).toBeLessThan(3e6);
    expect(captures(['export', out]).stdout).toBe(captures(['export', golden]).stdout);

    // The tokenizer.json line claims its size, but its data inflates to 200 MB of zeros.
    const at = lines.findIndex((l) => l.type === 'blob' && (l.size as number) > 1e6);
    const bomb = [...lines];
    bomb[at] = {
      ...lines[at],
      data: { base64: brotliCompressSync(Buffer.alloc(200e6), { params: { [zlibConstants.BROTLI_PARAM_QUALITY]: 1 } }).toString('base64') },
    };
    const bombInput = join(dir, 'bomb.jsonl');
    writeFileSync(bombInput, bomb.map((l) => JSON.stringify(l)).join('\n'));
    refused(
      ['import', bombInput, '-o', join(dir, 'bomb.db')],
      `bomb.jsonl line ${at + 1}: data: the blob's compressed data inflates to more than ${lines[at].size as number} bytes`,
    );
    expect(existsSync(join(dir, 'bomb.db'))).toBe(false);
  });

  it('refuses bytes that are not UTF-8, naming the line (not U+FFFD); an existing file keeps its exchanges', () => {
    const lines = captures(['export', golden]).stdout.trimEnd().split('\n');
    const at = lines.findIndex((l) => l.includes('"type":"exchange"')) + 1;
    const cut = lines[at].indexOf('Hi there');
    expect(cut).toBeGreaterThan(0);
    // "Hi thére" with a Latin-1 é (0xE9 followed by an ASCII letter is not UTF-8) in the second exchange's request body.
    const latin1 = Buffer.concat([Buffer.from(lines[at].slice(0, cut + 5)), Buffer.from([0xe9]), Buffer.from(lines[at].slice(cut + 6))]);
    const bad = Buffer.concat(lines.map((l, i) => Buffer.concat([i === at ? latin1 : Buffer.from(l), Buffer.from('\n')])));
    const input = join(dir, 'latin1.jsonl');
    writeFileSync(input, bad);
    refused(['import', input, '-o', join(dir, 'latin1.db')], `latin1.jsonl line ${at + 1}: not valid UTF-8`);
    expect(existsSync(join(dir, 'latin1.db'))).toBe(false);
    const target = join(dir, 'latin1-into.db');
    copyFileSync(golden, target);
    refused(['import', input, '-o', target], `latin1.jsonl line ${at + 1}: not valid UTF-8`);
    expect(json(['list', target]).total).toBe(5);
  });

  it('imports a JSONL file larger than its whole JavaScript heap (64 MB): memory holds a line, not the file', () => {
    const lines = exportedLines();
    const exchange = lines.find((l) => l.type === 'exchange')!;
    const input = join(dir, 'large.jsonl');
    const fd = openSync(input, 'w');
    let bytes = 0;
    let count = 0;
    try {
      for (const l of lines.filter((x) => x.type !== 'exchange')) bytes += writeSync(fd, `${JSON.stringify(l)}\n`);
      // 100 MB of exchanges, each with 64 KB of padding in its request body.
      const padding = 'x'.repeat(64 * 1024);
      while (bytes < 100e6) {
        bytes += writeSync(fd, `${JSON.stringify({ ...exchange, requestBody: JSON.stringify({ n: count++, padding }) })}\n`);
      }
    } finally {
      closeSync(fd);
    }
    const out = join(dir, 'large.db');
    const r = mocker(['captures', 'import', input, '-o', out], { env: { ...ENV, NODE_OPTIONS: '--max-old-space-size=64' } });
    rmSync(input);
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    expect(r.stdout).toContain(`imported ${count} exchanges`);
    expect(json(['list', out]).total).toBe(count);
  });
});

describe('terminal output and unreadable files', () => {
  /** Escape sequences a hostile capture could carry: a window title (OSC … BEL), clear screen, CSI in its C1 form, DEL. */
  const LABEL = 'evil\u001b]0;owned\u0007label';
  const MODEL_NAME = 'm\u001b[2J\u009b31mred\u007f';
  /** Control characters a terminal acts on: C0 but newline, DEL, C1. */
  const CONTROL = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f]/;

  let hostile: string;
  beforeAll(() => {
    const lines = exportedLines();
    for (const l of lines) {
      if (l.type === 'run') l.label = LABEL;
      if (l.type === 'exchange') l.model = MODEL_NAME;
      if (l.type === 'exchange' && l.outcome === 'failed') {
        l.responseBody = `boom${MODEL_NAME}`;
        l.responseHeaders = { 'x-evil': LABEL };
      }
    }
    const input = join(dir, 'hostile.jsonl');
    writeFileSync(input, lines.map((l) => JSON.stringify(l)).join('\n'));
    hostile = join(dir, 'hostile.db');
    expect(captures(['import', input, '-o', hostile]).code).toBe(0);
  });

  it('list, show and stats print escape sequences from labels and models as visible text', () => {
    const list = captures(['list', hostile, '--exchanges']);
    expect(list.code).toBe(0);
    expect(list.stdout).not.toMatch(CONTROL);
    expect(list.stdout).toContain('evil\\x1b]0;owned\\x07label');
    expect(list.stdout).toContain('m\\x1b[2J\\x9b31mred\\x7f');
    const show = captures(['show', hostile, String(exchangeIds(hostile)[0])]);
    expect(show.stdout).not.toMatch(CONTROL);
    expect(show.stdout).toContain('model: m\\x1b[2J');
    const failed = captures(['show', hostile, String(exchangeIds(hostile)[4])]);
    expect(failed.stdout).not.toMatch(CONTROL);
    expect(failed.stdout).toContain('  boomm\\x1b[2J\\x9b31mred\\x7f');
    expect(failed.stdout).toContain('  x-evil: evil\\x1b]0;owned\\x07label');
    const stats = captures(['stats', hostile]);
    expect(stats.stdout).not.toMatch(CONTROL);
    expect(stats.stdout).toContain('evil\\x1b]0;owned\\x07label');
    // JSON stays the same value, its control characters all written as escapes.
    const listed = captures(['list', hostile, '--json']);
    expect(listed.stdout).not.toMatch(CONTROL);
    const value = JSON.parse(listed.stdout) as { models: string[]; runs: { label: string }[] };
    expect([value.models, value.runs[0].label]).toEqual([[MODEL_NAME], LABEL]);
  });

  it("serve's start-up lines say what the file holds with the models escaped", async () => {
    const serve = await startMockerProcess(['serve', '--mode', 'replay', '--captures', hostile, '--timing', 'none'], 0, { env: ENV });
    processes.push(serve);
    await serve.stop();
    expect(serve.stdout()).toContain('models: m\\x1b[2J\\x9b31mred\\x7f');
    expect(serve.stdout()).not.toMatch(CONTROL);
  });

  /** A copy of the golden capture with the root page of one of its b-trees (a table or an index) zeroed. */
  function damaged(name: string, btree: string): string {
    const file = join(dir, name);
    copyFileSync(golden, file);
    const db = new Database(file, { readonly: true });
    const { pageno } = db.prepare("select pageno from dbstat where name = ? and path = '/'").get(btree) as { pageno: number };
    const pageSize = db.pragma('page_size', { simple: true }) as number;
    db.close();
    const fd = openSync(file, 'r+');
    writeSync(fd, Buffer.alloc(pageSize), 0, pageSize, (pageno - 1) * pageSize);
    closeSync(fd);
    return file;
  }

  it('a damaged file is named in the error', () => {
    const file = damaged('runs-damaged.db', 'runs');
    refused(['list', file], `capture file ${file}: database disk image is malformed`);
    refused(['stats', file], `capture file ${file}:`);
  });

  it('diff exits 2 naming the file when a side cannot be read, even where its queries would not look', () => {
    // An index the pairing never reads: only SQLite's page check finds it.
    const file = damaged('index-damaged.db', 'exchanges_model');
    refused(['diff', golden, file], `capture file ${file}: damaged`, 2);
    refused(['diff', file, golden], `capture file ${file}: damaged`, 2);
    refused(['diff', golden, join(dir, 'absent.db')], 'absent.db: no such file', 2);
    refused(['verify', file], `capture file ${file}: damaged`);
  });
});
