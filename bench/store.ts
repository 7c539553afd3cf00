/**
 * Benchmark 3: the capture store (src/store/captureStore.ts) on disk, WAL mode, as `mocker capture` uses it.
 * 1. saveExchange of realistic exchanges until --n stored generations: ~1000 prompt ids, 256 output ids with
 *    token times, 257 SSE events of vLLM's completion format with return_token_ids (~60 KB body); only the
 *    saveExchange calls are timed (building the exchanges is not);
 * 2. findByPrompt at that size: random stored prompts (hits), each returning the hydrated exchange;
 * 3. nearest(), the miss path's linear scan: a stored prompt with its last 10 tokens changed.
 * Prompt ids are a function of the exchange number, so any stored prompt can be rebuilt without keeping them.
 *
 *   npx tsx bench/store.ts [--n 100000] [--lookups 2000] [--nearest 5] [--dir /tmp] [--keep]
 */
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { CaptureStore, type Exchange } from '../src/store/captureStore.js';
import { flag, median, nowMs, numberArg, printTable, quantile, round, stringArg } from './lib/stats.js';

const N = numberArg('n', 100_000);
const LOOKUPS = numberArg('lookups', 2000);
const NEAREST = numberArg('nearest', 5);
const PROMPT_LEN = 1000;
const OUTPUT_LEN = 256;
const MODEL = 'Qwen/Qwen3-0.6B';

/** Deterministic prompt ids of exchange `i` (xorshift32 seeded by i). */
function promptIds(i: number): number[] {
  let x = (i + 1) * 2654435761 >>> 0 || 1;
  const ids = new Array<number>(PROMPT_LEN);
  for (let k = 0; k < PROMPT_LEN; k++) {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    ids[k] = x % 151_000;
  }
  return ids;
}

const OUTPUT_IDS = Array.from({ length: OUTPUT_LEN }, (_, k) => 1000 + ((k * 7919) % 50_000));
const PIECES = Array.from({ length: OUTPUT_LEN }, (_, k) => [' the', ' model', ' answers', ',', ' slowly', '.'][k % 6]);
const TOKEN_TIMES = Array.from({ length: OUTPUT_LEN }, (_, k) => 45.3 + k * 21.7);

/** The upstream's SSE bytes as captured (completion chunks with token ids, first one with the prompt ids). */
function sseBody(prompt: number[]): { body: Buffer; ends: number[] } {
  const head = '{"id":"cmpl-0123456789abcdef0123456789abcdef","object":"text_completion","created":1763800000,"model":"Qwen/Qwen3-0.6B"';
  const events = OUTPUT_IDS.map(
    (id, k) =>
      `data: ${head},"choices":[{"index":0,"text":${JSON.stringify(PIECES[k])},"logprobs":null,"finish_reason":${k === OUTPUT_LEN - 1 ? '"length"' : 'null'},"stop_reason":null,` +
      `"prompt_token_ids":${k === 0 ? `[${prompt.join(',')}]` : 'null'},"token_ids":[${id}]}],"usage":null}\n\n`,
  );
  events.push('data: [DONE]\n\n');
  const ends: number[] = [];
  let at = 0;
  for (const e of events) ends.push((at += Buffer.byteLength(e)));
  return { body: Buffer.from(events.join('')), ends };
}

function exchange(runId: number, i: number): Exchange {
  const prompt = promptIds(i);
  const { body, ends } = sseBody(prompt);
  const request = { model: MODEL, prompt, max_tokens: OUTPUT_LEN, stream: true };
  return {
    runId,
    startedAt: Date.now(),
    requestId: null,
    method: 'POST',
    path: '/v1/completions',
    endpoint: 'completion',
    outcome: 'complete',
    error: null,
    status: 200,
    model: MODEL,
    stream: true,
    requestHeaders: { 'content-type': 'application/json', 'user-agent': 'OpenAI/Python 1.99.0', accept: 'application/json' },
    requestBody: Buffer.from(JSON.stringify(request)),
    responseHeaders: { 'content-type': 'text/event-stream; charset=utf-8', server: 'uvicorn', date: new Date().toUTCString() },
    responseBody: body,
    eventEnds: ends,
    eventTimes: [...TOKEN_TIMES, TOKEN_TIMES[OUTPUT_LEN - 1] + 0.2],
    eventTokens: ends.map((_, k) => Math.min(k + 1, OUTPUT_LEN)),
    totalMs: TOKEN_TIMES[OUTPUT_LEN - 1] + 0.3,
    tokenSource: 'engine',
    promptIds: prompt,
    requestShape: '{"endpoint":"completion","max_tokens":256,"stream":true}',
    injected: ['return_token_ids'],
    usage: undefined,
    generations: [
      {
        choiceIndex: 0,
        outputIds: OUTPUT_IDS,
        tokenTimes: TOKEN_TIMES,
        chunkTokens: OUTPUT_IDS.map(() => 1),
        chunkDeltas: PIECES.map((text) => ({ text })),
        text: PIECES.join(''),
        finishReason: 'length',
        stopReason: null,
      },
    ],
  };
}

const fileSize = (path: string) => {
  try {
    return statSync(path).size;
  } catch {
    return 0;
  }
};

