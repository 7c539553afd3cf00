/**
 * A tiny continuous-batching engine for the vLLM double (`startUpstream(…, { engine })`): every request in
 * flight shares its steps, and each step's duration comes from known functions, so a test can tell whether
 * timings learnt from a capture recover them. A step admits every waiting request, prefills their prompts and
 * then decodes one token for every running request (the new ones included: their first token comes out at the
 * end of the step that prefilled them), as vLLM's scheduler does with an unlimited token budget.
 */
import { fileURLToPath } from 'node:url';
import { prng } from './prng.js';
import { startUpstream } from './vllmUpstream.js';

export interface StepCosts {
  /** ms to prefill the prompts of the requests admitted in one step (their lengths, all new tokens). */
  prefillMs(prompts: number[]): number;
  /** ms of one decode step of `batch` sequences holding `activeKvTokens` (prompts and outputs so far). */
  decodeMs(activeKvTokens: number, batch: number): number;
}

/** One request's place in the engine, as the double's stream loop uses it. */
export interface PacedSequence {
  /** Settles when the engine has produced this sequence's next token. */
  nextToken(): Promise<void>;
  /** The client went away: the sequence leaves the engine. */
  leave(): void;
}

export interface PacingEngine {
  admit(promptTokens: number, outputTokens: number): PacedSequence;
}

interface Sequence {
  promptTokens: number;
  outputTokens: number;
  generated: number;
  /** Tokens produced and not yet taken by `nextToken`. */
  ready: number;
  waiter: (() => void) | null;
}

/** A standard normal draw (Box–Muller). */
function gaussian(random: () => number): number {
  return Math.sqrt(-2 * Math.log(1 - random())) * Math.cos(2 * Math.PI * random());
}

/** A step's duration without noise: the admitted prompts' prefill, then one decode step of every running sequence (the admitted included). */
function idealStepMs(costs: StepCosts, admitted: Pick<Sequence, 'promptTokens'>[], running: Pick<Sequence, 'promptTokens' | 'generated'>[]): number {
  const activeKv = running.reduce((sum, s) => sum + s.promptTokens + s.generated, 0);
  return (admitted.length > 0 ? costs.prefillMs(admitted.map((s) => s.promptTokens)) : 0) + costs.decodeMs(activeKv, running.length);
}

const PAUSE = new Int32Array(new SharedArrayBuffer(4));

/** A timer for the bulk, then short blocking pauses between event-loop turns: steps end within ~0.2 ms of their time. */
async function sleepUntil(deadlineMs: number): Promise<void> {
  const remaining = deadlineMs - performance.now();
  if (remaining > 2) await new Promise((resolve) => setTimeout(resolve, remaining - 2));
  while (performance.now() < deadlineMs) {
    Atomics.wait(PAUSE, 0, 0, Math.min(0.2, deadlineMs - performance.now()));
    await new Promise((resolve) => setImmediate(resolve));
  }
}

export class BatchingEngine implements PacingEngine {
  private readonly waiting: Sequence[] = [];
  private readonly running: Sequence[] = [];
  private stepping = false;
  private lastStepEndMs = 0;
  private readonly random: () => number;
  private readonly relativeNoise: number;

  /** `relativeNoise`: each step's duration is multiplied by 1 + N(0, relativeNoise²), seeded. */
  constructor(
    private readonly costs: StepCosts,
    { seed, relativeNoise }: { seed: number; relativeNoise: number },
  ) {
    this.random = prng(seed).next;
    this.relativeNoise = relativeNoise;
  }

  admit(promptTokens: number, outputTokens: number): PacedSequence {
    const sequence: Sequence = { promptTokens, outputTokens, generated: 0, ready: 0, waiter: null };
    this.waiting.push(sequence);
    if (!this.stepping) void this.run();
    return {
      nextToken: () =>
        new Promise<void>((resolve) => {
          if (sequence.ready > 0) {
            sequence.ready--;
            resolve();
          } else sequence.waiter = resolve;
        }),
      leave: () => {
        for (const queue of [this.waiting, this.running]) {
          const at = queue.indexOf(sequence);
          if (at >= 0) queue.splice(at, 1);
        }
      },
    };
  }

  private gaussian(): number {
    return gaussian(this.random);
  }

