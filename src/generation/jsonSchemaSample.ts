/**
 * A small seeded sampler of JSON text valid against a JSON schema: the keywords tool definitions and vLLM's
 * structured-output backends (xgrammar, guidance) take: type, properties, required, additionalProperties,
 * min/maxProperties, enum, const, items, prefixItems, min/maxItems, uniqueItems, numeric bounds, multipleOf, string
 * lengths, `pattern` (randexp), common `format`s, `$ref` into the schema itself (`$defs`, `definitions`), `allOf`,
 * `anyOf` / `oneOf`. json-schema-faker covers more but is a large dependency with faker data. The text is written
 * as Python's json.dumps writes it (", " and ": "), what models and vLLM's parsers emit.
 */
import { pythonJsonDumps } from '../wire/errors.js';
import { RegexUnsupported, sampleRegex } from './regexSample.js';

type Schema = Record<string, unknown>;

/** Nesting past this depth draws the least it may (no optional property, fewest items): a recursive schema ends. */
const MAX_DEPTH = 8;
/** And past this one, the sample is given up as too large (a schema whose every value recurses forever). */
const GIVE_UP_DEPTH = 32;
/** `$ref`s followed in a row without reaching a schema (`{"$ref":"#/$defs/a"}` pointing at itself). */
const MAX_REF_CHAIN = 16;
/** Steps of work that write nothing a character of the budget may pay for (see `spend`). */
const WORK_PER_CHAR = 4;

const LETTERS = [...'abcdefghijklmnopqrstuvwxyz'];

/**
 * The sample would be longer than the characters it may take (`{"minLength": 1e9}`, or `minItems` nested seven
 * deep: 10^7 values): it is stopped before it is built, so its cost is bounded by the budget, not by the schema.
 * `prefix`: the text written until then, at most `maxChars` long (a prefix of a valid value, as a model cut by
 * max_tokens leaves it).
 */
export class SampleTooLarge extends Error {
  constructor(
    maxChars: number,
    readonly prefix: string,
  ) {
    super(`a value of this schema takes more than ${maxChars} characters`);
  }
}

/** A schema keyword (or value of one) no value is drawn for: the request is refused naming it. */
export class UnsupportedSchema extends Error {
  constructor(
    readonly keyword: string,
    message: string,
  ) {
    super(message);
  }
}

/** Keywords that constrain values in ways this sampler does not honour. */
const UNSUPPORTED_KEYWORDS = [
  'not',
  'if',
  'then',
  'else',
  'contains',
  'minContains',
  'maxContains',
  'patternProperties',
  'propertyNames',
  'dependentSchemas',
  'dependentRequired',
  'dependencies',
  'unevaluatedProperties',
  'unevaluatedItems',
  '$dynamicRef',
  '$recursiveRef',
];
/** `format`s values are drawn for (those xgrammar and guidance generate; others are refused). */
const FORMATS = ['date-time', 'date', 'time', 'duration', 'email', 'uuid', 'uri', 'uri-reference', 'hostname', 'ipv4', 'ipv6'];

const isSchema = (v: unknown): v is Schema => typeof v === 'object' && v !== null && !Array.isArray(v);
const num = (v: unknown): number | undefined => (typeof v === 'number' && Number.isFinite(v) ? v : undefined);
const schemaArray = (v: unknown): unknown[] => (Array.isArray(v) ? v : []);

/**
 * The first keyword of `schema` (at any depth) the sampler does not honour, with where it is: null when there is
 * none. The walk follows schema positions only, so a property named `not` is no keyword.
 */
export function unsupportedKeyword(schema: unknown, path = '$', depth = 0): { keyword: string; path: string } | null {
  // Deeper than any value is drawn (the sampler gives up past GIVE_UP_DEPTH): not walked, the stack stays small.
  if (!isSchema(schema) || depth > GIVE_UP_DEPTH * 4) return null;
  for (const keyword of UNSUPPORTED_KEYWORDS) if (keyword in schema) return { keyword, path };
  if (typeof schema.format === 'string' && !FORMATS.includes(schema.format)) return { keyword: `format: ${JSON.stringify(schema.format)}`, path };
  if (typeof schema.$ref === 'string' && !schema.$ref.startsWith('#')) return { keyword: `$ref: ${JSON.stringify(schema.$ref)}`, path };
  const children: [string, unknown][] = [];
  for (const key of ['properties', '$defs', 'definitions'])
    if (isSchema(schema[key])) for (const [k, v] of Object.entries(schema[key])) children.push([`${key}.${k}`, v]);
  for (const key of ['allOf', 'anyOf', 'oneOf', 'prefixItems']) schemaArray(schema[key]).forEach((v, i) => children.push([`${key}[${i}]`, v]));
  if (Array.isArray(schema.items)) schema.items.forEach((v, i) => children.push([`items[${i}]`, v]));
  for (const key of ['items', 'additionalProperties']) if (isSchema(schema[key])) children.push([key, schema[key]]);
  for (const [key, child] of children) {
    const found = unsupportedKeyword(child, `${path}.${key}`, depth + 1);
    if (found) return found;
  }
  return null;
}

