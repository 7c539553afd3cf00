/**
 * An agent-like Mooncake trace (sessions with `session_id` and `delay`): every turn's prompt is its session's
 * previous prompt plus new blocks — a growing shared history, where KV-aware routing pays. Sessions start about
 * `gapMs` apart and each later turn comes about `delayMs` after the previous answer (each drawn from half to
 * one and a half times that, seeded): irregular, as agents' tool calls are, so that round robin does not land a
 * session's turns on one worker by the accident of a regular schedule.
 */
import { writeFileSync } from 'node:fs';
import { prng } from './prng.js';

export interface AgentTraceShape {
  sessions: number;
  turns: number;
  /** New blocks (hash ids) each turn appends. */
  blocksPerTurn: number;
  /** Tokens per hash id: the trace block size given to `mocker trace --trace-block-size`. */
  blockTokens: number;
  outputTokens: number;
  gapMs: number;
  delayMs: number;
  seed: number;
  /**
   * Dynamo's agentic_mooncake instead of Mooncake sessions: each turn a request (`request_id`) that waits for the
   * previous one of its session (`wait_for`) and then its delay; the first at its timestamp.
   */
  agentic?: boolean;
}

export function writeAgentTrace(path: string, shape: AgentTraceShape): void {
  const random = prng(shape.seed);
  const around = (ms: number) => Math.round(ms * (0.5 + random.next()));
  const rows: string[] = [];
  let startMs = 0;
  for (let s = 0; s < shape.sessions; s++) {
    const history: number[] = [];
    startMs += around(shape.gapMs);
    for (let t = 0; t < shape.turns; t++) {
      // Session s owns hash ids s·1,000,000 onwards.
      for (let b = 0; b < shape.blocksPerTurn; b++) history.push(s * 1_000_000 + history.length);
      const after = t === 0 ? { timestamp: startMs } : { delay: around(shape.delayMs) };
      const dag = shape.agentic ? { request_id: `s${s}-t${t}`, ...(t > 0 ? { wait_for: [`s${s}-t${t - 1}`] } : {}) } : {};
      rows.push(
        JSON.stringify({
          ...dag,
          session_id: `s${s}`,
          ...after,
          input_length: history.length * shape.blockTokens,
          output_length: shape.outputTokens,
          hash_ids: history,
        }),
      );
    }
  }
  writeFileSync(path, `${rows.join('\n')}\n`);
}
