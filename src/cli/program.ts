import { createRequire } from 'node:module';
import { Command, InvalidArgumentError, Option, type OptionValues } from 'commander';
import { runServeCommand } from '../app/serveCommand.js';
import { stopOnSignal } from '../app/shutdown.js';
import { CAPTURE_SETTINGS, checkedUrl, PD_PROXY_SETTINGS } from '../config/commonSettings.js';
import { resolveServeFlags } from '../config/resolveServe.js';
import { SERVE_SETTINGS } from '../config/serveSettings.js';
import { optionsFrom } from '../config/settings.js';
import { startPdProxy, type PdProxyOptions } from '../pd/proxy.js';
import { DEFAULT_REPORTS_DIR } from '../trace/report.js';
import { startCapture, type CaptureOptions } from './capture.js';
import { capturesExport, capturesImport, capturesList, capturesMerge, capturesPrune, capturesShow, capturesStats } from './captures.js';
import { fitCommand } from './capturesFit.js';
import { capturesDiffCommand, capturesVerifyCommand } from './capturesVerifyDiff.js';
import { applyEnvironment, npuMockCapture } from './environment.js';
import { forceOption, number } from './flags.js';
import { everyCommand, GROUPS, laterDefault, useOptionStyle } from './help.js';
import { addSettings } from './options.js';
import { rerunCommand } from './rerun.js';
import { runTrace } from './trace.js';

/** A URL flag's value, refused with the flag's name. */
function urlArg(flag: string, text: string): string {
  try {
    checkedUrl(flag, text);
  } catch (err) {
    throw new InvalidArgumentError((err as Error).message);
  }
  return text;
}

/** `mocker capture` from its flags (also `serve` under vLLM's NPU mock model's CAPTURE_MODE=1, which has them all but --label). */
// The table's paths are CaptureOptions' fields.
const startCaptureWith = (o: OptionValues) => startCapture(optionsFrom(CAPTURE_SETTINGS, o) as unknown as CaptureOptions);

/** The top-level help's examples: each runs in a clone after `npm ci`. */
export const EXAMPLES = `
Examples:
  # a simulated vLLM server on port 8000 (see mocker serve --help)
  npx mocker serve
  # record a real engine's answers through a proxy on port 8001
  npx mocker capture --upstream http://127.0.0.1:8000 --captures captures/golden.db
  # serve them again, with their captured timing
  npx mocker serve --mode replay --captures captures/golden.db
  # send the recorded requests to a new build and report what changed
  npx mocker rerun captures/golden.db --target http://127.0.0.1:8000
  # a synthetic workload through 4 simulated workers behind a KV-aware router
  npx mocker trace --input-tokens 1024 --output-tokens 128 --request-count 200 --num-workers 4 --router-mode kv_router`;

const { version } = createRequire(import.meta.url)('../../package.json') as { version: string };

