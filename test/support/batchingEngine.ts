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
  /** ms to prefill `tokens` new prompt tokens (all the requests admitted in one step). */
  prefillMs(tokens: number): number;
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

  /** A standard normal draw (Box–Muller). */
  private gaussian(): number {
    return Math.sqrt(-2 * Math.log(1 - this.random())) * Math.cos(2 * Math.PI * this.random());
  }

  private async run(): Promise<void> {
    this.stepping = true;
    while (this.waiting.length > 0 || this.running.length > 0) {
      // Busy steps follow each other without drift: a timer that fires late delays the tokens, not the engine.
      const startMs = this.running.length > 0 ? this.lastStepEndMs : performance.now();
      const admitted = this.waiting.splice(0);
      this.running.push(...admitted);
      const newTokens = admitted.reduce((sum, s) => sum + s.promptTokens, 0);
      const activeKv = this.running.reduce((sum, s) => sum + s.promptTokens + s.generated, 0);
      const ideal = (newTokens > 0 ? this.costs.prefillMs(newTokens) : 0) + this.costs.decodeMs(activeKv, this.running.length);
      const ms = Math.max(0.1, ideal * (1 + this.relativeNoise * this.gaussian()));
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

/** The engine the `captures fit` test learns: the oracle its fitted profile is held to (ms). */
export const KNOWN_COSTS: StepCosts = {
  prefillMs: (tokens) => 12 + 0.03 * tokens + 1.2e-5 * tokens * tokens,
  decodeMs: (activeKvTokens, batch) => 6 + 0.5 * batch + 0.002 * activeKvTokens,
};

/**
 * Run as its own process (`node --import tsx test/support/batchingEngine.ts SEED`): the vLLM double on a
 * BatchingEngine of KNOWN_COSTS with 5 % step noise, answering every completion with `max_tokens` tokens;
 * prints "on URL" and serves until SIGTERM. Apart from the test runner, its steps keep time.
 */
if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const engine = new BatchingEngine(KNOWN_COSTS, { seed: Number(process.argv[2]), relativeNoise: 0.05 });
  const upstream = await startUpstream(() => ({ content: ' a'.repeat(64), finish: 'length' }), { engine });
  process.stdout.write(`on ${upstream.url}\n`);
  process.once('SIGTERM', () => void upstream.close().then(() => process.exit(0)));
}
