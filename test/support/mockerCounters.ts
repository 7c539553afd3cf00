import parsePrometheusTextFormat from 'parse-prometheus-text-format';
import { expect } from 'vitest';
import { MODEL } from './vllmUpstream.js';

/**
 * The `mocker_` capture and upstream counters on /metrics, by name and reason label (the model_name label is
 * checked, then left out), read with a Prometheus parser.
 */
export async function mockerCounters(port: number): Promise<Record<string, number>> {
  const families = parsePrometheusTextFormat(await (await fetch(`http://127.0.0.1:${port}/metrics`)).text());
  const out: Record<string, number> = {};
  for (const f of families.filter((f) => /^mocker_(capture|upstream)/.test(f.name))) {
    for (const m of f.metrics) {
      expect(m.labels?.model_name).toBe(MODEL);
      out[f.name + (m.labels?.reason ? `{${m.labels.reason}}` : '')] = Number(m.value);
    }
  }
  return out;
}
