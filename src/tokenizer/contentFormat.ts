/**
 * vLLM's automatic chat-template content format (`--chat-template-content-format auto`, `_detect_content_format`):
 * a template that loops over a message's `content` ("openai") is handed content as a list of `{"type":"text",…}`
 * parts; any other ("string") gets one string. The detection reads the template's syntax tree, not its output.
 */
import { Template } from '@huggingface/jinja';

export type ContentFormat = 'string' | 'openai';

/** A node of @huggingface/jinja's syntax tree, read by its `type` and fields. */
interface Node {
  type: string;
  [field: string]: unknown;
}

const isNode = (value: unknown): value is Node => typeof value === 'object' && value !== null && typeof (value as Node).type === 'string';

/** Every node under `root` (itself included) in document order. */
function* nodesOf(root: Node): Generator<Node> {
  yield root;
  for (const value of Object.values(root)) {
    for (const child of Array.isArray(value) ? value : [value]) if (isNode(child)) yield* nodesOf(child);
  }
}

/** `name` itself. */
const isVariable = (node: Node, name: string): boolean => node.type === 'Identifier' && node.value === name;

/** `name.key` or `name['key']`. */
function isMember(node: Node, name: string, key: string): boolean {
  if (node.type !== 'MemberExpression' || !isNode(node.object) || !isNode(node.property) || !isVariable(node.object, name)) return false;
  const property = node.property;
  return node.computed === true ? property.type === 'StringLiteral' && property.value === key : isVariable(property, key);
}

/** `name` (or `name.key`) seen through filters, tests and slices, as vLLM's `_is_var_or_elems_access`. */
function accesses(node: Node, name: string, key?: string): boolean {
  if (node.type === 'FilterExpression' || node.type === 'TestExpression') return isNode(node.operand) && accesses(node.operand, name, key);
  if (node.type === 'MemberExpression' && node.computed === true && isNode(node.property) && node.property.type === 'SliceExpression') {
    return isNode(node.object) && accesses(node.object, name, key);
  }
  return key === undefined ? isVariable(node, name) : isMember(node, name, key);
}

/** A loop's sequence as Python's jinja parses it: `for x in xs if cond` keeps the condition apart. */
const loopSequence = (loop: Node): Node | undefined => {
  const iterable = loop.iterable;
  if (!isNode(iterable)) return undefined;
  return iterable.type === 'SelectExpression' && isNode(iterable.lhs) ? iterable.lhs : iterable;
};

/** The name a loop binds; vLLM asserts a plain name, and falls back to its default format on anything else. */
function loopName(loop: Node): string {
  if (!isNode(loop.loopvar) || loop.loopvar.type !== 'Identifier') throw new Error('loop target is not a name');
  return loop.loopvar.value as string;
}

function detect(root: Node): ContentFormat {
  const nodes = [...nodesOf(root)];
  const loops = nodes.filter((n) => n.type === 'For');
  // `messages` and every variable set from it (`{% set msgs = messages[1:] %}`), breadth first.
  const messageLists = ['messages'];
  for (let i = 0; i < messageLists.length; i++) {
    for (const set of nodes) {
      if (set.type !== 'Set' || !isNode(set.value) || !accesses(set.value, messageLists[i])) continue;
      if (!isNode(set.assignee) || set.assignee.type !== 'Identifier') throw new Error('assignment target is not a name');
      const name = set.assignee.value as string;
      if (!messageLists.includes(name)) messageLists.push(name);
    }
  }
  const messageNames = loops.flatMap((loop) => {
    const sequence = loopSequence(loop);
    return sequence && messageLists.some((name) => accesses(sequence, name)) ? [loopName(loop)] : [];
  });
  for (const loop of loops) {
    const sequence = loopSequence(loop);
    if (!sequence) continue;
    // `for part in message['content']`, or (vLLM #42660) `for part in content`, a macro's argument.
    if (messageNames.some((name) => accesses(sequence, name, 'content')) || isVariable(sequence, 'content')) {
      loopName(loop);
      return 'openai';
    }
  }
  return 'string';
}

/** A `for` over something named content: templates without one are "string" without being parsed. */
const LOOPS_OVER_CONTENT = /\{%[-+]?\s*for\b[^%]*\bcontent\b/;

/** The content format vLLM detects for a chat template ("string" when it cannot tell). */
export function detectContentFormat(source: string): ContentFormat {
  if (!LOOPS_OVER_CONTENT.test(source)) return 'string';
  try {
    return detect(new Template(source).parsed as unknown as Node);
  } catch {
    // Not parsable here, or a shape vLLM's detector asserts against: vLLM's default.
    return 'string';
  }
}
