/**
 * Which part of a chat request a rendered prompt's token came from — a message (the system prompt among them),
 * the tool definitions, or the generation prompt — found in the prompt's text, whatever the template: each
 * message's content is looked for in order, each tool by its name and description, and the generation prompt
 * starts at the last `assistant` marker after the last message. Template text between two contents belongs to
 * the message it opens (its role marker); a template's own preamble belongs to the first message.
 */
import type { PromptPart } from './report.js';

type Json = Record<string, unknown>;

/** The texts a message renders, in order: its content (parts of a list in turn), then its tool calls. */
function renderedTexts(message: Json): string[] {
  const texts: string[] = [];
  if (typeof message.content === 'string') texts.push(message.content);
  else if (Array.isArray(message.content)) for (const part of message.content as Json[]) if (typeof part?.text === 'string') texts.push(part.text);
  if (Array.isArray(message.tool_calls)) {
    for (const call of message.tool_calls as Json[]) {
      const fn = (call?.function ?? {}) as Json;
      for (const value of [fn.name, fn.arguments]) if (typeof value === 'string') texts.push(value);
    }
  }
  return texts.filter((t) => t.trim() !== '');
}

/** Where `text` (or, as templates often trim it, its trimmed form) occurs at or after `from`: its end, or null. */
function endOf(prompt: string, text: string, from: number): number | null {
  for (const probe of [text, text.trim()]) {
    const at = prompt.indexOf(probe, from);
    if (at >= 0) return at + probe.length;
  }
  return null;
}

/** The lines the tool definitions are rendered on (from the first tool's name to the last tool's text), or null. */
function toolSpan(prompt: string, tools: unknown): [number, number] | null {
  if (!Array.isArray(tools)) return null;
  let start = Infinity;
  let end = -1;
  for (const tool of tools as Json[]) {
    const fn = (tool?.function ?? tool ?? {}) as Json;
    for (const value of [fn.name, fn.description]) {
      if (typeof value !== 'string' || value === '') continue;
      const at = prompt.indexOf(value);
      if (at < 0) continue;
      start = Math.min(start, at);
      end = Math.max(end, at + value.length);
    }
  }
  if (end < 0) return null;
  const lineEnd = prompt.indexOf('\n', end);
  return [prompt.lastIndexOf('\n', start) + 1, lineEnd < 0 ? prompt.length : lineEnd];
}

function describe(part: PromptPart): string {
  switch (part.kind) {
    case 'system':
      return 'system prompt';
    case 'message':
      return `message ${part.message} (${part.role})`;
    case 'tools':
      return 'tool definitions';
    case 'generation-prompt':
      return 'generation prompt';
    case 'prompt':
      return 'prompt';
    case 'template':
      return 'chat template text';
  }
}

const labelled = (part: PromptPart) => ({ part, partLabel: describe(part) });

/**
 * The part of `request` that the text at `offset` of `prompt` (its rendered prompt, decoded with special tokens
 * shown) belongs to.
 */
export function promptPart(kind: 'chat' | 'completion', request: Json | null, prompt: string, offset: number): { part: PromptPart; partLabel: string } {
  const messages = Array.isArray(request?.messages) ? (request.messages as Json[]) : null;
  if (kind === 'completion' || messages === null) return labelled({ kind: 'prompt' });

  const tools = toolSpan(prompt, request?.tools);
  if (tools && offset >= tools[0] && offset < tools[1]) return labelled({ kind: 'tools' });

  // Where each message's rendered texts end (a message none of whose texts is found ends where the last did).
  const ends: number[] = [];
  let from = 0;
  for (const message of messages) {
    for (const text of renderedTexts(message)) from = endOf(prompt, text, from) ?? from;
    ends.push(from);
  }
  const lastEnd = ends.length > 0 ? ends[ends.length - 1] : 0;
  if (offset >= lastEnd && request?.add_generation_prompt !== false) {
    const role = prompt.lastIndexOf('assistant');
    // The marker that opens the assistant's turn starts at the special token (`<|im_start|>`) or the line it is on.
    const opener = role < lastEnd ? lastEnd : Math.max(lastEnd, prompt.lastIndexOf('<', role), prompt.lastIndexOf('\n', role) + 1);
    if (offset >= opener) return labelled({ kind: 'generation-prompt' });
  }
  const index = ends.findIndex((end) => offset < end);
  // Past every content (a last message's end marker): that message's.
  const message = index >= 0 ? index : messages.length - 1;
  if (message < 0) return labelled({ kind: 'template' });
  const role = typeof messages[message].role === 'string' ? (messages[message].role as string) : 'unknown';
  return labelled(role === 'system' || role === 'developer' ? { kind: 'system', message } : { kind: 'message', message, role });
}
