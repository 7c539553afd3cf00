/**
 * Text that came from a file or a server (labels, models, bodies, prompts, error messages) on its way to a
 * terminal: control characters — C0 (ESC among them), DEL and C1 — become visible escapes (`\x1b`), so that what
 * a capture holds cannot move the cursor, retitle the window or hide what is printed.
 */

const CONTROL = /[\u0000-\u001f\u007f-\u009f]/g;
const CONTROL_BUT_NEWLINE = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f]/g;
const NAMED: Record<string, string> = { '\n': '\\n', '\r': '\\r', '\t': '\\t' };

const hex = (c: string, digits: number) => c.charCodeAt(0).toString(16).padStart(digits, '0');

/** `text` with its control characters escaped; `keepNewlines`: text shown over several lines keeps its `\n`. */
export function terminalText(text: string, { keepNewlines = false } = {}): string {
  return text.replace(keepNewlines ? CONTROL_BUT_NEWLINE : CONTROL, (c) => NAMED[c] ?? `\\x${hex(c, 2)}`);
}

/** Pretty JSON for a terminal: JSON.stringify escapes C0 itself; DEL and C1 get `\u` escapes too (the same value). */
export function terminalJson(value: unknown): string {
  return JSON.stringify(value, null, 2).replace(/[\u007f-\u009f]/g, (c) => `\\u${hex(c, 4)}`);
}
