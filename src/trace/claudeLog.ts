/**
 * Claude Code session logs (`~/.claude/projects/<project>/<session>.jsonl`) as requests, the way Dynamo's
 * `claude_trace_export` reads them (`lib/bench/coding`):
 * - rows need `sessionId`, `type` and an ISO `timestamp`; a session's rows are taken in time order (file order on
 *   ties); only top-level user, assistant and system rows count (`isSidechain` rows are a sub-agent's);
 * - one request is a group of adjacent assistant rows sharing `requestId` (else `message.id`, else `uuid`), with
 *   the tool results written between them; its output length is the largest `message.usage.output_tokens` of the
 *   group (else the tokens of what it said);
 * - its prompt is the conversation so far rendered as text, one entry per line (`[user] …`, `[user_tool_result
 *   id=tool_0001 error=false] …`, `[assistant] …`, `[assistant_tool_use id=… name=… args=…]`; thinking dropped, tool
 *   ids numbered per session; `isMeta` rows and local-command wrappers skipped; after a `compact_boundary` the
 *   compact summary replaces the history), tokenized entry by entry so that each turn's prompt extends the last;
 * - it starts at the user row (a message, or the tool results) that preceded it, else at its first row; its delay
 *   is from the end of the previous request (its last row) to that start.
 */
import { canonicalJson } from '../captures/pairing.js';
import { TooManyTokens } from '../tokenizer/index.js';
import type { ConvertedRequest } from './convert.js';
import { RollingHashIds } from './rollingHash.js';

/** What tokenizes the rendered entries (a ModelTokenizer). */
export interface TextTokenizer {
  encodeBounded(text: string, addSpecialTokens: boolean, maxTokens: number): Promise<number[]>;
}

/** One log file's text and how errors name it. */
export interface LogInput {
  name: string;
  text: string;
}

/** The longest entry (a message, a tool result) tokenized: a log is untrusted input, a longer one is refused. */
export const MAX_ENTRY_TOKENS = 1 << 20;

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v);

interface LogRow {
  where: string;
  type: string;
  timestampMs: number;
  raw: Json;
}

/** A content field as blocks: a string is one text block. */
function contentBlocks(content: unknown): Json[] {
  if (typeof content === 'string') return content === '' ? [] : [{ type: 'text', text: content }];
  return Array.isArray(content) ? content.filter(isObject) : [];
}

/** A tool result's content as text: its text blocks, other blocks as JSON. */
function flattenText(content: unknown): string {
  if (content === undefined || content === null) return '';
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return canonicalJson(content);
  return content
    .map((part) => (typeof part === 'string' ? part : isObject(part) && part.type === 'text' ? String(part.text ?? '') : canonicalJson(part)))
    .join('\n');
}

const LOCAL_COMMAND_WRAPPERS = [
  '<command-name>',
  '<command-message>',
  '<command-args>',
  '<local-command-caveat>',
  '<local-command-stdout>',
  '<local-command-stderr>',
];

const messageOf = (row: LogRow): Json => (isObject(row.raw.message) ? row.raw.message : {});

/** `isMeta` rows, and rows of only local-command wrappers (a slash command's echo), are not the conversation. */
function skippedUserRow(row: LogRow): boolean {
  if (row.raw.isMeta === true) return true;
  const blocks = contentBlocks(messageOf(row).content);
  return (
    blocks.length > 0 &&
    blocks.every(
      (b) =>
        b.type === 'text' &&
        LOCAL_COMMAND_WRAPPERS.some((w) =>
          String(b.text ?? '')
            .trim()
            .startsWith(w),
        ),
    )
  );
}

const isToolResults = (row: LogRow) => {
  const blocks = contentBlocks(messageOf(row).content);
  return row.type === 'user' && blocks.length > 0 && blocks.every((b) => b.type === 'tool_result');
};

function groupKey(row: LogRow): string {
  const message = messageOf(row);
  for (const key of [row.raw.requestId, message.id, row.raw.uuid]) if (typeof key === 'string') return key;
  return row.where;
}

/** Tool call ids as `tool_0001`, `tool_0002`… in order of appearance (per session). */
class ToolIds {
  private readonly ids = new Map<string, string>();
  of(raw: unknown): string {
    if (typeof raw !== 'string') return 'tool_unknown';
    let id = this.ids.get(raw);
    if (id === undefined) this.ids.set(raw, (id = `tool_${String(this.ids.size + 1).padStart(4, '0')}`));
    return id;
  }
}

/** A row's entries, each one line of the rendered conversation. */
function render(row: LogRow, tools: ToolIds): string[] {
  const speaker = row.type === 'assistant' ? 'assistant' : 'user';
  const out: string[] = [];
  for (const block of contentBlocks(messageOf(row).content)) {
    const type = typeof block.type === 'string' ? block.type : 'unknown';
    if (type === 'thinking' || type === 'redacted_thinking') continue;
    if (type === 'text') {
      const text = String(block.text ?? '');
      if (text !== '') out.push(`[${speaker}] ${text}`);
    } else if (type === 'tool_result' && speaker === 'user') {
      const content = flattenText(block.content);
      const head = `[user_tool_result id=${tools.of(block.tool_use_id)} error=${block.is_error === true}]`;
      out.push(content === '' ? head : `${head} ${content}`);
    } else if (type === 'tool_use' && speaker === 'assistant') {
      out.push(`[assistant_tool_use id=${tools.of(block.id)} name=${String(block.name ?? 'unknown')} args=${canonicalJson(block.input)}]`);
    } else out.push(`[${speaker}_block type=${type}] ${canonicalJson(block)}`);
  }
  return out;
}

