/**
 * `mocker captures verify`: every complete exchange of a capture file rendered again by mocker's own response
 * rendering (the `PlanRenderer` `serve` answers with) from its stored token ids, and compared with the bytes the
 * engine sent: the measure of mocker's postprocessing fidelity.
 */
import { parseResponse, type ParsedResponse } from '../capture/extract.js';
import type { ChoicePlan, EndpointKind } from '../generation/plan.js';
import { ApiError } from '../wire/errors.js';
import { PlanRenderer } from '../api/planRenderer.js';
import { DONE_EVENT, includesUsage, restamp, type RenderContext } from '../api/render.js';
import { generateTokensChunk, generateTokensRequest, generateTokensResponse, generateTokensUsageChunk } from '../api/generateTokens.js';
import { wireOfEngine } from '../wire/shapes.js';
import { chatRequest, completionRequest, parseBody } from '../api/schemas.js';
import { CaptureStore, isGeneration, namingCapture, type StoredExchange } from '../store/captureStore.js';
import { outputIdsCheck, type OutputIdsVerdict } from './outputIds.js';
import { RunTokenizers } from './runTokenizers.js';

type Json = Record<string, unknown>;

/**
 * `bytes`: a vLLM run whose engine returned the token ids: every byte but `id` and `created` (vLLM makes them
 * per request). `content`: any other engine (llama.cpp, transformers, SGLang…) or ids mocker tokenized itself —
 * their bytes are not vLLM's format, so what is compared is what a client reads: each choice's text, its
 * finish reason, and the usage counts (the prompt's only, when the output ids are mocker's tokenization).
 */
export type Comparison = 'bytes' | 'content';

/** What a difference looks like, where it is recognisable. */
export type DifferenceKind =
  | 'split UTF-8 character'
  | 'chunking boundaries'
  | 'stop string'
  | 'stop_reason'
  | 'finish_reason'
  | 'usage field'
  | 'token ids'
  | 'content'
  | 'serialization';

export interface Mismatch {
  exchangeId: number;
  endpoint: EndpointKind | 'generate';
  stream: boolean;
  engine: string | null;
  comparison: Comparison;
  /** The SSE event (0-based) of a stream where the first difference is; null for a body or a content comparison. */
  event: number | null;
  /** JSON path of the first difference inside the event or body (null: not JSON on one side, or an event missing). */
  path: string | null;
  captured: unknown;
  rendered: unknown;
  /** Offset in the stored response bytes of the first differing byte (byte comparisons). */
  byteOffset: number | null;
  kind: DifferenceKind | null;
}

export interface VerifyReport {
  file: string;
  exchanges: number;
  verified: number;
  matched: number;
  mismatched: number;
  skipped: number;
  /** Skipped exchanges by reason. */
  skippedBy: Record<string, number>;
  /** Verified exchanges by how they were compared. */
  comparedBy: Record<Comparison, number>;
  /** The first `limit` mismatching exchanges, one difference each (the first). */
  mismatches: Mismatch[];
  /** Exchanges with choices, by whether their output ids are the engine's own (outputIds.ts). */
  outputIds: Record<OutputIdsVerdict, number>;
  /** The first `limit` exchanges whose output ids are not the engine's. */
  notTheEnginesIds: number[];
}

export interface VerifyOptions {
  /** How many mismatching exchanges are described (all are counted). */
  limit: number;
}

/** Where and what the first difference of an exchange is. */
type Difference = Pick<Mismatch, 'event' | 'path' | 'captured' | 'rendered' | 'byteOffset' | 'kind'>;

type Outcome = { type: 'match'; comparison: Comparison } | { type: 'mismatch'; mismatch: Mismatch } | { type: 'skip'; reason: string };

const ABSENT = '(absent)';

/** The first place two JSON values differ, keys in the captured value's order first. */
function firstDifference(captured: unknown, rendered: unknown, path: string): { path: string; captured: unknown; rendered: unknown } | null {
  if (Array.isArray(captured) && Array.isArray(rendered)) {
    for (let i = 0; i < Math.max(captured.length, rendered.length); i++) {
      const at = `${path}[${i}]`;
      if (i >= captured.length || i >= rendered.length)
        return { path: at, captured: i < captured.length ? captured[i] : ABSENT, rendered: i < rendered.length ? rendered[i] : ABSENT };
      const d = firstDifference(captured[i], rendered[i], at);
      if (d) return d;
    }
    return null;
  }
  const isObject = (v: unknown): v is Json => v !== null && typeof v === 'object' && !Array.isArray(v);
  if (isObject(captured) && isObject(rendered)) {
    for (const key of new Set([...Object.keys(captured), ...Object.keys(rendered)])) {
      const at = path === '' ? key : `${path}.${key}`;
      if (!(key in captured) || !(key in rendered))
        return { path: at, captured: key in captured ? captured[key] : ABSENT, rendered: key in rendered ? rendered[key] : ABSENT };
      const d = firstDifference(captured[key], rendered[key], at);
      if (d) return d;
    }
    return null;
  }
  return Object.is(captured, rendered) ? null : { path, captured, rendered };
}

