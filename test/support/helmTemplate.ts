/**
 * A renderer of Helm charts for tests, for the machines where no `helm` binary can be had: Go's text/template
 * with the few Sprig/Helm functions deploy/helm/mocker uses, and Helm's values coalescing. It knows only those
 * constructs and throws on any other (an unknown function, `template`, a chained field on a parenthesised
 * pipeline, a number Helm would print in exponent form…), so the chart cannot drift past what it checks.
 *
 * Go's types matter in Helm and are kept: numbers read from values are float64 (JS `number`), integers made
 * by `int`, `len`, `until` or an integer literal are int (JS `bigint`), those of `add`, `sub`, `mul` int64
 * (`Int64`); `eq` between a float64 and an integer, `printf "%d"` of a float64 or `until` of an int64 fail as
 * Go's templates fail.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parse as parseYaml, stringify as stringifyYaml } from 'yaml';

/** Sprig's `add`, `sub`, `mul` return int64, which a function taking Go's int (`until`, `trunc`, `nindent`) refuses. */
class Int64 {
  constructor(readonly value: bigint) {}
}

type Value = string | number | bigint | Int64 | boolean | null | Value[] | { [key: string]: Value };
type Dict = { [key: string]: Value };

const isDict = (v: Value): v is Dict => v !== null && typeof v === 'object' && !Array.isArray(v) && !(v instanceof Int64);
/** An integer of either Go type as a bigint, else null. */
const integer = (v: Value): bigint | null => (typeof v === 'bigint' ? v : v instanceof Int64 ? v.value : null);

class TemplateError extends Error {}

// ---- lexing the template into text and actions ----

type Segment = { kind: 'text'; text: string } | { kind: 'action'; body: string; at: string };

function segments(source: string, name: string): Segment[] {
  const out: Segment[] = [];
  let i = 0;
  let trimNext = false;
  while (i < source.length) {
    const open = source.indexOf('{{', i);
    let text = source.slice(i, open < 0 ? source.length : open);
    if (trimNext) text = text.replace(/^\s+/, '');
    if (open < 0) {
      out.push({ kind: 'text', text });
      break;
    }
    const trimBefore = source.startsWith('{{- ', open);
    if (trimBefore) text = text.replace(/\s+$/, '');
    out.push({ kind: 'text', text });
    const close = source.indexOf('}}', open);
    if (close < 0) throw new TemplateError(`${name}: unclosed action`);
    const trimAfter = source[close - 1] === '-' && source[close - 2] === ' ';
    let body = source.slice(open + (trimBefore ? 3 : 2), close - (trimAfter ? 2 : 0)).trim();
    const line = source.slice(0, open).split('\n').length;
    if (body.startsWith('/*')) {
      if (!body.endsWith('*/')) throw new TemplateError(`${name}:${line}: unclosed comment`);
      body = '';
    }
    if (body !== '') out.push({ kind: 'action', body, at: `${name}:${line}` });
    trimNext = trimAfter;
    i = close + 2;
  }
  return out;
}

// ---- lexing and parsing one action ----

type Token = { kind: 'string' | 'int' | 'float' | 'word' | 'field' | 'var' | 'punct'; text: string };

