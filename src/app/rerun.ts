/**
 * `mocker rerun GOLDEN --target URL`: the golden capture's requests sent again, as their clients sent them,
 * through a capture proxy in front of the target (the same engine detection and token-id dialects as `capture`)
 * into a new capture file; then both files compared (src/rerun/). Exit 0: no regression; 1: regressions; 2: it
 * could not run.
 */
import { resolve } from 'node:path';
import { DEFAULT_REDACTED_HEADERS } from '../capture/forward.js';
import { compareRerun } from '../rerun/compare.js';
import { formatRerunReport } from '../rerun/format.js';
import { rerunHtml } from '../rerun/htmlReport.js';
import { junitXml } from '../rerun/junit.js';
import type { RerunReport } from '../rerun/report.js';
import { goldenRequests, type RerunRequest } from '../rerun/requests.js';
import { sendRequests, type Pacing } from '../rerun/send.js';
import { CaptureStore, namingCapture } from '../store/captureStore.js';
import { startCapture } from './capture.js';
import { COULD_NOT_RUN, ExitError } from '../util/exitError.js';
import { checkOutput, writeOutputFile } from '../util/outputFile.js';
import { progressReporter } from '../util/progress.js';
import { terminalJson, terminalText } from '../util/terminalText.js';

export interface RerunOptions {
  target: string;
  output?: string;
  concurrency: number;
  asCaptured?: boolean;
  speedup: number;
  header: string[];
  apiKey?: string;
  upstreamTimeout: number;
  upstreamCaCerts?: string;
  json?: boolean;
  junit?: string;
  reportHtml?: string;
  limit: number;
  force?: boolean;
}

/** `captures/rerun-20261128-193012.db`: a new file per run, in the working directory's captures/. */
function defaultOutput(now = new Date()): string {
  const stamp = now.toISOString().replace(/[-:]/g, '').replace('T', '-').slice(0, 15);
  return `captures/rerun-${stamp}.db`;
}

/** RFC 9110's token (a header's name) and a field value without line breaks or other control characters. */
const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
const HEADER_VALUE = /^[^\x00-\x08\x0a-\x1f\x7f]*$/;

function parseHeader(text: string): [string, string] {
  const colon = text.indexOf(':');
  const [name, value] = [text.slice(0, colon).trim(), text.slice(colon + 1).trim()];
  if (colon <= 0 || !HEADER_NAME.test(name) || !HEADER_VALUE.test(value))
    throw new ExitError(`--header "${text}": expected "Name: value" (a name of letters, digits and !#$%&'*+.^_\`|~-, a value on one line)`, COULD_NOT_RUN);
  return [name, value];
}

/** The golden file's tokenizer (its latest run's): the rerun's local tokenization, where needed, is the golden's. */
function goldenTokenizer(file: string): { name: string; files: Map<string, Buffer> } | undefined {
  const store = CaptureStore.open(file, { readonly: true });
  try {
    return namingCapture(file, () => {
      const run = store.latestRun();
      const files = run ? store.tokenizerFiles(run) : new Map<string, Buffer>();
      return run && files.has('tokenizer.json') ? { name: run.tokenizerName ?? 'captured', files } : undefined;
    });
  } finally {
    store.close();
  }
}

const couldNotRun = (err: unknown): never => {
  throw err instanceof ExitError ? err : new ExitError((err as Error).message, COULD_NOT_RUN);
};

/**
 * `mocker rerun`: the golden requests sent through a capture proxy (`startCapture`) in front of the target, then
 * both files compared. Resolves with the exit code (0: no regression, 1: regressions); throws an ExitError of
 * COULD_NOT_RUN when it could not run.
 */
export async function runRerun(golden: string, o: RerunOptions): Promise<number> {
  const output = o.output ?? defaultOutput();
  const headers: Record<string, string> = Object.fromEntries(o.header.map(parseHeader));
  const apiKey = o.apiKey ?? process.env.OPENAI_API_KEY;
  if (apiKey !== undefined && apiKey !== '') headers.Authorization = `Bearer ${apiKey}`;
  if (!o.asCaptured && o.speedup !== 1) throw new ExitError('--speedup divides the captured arrival times: it needs --as-captured', COULD_NOT_RUN);
  const sent = readGolden(golden, output, o);
  await record(golden, output, o, sent, headers);

  const report = await compareRerun({ golden, candidate: output, target: o.target, skipped: sent.skipped }).catch(couldNotRun);
  checkAnswered(report, o.target, output);
  console.log(o.json ? terminalJson(report) : terminalText(formatRerunReport(report, o.limit), { keepNewlines: true }));
  const rules = { inputs: [golden, output], force: o.force };
  try {
    if (o.junit !== undefined) await writeOutputFile(o.junit, rules, (write) => write(junitXml(report)));
    if (o.reportHtml !== undefined) await writeOutputFile(o.reportHtml, rules, (write) => write(rerunHtml(report)));
  } catch (err) {
    return couldNotRun(err);
  }
  return report.regression ? 1 : 0;
}

