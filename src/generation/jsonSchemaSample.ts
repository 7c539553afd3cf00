/**
 * A small seeded sampler of values valid against a tool's JSON-schema `parameters`: the keywords tool
 * definitions use (type, properties, required, additionalProperties, enum, const, items, min/max bounds and
 * lengths, anyOf/oneOf). json-schema-faker covers all of JSON Schema but is a large dependency with faker data;
 * `pattern`, `format`, `$ref` and `allOf` are not honoured here (a string is a plain lowercase word).
 */
type Schema = Record<string, unknown>;
type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** Nesting past this depth yields null (a recursive schema cannot loop forever). */
const MAX_DEPTH = 8;

const LETTERS = 'abcdefghijklmnopqrstuvwxyz';

const isSchema = (v: unknown): v is Schema => typeof v === 'object' && v !== null && !Array.isArray(v);
const num = (v: unknown): number | undefined => (typeof v === 'number' && Number.isFinite(v) ? v : undefined);

/** A value valid against `schema`, drawn with `rand` (uniform in [0, 1)). */
export function sampleJsonSchema(schema: unknown, rand: () => number, depth = 0): Json {
  if (!isSchema(schema) || depth > MAX_DEPTH) return null;
  const pick = <T>(items: readonly T[]): T => items[Math.floor(rand() * items.length)];
  if ('const' in schema) return schema.const as Json;
  if (Array.isArray(schema.enum) && schema.enum.length > 0) return pick(schema.enum) as Json;
  const branches = Array.isArray(schema.anyOf) ? schema.anyOf : Array.isArray(schema.oneOf) ? schema.oneOf : null;
  if (branches && branches.length > 0) return sampleJsonSchema(pick(branches), rand, depth + 1);
  const types: unknown[] = Array.isArray(schema.type) ? schema.type : [schema.type];
  const concrete = types.filter((t): t is string => typeof t === 'string' && t !== 'null');
  const type = concrete.length > 0 ? pick(concrete) : types.includes('null') ? 'null' : isSchema(schema.properties) ? 'object' : 'string';
  switch (type) {
    case 'object': {
      const properties = isSchema(schema.properties) ? schema.properties : {};
      const required = new Set(Array.isArray(schema.required) ? schema.required : []);
      const out: { [key: string]: Json } = {};
      for (const [key, sub] of Object.entries(properties)) if (required.has(key) || rand() < 0.5) out[key] = sampleJsonSchema(sub, rand, depth + 1);
      return out;
    }
    case 'array': {
      const min = num(schema.minItems) ?? 0;
      const max = Math.max(min, num(schema.maxItems) ?? min + 3);
      const length = min + Math.floor(rand() * (max - min + 1));
      return Array.from({ length }, () => sampleJsonSchema(schema.items, rand, depth + 1));
    }
    case 'integer':
    case 'number': {
      const low = Math.max(num(schema.minimum) ?? -Infinity, num(schema.exclusiveMinimum) ?? -Infinity);
      const high = Math.min(num(schema.maximum) ?? Infinity, num(schema.exclusiveMaximum) ?? Infinity);
      const from = Number.isFinite(low) ? low : Number.isFinite(high) ? high - 100 : 0;
      const to = Number.isFinite(high) ? high : from + 100;
      if (type === 'integer') {
        // Exclusive bounds move inwards to the next integer.
        const first = low === num(schema.exclusiveMinimum) ? Math.floor(from) + 1 : Math.ceil(from);
        const last = high === num(schema.exclusiveMaximum) ? Math.ceil(to) - 1 : Math.floor(to);
        return first + Math.floor(rand() * (Math.max(first, last) - first + 1));
      }
      const value = Math.round((from + rand() * (to - from)) * 100) / 100;
      const inside = value >= from && value <= to && value !== schema.exclusiveMinimum && value !== schema.exclusiveMaximum;
      return inside ? value : (from + to) / 2;
    }
    case 'boolean':
      return rand() < 0.5;
    case 'null':
      return null;
    default: {
      const min = num(schema.minLength) ?? 1;
      const max = Math.max(min, num(schema.maxLength) ?? Math.max(min, 8));
      const length = min + Math.floor(rand() * (Math.min(max, min + 8) - min + 1));
      return Array.from({ length }, () => pick([...LETTERS])).join('');
    }
  }
}