function tokens(body: string, at: string): Token[] {
  const out: Token[] = [];
  const patterns: [Token['kind'], RegExp][] = [
    ['string', /^"(?:[^"\\]|\\.)*"/],
    ['string', /^`[^`]*`/],
    ['float', /^-?\d+\.\d+/],
    ['int', /^-?\d+/],
    ['var', /^\$[A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*/],
    ['field', /^(?:\.[A-Za-z0-9_]+)+|^\./],
    ['punct', /^(?::=|=|\||\(|\)|,)/],
    ['word', /^[A-Za-z_][A-Za-z0-9_]*/],
  ];
  let rest = body;
  while ((rest = rest.trimStart()) !== '') {
    const match = patterns.map(([kind, re]) => [kind, re.exec(rest)] as const).find(([, m]) => m !== null);
    if (!match) throw new TemplateError(`${at}: cannot read "${rest}"`);
    const [kind, m] = match;
    out.push({ kind, text: m![0] });
    rest = rest.slice(m![0].length);
    // `(...).field` is valid Go but unknown here.
    if (kind === 'punct' && m![0] === ')' && rest.startsWith('.')) throw new TemplateError(`${at}: a field of a parenthesised pipeline is not supported`);
  }
  return out;
}

type Arg =
  | { kind: 'literal'; value: Value }
  | { kind: 'field'; path: string[] }
  | { kind: 'var'; name: string; path: string[] }
  | { kind: 'pipeline'; pipeline: Pipeline };
type Command = { fn: string | null; args: Arg[] };
type Pipeline = { declare: { names: string[]; assign: boolean } | null; commands: Command[]; at: string };

function unquote(text: string): string {
  if (text.startsWith('`')) return text.slice(1, -1);
  return JSON.parse(text) as string;
}

function parsePipeline(toks: Token[], at: string): Pipeline {
  let pos = 0;
  let declare: Pipeline['declare'] = null;
  // `$a, $b :=` or `$a :=` or `$a =`
  const decl = toks.findIndex((t) => t.kind === 'punct' && (t.text === ':=' || t.text === '='));
  if (decl > 0 && toks.slice(0, decl).every((t) => t.kind === 'var' || t.text === ',')) {
    declare = { names: toks.slice(0, decl).filter((t) => t.kind === 'var').map((t) => t.text), assign: toks[decl].text === '=' };
    pos = decl + 1;
  }
  const parseArg = (): Arg => {
    const t = toks[pos++];
    if (!t) throw new TemplateError(`${at}: missing argument`);
    if (t.kind === 'string') return { kind: 'literal', value: unquote(t.text) };
    if (t.kind === 'int') return { kind: 'literal', value: BigInt(t.text) };
    if (t.kind === 'float') return { kind: 'literal', value: Number(t.text) };
    if (t.kind === 'field') return { kind: 'field', path: t.text === '.' ? [] : t.text.slice(1).split('.') };
    if (t.kind === 'var') {
      const [name, ...path] = t.text.split('.');
      return { kind: 'var', name, path };
    }
    if (t.text === '(') {
      const start = pos;
      let depth = 1;
      while (depth > 0) {
        const next = toks[pos++];
        if (!next) throw new TemplateError(`${at}: unclosed (`);
        if (next.text === '(') depth++;
        if (next.text === ')') depth--;
      }
      return { kind: 'pipeline', pipeline: parsePipeline(toks.slice(start, pos - 1), at) };
    }
    if (t.kind === 'word' && (t.text === 'true' || t.text === 'false')) return { kind: 'literal', value: t.text === 'true' };
    if (t.kind === 'word' && t.text === 'nil') return { kind: 'literal', value: null };
    throw new TemplateError(`${at}: unexpected "${t.text}"`);
  };
  const commands: Command[] = [];
  while (pos < toks.length) {
    const command: Command = { fn: null, args: [] };
    const first = toks[pos];
    if (first.kind === 'word' && !['true', 'false', 'nil'].includes(first.text)) {
      command.fn = first.text;
      pos++;
    }
    while (pos < toks.length && toks[pos].text !== '|') command.args.push(parseArg());
    if (command.fn === null && command.args.length !== 1) throw new TemplateError(`${at}: a command of several values without a function`);
    commands.push(command);
    if (toks[pos]?.text === '|') pos++;
  }
  if (commands.length === 0) throw new TemplateError(`${at}: empty pipeline`);
  return { declare, commands, at };
}

// ---- the tree ----

type Node =
  | { kind: 'text'; text: string }
  | { kind: 'action'; pipeline: Pipeline }
  | { kind: 'if' | 'with'; pipeline: Pipeline; then: Node[]; otherwise: Node[] }
  | { kind: 'range'; pipeline: Pipeline; body: Node[]; otherwise: Node[] };

