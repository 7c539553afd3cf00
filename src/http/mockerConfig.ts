import { Hono } from 'hono';
import { badLatencyKnob, type LatencyKnobs } from '../engine/index.js';
import { ApiError, badRequest } from '../wire/errors.js';
import { badFaultSetting, parseFaultTypes, type FaultInjector, type FaultSettings } from './faults.js';

/** What `/mocker/config` reads and changes: the failure settings, and the latency knobs under `--timing latency` (else null). */
export interface RuntimeSettings {
  faults: FaultInjector;
  latency: LatencyKnobs | null;
  /** The server's timing mode, named when a latency knob is set without latency timing. */
  timing: string;
}

const FAULT_KEYS = { error_rate: 'errorRate', error_types: 'errorTypes', fail_first: 'failFirst', midstream_after_tokens: 'midstreamAfterTokens' } as const;
const LATENCY_KEYS = { ttft: 'ttftMs', itl: 'itlMs', ttft_std: 'ttftStdMs', itl_std: 'itlStdMs' } as const;

function view(s: RuntimeSettings) {
  const f = s.faults.settings;
  const l = s.latency;
  return {
    error_rate: f.errorRate,
    error_types: f.errorTypes,
    fail_first: f.failFirst,
    midstream_after_tokens: f.midstreamAfterTokens,
    random_seed: s.faults.seed,
    timing: s.timing,
    ttft: l?.ttftMs ?? null,
    itl: l?.itlMs ?? null,
    ttft_std: l?.ttftStdMs ?? null,
    itl_std: l?.itlStdMs ?? null,
  };
}

/**
 * `GET /mocker/config` shows the failure and latency settings; `POST /mocker/config` with any of their keys
 * changes them from the next request (latency: the next engine pass). A body with one bad value changes nothing.
 */
export function mockerConfigRoutes(settings: RuntimeSettings): Hono {
  const app = new Hono();
  app.get('/', (c) => c.json(view(settings)));
  app.post('/', async (c) => {
    let body: unknown;
    try {
      body = JSON.parse(await c.req.text());
    } catch (err) {
      throw new ApiError(400, `Invalid JSON body: ${(err as Error).message}`, 'Bad Request');
    }
    if (body === null || typeof body !== 'object' || Array.isArray(body)) throw badRequest('The body must be a JSON object of settings to change.');
    const faults: Partial<FaultSettings> = {};
    const latency: Partial<LatencyKnobs> = {};
    // Own keys of the tables only: `__proto__`, `constructor`, `prototype` are unknown settings (a 400), never Object.prototype's.
    for (const [key, value] of Object.entries(body)) {
      if (key === 'error_types') {
        if (!Array.isArray(value) && typeof value !== 'string') throw badRequest('error_types must be a list of error types.', key);
        try {
          faults.errorTypes = parseFaultTypes(value, 'error_types');
        } catch (err) {
          throw badRequest(`${(err as Error).message}.`, key);
        }
      } else if (Object.hasOwn(FAULT_KEYS, key)) Object.assign(faults, { [FAULT_KEYS[key as keyof typeof FAULT_KEYS]]: value });
      else if (Object.hasOwn(LATENCY_KEYS, key)) {
        if (!settings.latency) throw badRequest(`${key} applies to --timing latency; this server's timing is ${settings.timing}.`, key);
        Object.assign(latency, { [LATENCY_KEYS[key as keyof typeof LATENCY_KEYS]]: value });
      } else throw badRequest(`Unknown setting ${JSON.stringify(key)} (known: ${[...Object.keys(FAULT_KEYS), ...Object.keys(LATENCY_KEYS)].join(', ')}).`, key);
    }
    const badFault = badFaultSetting(faults);
    if (badFault) throw badRequest(`${badFault[1]}.`, badFault[0]);
    if (settings.latency) {
      const bad = badLatencyKnob({ ...settings.latency, ...latency });
      if (bad) {
        const key = Object.entries(LATENCY_KEYS).find(([, field]) => field === bad[0])![0];
        throw badRequest(`${key} must be a non-negative number of ms, got ${JSON.stringify(bad[1])}.`, key);
      }
      Object.assign(settings.latency, latency);
    }
    Object.assign(settings.faults.settings, faults);
    return c.json(view(settings));
  });
  return app;
}
