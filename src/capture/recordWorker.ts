/**
 * The recorder's worker thread (started by recorderThread.ts): owns its own connection to the capture file
 * and turns each exchange the proxy posts into a stored one — response parsing, token ids, one SQLite
 * transaction — then replies, so the proxy can end the client's response.
 */
import { readlinkSync } from 'node:fs';
import { setPriority } from 'node:os';
import { parentPort, workerData } from 'node:worker_threads';
import { CaptureStore } from '../store/captureStore.js';
import { ModelTokenizer } from '../tokenizer/index.js';
import type { RawExchange } from './forward.js';
import { Recorder, type RecorderTokenizer } from './recorder.js';
import type { FromWorker, RecordWorkerInit, ToWorker, WireExchange } from './recorderThread.js';

if (!parentPort) throw new Error('recordWorker.ts runs as a worker thread');

/**
 * This thread at the lowest priority (nice 19): the proxy's thread wakes it with every exchange it posts, and a
 * thread woken at the same priority takes the core from its waker when the other cores are busy. Measured
 * (bench/proxy-overhead.ts, 64 streams, two rounds, twice each): 15 and 23 of 600 posts held the proxy's loop
 * 0.6–1.4 ms, and every stream's next token with it; at nice 19, none over 0.3 ms. Under load, recording may
 * lag (a client's response ends once its exchange is stored); forwarding does not. The store's checkpointer
 * thread, started from this one, inherits the priority.
 */
function lowerThisThreadsPriority(): void {
  try {
    // Linux: the thread's own id, which setpriority(2) takes for one thread.
    setPriority(Number(readlinkSync('/proc/thread-self').split('/').pop()), 19);
  } catch {
    // Not Linux, or not allowed: the thread keeps the process's priority.
  }
}
lowerThisThreadsPriority();
const port = parentPort;
const init = workerData as RecordWorkerInit;
const store = CaptureStore.open(init.captures, { backgroundCheckpoints: true });

/**
 * The run's tokenizer, read back from the capture file: engines that send no token ids need it, and every
 * engine's stop token is its EOS id. Built at start (0.8 s, off the proxy's loop) and kept: the proxy's thread
 * never holds one (see capture.ts).
 */
function runTokenizer(): ModelTokenizer {
  const run = store.getRun(init.runId);
  if (!run) throw new Error(`run ${init.runId} is not in ${init.captures}`);
  return new ModelTokenizer(run.tokenizerName ?? 'captured', store.tokenizerFiles(run), { fromCapture: init.tokenizerFromCapture === true });
}
let local = runTokenizer();
const tokenizer: RecorderTokenizer = {
  get eosTokenIds() {
    return local.eosTokenIds;
  },
  renderChatGuarded: (req) => local.renderChatGuarded(req),
  encode: (text, addSpecialTokens) => local.encode(text, addSpecialTokens),
};
const recorder = new Recorder(
  store,
  init.runId,
  tokenizer,
  { url: new URL(init.upstream), tls: init.upstreamTls ?? {} },
  new Set(init.redacted),
  init.redactBodies === true,
);

const bytes = (a: Uint8Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength);

function fromWire(w: WireExchange): RawExchange {
  const { hasRequest, requestBody, responseBody, eventEnds, eventTimes, ...rest } = w;
  const body = bytes(requestBody);
  let request: Record<string, unknown> | null = null;
  // The proxy parsed the same bytes into an object: they parse again.
  if (hasRequest) request = JSON.parse(body.toString('utf8')) as Record<string, unknown>;
  return { ...rest, request, requestBody: body, responseBody: bytes(responseBody), eventEnds: Array.from(eventEnds), eventTimes: Array.from(eventTimes) };
}

let inFlight = 0;
let closeRequested = false;
function shutDown(): void {
  store.close();
  port.close();
}

const post = (msg: FromWorker) => port.postMessage(msg);
const reply = (id: number, work: () => Promise<unknown>) => {
  inFlight++;
  Promise.resolve()
    .then(work)
    .then(
      (value) => post({ type: 'reply', id, ok: true, value }),
      (err: unknown) => post({ type: 'reply', id, ok: false, error: err instanceof Error ? err.message : String(err) }),
    )
    .finally(() => {
      inFlight--;
      if (closeRequested && inFlight === 0) shutDown();
    });
};

port.on('message', (msg: ToWorker) => {
  if (msg.type === 'exchange') reply(msg.id, () => recorder.sink(fromWire(msg.exchange)));
  else if (msg.type === 'counts') reply(msg.id, async () => store.counts());
  else if (msg.type === 'updateRun') reply(msg.id, async () => store.updateRun(init.runId, msg.update));
  else if (msg.type === 'setTokenizer') {
    reply(msg.id, async () => {
      const files = new Map(msg.files.map(([file, data]) => [file, bytes(data)]));
      // Built before it is stored: files that do not make a tokenizer leave the run's own in place.
      const next = new ModelTokenizer(msg.name, files);
      store.setRunTokenizer(init.runId, msg.name, files);
      local = next;
    });
  } else {
    closeRequested = true;
    if (inFlight === 0) shutDown();
  }
});
post({ type: 'ready' });