function parseTree(segs: Segment[], defines: Map<string, Node[]>, name: string): Node[] {
  let pos = 0;
  /** Nodes up to an `end` or `else` (which is returned, not consumed past). */
  const block = (inside: string | null): { nodes: Node[]; stop: string | null } => {
    const nodes: Node[] = [];
    while (pos < segs.length) {
      const seg = segs[pos++];
      if (seg.kind === 'text') {
        if (seg.text !== '') nodes.push({ kind: 'text', text: seg.text });
        continue;
      }
      const toks = tokens(seg.body, seg.at);
      const keyword = toks[0].kind === 'word' ? toks[0].text : null;
      if (keyword === 'end' || keyword === 'else') {
        if (inside === null) throw new TemplateError(`${seg.at}: ${keyword} outside a block`);
        pos--;
        return { nodes, stop: keyword };
      }
      if (keyword === 'if' || keyword === 'with' || keyword === 'range') {
        nodes.push(control(keyword, toks.slice(1), seg.at));
        continue;
      }
      if (keyword === 'define') {
        const defined = unquote(toks[1].text);
        const body = block('define');
        expectEnd(body.stop, seg.at);
        defines.set(defined, body.nodes);
        continue;
      }
      if (keyword === 'template' || keyword === 'block' || keyword === 'break' || keyword === 'continue') throw new TemplateError(`${seg.at}: "${keyword}" is not supported (use include)`);
      nodes.push({ kind: 'action', pipeline: parsePipeline(toks, seg.at) });
    }
    if (inside !== null) throw new TemplateError(`${name}: ${inside} without end`);
    return { nodes, stop: null };
  };
  const expectEnd = (stop: string | null, at: string) => {
    const seg = segs[pos++];
    if (stop !== 'end' || seg.kind !== 'action' || seg.body !== 'end') throw new TemplateError(`${at}: expected end`);
  };
  const control = (keyword: 'if' | 'with' | 'range', rest: Token[], at: string): Node => {
    const pipeline = parsePipeline(rest, at);
    const then = block(keyword);
    let otherwise: Node[] = [];
    if (then.stop === 'else') {
      const seg = segs[pos++] as { body: string; at: string };
      const elseToks = tokens(seg.body, seg.at);
      if (elseToks.length > 1 && elseToks[1].text === 'if' && keyword === 'if') {
        // `else if`: the rest of the chain is an `if` inside the else, sharing its end.
        return { kind: 'if', pipeline, then: then.nodes, otherwise: [control('if', elseToks.slice(2), seg.at)] };
      }
      if (elseToks.length > 1) throw new TemplateError(`${seg.at}: "else ${elseToks[1].text}" is not supported`);
      const rest2 = block(keyword);
      expectEnd(rest2.stop, at);
      otherwise = rest2.nodes;
    } else expectEnd(then.stop, at);
    return keyword === 'range' ? { kind: 'range', pipeline, body: then.nodes, otherwise } : { kind: keyword, pipeline, then: then.nodes, otherwise };
  };
  return block(null).nodes;
}

// ---- values as Go and Sprig see them ----

/** Go's truth: the zero value of its type and empty collections are false. */
function truthy(v: Value): boolean {
  if (v === null || v === false || v === '' || v === 0 || integer(v) === 0n) return false;
  if (Array.isArray(v)) return v.length > 0;
  if (isDict(v)) return Object.keys(v).length > 0;
  return true;
}

/** fmt's %v of a float64 is the shortest form, in exponent form from 1e21 (and for tiny ones): refused. */
function formatNumber(n: number, at: string): string {
  if (!Number.isFinite(n) || Math.abs(n) >= 1e6 || (n !== 0 && Math.abs(n) < 1e-4)) {
    throw new TemplateError(`${at}: ${n} would print in exponent form in Helm (a float64): quote it in the values`);
  }
  return String(n);
}