/** The schema a local `$ref` (`#`, `#/$defs/name`, any JSON pointer into the root) points at. */
function pointAt(root: unknown, ref: string): unknown {
  if (ref === '#') return root;
  if (!ref.startsWith('#/')) throw new UnsupportedSchema('$ref', `$ref ${JSON.stringify(ref)} does not point into the schema itself.`);
  let at: unknown = root;
  for (const raw of ref.slice(2).split('/')) {
    let part: string;
    try {
      part = decodeURIComponent(raw).replaceAll('~1', '/').replaceAll('~0', '~');
    } catch {
      throw new UnsupportedSchema('$ref', `$ref ${JSON.stringify(ref)} is not a JSON pointer (bad percent-encoding).`);
    }
    at = isSchema(at) ? at[part] : Array.isArray(at) ? at[Number(part)] : undefined;
    if (at === undefined) throw new UnsupportedSchema('$ref', `$ref ${JSON.stringify(ref)} points at nothing in the schema.`);
  }
  return at;
}

/** Two schemas that both apply (allOf, or `$ref` with siblings), as one: properties merged, bounds tightened. */
function merge(a: Schema, b: Schema): Schema {
  const out: Schema = { ...a, ...b };
  if (isSchema(a.properties) && isSchema(b.properties)) {
    const properties: Schema = { ...a.properties };
    for (const [k, v] of Object.entries(b.properties)) properties[k] = k in properties ? { allOf: [properties[k], v] } : v;
    out.properties = properties;
  }
  if (Array.isArray(a.required) && Array.isArray(b.required)) out.required = [...new Set([...a.required, ...b.required])];
  if (a.type !== undefined && b.type !== undefined) {
    const bt = new Set(Array.isArray(b.type) ? b.type : [b.type]);
    const both = (Array.isArray(a.type) ? a.type : [a.type]).filter((t) => bt.has(t) || (t === 'number' && bt.has('integer')));
    out.type = both.length > 0 ? both.map((t) => (t === 'number' && bt.has('integer') && !bt.has('number') ? 'integer' : t)) : b.type;
  }
  for (const key of ['minimum', 'exclusiveMinimum', 'minLength', 'minItems', 'minProperties'])
    if (num(a[key]) !== undefined && num(b[key]) !== undefined) out[key] = Math.max(a[key] as number, b[key] as number);
  for (const key of ['maximum', 'exclusiveMaximum', 'maxLength', 'maxItems', 'maxProperties'])
    if (num(a[key]) !== undefined && num(b[key]) !== undefined) out[key] = Math.min(a[key] as number, b[key] as number);
  if (Array.isArray(a.enum) && Array.isArray(b.enum)) {
    const inB = new Set(b.enum.map((v) => JSON.stringify(v)));
    out.enum = a.enum.filter((v) => inB.has(JSON.stringify(v)));
  }
  if (a.additionalProperties === false || b.additionalProperties === false) out.additionalProperties = false;
  if (isSchema(a.items) && isSchema(b.items)) out.items = { allOf: [a.items, b.items] };
  return out;
}

/** Python's json.dumps of a number: an integral float keeps its `.0`; integers stay integers. */
const numberText = (value: number, integer: boolean): string => (integer || !Number.isInteger(value) ? JSON.stringify(value) : `${value}.0`);

/**
 * The JSON text of a value valid against `schema`, drawn with `rand` (uniform in [0, 1)), at most `maxChars`
 * characters long; throws `SampleTooLarge` as soon as it would take more. Every piece is charged its length before
 * it is written, retries included, so the work done is bounded by `maxChars` too. Throws `UnsupportedSchema` for a
 * `$ref` it cannot follow or a `pattern` it cannot draw from.
 */
