import { parseSlo } from '../trace/goodput.js';
import { DEFAULT_REPORTS_DIR } from '../trace/report.js';
import { parseTraceFormat, TRACE_OUTPUT_FORMATS } from '../trace/traceFormats.js';
import { checkedUrl, FORCE } from './commonSettings.js';
import { choice, int, num, parsed, type Setting } from './settings.js';

/** Tokens per hash id: of the trace `mocker trace` reads, and of the one `mocker trace convert` writes. */
const TRACE_BLOCK_SIZE: Setting = {
  flags: '--trace-block-size <n>',
  help: 'tokens per hash id of the trace',
  group: 'input',
  value: int({ min: 1 }),
  default: 512,
};

/** `mocker trace`'s settings (its runner reads them by name), in the order `--help` lists them. */
export const TRACE_SETTINGS: Setting[] = [
  {
    flags: '--from-captures <file>',
    help: "replay a capture file's own requests (prompt ids, output lengths, arrival times) as load, an agent's turns as conversations (each its captured tool time after the turn it extends); answers are checked by mocker rerun",
    group: 'input',
  },
  {
    flags: '--trace-format <format>',
    help: "the trace file's format (Dynamo's): mooncake | mooncake-delta (each row adds to its session's prompt, after the previous turn's output) | agentic_mooncake (a request DAG: wait_for, delay, tool_wait_ms) | applied_compute_agentic (a tool loop per row; needs --replay-concurrency)",
    group: 'input',
    value: parsed(parseTraceFormat),
    default: 'mooncake',
  },
  TRACE_BLOCK_SIZE,
  { flags: '--input-tokens <n>', help: 'synthetic workload: prompt tokens per request', group: 'input', value: int({ min: 1 }) },
  { flags: '--output-tokens <n>', help: 'synthetic workload: output tokens per request', group: 'input', value: int({ min: 1 }) },
  { flags: '--request-count <n>', help: 'synthetic workload: requests (sessions when multi-turn)', group: 'input', value: int({ min: 1 }) },
  { flags: '--arrival-interval-ms <ms>', help: 'synthetic workload: ms between arrivals (sessions)', group: 'input', value: num({ min: 0 }), default: 1 },
  { flags: '--turns-per-session <n>', help: 'synthetic workload: turns per session', group: 'input', value: int({ min: 1 }), default: 1 },
  {
    flags: '--shared-prefix-ratio <r>',
    help: 'synthetic workload: fraction of each prompt shared with its prefix group',
    group: 'input',
    value: num({ min: 0, below: 1.0000001 }),
    default: 0,
  },
  { flags: '--num-prefix-groups <n>', help: 'synthetic workload: prefix groups sessions are drawn into', group: 'input', value: int({ min: 0 }), default: 0 },
  {
    flags: '--inter-turn-delay-ms <ms>',
    help: "synthetic workload: ms after a turn completes before the session's next",
    group: 'input',
    value: num({ min: 0 }),
    default: 0,
  },
  {
    flags: '--replay-mode <mode>',
    help: 'offline: virtual clock, as fast as possible | online: real time',
    group: 'replay',
    value: choice(['offline', 'online']),
    later: 'offline; online with --target',
  },
  {
    flags: '--speedup-ratio <x>',
    help: 'divide every simulated duration by this',
    group: 'replay',
    value: num({ above: 0 }),
    later: "the engine args' speedup_ratio, 1",
  },
  { flags: '--arrival-speedup-ratio <x>', help: 'divide arrival times and inter-turn delays by this', group: 'replay', value: num({ above: 0 }), default: 1 },
  { flags: '--replay-concurrency <n>', help: 'closed loop: keep n requests in flight, ignoring arrival times', group: 'replay', value: int({ min: 1 }) },
  { flags: '--seed <n>', help: 'seed of the synthetic workload, the engines and the router', group: 'replay', value: int(), default: 42 },
  {
    flags: '--sweep <key=values>',
    help: 'replay the workload offline over the cross product of these values (repeatable), key=v1,v2,…; keys: num-workers, router-mode, replay-concurrency, arrival-speedup-ratio, num-prefill-workers, num-decode-workers, engine-args keys (num_gpu_blocks, block_size, …) and router-config keys (overlap_score_weight, …)',
    group: 'replay',
    repeatable: true,
  },
  {
    flags: '--router-mode <mode>',
    help: 'how requests are spread over workers',
    group: 'replayWorkers',
    value: choice(['round_robin', 'kv_router']),
    default: 'round_robin',
  },
  { flags: '--num-workers <n>', help: 'aggregated workers', group: 'replayWorkers', value: int({ min: 1 }), later: '1; with --target, one per target' },
  { flags: '--num-prefill-workers <n>', help: 'prefill workers of a disaggregated replay', group: 'replayWorkers', value: int({ min: 1 }), later: '1' },
  { flags: '--num-decode-workers <n>', help: 'decode workers of a disaggregated replay', group: 'replayWorkers', value: int({ min: 1 }), later: '1' },
  { flags: '--extra-engine-args <json>', help: 'Dynamo mocker engine args of every aggregated worker (JSON file or inline object)', group: 'replayWorkers' },
  {
    flags: '--prefill-engine-args <json>',
    help: 'engine args of the prefill workers (disaggregated; kv_bytes_per_token and kv_transfer_bandwidth set the KV handoff)',
    group: 'replayWorkers',
  },
  { flags: '--decode-engine-args <json>', help: 'engine args of the decode workers (disaggregated)', group: 'replayWorkers' },
  {
    flags: '--router-config <json>',
    help: 'KV router settings (JSON file or inline object), e.g. {"overlap_score_weight":1,"router_temperature":0,"router_queue_policy":"fcfs"}',
    group: 'replayWorkers',
  },
  {
    flags: '--target <urls>',
    help: 'send the requests to these running servers (comma list: one worker each) instead of simulating',
    group: 'live',
    value: parsed((value, flag) => value.split(',').map((u) => (checkedUrl(flag, u.trim()), u.trim()))),
  },
  {
    flags: '--kv-events <endpoints>',
    help: "each server's ZMQ KV events endpoint (comma list, e.g. tcp://host:5557), for --router-mode kv_router",
    group: 'live',
    value: parsed((value) => value.split(',').map((e) => e.trim())),
  },
  { flags: '--model <name>', help: 'the model to ask for', group: 'live', later: "the first of each server's /v1/models" },
  {
    flags: '--request-timeout <s>',
    help: 'give up a request after this many seconds without a byte from its server (0: never)',
    group: 'live',
    value: num({ min: 0 }),
    default: 600,
  },
  {
    flags: '--report-json <path>',
    help: 'where the JSON report goes (a directory: a timestamped file inside)',
    group: 'output',
    later: `${DEFAULT_REPORTS_DIR}/dynamo_replay_report_<time>.json`,
  },
  {
    flags: '--report-html <file>',
    help: 'also write a self-contained HTML report with latency CDFs, throughput, KV usage and prefix hits over time',
    group: 'output',
  },
  {
    flags: '--report-requests <file>',
    help: 'also write one JSON line per request: its session and turn, arrival, admission and token times, lengths and prefix reuse',
    group: 'output',
  },
  {
    flags: '--slo <targets>',
    help: "add goodput to the report (AIPerf's: completed requests per second within every bound) under this SLO in ms: ttft=<ms>,itl=<ms>,e2e=<ms>, any of them (itl bounds each request's mean gap between tokens)",
    group: 'output',
    value: parsed(parseSlo),
  },
  { ...FORCE, group: 'output' },
  { flags: '--no-progress', help: 'no progress bar or progress lines on stderr', group: 'output' },
];

/** `mocker trace convert`'s settings. */
export const TRACE_CONVERT_SETTINGS: Setting[] = [
  TRACE_BLOCK_SIZE,
  {
    flags: '--to <format>',
    help: "the trace's format: Mooncake sessions of turns, or Dynamo's agentic_mooncake requests that wait for others (wait_for)",
    group: 'output',
    value: choice(TRACE_OUTPUT_FORMATS),
    default: 'mooncake',
  },
  { flags: '-o, --output <file>', help: 'write the trace to this file (never one of the inputs)', group: 'output', later: 'standard output' },
  { ...FORCE, group: 'output' },
];