/** The rows of every input by session (sessions in order of their first row's time), each session's in time order. */
function sessionsOf(inputs: readonly LogInput[]): Map<string, LogRow[]> {
  const sessions = new Map<string, LogRow[]>();
  for (const { name, text } of inputs) {
    text.split('\n').forEach((line, index) => {
      if (line.trim() === '') return;
      const where = `${name}:${index + 1}`;
      let raw: unknown;
      try {
        raw = JSON.parse(line);
      } catch (err) {
        throw new Error(`${where}: not JSON (${(err as Error).message})`);
      }
      if (!isObject(raw) || typeof raw.sessionId !== 'string' || typeof raw.type !== 'string' || typeof raw.timestamp !== 'string') return;
      const timestampMs = Date.parse(raw.timestamp);
      if (Number.isNaN(timestampMs) || raw.isSidechain === true || !['user', 'assistant', 'system'].includes(raw.type)) return;
      let rows = sessions.get(raw.sessionId);
      if (!rows) sessions.set(raw.sessionId, (rows = []));
      rows.push({ where, type: raw.type, timestampMs, raw });
    });
  }
  // Stable: rows of one time keep their file order.
  for (const rows of sessions.values()) rows.sort((a, b) => a.timestampMs - b.timestampMs);
  return new Map([...sessions].sort(([, a], [, b]) => a[0].timestampMs - b[0].timestampMs));
}

/** Converts the logs; `skipped` counts requests without a prompt (an answer before any message). */
export async function claudeLogRequests(
  inputs: readonly LogInput[],
  tokenizer: TextTokenizer,
  traceBlockSize: number,
  maxEntryTokens = MAX_ENTRY_TOKENS,
): Promise<{ requests: ConvertedRequest[]; skipped: number }> {
  const hashIds = new RollingHashIds(traceBlockSize);
  const requests: ConvertedRequest[] = [];
  let skipped = 0;
  const tokenize = async (entries: readonly string[], where: string): Promise<number[]> => {
    const ids: number[] = [];
    for (const entry of entries) {
      try {
        for (const id of await tokenizer.encodeBounded(`${entry}\n`, false, maxEntryTokens)) ids.push(id);
      } catch (err) {
        if (err instanceof TooManyTokens) throw new Error(`${where}: an entry of more than ${maxEntryTokens} tokens`);
        throw err;
      }
    }
    return ids;
  };
  for (const [sessionId, rows] of sessionsOf(inputs)) {
    const tools = new ToolIds();
    let history: number[] = [];
    let requestStart: number | null = null;
    let previous: { id: string; endMs: number } | null = null;
    let compacting = false;
    let turn = 0;
    for (let i = 0; i < rows.length; ) {
      const row = rows[i++];
      if (row.type === 'system') {
        compacting = row.raw.subtype === 'compact_boundary';
        continue;
      }
      if (row.type === 'user') {
        if (!skippedUserRow(row)) {
          const ids = await tokenize(render(row, tools), row.where);
          if (compacting && row.raw.isCompactSummary === true) history = [];
          for (const id of ids) history.push(id);
          requestStart = row.timestampMs;
        }
        compacting = false;
        continue;
      }
      compacting = false;
      // The request's rows, and the tool results written among them (they follow its answer in the history).
      const key = groupKey(row);
      const said: LogRow[] = [row];
      const after: LogRow[] = [];
      for (; i < rows.length; i++) {
        const next = rows[i];
        if (next.type === 'system' && next.raw.subtype !== 'compact_boundary') continue;
        if (isToolResults(next)) after.push(next);
        else if (next.type === 'assistant' && groupKey(next) === key) said.push(next);
        else break;
      }
      const answer = await tokenize(
        said.flatMap((r) => render(r, tools)),
        row.where,
      );
      const counted = said.map((r) => messageOf(r).usage).map((u) => (isObject(u) && Number.isInteger(u.output_tokens) ? (u.output_tokens as number) : -1));
      const start = requestStart ?? row.timestampMs;
      const id = `${sessionId}:${turn++}`;
      if (history.length === 0) skipped++;
      else {
        requests.push({
          requestId: id,
          sessionId,
          after: previous?.id ?? null,
          startMs: start,
          delayMs: previous === null ? 0 : Math.max(0, start - previous.endMs),
          inputLength: history.length,
          outputLength: Math.max(...counted) >= 0 ? Math.max(...counted) : answer.length,
          hashIds: hashIds.of(history),
        });
        previous = { id, endMs: Math.max(...said.map((r) => r.timestampMs)) };
      }
      for (const next of answer) history.push(next);
      for (const r of after) for (const next of await tokenize(render(r, tools), r.where)) history.push(next);
      requestStart = after.length > 0 ? after[after.length - 1].timestampMs : null;
    }
  }
  return { requests, skipped };
}
