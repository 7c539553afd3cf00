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

const LETTERS = [...'abcdefghijklmnopqrstuvwxyz'];

/**
 * The sample would be longer than the characters it may take (`{"minLength": 1e9}`, or `minItems` nested seven
 * deep: 10^7 values): it is stopped before it is built, so its cost is bounded by the budget, not by the schema.
 */
export class SampleTooLarge extends Error {
  constructor(readonly maxChars: number) {
    super(`a value of this schema takes more than ${maxChars} characters`);
  }
}

const isSchema = (v: unknown): v is Schema => typeof v === 'object' && v !== null && !Array.isArray(v);
const num = (v: unknown): number | undefined => (typeof v === 'number' && Number.isFinite(v) ? v : undefined);

/**
 * A value valid against `schema`, drawn with `rand` (uniform in [0, 1)), whose JSON text takes at most `maxChars`
 * characters; throws `SampleTooLarge` as soon as it would take more. Every value is charged its length as JSON
 * (separators included) before it is made, so the work done is bounded by `maxChars` too: no value costs nothing.
 */
export function sampleJsonSchema(schema: unknown, rand: () => number, maxChars: number): Json {
  let left = maxChars;
  const charge = (chars: number) => {
    left -= chars;
    if (left < 0) throw new SampleTooLarge(maxChars);
  };
  const pick = <T>(items: readonly T[]): T => items[Math.floor(rand() * items.length)];
  /** A const or enum value comes from the request as it is: charged its JSON length (a value too deep to write is too large). */
  const given = (value: unknown): Json => {
    let text: string | undefined;
    try {
      text = JSON.stringify(value);
    } catch {
      throw new SampleTooLarge(maxChars);
    }
    charge(text?.length ?? 4);
    return value as Json;
  };

  const sample = (schema: unknown, depth: number): Json => {
    if (!isSchema(schema) || depth > MAX_DEPTH) return given(null);
    if ('const' in schema) return given(schema.const);
    if (Array.isArray(schema.enum) && schema.enum.length > 0) return given(pick(schema.enum));
    const branches = Array.isArray(schema.anyOf) ? schema.anyOf : Array.isArray(schema.oneOf) ? schema.oneOf : null;
    if (branches && branches.length > 0) return sample(pick(branches), depth + 1);
    const types: unknown[] = Array.isArray(schema.type) ? schema.type : [schema.type];
    const concrete = types.filter((t): t is string => typeof t === 'string' && t !== 'null');
    const type = concrete.length > 0 ? pick(concrete) : types.includes('null') ? 'null' : isSchema(schema.properties) ? 'object' : 'string';
    switch (type) {
      case 'object': {
        const properties = isSchema(schema.properties) ? schema.properties : {};
        const required = new Set(Array.isArray(schema.required) ? schema.required : []);
        charge(2);
        const out: { [key: string]: Json } = {};
        for (const [key, sub] of Object.entries(properties)) {
          if (!required.has(key) && !(rand() < 0.5)) continue;
          // `"key": ` and the `, ` before the next member.
          charge(JSON.stringify(key).length + 4);
          out[key] = sample(sub, depth + 1);
        }
        return out;
      }
      case 'array': {
        const min = num(schema.minItems) ?? 0;
        const max = Math.max(min, num(schema.maxItems) ?? min + 3);
        const length = min + Math.floor(rand() * (max - min + 1));
        charge(2);
        const out: Json[] = [];
        for (let i = 0; i < length; i++) {
          charge(2);
          out.push(sample(schema.items, depth + 1));
        }
        return out;
      }
      case 'integer':
      case 'number': {
        const low = Math.max(num(schema.minimum) ?? -Infinity, num(schema.exclusiveMinimum) ?? -Infinity);
        const high = Math.min(num(schema.maximum) ?? Infinity, num(schema.exclusiveMaximum) ?? Infinity);
        const from = Number.isFinite(low) ? low : Number.isFinite(high) ? high - 100 : 0;
        const to = Number.isFinite(high) ? high : from + 100;
        let value: number;
        if (type === 'integer') {
          // Exclusive bounds move inwards to the next integer.
          const first = low === num(schema.exclusiveMinimum) ? Math.floor(from) + 1 : Math.ceil(from);
          const last = high === num(schema.exclusiveMaximum) ? Math.ceil(to) - 1 : Math.floor(to);
          value = first + Math.floor(rand() * (Math.max(first, last) - first + 1));
        } else {
          const drawn = Math.round((from + rand() * (to - from)) * 100) / 100;
          const inside = drawn >= from && drawn <= to && drawn !== schema.exclusiveMinimum && drawn !== schema.exclusiveMaximum;
          value = inside ? drawn : (from + to) / 2;
        }
        return given(value);
      }
      case 'boolean':
        return given(rand() < 0.5);
      case 'null':
        return given(null);
      default: {
        const min = num(schema.minLength) ?? 1;
        const max = Math.max(min, num(schema.maxLength) ?? Math.max(min, 8));
        const length = min + Math.floor(rand() * (Math.min(max, min + 8) - min + 1));
        charge(Math.max(0, length) + 2);
        let word = '';
        for (let i = 0; i < length; i++) word += pick(LETTERS);
        return word;
      }
    }
  };
  return sample(schema, 0);
}