function printValue(v: Value, at: string): string {
  if (v === null) return '';
  if (typeof v === 'string') return v;
  if (integer(v) !== null) return integer(v)!.toString();
  if (typeof v === 'number') return formatNumber(v, at);
  if (typeof v === 'boolean') return String(v);
  throw new TemplateError(`${at}: printing a ${Array.isArray(v) ? 'list' : 'map'} (Go would print map[…]/[…]): use toYaml`);
}

function toInt(v: Value, at: string): bigint {
  if (integer(v) !== null) return integer(v)!;
  if (typeof v === 'number') return BigInt(Math.trunc(v));
  if (typeof v === 'string' && /^-?\d+$/.test(v)) return BigInt(v);
  throw new TemplateError(`${at}: not a number: ${JSON.stringify(v)}`);
}

function expectInt(v: Value, what: string, at: string): bigint {
  if (typeof v !== 'bigint') throw new TemplateError(`${at}: ${what} wants an int, got ${kindOf(v)} (use int)`);
  return v;
}

function compare(a: Value, b: Value, at: string): number {
  // Go compares int with int64 (one basic kind), never an integer with a float64.
  const kind = (v: Value) => (integer(v) !== null ? 'integer' : kindOf(v));
  if (kind(a) !== kind(b)) throw new TemplateError(`${at}: incompatible types for comparison (${kindOf(a)}, ${kindOf(b)})`);
  if (['slice', 'map', 'invalid'].includes(kind(a))) throw new TemplateError(`${at}: comparing a ${kind(a)}`);
  const [x, y] = integer(a) !== null ? [integer(a)!, integer(b)!] : [a as string | number | boolean, b as string | number | boolean];
  return x === y ? 0 : x < y ? -1 : 1;
}

/** Go's fmt for the verbs the chart uses: %s, %d (an int only), %v, %%. */
function sprintf(format: string, args: Value[], at: string): string {
  let next = 0;
  return format.replace(/%([%sdv])|%./g, (verb, known: string | undefined) => {
    if (known === undefined) throw new TemplateError(`${at}: printf verb ${verb} is not supported`);
    if (known === '%') return '%';
    if (next >= args.length) throw new TemplateError(`${at}: printf: missing argument for ${verb}`);
    const arg = args[next++];
    if (known === 'd') {
      if (integer(arg) === null) throw new TemplateError(`${at}: printf %d of a ${kindOf(arg)} (Go prints %!d(…))`);
      return integer(arg)!.toString();
    }
    if (known === 's' && typeof arg !== 'string') throw new TemplateError(`${at}: printf %s of a ${typeof arg}`);
    return printValue(arg, at);
  });
}

/** Go's %q of a string: refused where it would differ from JSON's quoting (control characters). */
function goQuote(s: string, at: string): string {
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u001f\u007f]/.test(s)) throw new TemplateError(`${at}: quoting a control character`);
  return JSON.stringify(s);
}

/** Helm's toYaml: keys sorted (Go's JSON), the last newline trimmed. */
function toYaml(v: Value): string {
  const plain = (x: Value): unknown => (integer(x) !== null ? Number(integer(x)) : Array.isArray(x) ? x.map(plain) : isDict(x) ? Object.fromEntries(Object.entries(x).map(([k, y]) => [k, plain(y)])) : x);
  return stringifyYaml(plain(v), { sortMapEntries: true, lineWidth: 0 }).replace(/\n$/, '');
}

function kindOf(v: Value): string {
  if (v === null) return 'invalid';
  if (typeof v === 'bigint') return 'int';
  if (v instanceof Int64) return 'int64';
  if (typeof v === 'number') return 'float64';
  if (typeof v === 'boolean') return 'bool';
  if (typeof v === 'string') return 'string';
  return Array.isArray(v) ? 'slice' : 'map';
}

// ---- execution ----

