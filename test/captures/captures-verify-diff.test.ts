/**
 * `mocker captures verify` and `mocker captures diff` on capture files made through the CLI (`mocker capture` in
 * front of the vLLM, llama.cpp and transformers-serve doubles), run as a user runs them: `node dist/cli/main.js`.
 * Oracles: the Python tokenizer's ids (qwen3Oracle), the stored bytes read with plain SQLite.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CaptureStore } from '../../src/store/captureStore.js';
import { startEngineDouble, type EngineName } from '../support/engineDoubles.js';
import { runMockerToExit, startMockerProcess } from '../support/mockerProcess.js';
import { oracleIds } from '../support/qwen3Oracle.js';
import { testTmpdir } from '../support/tempRoot.js';
import { CHAT_TEMPLATE, EOS, MODEL, startUpstream, type Answer, type UpstreamOptions } from '../support/vllmUpstream.js';

type Json = Record<string, unknown>;

const tempDirs: string[] = [];
function tempFile(name: string): string {
  const dir = mkdtempSync(join(testTmpdir(), 'mocker-cverify-'));
  tempDirs.push(dir);
  return join(dir, name);
}
afterAll(() => tempDirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

interface Request {
  path: '/v1/chat/completions' | '/v1/completions';
  body: Json;
}

/** Sends each request through a `mocker capture` in front of `upstream`, then stops it (the file is then complete). */
async function capture(upstream: string, file: string, requests: Request[]): Promise<void> {
  const proxy = await startMockerProcess(['capture', '--upstream', upstream, '--captures', file]);
  try {
    for (const r of requests) {
      const res = await fetch(`http://127.0.0.1:${proxy.port}${r.path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(r.body),
      });
      await res.text();
    }
  } finally {
    await proxy.stop();
  }
}

async function captureVllm(file: string, requests: Request[], script: (body: Json) => Answer, options: UpstreamOptions = {}): Promise<void> {
  const upstream = await startUpstream((body) => script(body), options);
  try {
    await capture(upstream.url, file, requests);
  } finally {
    await upstream.close();
  }
}

async function mocker(...args: string[]): Promise<{ code: number | null; stdout: string; stderr: string; json: Json }> {
  const out = await runMockerToExit(args);
  let json: Json = {};
  try {
    json = JSON.parse(out.stdout) as Json;
  } catch {
    // A text report.
  }
  return { ...out, json };
}

/** The exchanges of a capture file as the store reads them back (bodies decompressed). */
function storedRows(file: string): { id: number; path: string; outcome: string; body: Buffer; eventEnds: number[] }[] {
  const store = CaptureStore.open(file, { readonly: true });
  try {
    return store.exchangeIds().map((id) => {
      const ex = store.getExchange(id)!;
      return { id, path: ex.path, outcome: ex.outcome, body: ex.responseBody, eventEnds: ex.eventEnds };
    });
  } finally {
    store.close();
  }
}

/**
 * A copy of a capture file whose exchanges `change` names have other stored response bytes, written through the
 * store as an import writes (the file's own layout compresses them); returns the copy's exchange ids by the source's.
 */
function alteredCopy(file: string, out: string, change: Map<number, (body: Buffer) => Buffer>): Map<number, number> {
  const source = CaptureStore.open(file, { readonly: true });
  const target = CaptureStore.open(out);
  const runs = new Map<number, number>();
  const ids = new Map<number, number>();
  try {
    for (const id of source.exchangeIds()) {
      const ex = source.getExchange(id)!;
      let runId = runs.get(ex.runId);
      if (runId === undefined) {
        const run = source.getRun(ex.runId)!;
        const { id: _, startedAt, tokenizerFiles: __, ...info } = run;
        runId = target.startRun(info, source.tokenizerFiles(run), startedAt);
        runs.set(ex.runId, runId);
      }
      const mutate = change.get(id);
      ids.set(id, target.saveExchange({ ...ex, runId, responseBody: mutate ? mutate(ex.responseBody) : ex.responseBody }));
    }
  } finally {
    source.close();
    target.close();
  }
  return ids;
}

/** Characters of several UTF-8 bytes that the tokenizer splits over byte tokens (👍 is 61804 + 235 in the oracle). */
const EMOJI_TEXT = 'emoji 👍🏽 family 👨‍👩‍👧‍👦 flag 🇯🇵';
const CJK_TEXT = '日本語のテキストです。';
const CHAT = (content: string, extra: Json = {}): Request => ({
  path: '/v1/chat/completions',
  body: { model: MODEL, messages: [{ role: 'user', content }], ...extra },
});
const COMPLETION = (prompt: string, extra: Json = {}): Request => ({ path: '/v1/completions', body: { model: MODEL, prompt, ...extra } });

describe('mocker captures verify', () => {
  describe('on a capture of vLLM', () => {
    const file = tempFile('vllm.db');
    const requests: Request[] = [
      CHAT('Hi there'),
      CHAT('Hi there', { stream: true, stream_options: { include_usage: true } }),
      CHAT('Hi there', { stream: true, return_token_ids: true, max_tokens: 5 }),
      COMPLETION('Hello world', { max_tokens: 40 }),
      COMPLETION('Hello world', { max_tokens: 40, stream: true }),
      COMPLETION('Hello world', { max_tokens: 40, stream: true, n: 2, stream_options: { include_usage: true } }),
      COMPLETION('fail please'),
      CHAT('Hi there', { logprobs: true }),
    ];
    beforeAll(async () => {
      await captureVllm(file, requests, (body) => (body.prompt === 'fail please' ? { errorStatus: 500 } : { content: body.messages ? EMOJI_TEXT : CJK_TEXT }));
    });

    it('captured multi-byte characters split across tokens (an empty chunk holds half of one)', () => {
      const stream = storedRows(file)[1].body.toString('utf8');
      // The oracle: 👍 is two byte tokens, 61804 then 235; vLLM sends nothing for the first.
      expect(oracleIds(EMOJI_TEXT).slice(0, 3)).toEqual([37523, 61804, 235]);
      expect(stream).toContain('"delta":{"content":""},"logprobs":null,"finish_reason":null,"token_ids":[61804]}');
    });

    it('re-renders every complete exchange byte for byte: 0 mismatches, the failed and the logprobs ones skipped', async () => {
      const { code, json, stdout } = await mocker('captures', 'verify', file, '--json');
      expect(code, stdout).toBe(0);
      expect(json).toMatchObject({ exchanges: 8, verified: 6, matched: 6, mismatched: 0, skipped: 2, comparedBy: { bytes: 6, content: 0 }, mismatches: [] });
      expect(json.skippedBy).toEqual({ failed: 1, 'logprobs requested': 1 });
      const text = await mocker('captures', 'verify', file);
      expect(text.code).toBe(0);
      expect(text.stdout).toContain('8 exchanges, 6 verified (6 by bytes, 0 by content): 6 match, 0 mismatch; 2 skipped (failed: 1, logprobs requested: 1)');
    });

    it('reports a byte changed in the stored response with its position, event and JSON path; exit 1', async () => {
      const altered = tempFile('altered.db');
      const source = storedRows(file)[1];
      const needle = '"content":"emoji"';
      const offset = source.body.indexOf(needle) + '"content":"'.length;
      expect(source.body[offset]).toBe('e'.charCodeAt(0));
      const ids = alteredCopy(
        file,
        altered,
        new Map([
          [
            source.id,
            (body: Buffer) => {
              const changed = Buffer.from(body);
              changed[offset] = 'E'.charCodeAt(0);
              return changed;
            },
          ],
        ]),
      );
      const row = { ...source, id: ids.get(source.id)! };
      const event = row.eventEnds.findIndex((end) => end > offset);

      const { code, json } = await mocker('captures', 'verify', altered, '--json');
      expect(code).toBe(1);
      expect(json).toMatchObject({ verified: 6, matched: 5, mismatched: 1 });
      expect(json.mismatches).toEqual([
        {
          exchangeId: row.id,
          endpoint: 'chat',
          stream: true,
          engine: 'vllm',
          comparison: 'bytes',
          event,
          path: 'choices[0].delta.content',
          captured: 'Emoji',
          rendered: 'emoji',
          byteOffset: offset,
          kind: 'content',
        },
      ]);
      const text = await mocker('captures', 'verify', altered);
      expect(text.code).toBe(1);
      expect(text.stdout).toContain(
        `exchange ${row.id} (chat stream, vllm, bytes): event ${event}, choices[0].delta.content, byte ${offset}: captured "Emoji", rendered "emoji" — content`,
      );
    });

    it('--limit bounds the examples, not the count', async () => {
      const altered = tempFile('altered-twice.db');
      const stoP = (body: Buffer) => {
        const changed = Buffer.from(body);
        changed.write('stoP', changed.indexOf(Buffer.from('"finish_reason":"stop"')) + '"finish_reason":"'.length);
        return changed;
      };
      alteredCopy(
        file,
        altered,
        new Map(
          storedRows(file)
            .slice(3, 5)
            .map((row) => [row.id, stoP]),
        ),
      );
      const { code, json } = await mocker('captures', 'verify', altered, '--json', '--limit', '1');
      expect(code).toBe(1);
      expect(json).toMatchObject({ mismatched: 2 });
      expect((json.mismatches as Json[]).map((m) => [m.path?.toString().endsWith('finish_reason'), m.kind])).toEqual([[true, 'finish_reason']]);
    });

    it('refuses a file that is not there, naming it', async () => {
      const missing = join(testTmpdir(), 'no-such-capture.db');
      const { code, stderr } = await mocker('captures', 'verify', missing);
      expect(code).toBe(1);
      expect(stderr).toContain(`capture file ${missing}: no such file`);
    });
  });

  describe.each<EngineName>(['llama.cpp', 'transformers'])('on a capture of %s', (engineName) => {
    it('compares what a client reads (text, finish, usage): 0 mismatches', async () => {
      const engine = await startEngineDouble(engineName);
      const file = tempFile(`${engineName}.db`);
      const chat = { model: engine.model, messages: [{ role: 'user', content: 'Say hello in three words.' }], max_tokens: 8, temperature: 0 };
      const completion = { model: engine.model, prompt: 'The capital of France is', max_tokens: 12, temperature: 0 };
      const streamed = { stream: true, stream_options: { include_usage: true } };
      try {
        await capture(engine.url, file, [
          { path: '/v1/chat/completions', body: chat },
          { path: '/v1/chat/completions', body: { ...chat, ...streamed } },
          { path: '/v1/completions', body: completion },
          { path: '/v1/completions', body: { ...completion, ...streamed } },
        ]);
      } finally {
        await engine.close();
      }
      const { code, json, stdout } = await mocker('captures', 'verify', file, '--json');
      expect(code, stdout).toBe(0);
      expect(json).toMatchObject({ exchanges: 4, verified: 4, matched: 4, mismatched: 0, comparedBy: { bytes: 0, content: 4 } });
    });
  });
});

describe('mocker captures diff', () => {
  /** Qwen3's template with an empty system turn always first: a changed chat template. */
  const WITH_SYSTEM = `{{- '<|im_start|>system\\n<|im_end|>\\n' }}${CHAT_TEMPLATE}`;
  const requests: Request[] = [CHAT('empty system', { stream: true }), COMPLETION('Hi', { max_tokens: 10 })];
  const files = { a: tempFile('a.db'), same: tempFile('same.db'), b: tempFile('b.db'), notStreamed: tempFile('not-streamed.db'), empty: tempFile('empty.db') };
  // The oracle: the chat "empty system" with its system turn; without it, what follows that turn (it ends on a special token).
  const chatOracle = JSON.parse(
    readFileSync(join(import.meta.dirname, '..', 'fixtures', 'tokenizer', 'qwen3.jsonl'), 'utf8')
      .split('\n')
      .find((l) => l.includes('"empty system"'))!,
  ) as { ids: number[] };
  const promptA = chatOracle.ids.slice(5);
  const promptB = chatOracle.ids;

  beforeAll(async () => {
    const answer = (text: string) => (body: Json) => ({ content: body.messages ? 'Hello world' : text, ttftMs: 5 });
    await captureVllm(files.a, requests, answer('Hello world'));
    await captureVllm(files.same, requests, answer('Hello world'));
    await captureVllm(files.b, [...requests, COMPLETION('only in B')], answer('Hello  world'), { chatTemplate: WITH_SYSTEM });
    await captureVllm(
      files.notStreamed,
      requests.map((r) => ({ ...r, body: { ...r.body, stream: false } })),
      answer('Hello world'),
    );
    await captureVllm(files.empty, [], answer('Hello world'));
  });

  it('a side with no sample of a figure (no streamed exchange, or an empty file) prints n/a for it, null in --json, never 0 (issue 36)', async () => {
    const absent = { count: 0, p50: null, p90: null, p99: null };
    for (const other of [files.notStreamed, files.empty]) {
      const { code, json } = await mocker('captures', 'diff', files.a, other, '--json');
      expect(code).toBe(1);
      const timing = json.timing as Record<'ttftMs' | 'itlMs', { a: Json; b: Json; change: Json }>;
      // A's one streamed chat: its first token no sooner than the double's scripted 5 ms.
      expect(timing.ttftMs.a.count).toBe(1);
      expect(timing.ttftMs.a.p50).toBeGreaterThanOrEqual(5 - 1);
      for (const figure of [timing.ttftMs, timing.itlMs]) {
        expect(figure.b).toEqual(absent);
        expect(figure.change).toEqual({ p50: null, p90: null, p99: null });
      }
      const text = await mocker('captures', 'diff', files.a, other);
      expect(text.stdout).toMatch(
        /^TTFT ms \(A 1 \/ B 0 samples\): p50 \d+\.\d\d -> n\/a \(n\/a\), p90 \d+\.\d\d -> n\/a \(n\/a\), p99 \d+\.\d\d -> n\/a \(n\/a\)$/m,
      );
      expect(text.stdout).toMatch(/^ITL ms \(A \d+ \/ B 0 samples\): p50 \d+\.\d\d -> n\/a \(n\/a\)/m);
      const reversed = await mocker('captures', 'diff', other, files.a);
      expect(reversed.stdout).toMatch(/^TTFT ms \(A 0 \/ B 1 samples\): p50 n\/a -> \d+\.\d\d \(n\/a\)/m);
    }
  });

  it('two captures of the same requests and engine: nothing reported, exit 0', async () => {
    const { code, json } = await mocker('captures', 'diff', files.a, files.same, '--json');
    expect(code).toBe(0);
    expect(json).toMatchObject({
      paired: 2,
      identical: 2,
      promptChanges: 0,
      outputChanges: 0,
      onlyInA: 0,
      onlyInB: 0,
      differs: false,
      examples: { promptChanges: [], outputChanges: [], onlyInA: [], onlyInB: [] },
    });
  });

  it('a changed chat template is a tokenization change at the first differing token; a changed output token at its index; exit 1', async () => {
    // The prompts part where the system turn starts: the oracle's first difference.
    const promptAt = promptA.findIndex((id, i) => id !== promptB[i]);
    expect(promptAt).toBe(1);
    const outputA = [...oracleIds('Hello world'), EOS];
    const outputB = [...oracleIds('Hello  world'), EOS];
    const outputAt = outputA.findIndex((id, i) => id !== outputB[i]);

    const { code, json } = await mocker('captures', 'diff', files.a, files.b, '--json');
    expect(code).toBe(1);
    expect(json).toMatchObject({ pairedBy: 'request', paired: 2, identical: 0, promptChanges: 1, outputChanges: 1, onlyInA: 0, onlyInB: 1, differs: true });
    const examples = json.examples as Record<string, Json[]>;
    expect(examples.promptChanges).toEqual([
      expect.objectContaining({
        position: promptAt,
        aToken: promptA[promptAt],
        bToken: promptB[promptAt],
        aLength: promptA.length,
        bLength: promptB.length,
        before: '<|im_start|>',
      }),
    ]);
    expect(String(examples.promptChanges[0].aText)).toMatch(/^user\n/);
    expect(String(examples.promptChanges[0].bText)).toMatch(/^system\n<\|im_end\|>/);
    expect(examples.outputChanges).toEqual([
      expect.objectContaining({
        choice: 0,
        position: outputAt,
        aToken: outputA[outputAt],
        bToken: outputB[outputAt],
        aLength: outputA.length,
        bLength: outputB.length,
      }),
    ]);
    expect(examples.onlyInB).toEqual([expect.objectContaining({ path: '/v1/completions', model: MODEL })]);
    // One streamed exchange each side: its TTFT, and the gaps between its tokens.
    const timing = json.timing as Record<string, { a: Json; b: Json; change: Json }>;
    expect(timing.ttftMs.a.count).toBe(1);
    expect(timing.ttftMs.b.count).toBe(1);
    expect(timing.itlMs.a.count).toBe(outputA.length - 1);
    expect(timing.ttftMs.change.p50).toBeCloseTo((timing.ttftMs.b.p50 as number) - (timing.ttftMs.a.p50 as number), 9);

    const text = await mocker('captures', 'diff', files.a, files.b);
    expect(text.code).toBe(1);
    expect(text.stdout).toContain(
      `prompt tokenization changed: A#1 / B#1 (${MODEL}): first difference at token ${promptAt} of ${promptA.length} / ${promptB.length}`,
    );
    expect(text.stdout).toContain('2 paired by request (0 identical), 1 prompt tokenization changes, 1 output changes, 0 only in A, 1 only in B');
    expect(text.stdout).toMatch(/^TTFT ms \(A 1 \/ B 1 samples\): p50 /m);
  });

  it('--by-prompt pairs by prompt ids: the re-templated chat is then in one file only', async () => {
    const { code, json } = await mocker('captures', 'diff', files.a, files.b, '--json', '--by-prompt');
    expect(code).toBe(1);
    expect(json).toMatchObject({ pairedBy: 'prompt', paired: 1, promptChanges: 0, outputChanges: 1, onlyInA: 1, onlyInB: 2 });
  });
});