/** What is sent again, and how the golden file tokenizes (checked with the output files before anything is sent). */
interface GoldenRequests {
  requests: RerunRequest[];
  skipped: { reason: string; count: number }[];
  tokenizer: ReturnType<typeof goldenTokenizer>;
}

function readGolden(golden: string, output: string, o: RerunOptions): GoldenRequests {
  let read: GoldenRequests;
  try {
    checkOutput(output, { inputs: [golden] });
    const reports = [o.junit, o.reportHtml].filter((path) => path !== undefined);
    for (const path of reports) {
      if (resolve(path) === resolve(output)) throw new ExitError(`${path} is also -o: the rerun's capture file and its report are two files`, COULD_NOT_RUN);
      checkOutput(path, { inputs: [golden], force: o.force });
    }
    if (reports.length === 2 && resolve(reports[0]) === resolve(reports[1]))
      throw new ExitError(`--junit and --report-html both name ${reports[0]}`, COULD_NOT_RUN);
    read = { ...goldenRequests(golden), tokenizer: goldenTokenizer(golden) };
  } catch (err) {
    return couldNotRun(err);
  }
  if (read.requests.length === 0) throw new ExitError(`${golden} holds no complete exchange to send again`, COULD_NOT_RUN);
  return read;
}

/** The golden requests sent through a capture proxy in front of the target, recorded into `output`. */
async function record(
  golden: string,
  output: string,
  o: RerunOptions,
  { requests, tokenizer }: GoldenRequests,
  headers: Record<string, string>,
): Promise<void> {
  const pacing: Pacing = o.asCaptured ? { kind: 'as-captured', speedup: o.speedup } : { kind: 'concurrency', concurrency: o.concurrency };
  const proxy = await startCapture({
    upstream: o.target,
    captures: output,
    host: '127.0.0.1',
    port: 0,
    label: `rerun of ${resolve(golden)}`,
    upstreamTimeoutMs: o.upstreamTimeout,
    // The golden requests were accepted once: none is refused for its size now.
    maxBodyBytes: requests.reduce((most, r) => Math.max(most, r.body.length), 1),
    // What --header adds may be a secret too: never stored.
    redactHeaders: [...DEFAULT_REDACTED_HEADERS, ...Object.keys(headers)],
    upstreamCaCerts: o.upstreamCaCerts,
    tokenizer,
    quiet: true,
  }).catch(couldNotRun);
  console.error(
    `mocker rerun: sending ${requests.length} request(s) of ${golden} to ${o.target} (${o.asCaptured ? `as captured${o.speedup !== 1 ? `, ${o.speedup}x faster` : ''}` : `${o.concurrency} at a time`}), recording into ${output}`,
  );
  const progress = progressReporter('rerun', true, requests.length);
  const started = performance.now();
  try {
    await sendRequests(new URL(`http://127.0.0.1:${proxy.port}`), requests, {
      pacing,
      headers,
      onDone: (done) => progress.update(done, performance.now() - started),
    });
  } finally {
    progress.stop();
    await proxy.close(0);
  }
}

/** A target that answered nothing, or refused everything, is no rerun: it could not run. */
function checkAnswered(report: RerunReport, target: string, output: string): void {
  const sent = report.exchanges.filter((e) => e.verdict !== 'not-compared');
  const unanswered = sent.filter((e) => e.status.candidate === null);
  if (unanswered.length === sent.length)
    throw new ExitError(
      `${target} answered none of the ${sent.length} request(s) (${unanswered[0]?.note ?? 'no answer'}); what was tried is in ${output}`,
      COULD_NOT_RUN,
    );
  const refused = sent.filter((e) => e.status.candidate === 401 || e.status.candidate === 403);
  if (refused.length === sent.length)
    throw new ExitError(
      `${target} refused every request (${refused[0].status.candidate}): give its key with --api-key or --header; what was tried is in ${output}`,
      COULD_NOT_RUN,
    );
}
