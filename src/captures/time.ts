/** Points in time and ages as `mocker captures` flags spell them: `2026-11-01`, `2026-11-01T12:00Z`, `30m`, `7d`. */

const UNIT_MS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000, w: 604_800_000 };
const AGE = /^(\d+(?:\.\d+)?)(ms|s|m|h|d|w)$/;
const DATE = /^\d{4}-\d{2}-\d{2}([T ][0-9:.]+)?(Z|[+-]\d{2}:?\d{2})?$/;

/** A flag's value that is neither a date nor an age. */
export class TimeArgumentError extends Error {}

/** An age (`7d`) in ms, or null when `text` is not one. */
export function parseAge(text: string): number | null {
  const m = AGE.exec(text.trim());
  return m ? Number(m[1]) * UNIT_MS[m[2]] : null;
}

/** Epoch ms of a date (`2026-11-01`, ISO 8601 with a time) or of an age before `now` (`7d`: seven days ago). */
export function parseTimePoint(flag: string, text: string, now = Date.now()): number {
  const age = parseAge(text);
  if (age !== null) return now - age;
  const at = DATE.test(text.trim()) ? Date.parse(text.trim()) : NaN;
  if (!Number.isFinite(at)) throw new TimeArgumentError(`${flag}: "${text}" is neither a date (2026-11-01, 2026-11-01T12:00Z) nor an age (30m, 12h, 7d)`);
  return at;
}
