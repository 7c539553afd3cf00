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
  /** The keys `/mocker/config` knows (the settings table's, by flag name), with the field each sets. */
  keys: ControlKeys;
}

export interface ControlKeys {
  faults: Readonly<Record<string, keyof FaultSettings>>;
  latency: Readonly<Record<string, keyof LatencyKnobs>>;
}

function view(s: RuntimeSettings) {
  const f = s.faults.settings;
  const l = s.latency;
  return {
    ...Object.fromEntries(Object.entries(s.keys.faults).map(([key, field]) => [key, f[field]])),
    random_seed: s.faults.seed,
    timing: s.timing,
    ...Object.fromEntries(Object.entries(s.keys.latency).map(([key, field]) => [key, l?.[field] ?? null])),
  };
}

/**
 * `GET /mocker/config` shows the failure and latency settings; `POST /mocker/config` with any of their keys
 * changes them from the next request (latency: the next engine pass). A body with one bad value changes nothing.
 */
export function mockerConfigRoutes(settings: RuntimeSettings): Hono {
  const app = new Hono();
  app.get('/', (c) => c.json(view(settings)));
  const { faults: FAULT_KEYS, latency: LATENCY_KEYS } = settings.keys;
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
      } else if (Object.hasOwn(FAULT_KEYS, key)) Object.assign(faults, { [FAULT_KEYS[key]]: value });
      else if (Object.hasOwn(LATENCY_KEYS, key)) {
        if (!settings.latency) throw badRequest(`${key} applies to --timing latency; this server's timing is ${settings.timing}.`, key);
        Object.assign(latency, { [LATENCY_KEYS[key]]: value });
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
