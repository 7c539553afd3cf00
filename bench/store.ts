/**
 * Benchmark 3: the capture store (src/store/captureStore.ts) on disk, WAL mode, as `mocker capture` uses it: its
 * log checkpointed by a worker thread (--writer-checkpoints: by the writer itself, SQLite's default, instead).
 * 1. saveExchanges until --n stored generations of realistic exchanges: ~1000 prompt ids, 256 output ids with
 *    token times, 257 SSE events of vLLM's completion format with return_token_ids (~78 KB body,
 *    test/support/benchExchange.ts), --batch K at a time, one transaction each (the recorder's group commit when
 *    K exchanges end together). Exchanges are built 128 at a time and only the saveExchanges calls are timed;
 *    per-write times are a batch's time / K. The CPU time of the whole process (this thread and the
 *    checkpointer's) in the timed calls is reported per write;
 * 2. the writer closed, the file opened read-only as `mocker serve` opens it (no --on-miss record): findByPrompt
 *    at that size on random stored prompts (hits), --rounds rounds of --lookups each, reported as the median
 *    round's rate and the spread over rounds. The exchange it returns reads its large values on first use,
 *    so lookups are timed again reading what replay reads (generations, response body). A read-only store's
 *    reads share one read transaction per 10 ms (CaptureStore.holdReads), a round's as a busy server's;
 * 3. nearest(), the miss path: a stored prompt with its last 10 tokens changed.
 *
 *   npx tsx bench/store.ts [--n 100000] [--batch 1] [--lookups 2000] [--rounds 5] [--nearest 5] [--dir /tmp] [--keep] [--writer-checkpoints]
 */
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { CaptureStore } from '../src/store/captureStore.js';
import { benchExchange as exchange, MODEL, OUTPUT_LEN, PROMPT_LEN, promptIds, sseBody } from '../test/support/benchExchange.js';
import { flag, median, nowMs, numberArg, printTable, quantile, round, stringArg } from './lib/stats.js';