export function sampleJsonText(schema: unknown, rand: () => number, maxChars: number): string {
  const sampler = new Sampler(schema, rand, maxChars);
  sampler.sample(schema, 0);
  return sampler.text;
}

/** One draw: the text written so far and what is left of the budget, in characters and in work. */
class Sampler {
  text = '';
  private left: number;
  /**
   * Work that writes nothing (following `$ref`s, merging `allOf`s, intersecting enums) is charged too, at most
   * WORK_PER_CHAR steps a character of the budget: `allOf` over two `$ref`s of the same definition, 31 deep, is
   * 2^31 resolutions of a 3 KB schema.
   */
  private work: number;

  constructor(
    private readonly root: unknown,
    private readonly rand: () => number,
    private readonly maxChars: number,
  ) {
    this.left = maxChars;
    this.work = maxChars * WORK_PER_CHAR;
  }

  private write(piece: string): void {
    this.left -= piece.length;
    if (this.left < 0) throw new SampleTooLarge(this.maxChars, (this.text + piece).slice(0, this.maxChars));
    this.text += piece;
  }

  private giveUp(): never {
    throw new SampleTooLarge(this.maxChars, this.text.slice(0, this.maxChars));
  }

  private spend(steps: number): void {
    this.work -= steps;
    if (this.work < 0) this.giveUp();
  }

  private mergeCharged(a: Schema, b: Schema): Schema {
    const size = (value: unknown) => (Array.isArray(value) ? value.length : isSchema(value) ? Object.keys(value).length : 0);
    this.spend(1 + size(a) + size(b) + size(a.enum) + size(b.enum) + size(a.properties) + size(b.properties));
    return merge(a, b);
  }

  private pick<T>(items: readonly T[]): T {
    return items[Math.floor(this.rand() * items.length)];
  }

  private word(n: number): string {
    return Array.from({ length: n }, () => this.pick(LETTERS)).join('');
  }

  private between(low: number, high: number): number {
    return low + Math.floor(this.rand() * (high - low + 1));
  }

  /** The schema as it applies: `$ref`s followed, `allOf` merged, one `anyOf` / `oneOf` branch taken. */
  private resolve(raw: unknown, nesting = 0): Schema | null {
    let schema: unknown = raw;
    for (let chain = 0; isSchema(schema); chain++) {
      if (chain > MAX_REF_CHAIN || nesting > GIVE_UP_DEPTH) this.giveUp();
      this.spend(1);
      if (typeof schema.$ref === 'string') {
        const { $ref, ...siblings } = schema;
        const target = pointAt(this.root, $ref as string);
        schema = isSchema(target) ? this.mergeCharged(target, siblings) : target;
        continue;
      }
      if (Array.isArray(schema.allOf)) {
        const { allOf, ...rest } = schema;
        schema = (allOf as unknown[]).reduce<Schema>((acc, sub) => {
          const part = this.resolve(sub, nesting + 1);
          return part ? this.mergeCharged(acc, part) : acc;
        }, rest);
        continue;
      }
      const branches = Array.isArray(schema.anyOf) ? schema.anyOf : Array.isArray(schema.oneOf) ? schema.oneOf : null;
      if (branches && branches.length > 0) {
        const { anyOf: _a, oneOf: _o, ...rest } = schema;
        const branch = this.resolve(this.pick(branches), nesting + 1);
        schema = branch ? this.mergeCharged(rest, branch) : rest;
        continue;
      }
      return schema;
    }
    // `true` (anything) is drawn as {}; `false` accepts nothing: null is as good as any.
    return raw === true ? {} : null;
  }

  private typeOf(schema: Schema): string {
    const types: unknown[] = Array.isArray(schema.type) ? schema.type : schema.type === undefined ? [] : [schema.type];
    const concrete = types.filter((t): t is string => typeof t === 'string' && t !== 'null');
    if (concrete.length > 0) return this.pick(concrete);
    if (types.includes('null')) return 'null';
    if (['properties', 'required', 'additionalProperties', 'minProperties'].some((k) => k in schema)) return 'object';
    if (['items', 'prefixItems', 'minItems', 'maxItems'].some((k) => k in schema)) return 'array';
    if (['minimum', 'maximum', 'exclusiveMinimum', 'exclusiveMaximum', 'multipleOf'].some((k) => k in schema)) return 'number';
    return 'string';
  }

