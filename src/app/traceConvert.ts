/**
 * `mocker trace convert INPUT… --to FORMAT [-o FILE]`: a capture file, or Claude Code session logs, as a text-free
 * trace (trace/convert.ts) that `mocker trace` (and Dynamo's replay) can run.
 */
import { once } from 'node:events';
import { readdirSync, statSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { namingCapture } from '../store/captureStore.js';
import { loadTokenizer } from '../tokenizer/index.js';
import { capturedConversations } from '../trace/capturedWorkload.js';
import { claudeLogRequests } from '../trace/claudeLog.js';
import { type ConvertedRequest, capturedRequests, traceLines } from '../trace/convert.js';
import type { TraceOutputFormat } from '../trace/traceFormats.js';
import { isSqlite, writeOutputFile } from '../util/outputFile.js';

export interface TraceConvertOptions {
  to: TraceOutputFormat;
  traceBlockSize: number;
  /** The trace file (none: standard output). */
  output?: string;
  force?: boolean;
}

/** The files named: a directory stands for its session logs (`*.jsonl`, Claude Code's prompt history left out). */
function inputFiles(inputs: readonly string[]): string[] {
  return inputs.flatMap((input) => {
    let directory: boolean;
    try {
      directory = statSync(input).isDirectory();
    } catch (err) {
      throw new Error(`cannot read ${input}: ${(err as Error).message}`);
    }
    if (!directory) return [input];
    const logs = readdirSync(input)
      .filter((name) => name.endsWith('.jsonl') && name !== 'history.jsonl')
      .sort()
      .map((name) => join(input, name));
    if (logs.length === 0) throw new Error(`${input}: a directory without session logs (*.jsonl)`);
    return logs;
  });
}

async function logRequests(files: readonly string[], traceBlockSize: number): Promise<ConvertedRequest[]> {
  const inputs = await Promise.all(
    files.map(async (name) => ({
      name,
      text: await readFile(name, 'utf8').catch((err: Error) => {
        throw new Error(`cannot read ${name}: ${err.message}`);
      }),
    })),
  );
  const { requests, skipped } = await claudeLogRequests(inputs, loadTokenizer(), traceBlockSize);
  if (requests.length === 0)
    throw new Error(
      `${files.join(', ')}: no request found: neither a capture file (SQLite) nor Claude Code session logs (JSONL rows with sessionId, type, timestamp and assistant messages)`,
    );
  if (skipped > 0) console.error(`mocker trace convert: ${skipped} answer(s) without a message before them skipped`);
  return requests;
}

/** Lines gathered into chunks of about this many characters per write. */
const CHUNK_CHARS = 1 << 16;

function* chunks(lines: Iterable<string>): Generator<string> {
  let chunk = '';
  for (const line of lines) {
    chunk += line;
    if (chunk.length >= CHUNK_CHARS) {
      yield chunk;
      chunk = '';
    }
  }
  if (chunk !== '') yield chunk;
}

export async function runTraceConvert(inputs: readonly string[], o: TraceConvertOptions): Promise<void> {
  const files = inputFiles(inputs);
  let requests: ConvertedRequest[];
  const capture = files.find(isSqlite);
  if (capture !== undefined) {
    if (files.length > 1) throw new Error(`convert one capture file at a time (${capture} is one; session logs may be several)`);
    const conversations = namingCapture(capture, () => capturedConversations(capture));
    for (const line of conversations.notes) console.error(`mocker trace convert: ${line}`);
    if (conversations.turns.length === 0) throw new Error(`capture file ${capture}: no complete exchange with prompt token ids to convert`);
    requests = capturedRequests(conversations, o.traceBlockSize);
  } else requests = await logRequests(files, o.traceBlockSize);

  const lines = chunks(traceLines(requests, o.to));
  if (o.output !== undefined) {
    await writeOutputFile(o.output, { inputs: files, force: o.force }, (write) => {
      for (const chunk of lines) write(chunk);
    });
  } else {
    for (const chunk of lines) if (!process.stdout.write(chunk)) await once(process.stdout, 'drain');
  }
  const sessions = new Set(requests.map((r) => r.sessionId)).size;
  console.error(
    `mocker trace convert: ${requests.length} request(s) in ${sessions} session(s) written to ${o.output ?? 'standard output'} as ${o.to} (${o.traceBlockSize} tokens per hash id)`,
  );
}