const N = numberArg('n', 100_000);
const BATCH = Math.max(1, numberArg('batch', 1));
/** Exchanges built ahead of the timed calls: ~11 MB (more would outlive V8's young generation, to be copied by the GC). */
const CHUNK = Math.ceil(128 / BATCH) * BATCH;
const LOOKUPS = numberArg('lookups', 2000);
/** Rounds of LOOKUPS lookups; the median round is reported, with the spread. */
const ROUNDS = Math.max(1, numberArg('rounds', 5));
const NEAREST = numberArg('nearest', 5);
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
  console.log(
    `capture store: ${N} exchanges (${PROMPT_LEN} prompt ids, ${OUTPUT_LEN} output ids, ${sseBody(promptIds(0)).body.length} bytes SSE body), file ${dbPath}`,
  );
  console.log(`machine: ${cpus().length} cores, ${cpus()[0]?.model ?? '?'}, node ${process.version}`);
  const store = CaptureStore.open(dbPath, { backgroundCheckpoints: !flag('writer-checkpoints') });
  const runId = store.startRun({ kind: 'capture', label: 'bench', tokenizerName: MODEL }, new Map());

  // 1. writes: exchanges built a chunk at a time outside the timed calls
  const writeMs = new Float64Array(N);
  const every = Math.max(1, Math.round(N / 10));
  let timed = 0;
  // CPU time of every thread of the process (this one, the checkpointer's) in the timed calls.
  let cpuUs = 0;
  let systemUs = 0;
  const wall0 = nowMs();
  let last = { stored: 0, timed: 0 };
  for (let start = 0; start < N; start += CHUNK) {
    const chunk = Array.from({ length: Math.min(CHUNK, N - start) }, (_, k) => exchange(runId, start + k));
    for (let k = 0; k < chunk.length; k += BATCH) {
      const batch = chunk.slice(k, k + BATCH);
      const cpu0 = process.cpuUsage();
      const t = nowMs();
      store.saveExchanges(batch);
      const ms = nowMs() - t;
      const cpu = process.cpuUsage(cpu0);
      writeMs.fill(ms / batch.length, start + k, start + k + batch.length);
      timed += ms;
      cpuUs += cpu.user + cpu.system;
      systemUs += cpu.system;
      const stored = start + k + batch.length;
      if (Math.floor(stored / every) > Math.floor(last.stored / every) || stored === N) {
        console.log(
          `  ${String(stored).padStart(7)} stored: ${Math.round(((stored - last.stored) * 1000) / (timed - last.timed))} writes/s (last ${stored - last.stored}), ` +
            `${Math.round((stored * 1000) / timed)} writes/s overall, file ${((fileSize(dbPath) + fileSize(`${dbPath}-wal`)) / 1e9).toFixed(2)} GB, ${((nowMs() - wall0) / 1000).toFixed(0)} s`,
        );
        last = { stored, timed };
      }
    }
  }
  const writes = {
    perS: Math.round((N * 1000) / timed),
    cpuUsPerWrite: Math.round(cpuUs / N),
    systemUsPerWrite: Math.round(systemUs / N),
    cores: round(cpuUs / 1000 / timed, 2),
    p50Ms: round(median(writeMs)),
    p99Ms: round(quantile(writeMs, 0.99)),
    maxMs: round(quantile(writeMs, 1)),
  };

  store.close();
  const bytes = { db: fileSize(dbPath), wal: fileSize(`${dbPath}-wal`) };
  // Read as `mocker serve` reads a capture file (without --on-miss record: read-only).
  const replayStore = CaptureStore.open(dbPath, { readonly: true });

  // 2. lookups (hits) on random stored prompts, in rounds: the first pays for the JIT
  let seed = 12345;
  const random = () => (seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32;
  const lookupRounds = (readInFull: boolean) => {
    const perS: number[] = [];
    const allMs: number[] = [];
    for (let r = 0; r < ROUNDS; r++) {
      let sum = 0;
      for (let k = 0; k < LOOKUPS; k++) {
        // Other prompts each time: the store remembers recent lookups.
        const i = Math.floor(random() * N);
        const ids = promptIds(i);
        const t = nowMs();
        const found = replayStore.findByPrompt(MODEL, ids);
        if (readInFull) {
          const read = found[0].generations[0].outputIds.length + found[0].responseBody.length + found[0].eventTimes.length;
          if (read === 0) throw new Error('read nothing');
        }
        const ms = nowMs() - t;
        sum += ms;
        allMs.push(ms);
        if (found.length !== 1 || found[0].id !== i + 1) throw new Error(`lookup of exchange ${i + 1} found ${found.map((f) => f.id).join(',') || 'nothing'}`);
      }
      perS.push(Math.round((LOOKUPS * 1000) / sum));
    }
    return {
      perS: median(perS),
      perSMin: Math.min(...perS),
      perSMax: Math.max(...perS),
      rounds: perS,
      p50Ms: round(median(allMs)),
      p99Ms: round(quantile(allMs, 0.99)),
    };
  };
  const lookups = lookupRounds(false);
  console.log(`  ${ROUNDS} × ${LOOKUPS} findByPrompt hits: ${lookups.perS}/s (rounds ${lookups.rounds.join(', ')}), p50 ${lookups.p50Ms} ms`);
  // 2b. the same, reading what a replay reads
  const reads = lookupRounds(true);
  console.log(`  ${ROUNDS} × ${LOOKUPS} findByPrompt hits read in full: ${reads.perS}/s (rounds ${reads.rounds.join(', ')}), p50 ${reads.p50Ms} ms`);

  // 3. the miss path's nearest()
  const nearestMs: number[] = [];
  for (let k = 0; k < NEAREST; k++) {
    const i = Math.floor(random() * N);
    const probe = promptIds(i);
    for (let j = PROMPT_LEN - 10; j < PROMPT_LEN; j++) probe[j] = 151_500 + j;
    const t = nowMs();
    const near = replayStore.nearest(MODEL, probe);
    nearestMs.push(nowMs() - t);
    if (!near || near.exchangeId !== i + 1 || near.commonPrefix !== PROMPT_LEN - 10)
      throw new Error(`nearest of exchange ${i + 1}: ${JSON.stringify(near && { id: near.exchangeId, prefix: near.commonPrefix })}`);
    console.log(`  nearest() ${k + 1}/${NEAREST}: ${round(nearestMs[k], 1)} ms`);
  }
  replayStore.close();

  console.log('');
  printTable(
    ['operation', 'per second', 'p50 ms', 'p99 ms'],
    [
      [BATCH === 1 ? `saveExchange (0 → ${N})` : `saveExchanges by ${BATCH} (0 → ${N})`, writes.perS, writes.p50Ms, writes.p99Ms],
      [`findByPrompt hit @ ${N}`, lookups.perS, lookups.p50Ms, lookups.p99Ms],
      [`  + generations, SSE body, event times read`, reads.perS, reads.p50Ms, reads.p99Ms],
      [`nearest() miss @ ${N}`, round(1000 / median(nearestMs), 2), round(median(nearestMs), 1), round(quantile(nearestMs, 0.99), 1)],
    ],
  );
  console.log(
    `write max ${writes.maxMs} ms; writes took ${writes.cpuUsPerWrite} µs of CPU each (${writes.systemUsPerWrite} in the kernel; ${writes.cores} cores busy); file ${(bytes.db / 1e9).toFixed(2)} GB (+ WAL ${(bytes.wal / 1e6).toFixed(1)} MB after close), ${Math.round(bytes.db / N)} bytes per exchange`,
  );
  if (!flag('keep')) rmSync(dir, { recursive: true, force: true });
  console.log(
    JSON.stringify({
      bench: 'store',
      config: { n: N, batch: BATCH, promptLen: PROMPT_LEN, outputLen: OUTPUT_LEN, lookups: LOOKUPS, rounds: ROUNDS, nearest: NEAREST },
      writes,
      lookups,
      lookupsReadInFull: reads,
      nearest: { msMedian: round(median(nearestMs), 1), ms: nearestMs.map((x) => round(x, 1)) },
      fileBytes: bytes.db,
      bytesPerExchange: Math.round(bytes.db / N),
    }),
  );
}

main();
