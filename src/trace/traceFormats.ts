/**
 * The trace file formats of `mocker trace --trace-format`, with Dynamo's names, its other spellings, and the replay
 * modes it refuses each in (ai-dynamo/dynamo docs/dynosim/trace-formats.md).
 */
import { agenticMooncakeWorkload, appliedComputeWorkload } from './agentic.js';
import { parseMooncake } from './mooncake.js';
import { mooncakeDeltaWorkload, mooncakeFileWorkload, type Workload } from './workload.js';

export const TRACE_FORMATS = ['mooncake', 'mooncake-delta', 'agentic_mooncake', 'applied_compute_agentic'] as const;
export type TraceFormat = (typeof TRACE_FORMATS)[number];

/** What `mocker trace convert --to` writes. */
export const TRACE_OUTPUT_FORMATS = ['mooncake', 'agentic_mooncake'] as const;
export type TraceOutputFormat = (typeof TRACE_OUTPUT_FORMATS)[number];

/** Dynamo's Python binding accepts these too. */
const OTHER_SPELLINGS: Record<string, TraceFormat> = { mooncake_delta: 'mooncake-delta', 'agentic-mooncake': 'agentic_mooncake' };

/** A format's name as given (either spelling); errors name the flag. */
export function parseTraceFormat(text: string, flag: string): TraceFormat {
  const format = (TRACE_FORMATS as readonly string[]).includes(text) ? (text as TraceFormat) : OTHER_SPELLINGS[text];
  if (format === undefined) throw new Error(`${flag} must be one of ${TRACE_FORMATS.join(', ')}, got "${text}"`);
  return format;
}

/** A trace file's workload in its format. */
export function traceFileWorkload(text: string, format: TraceFormat, traceBlockSize: number): Workload {
  switch (format) {
    case 'mooncake':
      return mooncakeFileWorkload(text, traceBlockSize);
    case 'mooncake-delta':
      return mooncakeDeltaWorkload(parseMooncake(text, traceBlockSize), traceBlockSize);
    case 'agentic_mooncake':
      return agenticMooncakeWorkload(text, traceBlockSize);
    case 'applied_compute_agentic':
      return appliedComputeWorkload(text, traceBlockSize);
  }
}

/**
 * Dynamo's refusals, with its reasons: a delta trace needs the outputs it appends (offline, one engine generating
 * them); a request DAG runs on its own schedule, offline and aggregated; Applied Compute rows have no arrival times.
 */
export function checkTraceFormatMode(format: TraceFormat, mode: { online: boolean; disaggregated: boolean; concurrency: boolean }): void {
  const refuse = (why: string) => {
    throw new Error(`${format} trace format is not supported ${why}`);
  };
  if (format === 'mooncake-delta' || format === 'agentic_mooncake') {
    if (mode.online) refuse('for online replay');
    if (mode.disaggregated) refuse('for disaggregated replay');
  }
  if (format === 'agentic_mooncake' && mode.concurrency) refuse('with --replay-concurrency');
  if (format === 'applied_compute_agentic' && !mode.concurrency)
    throw new Error('applied_compute_agentic trace format requires --replay-concurrency because source traces do not contain first-turn timestamps');
}
