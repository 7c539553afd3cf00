/**
 * The command lines users bring from the tools mocker replaces — Dynamo's `python -m dynamo.mocker` and AIPerf's
 * `aiperf-mock-server` — as `serve` settings: an alias where mocker has the setting under another name, the
 * setting itself where it means something here (logs, worker stagger), and a refusal naming what to use instead
 * where it belongs to Dynamo's runtime or a tool that does not exist here.
 */
import { DEFAULT_LOG_CONFIG, LOG_FORMATS, LOG_LEVELS } from '../util/log.js';
import { choice, parsed, type Setting } from './settings.js';

/** AIPerf's level names are upper case, uvicorn's lower; `critical` and `trace` are theirs too. */
const logLevel = parsed((value, flag) => {
  const level = { critical: 'error', trace: 'debug' }[value.toLowerCase()] ?? value.toLowerCase();
  if (!(LOG_LEVELS as readonly string[]).includes(level)) throw new Error(`${flag} must be one of ${LOG_LEVELS.join(', ')}, got "${value}"`);
  return level;
});

/** Dynamo's rule: -1 is auto, 0 off, a positive value the seconds between two workers' starts. */
const staggerDelay = parsed((value, flag) => {
  const n = Number(value);
  if (value.trim() === '' || !Number.isFinite(n) || (n < 0 && n !== -1))
    throw new Error(`${flag} must be -1 (auto), 0 (off) or a positive number of seconds, got "${value}"`);
  return n;
});

/** The logs of every server command. */
export const LOG_SETTINGS: Setting[] = [
  {
    flags: '--log-level <level>',
    help: 'least severe log lines shown (debug shows scheduler steps)',
    group: 'server',
    value: logLevel,
    default: DEFAULT_LOG_CONFIG.level,
    to: 'logs.level',
  },
  {
    flags: '--log-format <format>',
    help: 'log lines as text or as JSON lines',
    group: 'server',
    value: choice(LOG_FORMATS),
    default: DEFAULT_LOG_CONFIG.format,
    to: 'logs.format',
  },
  {
    flags: '--access-logs',
    help: 'one line per request: client, method, path, status, duration and request id (on at --log-level debug)',
    group: 'server',
    to: 'logs.accessLogs',
  },
];

const DYNAMO_RUNTIME = "it configures Dynamo's distributed runtime, which mocker does not join: clients and routers reach it at --host/--port";
const AIC = 'mocker has no AIConfigurator SDK: fit a profile from a capture (mocker captures fit) and give it with --planner-profile-data';
const AIPERF_SCHEDULER = "mocker simulates vLLM's own scheduler: size it with --max-num-seqs, --max-num-batched-tokens and --long-prefill-token-threshold";
const AIPERF_ACCURACY = 'mocker answers with captured outputs: capture the graded answers once (mocker capture) and serve them with --mode replay';

const refused = (flags: string, refusal: string): Setting => ({ flags, help: `not supported: ${refusal}`, group: 'compatibility', refused: refusal });

/** `serve`'s compatibility group, after its own settings. */
export const COMPATIBILITY_SETTINGS: Setting[] = [
  { flags: '--model-path <model>', help: "Dynamo's mocker: --model", group: 'compatibility', alias: { of: '--model' } },
  { flags: '--model-name <name...>', help: "Dynamo's mocker: --served-model-name", group: 'compatibility', alias: { of: '--served-model-name' } },
  { flags: '--tokenizer <model>', help: "AIPerf's mock server: --model", group: 'compatibility', alias: { of: '--model' } },
  { flags: '--workers <n>', help: "AIPerf's mock server (server processes sharing the port): --threads", group: 'compatibility', alias: { of: '--threads' } },
  {
    flags: '-v, --verbose',
    help: "AIPerf's mock server: --log-level debug (access logs included)",
    group: 'compatibility',
    alias: { of: '--log-level', value: 'debug' },
  },
  {
    flags: '--stagger-delay <s>',
    help: "Dynamo's mocker: seconds between two workers' starts (-1: auto, 0.1 s from 33 workers, 0.2 s from 129, a 2 s pause every 32; 0: off)",
    group: 'compatibility',
    value: staggerDelay,
    default: -1,
    to: 'staggerDelayS',
  },
  {
    flags: '--tokenizer-trust-remote-code',
    help: "AIPerf's mock server: accepted; tokenizers are data here (tokenizer.json), never code",
    group: 'compatibility',
  },
  {
    flags: '--no-tokenizer',
    help: "AIPerf's mock server: tokens are character chunks as it counts prompts (4 characters, 6 with a word's end and its space), not a model's vocabulary",
    group: 'compatibility',
    to: 'noTokenizer',
  },
  refused('--tokenizer-revision <rev>', 'tokenizers load from local files: give --model (or --tokenizer) a directory holding that revision'),
  refused('--endpoint <endpoint>', DYNAMO_RUNTIME),
  refused('--discovery-backend <backend>', DYNAMO_RUNTIME),
  refused('--request-plane <plane>', DYNAMO_RUNTIME),
  refused('--event-plane <plane>', `${DYNAMO_RUNTIME}; KV events are published over ZMQ with --kv-events-config or --zmq-kv-events-ports`),
  refused(
    '--durable-kv-events',
    'KV events are published over ZMQ (--kv-events-config or --zmq-kv-events-ports), with a replay socket for gaps (--zmq-replay-ports)',
  ),
  refused(
    '--bootstrap-ports <ports>',
    "prefill and decode engines meet through vLLM's kv_transfer_params here: run them behind mocker pd-proxy, or in one process with --pd 1P1D",
  ),
  refused('--aic-perf-model', AIC),
  refused('--aic-system <system>', AIC),
  refused('--aic-backend-version <version>', AIC),
  refused('--aic-tp-size <n>', AIC),
  refused('--scheduler-enabled', AIPERF_SCHEDULER),
  refused('--scheduler-step-ms <ms>', AIPERF_SCHEDULER),
  refused('--scheduler-max-batch-size <n>', AIPERF_SCHEDULER),
  refused('--scheduler-max-prefill-chunks-per-step <n>', AIPERF_SCHEDULER),
  refused('--scheduler-prefill-chunk-tokens <n>', AIPERF_SCHEDULER),
  refused('--scheduler-goodput-collapse-enabled', AIPERF_SCHEDULER),
  refused('--scheduler-goodput-collapse-threshold <x>', AIPERF_SCHEDULER),
  refused('--scheduler-goodput-collapse-slope <x>', AIPERF_SCHEDULER),
  refused('--scheduler-goodput-collapse-floor <x>', AIPERF_SCHEDULER),
  refused('--ttft-jitter-cv <cv>', 'give the spread as a standard deviation: --ttft-std (ms)'),
  refused('--itl-jitter-cv <cv>', 'give the spread as a standard deviation: --itl-std (ms)'),
  refused('--record-requests <path>', 'record requests (and answers) with mocker capture in front of any server, then read them with mocker captures'),
  refused('--auth-header-name <name>', "the key goes in Authorization: Bearer, as vLLM's (--api-key)"),
  refused('--accuracy-dataset <path>', AIPERF_ACCURACY),
  refused('--accuracy-format <format>', AIPERF_ACCURACY),
  refused('--accuracy-correct-rate <rate>', AIPERF_ACCURACY),
  refused('--accuracy-cot-rate <rate>', AIPERF_ACCURACY),
  refused('--accuracy-reasoning-field', AIPERF_ACCURACY),
];
