/**
 * Goodput as AIPerf defines it (`aiperf profile --goodput`): the completed requests per second of the run that
 * meet every target of a service level objective, each target an inclusive bound on one of the request's own
 * latencies — time to first token, its mean inter-token latency ((last token − first token) ÷ (output tokens −
 * 1), its TPOT, as AISimulate compares `itl_ms`) and its end-to-end latency. The fields are named as Dynamo's
 * replay report names them (`goodput_completed_requests`, `goodput_request_throughput_rps`,
 * `goodput_output_throughput_tok_s`), plus the fraction of the completed requests that are good.
 */
import type { PerRequestRecord } from './collector.js';

/** Upper bounds in ms; a target left out is not checked. */
export interface Slo {
  ttft?: number;
  itl?: number;
  e2e?: number;
}

const SLO_KEYS = ['ttft', 'itl', 'e2e'] as const;

/** `--slo ttft=200,itl=20[,e2e=5000]` (ms; AISimulate's `ttft_ms`, `itl_ms`, `e2e_ms` too); errors name `flag`. */
export function parseSlo(text: string, flag: string): Slo {
  const slo: Slo = {};
  for (const part of text.split(',')) {
    const [given, value, extra] = part.split('=').map((s) => s.trim());
    const key = given.replace(/_ms$/, '');
    if (!(SLO_KEYS as readonly string[]).includes(key) || value === undefined || extra !== undefined)
      throw new Error(`${flag}: expected ${SLO_KEYS.map((k) => `${k}=<ms>`).join(',')} (any of them), got "${part}"`);
    const ms = Number(value);
    if (value === '' || !Number.isFinite(ms) || ms <= 0) throw new Error(`${flag}: ${key} must be a number of ms > 0, got "${value}"`);
    if (slo[key as keyof Slo] !== undefined) throw new Error(`${flag}: ${key} is given twice`);
    slo[key as keyof Slo] = ms;
  }
  return slo;
}

/** The SLO as the report shows it: `ttft ≤ 200 ms, itl ≤ 20 ms`. */
export const sloText = (slo: Slo): string =>
  SLO_KEYS.filter((k) => slo[k] !== undefined)
    .map((k) => `${k} <= ${slo[k]} ms`)
    .join(', ');

/** Whether a completed request meets every target. A request of one token has no inter-token latency to miss. */
function meets(r: PerRequestRecord, slo: Slo): boolean {
  const first = r.first_token_ms!;
  const last = r.last_token_ms!;
  if (slo.ttft !== undefined && first - r.arrival_time_ms > slo.ttft) return false;
  if (slo.itl !== undefined && r.output_length > 1 && (last - first) / (r.output_length - 1) > slo.itl) return false;
  return slo.e2e === undefined || last - r.arrival_time_ms <= slo.e2e;
}

/** The report's goodput fields over a run of `durationMs` (the report's duration, its drain tail included). */
export function goodputFields(records: readonly PerRequestRecord[], durationMs: number, slo: Slo): Record<string, number> {
  const completed = records.filter((r) => r.first_admit_ms !== null && r.output_length > 0);
  const good = completed.filter((r) => meets(r, slo));
  const durationS = Math.max(durationMs / 1000, 1e-9);
  return {
    goodput_completed_requests: good.length,
    goodput_request_throughput_rps: good.length / durationS,
    goodput_output_throughput_tok_s: good.reduce((n, r) => n + r.output_length, 0) / durationS,
    goodput_request_fraction: completed.length > 0 ? good.length / completed.length : 0,
  };
}
