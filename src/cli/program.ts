import { createRequire } from 'node:module';
import { Command, type OptionValues } from 'commander';
import type { CaptureOptions } from '../app/capture.js';
import { CAPTURE_SETTINGS, PD_PROXY_SETTINGS } from '../config/commonSettings.js';
import { SERVE_SETTINGS } from '../config/serveSettings.js';
import { TRACE_CONVERT_SETTINGS, TRACE_SETTINGS } from '../config/traceSettings.js';
import { optionsFrom } from '../config/settings.js';
import type { PdProxyOptions } from '../pd/proxy.js';
import { capturesExport, capturesImport, capturesList, capturesMerge, capturesPrune, capturesShow, capturesStats } from './captures.js';
import { fitCommand } from './capturesFit.js';
import { capturesDiffCommand, capturesVerifyCommand } from './capturesVerifyDiff.js';
import { applyEnvironment, isGiven, npuMockCapture } from './environment.js';
import { everyCommand, useOptionStyle } from './help.js';
import { addSettings } from './options.js';
import { rerunCommand } from './rerun.js';

// Each command's implementation is imported when it runs: `mocker --help` or `mocker captures ls` need not load the
// servers, the engine and the tokenizers (half a second of module loading for every command otherwise).

/** `mocker capture` from its flags (also `serve` under vLLM's NPU mock model's CAPTURE_MODE=1, which has them all but --label), until a signal. */
async function runCapture(o: OptionValues): Promise<void> {
  const [{ startCapture }, { stopOnSignal }] = await Promise.all([import('../app/capture.js'), import('../app/shutdown.js')]);
  // The table's paths are CaptureOptions' fields.
  await stopOnSignal('capture', startCapture(optionsFrom(CAPTURE_SETTINGS, o) as unknown as CaptureOptions), o.shutdownTimeout);
}

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
export function buildProgram(): Command {
  const program = new Command('mocker')
    .description('Capture/replay proxy and engine simulator for LLM inference (vLLM-compatible).')
    .version(version, '-V, --version', 'print the mocker version')
    .showHelpAfterError()
    // A command's flags stop at its subcommand's name: `trace convert` has --trace-block-size and --force as `trace` does.
    .enablePositionalOptions()
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
      await runCapture(o);
      return;
    }
    const [{ runServeCommand }, { resolveServeFlags }] = await Promise.all([import('../app/serveCommand.js'), import('../config/resolveServe.js')]);
    await runServeCommand(resolveServeFlags(o, (attribute) => isGiven(command, attribute)));
  });

  const trace = program
    .command('trace')
    .description(
      "Replay a Mooncake trace, a synthetic workload or a capture's traffic through simulated workers (offline or online) or against live servers; report like AIPerf (Dynamo's python -m dynamo.replay).",
    )
    .argument('[trace]', 'JSONL trace (Mooncake: hash_ids, input_length, output_length, timestamp, session_id, delay; other formats: --trace-format)');
  addSettings(trace, TRACE_SETTINGS).action(async (file: string | undefined, o) => {
    const run = o.sweep === undefined ? (await import('../app/trace.js')).runTrace : (await import('../app/traceSweep.js')).runTraceSweep;
    process.exitCode = await run({ ...o, trace: file });
  });
  const convert = trace
    .command('convert')
    .description(
      "Write a capture file's conversations, or Claude Code session logs (~/.claude/projects/*/*.jsonl, or their directory), as a text-free trace: Mooncake or Dynamo's agentic_mooncake rows with rolling hash ids per block.",
    )
    .argument('<inputs...>', 'a capture file, or session logs (JSONL files or directories of them)');
  addSettings(convert, TRACE_CONVERT_SETTINGS).action(async (inputs: string[], o) => {
    const { runTraceConvert } = await import('../app/traceConvert.js');
    await runTraceConvert(inputs, { to: o.to, traceBlockSize: o.traceBlockSize, output: o.output, force: o.force });
  });

  const pdProxy = program
    .command('pd-proxy')
    .description("vLLM's disaggregated prefill/decode proxy (NIXL kv_transfer_params protocol) in front of prefill and decode engines");
  addSettings(pdProxy, PD_PROXY_SETTINGS).action(async (o) => {
    const [{ startPdProxy }, { stopOnSignal }] = await Promise.all([import('../pd/proxy.js'), import('../app/shutdown.js')]);
    await stopOnSignal('pd-proxy', startPdProxy(optionsFrom(PD_PROXY_SETTINGS, o) as unknown as PdProxyOptions), o.shutdownTimeout);
  });

  const capture = program.command('capture').description('Proxy a real engine transparently and record every generation into a capture file.');
  addSettings(capture, CAPTURE_SETTINGS).action(runCapture);

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
