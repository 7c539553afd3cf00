/**
 * `mocker rerun GOLDEN --target URL`: the golden capture's requests sent again, as their clients sent them,
 * through a capture proxy in front of the target (the same engine detection and token-id dialects as `capture`)
 * into a new capture file; then both files compared (src/rerun/). Exit 0: no regression; 1: regressions; 2: it
 * could not run.
 */
import { resolve } from 'node:path';
import { Command, Option } from 'commander';
import { DEFAULT_REDACTED_HEADERS } from '../capture/forward.js';
import { compareRerun } from '../rerun/compare.js';
import { formatRerunReport } from '../rerun/format.js';
import { rerunHtml } from '../rerun/htmlReport.js';
import { junitXml } from '../rerun/junit.js';
import { goldenRequests, type RerunRequest } from '../rerun/requests.js';
import { sendRequests, type Pacing } from '../rerun/send.js';
import { CaptureStore, namingCapture } from '../store/captureStore.js';
import { checkOutput, writeOutputFile } from '../util/outputFile.js';
import { progressReporter } from '../util/progress.js';
import { terminalJson, terminalText } from '../util/terminalText.js';
import { startCapture } from './capture.js';
import { ExitError } from './exit.js';
import { forceOption, number } from './flags.js';
import { GROUPS, laterDefault } from './help.js';
import { DEFAULT_UPSTREAM_TIMEOUT_MS } from '../config/commonSettings.js';

/** diff(1)'s exit code for trouble: the rerun could not run. */
const COULD_NOT_RUN = 2;
const DEFAULT_LIMIT = 20;

interface RerunOptions {
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

export async function runRerun(golden: string, o: RerunOptions): Promise<number> {
  const output = o.output ?? defaultOutput();
  const headers: Record<string, string> = Object.fromEntries(o.header.map(parseHeader));
  const apiKey = o.apiKey ?? process.env.OPENAI_API_KEY;
  if (apiKey !== undefined && apiKey !== '') headers.Authorization = `Bearer ${apiKey}`;
  const pacing: Pacing = o.asCaptured ? { kind: 'as-captured', speedup: o.speedup } : { kind: 'concurrency', concurrency: o.concurrency };
  if (!o.asCaptured && o.speedup !== 1) throw new ExitError('--speedup divides the captured arrival times: it needs --as-captured', COULD_NOT_RUN);

  let requests: RerunRequest[];
  let skipped: { reason: string; count: number }[];
  let tokenizer: ReturnType<typeof goldenTokenizer>;
  try {
    checkOutput(output, { inputs: [golden] });
    const reports = [o.junit, o.reportHtml].filter((path) => path !== undefined);
    for (const path of reports) {
      if (resolve(path) === resolve(output)) throw new ExitError(`${path} is also -o: the rerun's capture file and its report are two files`, COULD_NOT_RUN);
      checkOutput(path, { inputs: [golden], force: o.force });
    }
    if (reports.length === 2 && resolve(reports[0]) === resolve(reports[1]))
      throw new ExitError(`--junit and --report-html both name ${reports[0]}`, COULD_NOT_RUN);
    ({ requests, skipped } = goldenRequests(golden));
    tokenizer = goldenTokenizer(golden);
  } catch (err) {
    return couldNotRun(err);
  }
  if (requests.length === 0) throw new ExitError(`${golden} holds no complete exchange to send again`, COULD_NOT_RUN);

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

  const report = await compareRerun({ golden, candidate: output, target: o.target, skipped }).catch(couldNotRun);
  const sent = report.exchanges.filter((e) => e.verdict !== 'not-compared');
  const unanswered = sent.filter((e) => e.status.candidate === null);
  if (unanswered.length === sent.length)
    throw new ExitError(
      `${o.target} answered none of the ${sent.length} request(s) (${unanswered[0]?.note ?? 'no answer'}); what was tried is in ${output}`,
      COULD_NOT_RUN,
    );
  const refused = sent.filter((e) => e.status.candidate === 401 || e.status.candidate === 403);
  if (refused.length === sent.length)
    throw new ExitError(
      `${o.target} refused every request (${refused[0].status.candidate}): give its key with --api-key or --header; what was tried is in ${output}`,
      COULD_NOT_RUN,
    );
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

export function rerunCommand(): Command {
  const command = new Command('rerun')
    .description(
      "Send a golden capture's requests again, each as its client sent it, to a new build (--target), record its answers as a new capture file, and report what changed: " +
        'prompt token ids (preprocessing), outputs, timing. Exit 0: no regression; 1: regressions; 2: it could not run.',
    )
    .argument('<file>', 'the golden capture file (read only)')
    .optionsGroup(GROUPS.target)
    .requiredOption('--target <url>', 'the server to check (any engine `capture` speaks to)')
    .option(
      '--header <header>',
      'add this header to every request ("Name: value"; repeatable); stored secrets never exist, so keys come from here or --api-key',
      (v: string, prev: string[]) => [...prev, v],
      [] as string[],
    )
    .addOption(laterDefault(new Option('--api-key <key>', 'send Authorization: Bearer <key>'), '$OPENAI_API_KEY when set'))
    .option(
      '--upstream-timeout <ms>',
      'give up on an answer after this long without a byte from the target',
      number('--upstream-timeout', { integer: true, min: 1 }),
      DEFAULT_UPSTREAM_TIMEOUT_MS,
    )
    .option('--upstream-ca-certs <file>', "CA certificates (PEM) an https: target's certificate is checked against, instead of Node's")
    .optionsGroup(GROUPS.pacing)
    .option('--concurrency <n>', 'requests in flight at once, each sent when one ends', number('--concurrency', { integer: true, min: 1 }), 1)
    .addOption(new Option('--as-captured', 'send each request at its captured arrival time instead (see --speedup)').conflicts('concurrency'))
    .option('--speedup <x>', 'with --as-captured: divide the captured arrival times by x', number('--speedup', { above: 0 }), 1)
    .optionsGroup(GROUPS.output)
    .addOption(
      laterDefault(new Option('-o, --output <file>', "the new capture file of the target's answers (never an existing file)"), 'captures/rerun-<UTC time>.db'),
    )
    .option('--json', 'print the report as JSON')
    .option('--junit <file>', 'also write the report as JUnit XML, one test case per exchange (for CI systems)')
    .option('--report-html <file>', 'also write the report as one self-contained HTML page: the exchanges side by side, timing CDFs')
    .option('--limit <n>', 'describe at most n differing exchanges (all are counted)', number('--limit', { integer: true, min: 1 }), DEFAULT_LIMIT)
    .addOption(forceOption())
    .action(async (file: string, o: RerunOptions) => {
      process.exitCode = await runRerun(file, o);
    });
  // A usage error is one more way of not running: 2, as every other.
  command.configureOutput({ outputError: () => undefined }).exitOverride((err) => {
    if (err.exitCode === 0) process.exit(0);
    throw new ExitError(err.message.replace(/^error: /, ''), COULD_NOT_RUN);
  });
  return command;
}