  sample(raw: unknown, depth: number): void {
    if (depth > GIVE_UP_DEPTH) this.giveUp();
    const schema = this.resolve(raw);
    if (schema === null) return this.write('null');
    if ('const' in schema) return this.write(pythonJsonDumps(schema.const));
    if (Array.isArray(schema.enum) && schema.enum.length > 0) return this.write(pythonJsonDumps(this.pick(schema.enum)));
    const minimal = depth > MAX_DEPTH;
    const type = this.typeOf(schema);
    switch (type) {
      case 'object':
        return this.sampleObject(schema, depth, minimal);
      case 'array':
        return this.sampleArray(schema, depth, minimal);
      case 'integer':
      case 'number':
        return this.write(this.sampleNumber(schema, type === 'integer'));
      case 'boolean':
        return this.write(this.rand() < 0.5 ? 'true' : 'false');
      case 'null':
        return this.write('null');
      default:
        return this.write(JSON.stringify(this.sampleString(schema)));
    }
  }

  private sampleObject(schema: Schema, depth: number, minimal: boolean): void {
    const properties = isSchema(schema.properties) ? schema.properties : {};
    const required = new Set(schema.required === undefined ? [] : schemaArray(schema.required).filter((k): k is string => typeof k === 'string'));
    const extra = schema.additionalProperties;
    const max = num(schema.maxProperties) ?? Infinity;
    const chosen = new Set(Object.keys(properties).filter((key) => required.has(key) || (!minimal && this.rand() < 0.5)));
    // Required keys the properties do not describe take the additional properties' schema.
    for (const key of required) chosen.add(key);
    // Too few: the optional properties left out, then new keys where additional properties are allowed (no more
    // than the budget could hold: each takes more than a character).
    const min = Math.min(num(schema.minProperties) ?? 0, Math.max(0, this.left));
    for (const key of Object.keys(properties)) if (chosen.size < min) chosen.add(key);
    for (let i = 0; chosen.size < min && extra !== false; i++) chosen.add(`key${i}`);
    const keys = [...chosen];
    while (keys.length > Math.max(max, required.size)) {
      const optional = keys.findLastIndex((key) => !required.has(key));
      if (optional < 0) break;
      keys.splice(optional, 1);
    }
    this.write('{');
    keys.forEach((key, i) => {
      this.write(`${i > 0 ? ', ' : ''}${JSON.stringify(key)}: `);
      this.sample(key in properties ? properties[key] : isSchema(extra) ? extra : {}, depth + 1);
    });
    this.write('}');
  }

  private sampleArray(schema: Schema, depth: number, minimal: boolean): void {
    const prefix = Array.isArray(schema.prefixItems) ? schema.prefixItems : Array.isArray(schema.items) ? schema.items : [];
    const rest = Array.isArray(schema.items) ? (schema.additionalItems ?? {}) : (schema.items ?? {});
    const min = num(schema.minItems) ?? 0;
    const max = Math.max(min, num(schema.maxItems) ?? (rest === false ? prefix.length : min + 3));
    const length = minimal ? min : this.between(min, Math.min(max, min + 3 + prefix.length));
    this.write('[');
    const seen = new Set<string>();
    items: for (let i = 0; i < length; i++) {
      const itemSchema = i < prefix.length ? prefix[i] : rest;
      const start = this.text.length;
      for (let attempt = 0; ; attempt++) {
        this.write(i > 0 ? ', ' : '');
        this.sample(itemSchema, depth + 1);
        const item = this.text.slice(start + (i > 0 ? 2 : 0));
        // `uniqueItems`: a repeated item is drawn again, a few times at most (some schemas have too few values);
        // then the array ends before it if it may, else the schema is one no answer can satisfy here.
        if (schema.uniqueItems !== true || !seen.has(item)) {
          seen.add(item);
          break;
        }
        this.text = this.text.slice(0, start);
        if (attempt >= 8) {
          if (i >= min) break items;
          throw new UnsupportedSchema('uniqueItems', `mocker cannot draw ${min} distinct items for this array schema (uniqueItems).`);
        }
      }
    }
    this.write(']');
  }