class Scope {
  private readonly vars: Map<string, Value>[];
  constructor(root: Value) {
    this.vars = [new Map([['$', root]])];
  }
  push(): void {
    this.vars.push(new Map());
  }
  pop(): void {
    this.vars.pop();
  }
  declare(name: string, v: Value): void {
    this.vars[this.vars.length - 1].set(name, v);
  }
  assign(name: string, v: Value, at: string): void {
    const frame = [...this.vars].reverse().find((f) => f.has(name));
    if (!frame) throw new TemplateError(`${at}: undefined variable ${name}`);
    frame.set(name, v);
  }
  get(name: string, at: string): Value {
    const frame = [...this.vars].reverse().find((f) => f.has(name));
    if (!frame) throw new TemplateError(`${at}: undefined variable ${name}`);
    return frame.get(name)!;
  }
}

export interface Chart {
  metadata: Dict;
  values: Dict;
  templates: { name: string; source: string }[];
}

class Renderer {
  private readonly defines = new Map<string, Node[]>();

  constructor(templates: { name: string; source: string }[]) {
    this.trees = templates.map((t) => ({ name: t.name, nodes: parseTree(segments(t.source, t.name), this.defines, t.name) }));
  }
  readonly trees: { name: string; nodes: Node[] }[];

  render(nodes: Node[], dot: Value, scope: Scope): string {
    let out = '';
    for (const node of nodes) {
      if (node.kind === 'text') out += node.text;
      else if (node.kind === 'action') {
        const v = this.pipeline(node.pipeline, dot, scope);
        if (!node.pipeline.declare) out += printValue(v, node.pipeline.at);
      } else if (node.kind !== 'range') {
        scope.push();
        const v = this.pipeline(node.pipeline, dot, scope);
        if (truthy(v)) out += this.render(node.then, node.kind === 'with' ? v : dot, scope);
        else out += this.render(node.otherwise, dot, scope);
        scope.pop();
      } else {
        const { declare, at } = node.pipeline;
        const over = this.pipeline({ ...node.pipeline, declare: null }, dot, scope);
        const entries: [Value, Value][] = Array.isArray(over)
          ? over.map((v, i) => [BigInt(i), v])
          : isDict(over)
            ? Object.keys(over).sort().map((k) => [k, over[k]])
            : over === null
              ? []
              : (() => {
                  throw new TemplateError(`${at}: range over a ${kindOf(over)}`);
                })();
        if (entries.length === 0) out += this.render(node.otherwise, dot, scope);
        for (const [key, v] of entries) {
          scope.push();
          if (declare?.names.length === 1) scope.declare(declare.names[0], v);
          if (declare?.names.length === 2) {
            scope.declare(declare.names[0], key);
            scope.declare(declare.names[1], v);
          }
          out += this.render(node.body, v, scope);
          scope.pop();
        }
      }
    }
    return out;
  }

  private pipeline(p: Pipeline, dot: Value, scope: Scope): Value {
    let piped: Value | undefined;
    for (const command of p.commands) piped = this.command(command, dot, scope, piped, p.at);
    const result = piped as Value;
    if (p.declare) {
      if (p.declare.names.length !== 1) throw new TemplateError(`${p.at}: several variables outside range`);
      if (p.declare.assign) scope.assign(p.declare.names[0], result, p.at);
      else scope.declare(p.declare.names[0], result);
    }
    return result;
  }

  private arg(a: Arg, dot: Value, scope: Scope, at: string): Value {
    if (a.kind === 'literal') return a.value;
    if (a.kind === 'pipeline') return this.pipeline(a.pipeline, dot, scope);
    const base = a.kind === 'field' ? dot : scope.get(a.name, at);
    return a.path.reduce<Value>((v, key) => {
      if (!isDict(v)) throw new TemplateError(`${at}: nil pointer evaluating .${key} (of a ${kindOf(v)})`);
      return key in v ? v[key] : null;
    }, base);
  }