function main(): void {
  const dir = mkdtempSync(join(stringArg('dir', tmpdir()), 'mocker-bench-store-'));
  const dbPath = join(dir, 'store.db');
  console.log(`capture store: ${N} exchanges (${PROMPT_LEN} prompt ids, ${OUTPUT_LEN} output ids, ${sseBody(promptIds(0)).body.length} bytes SSE body), file ${dbPath}`);
  console.log(`machine: ${cpus().length} cores, ${cpus()[0]?.model ?? '?'}, node ${process.version}`);
  const store = CaptureStore.open(dbPath);
  const runId = store.startRun({ kind: 'capture', label: 'bench', tokenizerName: MODEL }, new Map());

  // 1. writes
  const writeMs = new Float64Array(N);
  let timed = 0;
  const wall0 = nowMs();
  const every = Math.max(1, Math.round(N / 10));
  for (let i = 0; i < N; i++) {
    const ex = exchange(runId, i);
    const t = nowMs();
    store.saveExchange(ex);
    writeMs[i] = nowMs() - t;
    timed += writeMs[i];
    if ((i + 1) % every === 0 || i + 1 === N) {
      const last = writeMs.subarray(i + 1 - every, i + 1).reduce((a, b) => a + b, 0);
      console.log(
        `  ${String(i + 1).padStart(7)} stored: ${Math.round((every * 1000) / last)} writes/s (last ${every}), ${Math.round(((i + 1) * 1000) / timed)} writes/s overall, ` +
          `file ${((fileSize(dbPath) + fileSize(`${dbPath}-wal`)) / 1e9).toFixed(2)} GB, ${((nowMs() - wall0) / 1000).toFixed(0)} s`,
      );
    }
  }
  const writes = { perS: Math.round((N * 1000) / timed), p50Ms: round(median(writeMs)), p99Ms: round(quantile(writeMs, 0.99)), maxMs: round(quantile(writeMs, 1)) };

  // 2. lookups (hits) on random stored prompts
  const lookupMs: number[] = [];
  let seed = 12345;
  const random = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32);
  for (let k = 0; k < LOOKUPS; k++) {
    const i = Math.floor(random() * N);
    const ids = promptIds(i);
    const t = nowMs();
    const found = store.findByPrompt(MODEL, ids);
    lookupMs.push(nowMs() - t);
    if (found.length !== 1 || found[0].id !== i + 1) throw new Error(`lookup of exchange ${i + 1} found ${found.map((f) => f.id).join(',') || 'nothing'}`);
  }
  const lookups = { perS: Math.round((LOOKUPS * 1000) / lookupMs.reduce((a, b) => a + b, 0)), p50Ms: round(median(lookupMs)), p99Ms: round(quantile(lookupMs, 0.99)) };
  console.log(`  ${LOOKUPS} findByPrompt hits: ${lookups.perS}/s, p50 ${lookups.p50Ms} ms`);

  // 3. the miss path's nearest() scan
  const nearestMs: number[] = [];
  for (let k = 0; k < NEAREST; k++) {
    const i = Math.floor(random() * N);
    const probe = promptIds(i);
    for (let j = PROMPT_LEN - 10; j < PROMPT_LEN; j++) probe[j] = 151_500 + j;
    const t = nowMs();
    const near = store.nearest(MODEL, probe);
    nearestMs.push(nowMs() - t);
    if (!near || near.exchangeId !== i + 1 || near.commonPrefix !== PROMPT_LEN - 10) throw new Error(`nearest of exchange ${i + 1}: ${JSON.stringify(near && { id: near.exchangeId, prefix: near.commonPrefix })}`);
    console.log(`  nearest() ${k + 1}/${NEAREST}: ${round(nearestMs[k], 1)} ms`);
  }
  store.close();
  const bytes = { db: fileSize(dbPath), wal: fileSize(`${dbPath}-wal`) };

  console.log('');
  printTable(
    ['operation', 'per second', 'p50 ms', 'p99 ms'],
    [
      [`saveExchange (0 → ${N})`, writes.perS, writes.p50Ms, writes.p99Ms],
      [`findByPrompt hit @ ${N}`, lookups.perS, lookups.p50Ms, lookups.p99Ms],
      [`nearest() miss scan @ ${N}`, round(1000 / median(nearestMs), 2), round(median(nearestMs), 1), round(quantile(nearestMs, 0.99), 1)],
    ],
  );
  console.log(`saveExchange max ${writes.maxMs} ms; file ${(bytes.db / 1e9).toFixed(2)} GB (+ WAL ${(bytes.wal / 1e6).toFixed(1)} MB after close), ${Math.round(bytes.db / N)} bytes per exchange`);
  if (!flag('keep')) rmSync(dir, { recursive: true, force: true });
  console.log(
    JSON.stringify({
      bench: 'store',
      config: { n: N, promptLen: PROMPT_LEN, outputLen: OUTPUT_LEN, lookups: LOOKUPS, nearest: NEAREST },
      writes,
      lookups,
      nearest: { msMedian: round(median(nearestMs), 1), ms: nearestMs.map((x) => round(x, 1)) },
      fileBytes: bytes.db,
      bytesPerExchange: Math.round(bytes.db / N),
    }),
  );
}

main();