  private async run(): Promise<void> {
    this.stepping = true;
    while (this.waiting.length > 0 || this.running.length > 0) {
      // Busy steps follow each other without drift: a timer that fires late delays the tokens, not the engine.
      const startMs = this.running.length > 0 ? this.lastStepEndMs : performance.now();
      const admitted = this.waiting.splice(0);
      this.running.push(...admitted);
      const ms = Math.max(0.1, idealStepMs(this.costs, admitted, this.running) * (1 + this.relativeNoise * this.gaussian()));
      this.lastStepEndMs = startMs + ms;
      await sleepUntil(this.lastStepEndMs);
      for (const sequence of [...this.running]) {
        sequence.generated++;
        if (sequence.waiter) {
          const wake = sequence.waiter;
          sequence.waiter = null;
          wake();
        } else sequence.ready++;
        if (sequence.generated >= sequence.outputTokens) this.running.splice(this.running.indexOf(sequence), 1);
      }
    }
    this.stepping = false;
  }
}

/**
 * The same engine on a virtual clock, for a test's oracle: each request's token times (ms since it was sent) when
 * `requests` arrive at their send times; with `noise`, each step drawn as the real double draws it.
 */
export function simulateBatchingEngine(
  costs: StepCosts,
  requests: { sentMs: number; promptTokens: number; outputTokens: number }[],
  noise: { seed: number; relativeNoise: number } | null,
): number[][] {
  const random = noise ? prng(noise.seed).next : () => 0.5;
  const order = requests.map((_, i) => i).sort((a, b) => requests[a].sentMs - requests[b].sentMs);
  const times: number[][] = requests.map(() => []);
  const sequences = requests.map((r) => ({ promptTokens: r.promptTokens, generated: 0 }));
  let running: number[] = [];
  let next = 0;
  let now = -Infinity;
  while (next < order.length || running.length > 0) {
    if (running.length === 0) now = Math.max(now, requests[order[next]].sentMs);
    const admitted: number[] = [];
    while (next < order.length && requests[order[next]].sentMs <= now) admitted.push(order[next++]);
    running = [...running, ...admitted];
    const ideal = idealStepMs(
      costs,
      admitted.map((i) => sequences[i]),
      running.map((i) => sequences[i]),
    );
    now += noise ? Math.max(0.1, ideal * (1 + noise.relativeNoise * gaussian(random))) : ideal;
    for (const i of running) {
      sequences[i].generated++;
      times[i].push(now - requests[i].sentMs);
    }
    running = running.filter((i) => sequences[i].generated < requests[i].outputTokens);
  }
  return times;
}

/** The engine the `captures fit` test learns: the oracle its fitted profile is held to (ms). */
export const KNOWN_COSTS: StepCosts = {
  prefillMs: (prompts) => {
    const tokens = prompts.reduce((a, b) => a + b, 0);
    return 12 + 0.03 * tokens + 1.2e-5 * tokens * tokens;
  },
  decodeMs: (activeKvTokens, batch) => 6 + 0.5 * batch + 0.002 * activeKvTokens,
};

/**
 * An engine whose prefill has a context term, as attention makes it (Vidur's form): each admitted prompt's new
 * tokens attend over its own context, so a step's prefill is 25 + 0.05 × new tokens + 5·10⁻⁵ × Σ new × context ms.
 * Steps of 15–40 ms: the timer overshoot of a busy machine (a few tenths of a ms) stays small beside its noise.
 */
export const CONTEXT_COSTS: StepCosts = {
  prefillMs: (prompts) => 25 + prompts.reduce((sum, tokens) => sum + 0.05 * tokens + 5e-5 * tokens * tokens, 0),
  decodeMs: (activeKvTokens, batch) => 12 + 1 * batch + 0.004 * activeKvTokens,
};

/** The step noise of the double run as a process: each step × 1 + N(0, σ²), σ 5 % with KNOWN_COSTS, 10 % with CONTEXT_COSTS. */
export const DOUBLE_RELATIVE_NOISE = { known: 0.05, context: 0.1 };

/**
 * Run as its own process (`node --import tsx test/support/batchingEngine.ts SEED [context]`): the vLLM double on a
 * BatchingEngine of KNOWN_COSTS (CONTEXT_COSTS with `context`) with DOUBLE_RELATIVE_NOISE, answering every
 * completion with `max_tokens` tokens; prints "on URL" and serves until SIGTERM. Apart from the test runner, its
 * steps keep time.
 */
if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const context = process.argv[3] === 'context';
  const engine = new BatchingEngine(context ? CONTEXT_COSTS : KNOWN_COSTS, {
    seed: Number(process.argv[2]),
    relativeNoise: DOUBLE_RELATIVE_NOISE[context ? 'context' : 'known'],
  });
  const upstream = await startUpstream(() => ({ content: ' a'.repeat(64), finish: 'length' }), { engine });
  process.stdout.write(`on ${upstream.url}\n`);
  process.once('SIGTERM', () => void upstream.close().then(() => process.exit(0)));
}