  private command(c: Command, dot: Value, scope: Scope, piped: Value | undefined, at: string): Value {
    const args = c.args.map((a) => this.arg(a, dot, scope, at));
    if (piped !== undefined) args.push(piped);
    if (c.fn === null) return args[0];
    const fn = c.fn;
    const want = (n: number) => {
      if (args.length !== n) throw new TemplateError(`${at}: ${fn} wants ${n} argument(s), got ${args.length}`);
    };
    const str = (v: Value) => {
      if (typeof v !== 'string') throw new TemplateError(`${at}: ${fn} wants a string, got ${kindOf(v)}`);
      return v;
    };
    switch (fn) {
      case 'include': {
        want(2);
        const nodes = this.defines.get(str(args[0]));
        if (!nodes) throw new TemplateError(`${at}: no template "${args[0] as string}"`);
        return this.render(nodes, args[1], new Scope(args[1]));
      }
      case 'dict': {
        if (args.length % 2 !== 0) throw new TemplateError(`${at}: dict wants pairs`);
        const d: Dict = {};
        for (let i = 0; i < args.length; i += 2) d[str(args[i])] = args[i + 1];
        return d;
      }
      case 'list':
        return args;
      case 'toYaml':
        want(1);
        return toYaml(args[0]);
      case 'indent':
      case 'nindent': {
        want(2);
        const pad = ' '.repeat(Number(expectInt(args[0], fn, at)));
        const indented = pad + str(args[1]).replaceAll('\n', `\n${pad}`);
        return fn === 'nindent' ? `\n${indented}` : indented;
      }
      case 'quote':
        return args.filter((a) => a !== null).map((a) => goQuote(printValue(a, at), at)).join(' ');
      case 'default':
        want(2);
        return truthy(args[1]) ? args[1] : args[0];
      case 'printf':
        return sprintf(str(args[0]), args.slice(1), at);
      case 'trim':
        want(1);
        return str(args[0]).trim();
      case 'contains':
        want(2);
        return str(args[1]).includes(str(args[0]));
      case 'upper':
        want(1);
        return str(args[0]).toUpperCase();
      case 'replace':
        want(3);
        return str(args[2]).replaceAll(str(args[0]), str(args[1]));
      case 'trunc': {
        want(2);
        return str(args[1]).slice(0, Number(expectInt(args[0], 'trunc', at)));
      }
      case 'trimSuffix':
        want(2);
        return str(args[1]).endsWith(str(args[0])) ? str(args[1]).slice(0, -str(args[0]).length || undefined) : str(args[1]);
      case 'join': {
        want(2);
        if (!Array.isArray(args[1])) throw new TemplateError(`${at}: join of a ${kindOf(args[1])}`);
        return args[1].map((x) => printValue(x, at)).join(str(args[0]));
      }
      case 'int':
        want(1);
        return toInt(args[0], at);
      case 'add':
        return new Int64(args.reduce<bigint>((sum, a) => sum + toInt(a, at), 0n));
      case 'sub':
        want(2);
        return new Int64(toInt(args[0], at) - toInt(args[1], at));
      case 'mul':
        return new Int64(args.reduce<bigint>((product, a) => product * toInt(a, at), 1n));
      case 'until': {
        want(1);
        const n = Number(expectInt(args[0], 'until', at));
        return Array.from({ length: Math.max(0, n) }, (_, i) => BigInt(i));
      }
      case 'len': {
        want(1);
        const v = args[0];
        if (typeof v === 'string' || Array.isArray(v)) return BigInt(v.length);
        if (isDict(v)) return BigInt(Object.keys(v).length);
        throw new TemplateError(`${at}: len of a ${kindOf(v)}`);
      }
      case 'has':
        want(2);
        if (!Array.isArray(args[1])) throw new TemplateError(`${at}: has in a ${kindOf(args[1])}`);
        return args[1].some((x) => kindOf(x) === kindOf(args[0]) && compare(x, args[0], at) === 0);
      case 'index': {
        want(2);
        const [collection, key] = args;
        if (isDict(collection)) return str(key) in collection ? collection[str(key)] : null;
        if (Array.isArray(collection) && integer(key) !== null) {
          const i = Number(integer(key));
          if (i < 0 || i >= collection.length) throw new TemplateError(`${at}: index out of range: ${i}`);
          return collection[i];
        }
        throw new TemplateError(`${at}: index of a ${kindOf(collection)}`);
      }
      case 'hasKey':
        want(2);
        if (!isDict(args[0])) throw new TemplateError(`${at}: hasKey of a ${kindOf(args[0])}`);
        return str(args[1]) in args[0];
      case 'kindIs':
        want(2);
        return kindOf(args[1]) === str(args[0]);
      case 'eq':
        if (args.length < 2) throw new TemplateError(`${at}: eq wants 2 arguments or more`);
        return args.slice(1).some((b) => compare(args[0], b, at) === 0);
      case 'ne':
        want(2);
        return compare(args[0], args[1], at) !== 0;
      case 'lt':
        want(2);
        return compare(args[0], args[1], at) < 0;
      case 'gt':
        want(2);
        return compare(args[0], args[1], at) > 0;
      case 'and':
        return args.find((a) => !truthy(a)) ?? args[args.length - 1];
      case 'or':
        return args.find((a) => truthy(a)) ?? args[args.length - 1];
      case 'not':
        want(1);
        return !truthy(args[0]);
      case 'required':
        want(2);
        if (args[1] === null || args[1] === '') throw new TemplateError(`execution error at (${at}): ${str(args[0])}`);
        return args[1];
      case 'fail':
        want(1);
        throw new TemplateError(`execution error at (${at}): ${str(args[0])}`);
      default:
        throw new TemplateError(`${at}: function "${fn}" is not supported by this renderer`);
    }
  }
}