const ID_AND_CREATED = /^(?:data: )?\{"id":("[^"]*"),"object":"[^"]*","created":(\d+)/;

/** The event's JSON payload, or undefined when it is not JSON. */
function payload(event: string): unknown {
  try {
    return JSON.parse(event.startsWith('data: ') ? event.slice(6) : event);
  } catch {
    return undefined;
  }
}

function isMultiByteEdge(text: unknown): boolean {
  if (typeof text !== 'string' || text === '') return false;
  const chars = [...text];
  return Buffer.byteLength(chars[0]) > 1 || Buffer.byteLength(chars[chars.length - 1]) > 1;
}

/** Names a text, finish, stop, usage or id difference; `sameText`: each choice's whole text is the same on both sides. */
function classify(path: string, captured: unknown, rendered: unknown, sameText: boolean, stopStrings: boolean): DifferenceKind | null {
  if (/(^|\.)usage(\.|$)/.test(path)) return 'usage field';
  if (path.endsWith('stop_reason')) return 'stop_reason';
  if (path.endsWith('finish_reason')) return 'finish_reason';
  if (path.endsWith('token_ids') || /token_ids\[\d+\]$/.test(path)) return 'token ids';
  if (/\.(content|text)$/.test(path)) {
    if ([captured, rendered].some((v) => typeof v === 'string' && v.includes('\uFFFD'))) return 'split UTF-8 character';
    if (sameText) return isMultiByteEdge(captured) || isMultiByteEdge(rendered) ? 'split UTF-8 character' : 'chunking boundaries';
    return stopStrings ? 'stop string' : 'content';
  }
  return null;
}

/** A stream's events as text (each with its `\n\n`), or a body as its one "event". */
function renderedEvents(text: string, stream: boolean): string[] {
  if (!stream) return [text];
  return text.split(/(?<=\n\n)/).filter((e) => e !== '');
}

function capturedEvents(ex: StoredExchange): { text: string; start: number }[] {
  if (!ex.stream) return [{ text: ex.responseBody.toString('utf8'), start: 0 }];
  return ex.eventEnds.map((end, i) => {
    const start = i === 0 ? 0 : ex.eventEnds[i - 1];
    return { text: ex.responseBody.toString('utf8', start, end), start };
  });
}

function eventEndsOf(events: string[]): number[] {
  let at = 0;
  return events.map((e) => (at += Buffer.byteLength(e)));
}

class Verifier {
  private readonly tokenizers: RunTokenizers;

  constructor(store: CaptureStore) {
    this.tokenizers = new RunTokenizers(store);
  }

  async verify(ex: StoredExchange): Promise<Outcome> {
    if (ex.outcome !== 'complete') return { type: 'skip', reason: ex.outcome };
    // Embeddings and rerank answers are stored and replayed whole: there is nothing of mocker's to render.
    if (ex.endpoint === 'generate') return this.verifyGenerate(ex);
    if (ex.endpoint === 'responses' || ex.endpoint === 'messages') return { type: 'skip', reason: `${ex.endpoint} (not rendered by mocker yet)` };
    if (!isGeneration(ex.endpoint)) return { type: 'skip', reason: 'not a generation' };
    if (ex.status !== 200) return { type: 'skip', reason: `HTTP ${ex.status}` };
    const kind = ex.endpoint;
    let body: Json;
    try {
      body = JSON.parse(ex.requestBody.toString('utf8')) as Json;
    } catch {
      return { type: 'skip', reason: 'request body is not JSON' };
    }
    let req;
    try {
      req = kind === 'chat' ? parseBody(chatRequest, body) : parseBody(completionRequest, body);
    } catch (err) {
      if (err instanceof ApiError) return { type: 'skip', reason: 'a request mocker refuses' };
      throw err;
    }
    const wants = (v: unknown) => v !== undefined && v !== null && v !== false;
    if (wants(body.logprobs) || wants(body.prompt_logprobs)) return { type: 'skip', reason: 'logprobs requested' };
    if (wants(body.echo)) return { type: 'skip', reason: 'echo requested' };
    if (wants(body.kv_transfer_params)) return { type: 'skip', reason: 'a prefill/decode hop (kv_transfer_params)' };
    if (kind === 'completion' && Array.isArray(body.prompt) && body.prompt.length > 0 && typeof body.prompt[0] !== 'number')
      return { type: 'skip', reason: 'a batched completion' };
    if (ex.promptIds === null) return { type: 'skip', reason: 'no prompt token ids' };
    if (ex.generations.length === 0) return { type: 'skip', reason: 'no choices' };
    if (ex.generations.some((g) => g.outputIds.length === 0 && g.text !== '')) return { type: 'skip', reason: 'no output token ids' };
    if (ex.generations.some((g) => g.finishReason === null)) return { type: 'skip', reason: 'a choice without finish_reason' };
    const field = kind === 'chat' ? 'content' : 'text';
    if (ex.generations.some((g) => g.chunkDeltas.some((d) => Object.keys(d).some((k) => k !== field)))) {
      return { type: 'skip', reason: 'reasoning or tool calls (a parser output, not rendered from token ids)' };
    }
    const { run, tokenizer } = this.tokenizers.get(ex.runId);
    if (!run || !tokenizer) return { type: 'skip', reason: 'the run stored no tokenizer' };

    const comparison: Comparison = run.engine === 'vllm' && ex.tokenSource === 'engine' ? 'bytes' : 'content';
    const plans: ChoicePlan[] = ex.generations.map((g) => {
      let end = 0;
      return {
        tokenIds: g.outputIds,
        chunks: g.chunkTokens.map((count) => ({ end: (end += count) })),
        finishReason: g.finishReason!,
        stopReason: g.stopReason,
      };
    });
    // The shape the capture's engine answers in; vLLM 0.11's (what mocker rendered before `--wire`) when not known.
    const wire = wireOfEngine(run.engine, run.engineVersion) ?? 'vllm-0.11';
    const ctx: RenderContext = {
      kind,
      wire,
      id: 'verify',
      created: 0,
      model: req.model ?? ex.model ?? '',
      // The proxy asked for the ids the client did not: the stored bytes carry them.
      returnTokenIds: req.return_token_ids === true || ex.injected.includes('return_token_ids'),
      promptTokenIds: ex.promptIds,
    };
    const renderer = new PlanRenderer(ctx, [ex.promptIds], [plans], tokenizer, req.skip_special_tokens ?? true, ex.stream);
    // The engine steps every choice at once: chunk k of each choice, in choice order, then chunk k + 1.
    let text = renderer.opening();
    for (let k = 0; k < Math.max(...plans.map((p) => p.chunks.length)); k++) {
      for (const [s, plan] of plans.entries()) if (k < plan.chunks.length) text += await renderer.advance(s, plan.chunks[k].end);
    }
    const details = (ex.usage as { prompt_tokens_details?: { cached_tokens?: number } | null } | undefined)?.prompt_tokens_details;
    const cached = typeof details?.cached_tokens === 'number' ? details.cached_tokens : null;
    text += ex.stream ? renderer.streamEnd(includesUsage(wire, ex.stream, req.stream_options), cached) : renderer.body(cached);

    const events = renderedEvents(text, ex.stream);
    const renderedBody = Buffer.from(text);
    // What a client reads of each side: each choice's whole text, its finish, the usage.
    const capturedRead = parseResponse(kind, ex.stream, ex.responseBody, ex.eventEnds, [], 0);
    const renderedRead = parseResponse(kind, ex.stream, renderedBody, eventEndsOf(events), [], 0);
    const sameText =
      capturedRead.generations.length === renderedRead.generations.length &&
      capturedRead.generations.every((g, i) => g.text === renderedRead.generations[i].text);
    const stopStrings = req.stop !== null && req.stop !== undefined && req.stop.length > 0;
    const base = { exchangeId: ex.id, endpoint: kind, stream: ex.stream, engine: run.engine ?? null, comparison };
    const mismatch =
      comparison === 'bytes'
        ? this.compareBytes(ex, events, sameText, stopStrings)
        : compareContent(kind, capturedRead, renderedRead, ex.tokenSource === 'engine', stopStrings);
    return mismatch ? { type: 'mismatch', mismatch: { ...base, ...mismatch } } : { type: 'match', comparison };
  }

  /**
   * vLLM's generate: its answer rendered again from the stored ids, chunk for chunk, under the captured
   * request_id, model and created (what vLLM makes per request), compared byte for byte.
   */
  private verifyGenerate(ex: StoredExchange): Outcome {
    if (ex.status !== 200) return { type: 'skip', reason: `HTTP ${ex.status}` };
    const [g] = ex.generations;
    if (ex.promptIds === null || ex.generations.length !== 1 || g.finishReason === null)
      return { type: 'skip', reason: 'no prompt ids or no single finished choice' };
    let req;
    let first: Json;
    try {
      // The default max_tokens is not rendered: any context length reads the request alike.
      req = generateTokensRequest(JSON.parse(ex.requestBody.toString('utf8')), Number.MAX_SAFE_INTEGER);
      first = JSON.parse(capturedEvents(ex)[0].text.replace(/^data: /, '')) as Json;
    } catch {
      return { type: 'skip', reason: 'a request mocker refuses' };
    }
    const ctx = { id: String(first.request_id), model: String(first.model ?? ''), created: Number(first.created ?? 0), promptTokens: ex.promptIds.length };
    let text: string;
    if (!ex.stream) text = generateTokensResponse(ctx, g.outputIds, g.finishReason);
    else {
      text = '';
      let end = 0;
      for (const [i, count] of g.chunkTokens.entries()) {
        const last = i === g.chunkTokens.length - 1;
        text += generateTokensChunk(ctx, g.outputIds.slice(end, end + count), last ? g.finishReason : null, req.continuousUsage ? end + count : null);
        end += count;
      }
      if (req.includeUsage) text += generateTokensUsageChunk(ctx, end);
      text += DONE_EVENT;
    }
    const mismatch = this.compareBytes(ex, renderedEvents(text, ex.stream), true, false);
    const base = {
      exchangeId: ex.id,
      endpoint: 'generate' as const,
      stream: ex.stream,
      engine: this.tokenizers.get(ex.runId).run?.engine ?? null,
      comparison: 'bytes' as const,
    };
    return mismatch ? { type: 'mismatch', mismatch: { ...base, ...mismatch } } : { type: 'match', comparison: 'bytes' };
  }

  private compareBytes(ex: StoredExchange, rendered: string[], sameText: boolean, stopStrings: boolean): Difference | null {
    const captured = capturedEvents(ex);
    for (let i = 0; i < Math.max(captured.length, rendered.length); i++) {
      const event = ex.stream ? i : null;
      const cap = captured[i];
      if (!cap || rendered[i] === undefined) {
        return {
          event,
          path: null,
          captured: cap?.text ?? ABSENT,
          rendered: rendered[i] ?? ABSENT,
          byteOffset: cap?.start ?? ex.responseBody.length,
          kind: 'chunking boundaries',
        };
      }
      const stamp = ID_AND_CREATED.exec(cap.text);
      const ren = stamp ? restamp(rendered[i], JSON.parse(stamp[1]) as string, Number(stamp[2])) : rendered[i];
      if (ren === cap.text) continue;
      const a = Buffer.from(cap.text);
      const b = Buffer.from(ren);
      let at = 0;
      while (at < a.length && at < b.length && a[at] === b[at]) at++;
      const capJson = payload(cap.text.trimEnd());
      const renJson = payload(ren.trimEnd());
      if (capJson === undefined || renJson === undefined) {
        const around = (buf: Buffer) => buf.toString('utf8', Math.max(0, at - 20), at + 20);
        return { event, path: null, captured: around(a), rendered: around(b), byteOffset: cap.start + at, kind: null };
      }
      const d = firstDifference(capJson, renJson, '');
      if (!d) return { event, path: null, captured: cap.text, rendered: ren, byteOffset: cap.start + at, kind: 'serialization' };
      return {
        event,
        path: d.path,
        captured: d.captured,
        rendered: d.rendered,
        byteOffset: cap.start + at,
        kind: classify(d.path, d.captured, d.rendered, sameText, stopStrings),
      };
    }
    return null;
  }
}

/**
 * Not vLLM's bytes: what a client reads (each choice's text and finish, the usage counts). Output ids the engine
 * did not send are mocker's tokenization of the text: their count is not the engine's, so only the prompt's is
 * compared then.
 */
function compareContent(kind: EndpointKind, captured: ParsedResponse, rendered: ParsedResponse, engineIds: boolean, stopStrings: boolean): Difference | null {
  const field = kind === 'chat' ? 'content' : 'text';
  const summary = (parsed: ParsedResponse) => {
    const usage = (parsed.usage ?? null) as Json | null;
    const counts =
      usage &&
      (engineIds
        ? { prompt_tokens: usage.prompt_tokens, completion_tokens: usage.completion_tokens, total_tokens: usage.total_tokens }
        : { prompt_tokens: usage.prompt_tokens });
    return {
      choices: parsed.generations.map((g) => ({ [field]: g.text, finish_reason: g.finishReason })),
      // A stream without include_usage has none to compare.
      ...(captured.usage ? { usage: counts } : {}),
    };
  };
  const d = firstDifference(summary(captured), summary(rendered), '');
  if (!d) return null;
  return {
    event: null,
    path: d.path,
    captured: d.captured,
    rendered: d.rendered,
    byteOffset: null,
    kind: classify(d.path, d.captured, d.rendered, false, stopStrings),
  };
}

export async function verifyCaptures(file: string, options: VerifyOptions): Promise<VerifyReport> {
  const store = CaptureStore.open(file, { readonly: true });
  try {
    return await namingCapture(file, () => verifyStore(store, file, options));
  } finally {
    store.close();
  }
}

/** Every exchange of an open file (its pages checked first: damage anywhere fails the verification). */
async function verifyStore(store: CaptureStore, file: string, options: VerifyOptions): Promise<VerifyReport> {
  store.checkIntegrity();
  const verifier = new Verifier(store);
  const report: VerifyReport = {
    file,
    exchanges: 0,
    verified: 0,
    matched: 0,
    mismatched: 0,
    skipped: 0,
    skippedBy: {},
    comparedBy: { bytes: 0, content: 0 },
    mismatches: [],
    outputIds: { engine: 0, 'as-generated': 0, unchecked: 0, 'not-the-engines': 0 },
    notTheEnginesIds: [],
  };
  for (const id of store.exchangeIds()) {
    const ex = store.getExchange(id)!; // listed a moment ago, by this reader alone
    report.exchanges++;
    if (ex.generations.length > 0) {
      const { verdict } = outputIdsCheck(ex);
      report.outputIds[verdict]++;
      if (verdict === 'not-the-engines' && report.notTheEnginesIds.length < options.limit) report.notTheEnginesIds.push(ex.id);
    }
    const outcome = await verifier.verify(ex);
    if (outcome.type === 'skip') {
      report.skipped++;
      report.skippedBy[outcome.reason] = (report.skippedBy[outcome.reason] ?? 0) + 1;
      continue;
    }
    report.verified++;
    if (outcome.type === 'match') {
      report.matched++;
      report.comparedBy[outcome.comparison]++;
    } else {
      report.mismatched++;
      report.comparedBy[outcome.mismatch.comparison]++;
      if (report.mismatches.length < options.limit) report.mismatches.push(outcome.mismatch);
    }
  }
  return report;
}

const show = (value: unknown) => (typeof value === 'string' ? JSON.stringify(value) : (JSON.stringify(value) ?? String(value)));

/** The report as lines for a terminal. */
export function formatVerifyReport(report: VerifyReport): string {
  const lines = report.mismatches.map((m) => {
    const where = [m.event !== null ? `event ${m.event}` : m.stream ? null : 'body', m.path ?? null, m.byteOffset !== null ? `byte ${m.byteOffset}` : null]
      .filter((x) => x !== null)
      .join(', ');
    const what = `${m.endpoint}${m.stream ? ' stream' : ''}, ${m.engine ?? 'unknown engine'}, ${m.comparison}`;
    return `exchange ${m.exchangeId} (${what}): ${where}: captured ${show(m.captured)}, rendered ${show(m.rendered)}${m.kind ? ` — ${m.kind}` : ''}`;
  });
  if (report.mismatched > report.mismatches.length) lines.push(`… and ${report.mismatched - report.mismatches.length} more mismatching exchanges (--limit)`);
  const skipped = Object.entries(report.skippedBy)
    .map(([reason, n]) => `${reason}: ${n}`)
    .join(', ');
  lines.push(
    `${report.file}: ${report.exchanges} exchanges, ${report.verified} verified (${report.comparedBy.bytes} by bytes, ${report.comparedBy.content} by content): ` +
      `${report.matched} match, ${report.mismatched} mismatch; ${report.skipped} skipped${skipped ? ` (${skipped})` : ''}`,
  );
  const ids = report.outputIds;
  lines.push(
    `output ids: ${ids.engine} the engine's own, ${ids['as-generated']} tokenized as many as generated, ${ids.unchecked} unchecked (no usage), ` +
      `${ids['not-the-engines']} not the engine's${report.notTheEnginesIds.length > 0 ? ` (exchanges ${report.notTheEnginesIds.join(', ')})` : ''}`,
  );
  return lines.join('\n');
}