  private sampleNumber(schema: Schema, integer: boolean): string {
    const low = Math.max(num(schema.minimum) ?? -Infinity, num(schema.exclusiveMinimum) ?? -Infinity);
    const high = Math.min(num(schema.maximum) ?? Infinity, num(schema.exclusiveMaximum) ?? Infinity);
    const lowOpen = low === num(schema.exclusiveMinimum);
    const highOpen = high === num(schema.exclusiveMaximum);
    const from = Number.isFinite(low) ? low : Number.isFinite(high) ? high - 100 : 0;
    const to = Number.isFinite(high) ? high : from + 100;
    const step = num(schema.multipleOf);
    if (integer || (step !== undefined && Number.isInteger(step))) {
      const unit = step !== undefined && step > 0 ? step : 1;
      // Exclusive bounds move inwards to the next multiple.
      const first = lowOpen ? Math.floor(from / unit) + 1 : Math.ceil(from / unit);
      const last = highOpen ? Math.ceil(to / unit) - 1 : Math.floor(to / unit);
      return numberText(this.between(first, Math.max(first, last)) * unit, integer);
    }
    if (step !== undefined && step > 0)
      return numberText(this.between(Math.ceil(from / step), Math.max(Math.ceil(from / step), Math.floor(to / step))) * step, false);
    const drawn = Math.round((from + this.rand() * (to - from)) * 100) / 100;
    const inside = drawn >= from && drawn <= to && !(lowOpen && drawn === low) && !(highOpen && drawn === high);
    return numberText(inside ? drawn : (from + to) / 2, false);
  }

  private sampleString(schema: Schema): string {
    if (typeof schema.format === 'string' && FORMATS.includes(schema.format)) return this.sampleFormat(schema.format);
    const min = num(schema.minLength) ?? Math.min(1, num(schema.maxLength) ?? 1);
    const max = Math.max(min, num(schema.maxLength) ?? Math.max(min, 8));
    if (typeof schema.pattern === 'string') return this.samplePattern(schema.pattern, schema);
    // A word too long to write is cut where the budget ends: the write that follows gives up with its start.
    const length = Math.min(this.between(min, Math.min(max, min + 8)), Math.max(0, this.left) + 1);
    return this.word(length);
  }

  private samplePattern(pattern: string, schema: Schema): string {
    // Only the lengths the schema sets bound a pattern's draw (the defaults of free words do not).
    const [low, high] = [num(schema.minLength) ?? 0, num(schema.maxLength) ?? Infinity];
    const fits = (s: string) => [...s].length >= low && [...s].length <= high;
    for (let attempt = 0; attempt < 8; attempt++) {
      let drawn: string;
      try {
        drawn = sampleRegex(pattern, this.rand, Math.max(0, this.left), 'u');
      } catch (err) {
        if (!(err instanceof RegexUnsupported)) throw err;
        if (err.tooLong) this.giveUp();
        throw new UnsupportedSchema('pattern', err.message);
      }
      // A draw of the wrong length is drawn again: each takes at most the budget, 8 of them at most.
      if (fits(drawn)) return drawn;
    }
    throw new UnsupportedSchema(
      'pattern',
      `mocker cannot draw a string of ${low} to ${high} characters matching the pattern ${JSON.stringify(pattern)} (minLength/maxLength with pattern).`,
    );
  }

  private sampleFormat(format: string): string {
    const between = (low: number, high: number) => this.between(low, high);
    const date = () => `${between(1970, 2030)}-${String(between(1, 12)).padStart(2, '0')}-${String(between(1, 28)).padStart(2, '0')}`;
    const time = () => `${String(between(0, 23)).padStart(2, '0')}:${String(between(0, 59)).padStart(2, '0')}:${String(between(0, 59)).padStart(2, '0')}Z`;
    const hex = (n: number) => Array.from({ length: n }, () => between(0, 15).toString(16)).join('');
    switch (format) {
      case 'date-time':
        return `${date()}T${time()}`;
      case 'date':
        return date();
      case 'time':
        return time();
      case 'duration':
        return `P${between(1, 30)}DT${between(0, 23)}H`;
      case 'email':
        return `${this.word(6)}@${this.word(5)}.com`;
      case 'uuid':
        return `${hex(8)}-${hex(4)}-4${hex(3)}-${this.pick(['8', '9', 'a', 'b'])}${hex(3)}-${hex(12)}`;
      case 'uri':
      case 'uri-reference':
        return `https://${this.word(6)}.example.com/${this.word(4)}`;
      case 'hostname':
        return `${this.word(6)}.example.com`;
      case 'ipv4':
        return Array.from({ length: 4 }, () => between(0, 255)).join('.');
      default:
        return Array.from({ length: 8 }, () => hex(4)).join(':');
    }
  }
}