/** Helm's coalescing: maps merge key by key, anything else is replaced, and null removes the key. */
export function coalesce(base: Dict, override: Dict): Dict {
  const out: Dict = { ...base };
  for (const [key, v] of Object.entries(override)) {
    if (v === null) delete out[key];
    else if (isDict(v) && isDict(out[key])) out[key] = coalesce(out[key] as Dict, v);
    else out[key] = v;
  }
  return out;
}

/** A chart directory: Chart.yaml, values.yaml and templates/ (named as Helm names them, `CHART/templates/FILE`). */
export function loadChart(dir: string): Chart {
  const templatesDir = join(dir, 'templates');
  const metadata = parseYaml(readFileSync(join(dir, 'Chart.yaml'), 'utf8')) as Dict;
  return {
    metadata,
    values: (parseYaml(readFileSync(join(dir, 'values.yaml'), 'utf8')) ?? {}) as Dict,
    templates: readdirSync(templatesDir)
      .filter((f) => /\.(yaml|yml|tpl)$/.test(f))
      .sort()
      .map((f) => ({ name: `${String(metadata.name)}/templates/${f}`, source: readFileSync(join(templatesDir, f), 'utf8') })),
  };
}

export interface RenderOptions {
  releaseName: string;
  namespace: string;
  /** Values over the chart's own (a `-f` file). */
  values?: Dict;
}

/** `helm template`: each template file not starting with `_` rendered, keyed by its name. */
export function renderChart(chart: Chart, options: RenderOptions): Map<string, string> {
  const renderer = new Renderer(chart.templates);
  const metadata = chart.metadata;
  const top: Dict = {
    Values: coalesce(chart.values, options.values ?? {}),
    Release: { Name: options.releaseName, Namespace: options.namespace, Service: 'Helm', IsInstall: true, IsUpgrade: false, Revision: 1 },
    Chart: { Name: metadata.name, Version: metadata.version, AppVersion: metadata.appVersion ?? null, ApiVersion: metadata.apiVersion },
  };
  const out = new Map<string, string>();
  for (const tree of renderer.trees) {
    if (tree.name.split('/').pop()!.startsWith('_')) continue;
    const text = renderer.render(tree.nodes, top, new Scope(top));
    if (text.trim() !== '') out.set(tree.name, text);
  }
  return out;
}

export { TemplateError };