/** The `mocker` program with every command, built without parsing (main.ts parses; scripts/cli-docs.ts documents it). */
// biome-ignore lint/complexity/noExcessiveLinesPerFunction: over 120 lines until it is split (issue 37, in progress)
export function buildProgram(): Command {
  const program = new Command('mocker')
    .description('Capture/replay proxy and engine simulator for LLM inference (vLLM-compatible).')
    .version(version, '-V, --version', 'print the mocker version')
    .showHelpAfterError()
    .hook('preAction', (_, action) => {
      // Servers and runners take their flags from the environment; the file tools of `mocker captures` (prune!) do not.
      if (action.parent !== program) return;
      const applied = applyEnvironment(action, process.env, everyCommand(program).slice(1));
      if (applied.length > 0) console.error(`mocker ${action.name()}: settings from the environment: ${applied.join(', ')}`);
    })
    .addHelpText('after', EXAMPLES);

  const serve = program.command('serve').description('Serve a vLLM-compatible API through a simulated vLLM scheduler: simulate, replay or random.');
  addSettings(serve, SERVE_SETTINGS).action(async (o, command: Command) => {
    // vLLM's NPU mock model's CAPTURE_MODE=1: the engine's own process recorded; here, the capture proxy on serve's address.
    if (npuMockCapture(process.env) && command.getOptionValueSource('mode') === 'default') {
      if (!o.upstream) throw new Error('CAPTURE_MODE=1 records a real engine: give its URL with --upstream (or MOCKER_UPSTREAM)');
      console.log('mocker serve: CAPTURE_MODE=1: running as mocker capture');
      await stopOnSignal('capture', startCaptureWith(o), o.shutdownTimeout);
      return;
    }
    await runServeCommand(resolveServeFlags(o, (attribute) => !['default', undefined].includes(command.getOptionValueSource(attribute))));
  });

  program
    .command('trace')
    .description(
      "Replay a Mooncake trace, a synthetic workload or a capture's traffic through simulated workers (offline or online) or against live servers; report like AIPerf (Dynamo's python -m dynamo.replay).",
    )
    .argument('[trace]', 'Mooncake JSONL trace (hash_ids, input_length, output_length, timestamp, session_id, delay)')
    .optionsGroup(GROUPS.input)
    .option(
      '--from-captures <file>',
      "replay a capture file's own requests (prompt ids, output lengths, arrival times) as load; answers are checked by mocker rerun",
    )
    .option('--trace-block-size <n>', 'tokens per hash id of the trace', number('--trace-block-size', { integer: true, min: 1 }), 512)
    .option('--input-tokens <n>', 'synthetic workload: prompt tokens per request', number('--input-tokens', { integer: true, min: 1 }))
    .option('--output-tokens <n>', 'synthetic workload: output tokens per request', number('--output-tokens', { integer: true, min: 1 }))
    .option('--request-count <n>', 'synthetic workload: requests (sessions when multi-turn)', number('--request-count', { integer: true, min: 1 }))
    .option('--arrival-interval-ms <ms>', 'synthetic workload: ms between arrivals (sessions)', number('--arrival-interval-ms', { min: 0 }), 1)
    .option('--turns-per-session <n>', 'synthetic workload: turns per session', number('--turns-per-session', { integer: true, min: 1 }), 1)
    .option(
      '--shared-prefix-ratio <r>',
      'synthetic workload: fraction of each prompt shared with its prefix group',
      number('--shared-prefix-ratio', { min: 0, below: 1.0000001 }),
      0,
    )
    .option('--num-prefix-groups <n>', 'synthetic workload: prefix groups sessions are drawn into', number('--num-prefix-groups', { integer: true, min: 0 }), 0)
    .option(
      '--inter-turn-delay-ms <ms>',
      "synthetic workload: ms after a turn completes before the session's next",
      number('--inter-turn-delay-ms', { min: 0 }),
      0,
    )
    .optionsGroup(GROUPS.replay)
    .addOption(
      laterDefault(
        new Option('--replay-mode <mode>', 'offline: virtual clock, as fast as possible | online: real time').choices(['offline', 'online']),
        'offline; online with --target',
      ),
    )
    .addOption(
      laterDefault(
        new Option('--speedup-ratio <x>', 'divide every simulated duration by this').argParser(number('--speedup-ratio', { above: 0 })),
        "the engine args' speedup_ratio, 1",
      ),
    )
    .option('--arrival-speedup-ratio <x>', 'divide arrival times and inter-turn delays by this', number('--arrival-speedup-ratio', { above: 0 }), 1)
    .option(
      '--replay-concurrency <n>',
      'closed loop: keep n requests in flight, ignoring arrival times',
      number('--replay-concurrency', { integer: true, min: 1 }),
    )
    .option('--seed <n>', 'seed of the synthetic workload, the engines and the router', number('--seed', { integer: true }), 42)
    .optionsGroup(GROUPS.replayWorkers)
    .addOption(new Option('--router-mode <mode>', 'how requests are spread over workers').choices(['round_robin', 'kv_router']).default('round_robin'))
    .addOption(
      laterDefault(
        new Option('--num-workers <n>', 'aggregated workers').argParser(number('--num-workers', { integer: true, min: 1 })),
        '1; with --target, one per target',
      ),
    )
    .addOption(
      laterDefault(
        new Option('--num-prefill-workers <n>', 'prefill workers of a disaggregated replay').argParser(
          number('--num-prefill-workers', { integer: true, min: 1 }),
        ),
        '1',
      ),
    )
    .addOption(
      laterDefault(
        new Option('--num-decode-workers <n>', 'decode workers of a disaggregated replay').argParser(number('--num-decode-workers', { integer: true, min: 1 })),
        '1',
      ),
    )
    .option('--extra-engine-args <json>', 'Dynamo mocker engine args of every aggregated worker (JSON file or inline object)')
    .option(
      '--prefill-engine-args <json>',
      'engine args of the prefill workers (disaggregated; kv_bytes_per_token and kv_transfer_bandwidth set the KV handoff)',
    )
    .option('--decode-engine-args <json>', 'engine args of the decode workers (disaggregated)')
    .option(
      '--router-config <json>',
      'KV router settings (JSON file or inline object), e.g. {"overlap_score_weight":1,"router_temperature":0,"router_queue_policy":"fcfs"}',
    )
    .optionsGroup(GROUPS.live)
    .option('--target <urls>', 'send the requests to these running servers (comma list: one worker each) instead of simulating', (v: string) =>
      v.split(',').map((u) => urlArg('--target', u.trim())),
    )
    .option('--kv-events <endpoints>', "each server's ZMQ KV events endpoint (comma list, e.g. tcp://host:5557), for --router-mode kv_router", (v: string) =>
      v.split(',').map((e) => e.trim()),
    )
    .addOption(laterDefault(new Option('--model <name>', 'the model to ask for'), "the first of each server's /v1/models"))
    .option(
      '--request-timeout <s>',
      'give up a request after this many seconds without a byte from its server (0: never)',
      number('--request-timeout', { min: 0 }),
      600,
    )
    .optionsGroup(GROUPS.output)
    .addOption(
      laterDefault(
        new Option('--report-json <path>', 'where the JSON report goes (a directory: a timestamped file inside)'),
        `${DEFAULT_REPORTS_DIR}/dynamo_replay_report_<time>.json`,
      ),
    )
    .option('--report-html <file>', 'also write a self-contained HTML report with latency CDFs, throughput, KV usage and prefix hits over time')
    .addOption(forceOption())
    .option('--no-progress', 'no progress bar or progress lines on stderr')
    .action(async (trace: string | undefined, o) => {
      process.exitCode = await runTrace({ ...o, trace });
    });

  const pdProxy = program
    .command('pd-proxy')
    .description("vLLM's disaggregated prefill/decode proxy (NIXL kv_transfer_params protocol) in front of prefill and decode engines");
  addSettings(pdProxy, PD_PROXY_SETTINGS).action(async (o) => {
    await stopOnSignal('pd-proxy', startPdProxy(optionsFrom(PD_PROXY_SETTINGS, o) as unknown as PdProxyOptions), o.shutdownTimeout);
  });

  const capture = program.command('capture').description('Proxy a real engine transparently and record every generation into a capture file.');
  addSettings(capture, CAPTURE_SETTINGS).action(async (o) => stopOnSignal('capture', startCaptureWith(o), o.shutdownTimeout));

  program.addCommand(rerunCommand());

  /** `mocker captures <command> FILE`: capture files as a product (each command registers itself here). */
  program
    .command('captures')
    .description('Inspect, export, merge, verify, diff and fit capture files.')
    .addCommand(capturesList)
    .addCommand(capturesShow)
    .addCommand(capturesExport)
    .addCommand(capturesImport)
    .addCommand(capturesMerge)
    .addCommand(capturesPrune)
    .addCommand(capturesStats)
    .addCommand(capturesVerifyCommand())
    .addCommand(capturesDiffCommand())
    .addCommand(fitCommand());

  useOptionStyle(program);
  return program;
}
