import { createRequire } from 'node:module';
import { Command, InvalidArgumentError, Option, type OptionValues } from 'commander';
import { DEFAULT_REDACTED_HEADERS } from '../capture/forward.js';
import { dynamoKvEventsConfigs, parseKvEventsConfig, type KvEventsConfig, type KvEventsFormat } from '../events/index.js';
import { startCapture } from './capture.js';
import { capturesExport, capturesImport, capturesList, capturesMerge, capturesPrune, capturesShow, capturesStats } from './captures.js';
import { applyEnvironment, npuMockCapture } from './environment.js';
import { everyCommand, GROUPS, laterDefault, useOptionStyle } from './help.js';
import { forceOption, number } from './flags.js';
import { applyExtraEngineArgs, DEFAULT_ENGINE_ARGS, DEFAULT_SGLANG_ARGS, type EngineArgs } from '../config/engineArgs.js';
import { parseLoraModule } from '../http/loraAdapters.js';
import { startPdProxy } from '../pd/proxy.js';
import { parsePdLayout, startPdDeployment } from './pd.js';
import { parsePeer } from '../pd/kvTransfer.js';
import { DEFAULT_SHUTDOWN_TIMEOUT_S, stopOnSignal } from './shutdown.js';
import { DCGM_GPU_NAMES, DEFAULT_DCGM } from '../metrics/dcgm.js';
import { runTrace } from '../app/trace.js';
import { DEFAULT_REPORTS_DIR } from '../trace/report.js';
import { rerunCommand } from './rerun.js';
import { defaultThreads, startServeThreads } from './threads.js';
import { capturesDiffCommand, capturesVerifyCommand } from './capturesVerifyDiff.js';
import { fitCommand } from './capturesFit.js';
import {
  DEFAULT_FORWARD_TIME_MS,
  DEFAULT_KV_TRANSFER_BANDWIDTH_GBPS,
  DEFAULT_MAX_BODY_BYTES,
  DEFAULT_POOLING,
  DEFAULT_UPSTREAM_TIMEOUT_MS,
  startServe,
  type ServeMode,
  type ServeOptions,
} from './serve.js';
import { parseReasoningConfig } from '../generation/reasoning.js';
import { DEFAULT_TOOL_CALL_RATE } from '../generation/toolCalls.js';
import { DEFAULT_LATENCY_KNOBS } from '../engine/index.js';
import { DEFAULT_MIN_PREFIX_RATIO } from '../generation/resolver.js';
import { readJsonObjectArg } from '../util/jsonArg.js';
import { DEFAULT_FAULT_TYPES, DEFAULT_MIDSTREAM_AFTER_TOKENS, parseFaultTypes } from '../http/faults.js';
import { API_KEY_SCOPES, DEFAULT_API_KEY_SCOPE } from '../wire/access.js';

const DEFAULT_CAPTURES = 'captures/mocker.db';

/** A URL flag's value, refused with the flag's name. */
function checkedUrl(flag: string, text: string): URL {
  try {
    return new URL(text);
  } catch {
    throw new InvalidArgumentError(`${flag}: "${text}" is not a URL`);
  }
}

/** Parser of a URL flag that keeps the text as given. */
const urlFlag = (flag: string) => (value: string) => (checkedUrl(flag, value), value);

const collect = (value: string, previous: string[]) => [...previous, value];

/** The fields that were given (a flag left out must not override a default with undefined). */
const given = <T extends object>(fields: T) => Object.fromEntries(Object.entries(fields).filter(([, v]) => v !== undefined)) as Partial<T>;

function errorTypes(value: string) {
  try {
    return parseFaultTypes(value, '--error-types');
  } catch (err) {
    throw new InvalidArgumentError((err as Error).message);
  }
}

function percentage(name: string) {
  return (value: string) => {
    const n = Number(value);
    if (value.trim() === '' || !(n >= 0 && n <= 100)) throw new InvalidArgumentError(`${name} must be a percentage from 0 to 100, got "${value}"`);
    return n;
  };
}

const shutdownTimeout = () =>
  new Option(
    '--shutdown-timeout <s>',
    'on SIGINT/SIGTERM, seconds the requests in flight get to finish before they are cut off (a second signal exits at once)',
  )
    .argParser(number('--shutdown-timeout', { min: 0 }))
    .default(DEFAULT_SHUTDOWN_TIMEOUT_S);

/** vLLM's TLS flags (uvicorn's), the same on every server. */
const tlsOptions = () =>
  [
    new Option('--ssl-keyfile <file>', 'serve HTTPS: the private key (PEM), with --ssl-certfile'),
    new Option('--ssl-certfile <file>', 'serve HTTPS: the certificate chain (PEM), with --ssl-keyfile'),
    new Option('--ssl-ca-certs <file>', 'CA certificates (PEM) client certificates are checked against (with --ssl-cert-reqs)'),
    new Option('--ssl-cert-reqs <n>', 'client certificates: 0 not asked, 1 optional (checked when sent), 2 required')
      .argParser(number('--ssl-cert-reqs', { integer: true, min: 0, max: 2 }))
      .default(0),
  ].map((option) => option.helpGroup(GROUPS.security));
const tlsFiles = (o: OptionValues) => ({ keyfile: o.sslKeyfile, certfile: o.sslCertfile, caCerts: o.sslCaCerts, certReqs: o.sslCertReqs });

const upstreamCaCerts = () =>
  new Option('--upstream-ca-certs <file>', "CA certificates (PEM) an https: upstream's certificate is checked against, instead of Node's");

const apiKeyScope = () =>
  new Option('--api-key-scope <scope>', 'what --api-key guards: v1 (/v1/*, as vLLM) | all (every route but health, version and metrics)')
    .choices(API_KEY_SCOPES)
    .default(DEFAULT_API_KEY_SCOPE);

/** A TCP port (0: any free one, where `allowAny`). */
function port(name: string, allowAny = true) {
  return number(name, { integer: true, min: allowAny ? 0 : 1, below: 65536 });
}

/** `--kv-transfer-allowed-hosts`: comma-separated host:port peers. */
function peerList(value: string): string[] {
  return value.split(',').map((part) => {
    try {
      return parsePeer(part);
    } catch (err) {
      throw new InvalidArgumentError(`--kv-transfer-allowed-hosts: ${(err as Error).message}`);
    }
  });
}

function portList(name: string) {
  return (value: string) => value.split(',').map((part) => port(name, false)(part.trim()));
}

/** `mocker capture` from its flags (also `serve` under vLLM's NPU mock model's CAPTURE_MODE=1, which has them all but --label). */
function startCaptureWith(o: OptionValues) {
  return startCapture({
    upstream: o.upstream,
    captures: o.captures,
    host: o.host,
    port: o.port,
    model: o.model,
    label: o.label,
    upstreamTimeoutMs: o.upstreamTimeout,
    maxBodyBytes: o.maxBodyBytes,
    redactHeaders: o.redactHeader,
    redactBodies: o.redactBodies,
    access: { key: o.apiKey, scope: o.apiKeyScope },
    tls: tlsFiles(o),
    upstreamCaCerts: o.upstreamCaCerts,
  });
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

  program
    .command('serve')
    .description('Serve a vLLM-compatible API through a simulated vLLM scheduler: simulate, replay or random.')
    .optionsGroup(GROUPS.server)
    .option('--host <host>', 'address to listen on', '0.0.0.0')
    .option('--port <port>', 'port to listen on', port('--port'), 8000)
    .option('--max-body-bytes <n>', 'largest request body accepted', number('--max-body-bytes', { integer: true, min: 1 }), DEFAULT_MAX_BODY_BYTES)
    .option('--enable-request-id-headers', 'responses carry X-Request-Id', false)
    .option('--enable-server-load-tracking', '/load counts requests in flight', false)
    .option('--enable-prompt-tokens-details', 'usage.prompt_tokens_details.cached_tokens, as vLLM', false)
    .addOption(
      laterDefault(
        new Option('--enable-control-routes', 'the routes that change the server at run time exist: /mocker/config, /reset_prefix_cache'),
        'on with VLLM_SERVER_DEV_MODE=1',
      ),
    )
    .addOption(shutdownTimeout())
    .optionsGroup(GROUPS.modes)
    .addOption(new Option('--mode <mode>', 'simulate | replay | random').choices(['simulate', 'replay', 'random']).default('simulate'))
    .option('--captures <file>', 'capture file (SQLite)', DEFAULT_CAPTURES)
    .addOption(laterDefault(new Option('--outputs <source>', 'captured | random').choices(['captured', 'random']), 'random in random mode, else captured'))
    // Matching modes: which captures answer a request.
    .addOption(
      new Option(
        '--match <mode>',
        'exact: a capture of the same prompt | prefix: else the longest captured prefix, or the capture sharing the longest prefix | sequence: captures of one prompt in capture order, one per request',
      )
        .choices(['exact', 'prefix', 'sequence'])
        .default('exact'),
    )
    .option(
      '--min-prefix-ratio <r>',
      "--match prefix: the least share of the request's prompt tokens a capture must share with it",
      number('--min-prefix-ratio', { above: 0, max: 1 }),
      DEFAULT_MIN_PREFIX_RATIO,
    )
    .option(
      '--ignore-field <name>',
      "request field left out of the comparison that decides whether a capture's bytes are served verbatim (repeatable)",
      collect,
      [],
    )
    .addOption(
      laterDefault(
        new Option('--on-miss <policy>', 'when no capture matches: error | random | passthrough | record').choices([
          'error',
          'random',
          'passthrough',
          'record',
        ]),
        'random in simulate, error otherwise',
      ),
    )
    .option('--upstream <url>', 'engine to forward misses to (--on-miss passthrough|record)', urlFlag('--upstream'))
    .addOption(upstreamCaCerts())
    .option('--upstream-timeout <ms>', 'upstream inactivity timeout', number('--upstream-timeout', { integer: true, min: 1 }), DEFAULT_UPSTREAM_TIMEOUT_MS)
    .option('--redact-header <name>', 'also never store this header (for --on-miss record)', collect, [...DEFAULT_REDACTED_HEADERS])
    .optionsGroup(GROUPS.model)
    .addOption(
      laterDefault(
        new Option('--model <model>', 'local model directory or Hugging Face id in the local HF cache'),
        "the capture's tokenizer, else bundled Qwen/Qwen3-0.6B",
      ),
    )
    .addOption(laterDefault(new Option('--served-model-name <name...>', 'model names to accept'), 'the captured models, else --model'))
    .addOption(
      laterDefault(
        new Option('--max-model-len <n>', 'context length').argParser(number('--max-model-len', { integer: true, min: 1 })),
        'captured, else the model config',
      ),
    )
    .option(
      '--trust-request-chat-template',
      "render a chat_template sent in a request (in a process of its own, stopped after 2 s) instead of answering vLLM's 400",
      false,
    )
    .option('--enable-lora', 'serve LoRA adapters (requests name one in `model`)', false)
    .option(
      '--lora-modules <specs...>',
      'LoRA adapters loaded at start: name=path, a JSON {"name","path","base_model_name"}, or a bare name (needs --enable-lora)',
    )
    .option('--max-loras <n>', 'distinct LoRA adapters in one batch', number('--max-loras', { integer: true, min: 1 }), 1)
    // Latency knobs (AIPerf's mock server, llm-d's simulator, Dynamo).
    .optionsGroup(GROUPS.timing)
    .addOption(
      laterDefault(
        new Option('--timing <timing>', 'model | captured | fixed | latency | none').choices(['model', 'captured', 'fixed', 'latency', 'none']),
        'model in simulate, captured in replay, fixed in random; latency with --ttft/--itl',
      ),
    )
    .option('--fast', 'no simulated latency at all: --timing none')
    .addOption(
      laterDefault(
        new Option('--ttft <ms>', '--timing latency: time to first token, the duration of a pass that prefills').argParser(number('--ttft', { min: 0 })),
        String(DEFAULT_LATENCY_KNOBS.ttftMs),
      ),
    )
    .addOption(
      laterDefault(
        new Option('--itl <ms>', '--timing latency: inter-token latency, the duration of a decode pass').argParser(number('--itl', { min: 0 })),
        String(DEFAULT_LATENCY_KNOBS.itlMs),
      ),
    )
    .addOption(
      laterDefault(
        new Option('--ttft-std <ms>', '--timing latency: standard deviation of the TTFT (Gaussian, seeded by --seed, clipped at 0)').argParser(
          number('--ttft-std', { min: 0 }),
        ),
        String(DEFAULT_LATENCY_KNOBS.ttftStdMs),
      ),
    )
    .addOption(
      laterDefault(
        new Option('--itl-std <ms>', '--timing latency: standard deviation of the ITL').argParser(number('--itl-std', { min: 0 })),
        String(DEFAULT_LATENCY_KNOBS.itlStdMs),
      ),
    )
    .option('--forward-time-ms <ms>', 'duration of one engine step for --timing fixed', number('--forward-time-ms', { min: 0 }), DEFAULT_FORWARD_TIME_MS)
    .addOption(laterDefault(new Option('--planner-profile-data <path>', 'perf model for --timing model: NPZ or profiler results directory'), 'polynomial'))
    .option('--speedup-ratio <x>', 'divide every simulated duration by this', number('--speedup-ratio', { above: 0 }), DEFAULT_ENGINE_ARGS.speedupRatio)
    .option(
      '--decode-speedup-ratio <x>',
      'further divide decode steps (speculative decoding)',
      number('--decode-speedup-ratio', { above: 0 }),
      DEFAULT_ENGINE_ARGS.decodeSpeedupRatio,
    )
    .optionsGroup(GROUPS.engine)
    .addOption(
      new Option('--engine-type <type>', 'whose scheduler and KV cache are simulated: vllm (hashed blocks, preemption) or sglang (radix cache, retraction)')
        .choices(['vllm', 'sglang'])
        .default(DEFAULT_ENGINE_ARGS.engineType),
    )
    .option('--max-num-seqs <n>', 'running requests per rank', number('--max-num-seqs', { integer: true, min: 1 }), DEFAULT_ENGINE_ARGS.maxNumSeqs)
    .option(
      '--max-num-batched-tokens <n>',
      'token budget of one pass (at least --max-num-seqs)',
      number('--max-num-batched-tokens', { integer: true, min: 1 }),
      DEFAULT_ENGINE_ARGS.maxNumBatchedTokens,
    )
    .option('--enable-chunked-prefill', 'split long prompts over passes', DEFAULT_ENGINE_ARGS.enableChunkedPrefill)
    .option('--no-enable-chunked-prefill', 'a prompt waits until it fits one pass')
    .addOption(
      new Option('--preemption-mode <mode>', 'which running request is preempted on KV pressure')
        .choices(['lifo', 'fifo'])
        .default(DEFAULT_ENGINE_ARGS.preemptionMode),
    )
    .option(
      '--data-parallel-size <n>',
      'ranks, each with its own scheduler and KV cache',
      number('--data-parallel-size', { integer: true, min: 1 }),
      DEFAULT_ENGINE_ARGS.dataParallelSize,
    )
    .option('--extra-engine-args <json>', 'Dynamo mocker engine args (JSON file or inline object), applied over the flags')
    .optionsGroup(GROUPS.kvCache)
    .option(
      '--num-gpu-blocks-override <n>',
      'KV cache blocks per rank',
      number('--num-gpu-blocks-override', { integer: true, min: 1 }),
      DEFAULT_ENGINE_ARGS.numGpuBlocks,
    )
    .option(
      '--block-size <n>',
      'tokens per KV block: at least 2 with vllm, 1 or more with sglang (its page size, given either way)',
      number('--block-size', { integer: true, min: 1 }),
      DEFAULT_ENGINE_ARGS.blockSize,
    )
    .option('--enable-prefix-caching', 'reuse cached prompt blocks', DEFAULT_ENGINE_ARGS.enablePrefixCaching)
    .option('--no-enable-prefix-caching', 'never reuse cached blocks')
    .option(
      '--watermark <fraction>',
      'fraction of KV blocks kept free when admitting',
      number('--watermark', { min: 0, below: 1 }),
      DEFAULT_ENGINE_ARGS.watermark,
    )
    .optionsGroup(GROUPS.sglang)
    .addOption(
      new Option('--sglang-schedule-policy <policy>', 'admission order, fifo (fcfs) or lpm (longest cached prefix first)')
        .choices(['fifo', 'fcfs', 'lpm'])
        .default(DEFAULT_SGLANG_ARGS.schedulePolicy),
    )
    .addOption(
      laterDefault(
        new Option('--sglang-page-size <n>', 'radix cache page size in tokens').argParser(number('--sglang-page-size', { integer: true, min: 1 })),
        '--block-size',
      ),
    )
    .option(
      '--sglang-max-prefill-tokens <n>',
      'prompt tokens per pass (at least --sglang-chunked-prefill-size)',
      number('--sglang-max-prefill-tokens', { integer: true, min: 1 }),
      DEFAULT_SGLANG_ARGS.maxPrefillTokens,
    )
    .option(
      '--sglang-chunked-prefill-size <n>',
      'longer prompts are prefilled in chunks of this (a multiple of the page size)',
      number('--sglang-chunked-prefill-size', { integer: true, min: 1 }),
      DEFAULT_SGLANG_ARGS.chunkedPrefillSize,
    )
    .option(
      '--sglang-clip-max-new-tokens <n>',
      'output tokens reserved per request at most when admitting',
      number('--sglang-clip-max-new-tokens', { integer: true, min: 1 }),
      DEFAULT_SGLANG_ARGS.clipMaxNewTokens,
    )
    .option(
      '--sglang-schedule-conservativeness <x>',
      'scales the output reservation, in [0, 1]',
      number('--sglang-schedule-conservativeness', { min: 0, below: 1.0000001 }),
      DEFAULT_SGLANG_ARGS.scheduleConservativeness,
    )
    .optionsGroup(GROUPS.workers)
    .option('--num-workers <n>', 'independent engines, each on its own port: --port, --port + 1, …', number('--num-workers', { integer: true, min: 1 }), 1)
    .addOption(
      laterDefault(
        new Option('--threads <n>', 'worker threads the --num-workers engines are spread over, round-robin (1: all in the main thread)').argParser(
          number('--threads', { integer: true, min: 1 }),
        ),
        'the cores, at most --num-workers',
      ),
    )
    .optionsGroup(GROUPS.disaggregation)
    .option('--pd <xPyD>', 'run x prefill and y decode engines in-process behind a PD proxy on --port (e.g. 1P1D)')
    .addOption(
      laterDefault(
        new Option('--disaggregation-mode <mode>', 'agg | prefill (answers one token, holds its KV for a decode engine) | decode').choices([
          'agg',
          'prefill',
          'decode',
        ]),
        'agg, or as --is-prefill-worker / --is-decode-worker',
      ),
    )
    .option('--is-prefill-worker', "Dynamo's legacy spelling of --disaggregation-mode prefill")
    .option('--is-decode-worker', "Dynamo's legacy spelling of --disaggregation-mode decode")
    .addOption(
      laterDefault(
        new Option('--kv-bytes-per-token <n>', 'KV bytes per token for PD transfer times').argParser(number('--kv-bytes-per-token', { min: 0 })),
        "the model's config.json: layers x 2 x KV heads x head dim x dtype bytes",
      ),
    )
    .addOption(
      new Option('--kv-cache-dtype <dtype>', 'KV cache dtype for --kv-bytes-per-token')
        .choices(['auto', 'bfloat16', 'float16', 'float32', 'fp8', 'fp8_e4m3', 'fp8_e5m2', 'fp8_inc', 'fp8_ds_mla'])
        .default('auto'),
    )
    .option(
      '--kv-transfer-bandwidth <GBps>',
      'PD KV transfer bandwidth in GB/s (0: instant)',
      number('--kv-transfer-bandwidth', { min: 0 }),
      DEFAULT_KV_TRANSFER_BANDWIDTH_GBPS,
    )
    .addOption(
      laterDefault(
        new Option(
          '--kv-transfer-allowed-hosts <peers>',
          'PD: the prefill engines (comma list of host:port, as their kv_transfer_params name them) this engine may pull KV from; others are never called',
        ).argParser(peerList),
        'none',
      ),
    )
    .optionsGroup(GROUPS.randomOutputs)
    .option('--seed <n>', 'seed of random outputs', number('--seed', { integer: true }), 0)
    .option(
      '--reasoning <json>',
      'random answers open with a thinking span (Dynamo\'s {"start_thinking_token_id":N,"end_thinking_token_id":M,"thinking_ratio":R}; ids default to the tokenizer\'s <think> </think>)',
      (v: string) => parseReasoningConfig(readJsonObjectArg(v, '--reasoning'), '--reasoning'),
    )
    .option(
      '--tool-call-rate <r>',
      'share of random answers to a chat with tool_choice auto that call one of its tools',
      number('--tool-call-rate', { min: 0, below: 1.0000001 }),
      DEFAULT_TOOL_CALL_RATE,
    )
    .optionsGroup(GROUPS.pooling)
    .option(
      '--embedding-dimensions <n>',
      '/v1/embeddings vector size (the largest `dimensions` a request may ask for)',
      number('--embedding-dimensions', { integer: true, min: 1, below: 65537 }),
      DEFAULT_POOLING.embeddingDimensions,
    )
    .option(
      '--embedding-base-latency <ms>',
      '/v1/embeddings latency per request',
      number('--embedding-base-latency', { min: 0 }),
      DEFAULT_POOLING.embeddingBaseLatencyMs,
    )
    .option(
      '--embedding-per-input-latency <ms>',
      '/v1/embeddings latency per input',
      number('--embedding-per-input-latency', { min: 0 }),
      DEFAULT_POOLING.embeddingPerInputLatencyMs,
    )
    .option(
      '--ranking-base-latency <ms>',
      '/v1/ranking, /rerank, /v2/rerank latency per request',
      number('--ranking-base-latency', { min: 0 }),
      DEFAULT_POOLING.rankingBaseLatencyMs,
    )
    .option(
      '--ranking-per-passage-latency <ms>',
      '/v1/ranking, /rerank, /v2/rerank latency per passage',
      number('--ranking-per-passage-latency', { min: 0 }),
      DEFAULT_POOLING.rankingPerPassageLatencyMs,
    )
    // Failure injection and start-up delay (AIPerf's mock server, llm-d's simulator, Dynamo).
    .optionsGroup(GROUPS.failures)
    .addOption(laterDefault(new Option('--error-rate <pct>', 'percentage of generation requests that fail').argParser(percentage('--error-rate')), '0'))
    .addOption(
      laterDefault(
        new Option(
          '--error-types <types>',
          'comma list the failures are drawn from: rate_limit, invalid_api_key, context_length, server_error, invalid_request, model_not_found, timeout, midstream, disconnect',
        ).argParser(errorTypes),
        DEFAULT_FAULT_TYPES.join(','),
      ),
    )
    .addOption(
      laterDefault(
        new Option('--fail-first <n>', 'the first n generation requests fail (for retry tests)').argParser(number('--fail-first', { integer: true, min: 0 })),
        '0',
      ),
    )
    .option(
      '--midstream-after-tokens <n>',
      'midstream and disconnect failures break the answer after this many tokens',
      number('--midstream-after-tokens', { integer: true, min: 0 }),
      DEFAULT_MIDSTREAM_AFTER_TOKENS,
    )
    .addOption(laterDefault(new Option('--random-seed <n>', 'seed of which requests fail').argParser(number('--random-seed', { integer: true })), '--seed'))
    .addOption(
      laterDefault(
        new Option('--startup-time <s>', '/health and the API answer 503 for this many seconds after start').argParser(number('--startup-time', { min: 0 })),
        '0',
      ),
    )
    .optionsGroup(GROUPS.kvEvents)
    .option(
      '--kv-events-config <json>',
      'vLLM\'s KV events config, e.g. \'{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558"}\'',
    )
    .option(
      '--zmq-kv-events-ports <ports>',
      "Dynamo's spelling: one KV events PUB port per worker (comma list), rank r on port + r",
      portList('--zmq-kv-events-ports'),
    )
    .option('--zmq-replay-ports <ports>', 'one KV events replay (ROUTER) port per worker, with --zmq-kv-events-ports', portList('--zmq-replay-ports'))
    .addOption(
      new Option('--kv-events-format <format>', 'KV event layout: array (vLLM <= 0.2x tagged arrays) | map (named fields, vLLM PR #42892)')
        .choices(['array', 'map'])
        .default('array'),
    )
    .addOption(
      new Option('--prefix-caching-hash-algo <algo>', 'vLLM block hash of KV events (seed: $PYTHONHASHSEED, else "vllm-none-hash")')
        .choices(['sha256_cbor', 'sha256'])
        .default('sha256_cbor'),
    )
    .optionsGroup(GROUPS.metrics)
    .option('--show-hidden-metrics-for-version <version>', "also vLLM's hidden deprecated metrics (gpu_cache_usage_perc)")
    .addOption(new Option('--dcgm-gpu-name <gpu>', 'GPU model of the simulated DCGM telemetry').choices(DCGM_GPU_NAMES).default(DEFAULT_DCGM.gpuName))
    .option(
      '--dcgm-num-gpus <n>',
      'GPUs per simulated DCGM exporter (1-8)',
      number('--dcgm-num-gpus', { integer: true, min: 1, below: 9 }),
      DEFAULT_DCGM.numGpus,
    )
    .option('--dcgm-auto-load', 'DCGM load follows token throughput', DEFAULT_DCGM.autoLoad)
    .option('--no-dcgm-auto-load', 'DCGM GPUs stay idle')
    .option(
      '--dcgm-min-throughput <tokens/s>',
      'token throughput taken as full DCGM load until more is seen',
      number('--dcgm-min-throughput', { above: 0 }),
      DEFAULT_DCGM.minThroughput,
    )
    .option(
      '--dcgm-window-sec <s>',
      'sliding window of the DCGM throughput (0.1-60)',
      number('--dcgm-window-sec', { min: 0.1, below: 60.0000001 }),
      DEFAULT_DCGM.windowSec,
    )
    .option('--dcgm-hostname <name>', 'Hostname label of the DCGM metrics', DEFAULT_DCGM.hostname)
    .addOption(
      laterDefault(
        new Option('--dcgm-seed <n>', 'seed of the DCGM noise and GPU UUIDs').argParser(number('--dcgm-seed', { integer: true, min: 0 })),
        'a new one each start',
      ),
    )
    .optionsGroup(GROUPS.security)
    .addOption(laterDefault(new Option('--api-key <key>', 'require Authorization: Bearer <key> on /v1/*'), '$VLLM_API_KEY'))
    .addOption(apiKeyScope())
    .action(async (o, command: Command) => {
      // vLLM's NPU mock model's CAPTURE_MODE=1: the engine's own process recorded; here, the capture proxy on serve's address.
      if (npuMockCapture(process.env) && command.getOptionValueSource('mode') === 'default') {
        if (!o.upstream) throw new Error('CAPTURE_MODE=1 records a real engine: give its URL with --upstream (or MOCKER_UPSTREAM)');
        console.log('mocker serve: CAPTURE_MODE=1: running as mocker capture');
        await stopOnSignal('capture', startCaptureWith(o), o.shutdownTimeout);
        return;
      }
      // Dynamo's rule: the SGLang page size is the block size unless only one of them is given.
      const blockSizeGiven = command.getOptionValueSource('blockSize') !== 'default';
      let engine: EngineArgs = {
        engineType: o.engineType,
        sglang: {
          schedulePolicy: o.sglangSchedulePolicy === 'fcfs' ? 'fifo' : o.sglangSchedulePolicy,
          pageSize: o.sglangPageSize ?? null,
          maxPrefillTokens: o.sglangMaxPrefillTokens,
          chunkedPrefillSize: o.sglangChunkedPrefillSize,
          clipMaxNewTokens: o.sglangClipMaxNewTokens,
          scheduleConservativeness: o.sglangScheduleConservativeness,
        },
        numGpuBlocks: o.numGpuBlocksOverride,
        blockSize: o.sglangPageSize !== undefined && !blockSizeGiven ? o.sglangPageSize : o.blockSize,
        maxNumSeqs: o.maxNumSeqs,
        maxNumBatchedTokens: o.maxNumBatchedTokens,
        enablePrefixCaching: o.enablePrefixCaching,
        enableChunkedPrefill: o.enableChunkedPrefill,
        preemptionMode: o.preemptionMode,
        watermark: o.watermark,
        speedupRatio: o.speedupRatio,
        decodeSpeedupRatio: o.decodeSpeedupRatio,
        dataParallelSize: o.dataParallelSize,
        plannerProfileData: o.plannerProfileData,
        reasoning: o.reasoning,
      };
      if (o.extraEngineArgs) engine = applyExtraEngineArgs(engine, o.extraEngineArgs);
      const format = o.kvEventsFormat as KvEventsFormat;
      if (o.kvEventsConfig && o.zmqKvEventsPorts) throw new Error('--kv-events-config and --zmq-kv-events-ports both configure KV events: give one');
      if (o.zmqReplayPorts && !o.zmqKvEventsPorts) throw new Error('--zmq-replay-ports needs --zmq-kv-events-ports');
      if (o.disaggregationMode && (o.isPrefillWorker || o.isDecodeWorker))
        throw new Error('--disaggregation-mode cannot be combined with --is-prefill-worker / --is-decode-worker');
      if (o.isPrefillWorker && o.isDecodeWorker) throw new Error('--is-prefill-worker and --is-decode-worker are exclusive');
      const latency = given({
        ttftMs: o.ttft as number | undefined,
        itlMs: o.itl as number | undefined,
        ttftStdMs: o.ttftStd as number | undefined,
        itlStdMs: o.itlStd as number | undefined,
      });
      const latencyGiven = Object.keys(latency).length > 0;
      if (o.fast && o.timing !== undefined && o.timing !== 'none') throw new Error(`--fast is --timing none: it cannot be combined with --timing ${o.timing}`);
      if (o.fast && latencyGiven) throw new Error('--fast (no latency) cannot be combined with --ttft / --itl / --ttft-std / --itl-std');
      if (latencyGiven && o.timing !== undefined && o.timing !== 'latency')
        throw new Error(`--ttft / --itl / --ttft-std / --itl-std are --timing latency's: they cannot be combined with --timing ${o.timing}`);
      const role: ServeOptions['role'] = o.disaggregationMode ?? (o.isPrefillWorker ? 'prefill' : o.isDecodeWorker ? 'decode' : 'agg');
      let kvEvents: KvEventsConfig[] | undefined;
      if (o.kvEventsConfig) {
        const config = parseKvEventsConfig(o.kvEventsConfig, format);
        kvEvents = config ? [config] : undefined;
      } else if (o.zmqKvEventsPorts) kvEvents = dynamoKvEventsConfigs(o.zmqKvEventsPorts, o.zmqReplayPorts, o.numWorkers, format);
      const options: ServeOptions = {
        mode: o.mode as ServeMode,
        role,
        kvBytesPerToken: o.kvBytesPerToken,
        kvCacheDtype: o.kvCacheDtype,
        kvTransferBandwidthGBps: o.kvTransferBandwidth,
        kvTransferAllowedHosts: o.kvTransferAllowedHosts,
        engine,
        enablePromptTokensDetails: o.enablePromptTokensDetails,
        lora: { enabled: o.enableLora, modules: ((o.loraModules ?? []) as string[]).map(parseLoraModule), maxLoras: o.maxLoras },
        trustRequestChatTemplate: o.trustRequestChatTemplate,
        numWorkers: o.numWorkers,
        kvEvents,
        prefixCachingHashAlgo: o.prefixCachingHashAlgo,
        showHiddenMetrics: o.showHiddenMetricsForVersion !== undefined,
        apiKey: o.apiKey,
        apiKeyScope: o.apiKeyScope,
        enableControlRoutes: o.enableControlRoutes,
        requestIdHeaders: o.enableRequestIdHeaders,
        serverLoadTracking: o.enableServerLoadTracking,
        captures: o.captures,
        model: o.model,
        servedModelName: o.servedModelName,
        host: o.host,
        port: o.port,
        outputs: o.outputs,
        timing: o.fast ? 'none' : latencyGiven ? 'latency' : o.timing,
        latency: latencyGiven ? latency : undefined,
        faults: given({
          errorRate: o.errorRate as number | undefined,
          errorTypes: o.errorTypes as ReturnType<typeof errorTypes> | undefined,
          failFirst: o.failFirst as number | undefined,
          midstreamAfterTokens: o.midstreamAfterTokens as number,
        }),
        faultSeed: o.randomSeed,
        startupTimeS: o.startupTime,
        matching: { match: o.match, minPrefixRatio: o.minPrefixRatio, ignoreFields: o.ignoreField },
        forwardTimeMs: o.forwardTimeMs,
        onMiss: o.onMiss,
        upstream: o.upstream,
        upstreamCaCerts: o.upstreamCaCerts,
        tls: tlsFiles(o),
        upstreamTimeoutMs: o.upstreamTimeout,
        seed: o.seed,
        maxModelLen: o.maxModelLen,
        maxBodyBytes: o.maxBodyBytes,
        redactHeaders: o.redactHeader,
        pooling: {
          embeddingDimensions: o.embeddingDimensions,
          embeddingBaseLatencyMs: o.embeddingBaseLatency,
          embeddingPerInputLatencyMs: o.embeddingPerInputLatency,
          rankingBaseLatencyMs: o.rankingBaseLatency,
          rankingPerPassageLatencyMs: o.rankingPerPassageLatency,
        },
        toolCallRate: o.toolCallRate,
        dcgm: {
          gpuName: o.dcgmGpuName,
          numGpus: o.dcgmNumGpus,
          autoLoad: o.dcgmAutoLoad,
          minThroughput: o.dcgmMinThroughput,
          windowSec: o.dcgmWindowSec,
          hostname: o.dcgmHostname,
          seed: o.dcgmSeed,
        },
      };
      // More threads than engines would idle.
      const threads = Math.min(o.threads ?? defaultThreads(o.numWorkers), o.numWorkers);
      if (o.pd) {
        if (role !== 'agg') throw new Error('--pd starts its own prefill and decode engines: drop --disaggregation-mode');
        if (o.threads > 1) throw new Error('--threads spreads --num-workers engines; --pd runs its engines in the main thread: drop --threads');
        await stopOnSignal('serve', startPdDeployment(options, parsePdLayout(o.pd)), o.shutdownTimeout);
      } else await stopOnSignal('serve', threads > 1 ? startServeThreads(options, threads) : startServe(options), o.shutdownTimeout);
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
      v.split(',').map((u) => (checkedUrl('--target', u.trim()), u.trim())),
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

  program
    .command('pd-proxy')
    .description("vLLM's disaggregated prefill/decode proxy (NIXL kv_transfer_params protocol) in front of prefill and decode engines")
    .optionsGroup(GROUPS.engines)
    .requiredOption('--prefill <urls>', 'prefill engines, comma-separated (round robin)')
    .requiredOption('--decode <urls>', 'decode engines, comma-separated (round robin)')
    .optionsGroup(GROUPS.server)
    .option('--host <host>', 'address to listen on', '0.0.0.0')
    .option('--port <port>', 'port to listen on', port('--port'), 8000)
    .option('--max-body-bytes <n>', 'largest request body accepted', number('--max-body-bytes', { integer: true, min: 1 }), DEFAULT_MAX_BODY_BYTES)
    .addOption(shutdownTimeout())
    .optionsGroup(GROUPS.security)
    .option('--api-key <key>', 'require Authorization: Bearer <key> on /v1/* (the header is passed on to the engines)')
    .addOption(apiKeyScope())
    .action(async (o) => {
      const urls = (list: string, flag: string) => list.split(',').map((u) => checkedUrl(flag, u.trim()));
      const access = { key: o.apiKey, scope: o.apiKeyScope };
      const options = {
        prefill: urls(o.prefill, '--prefill'),
        decode: urls(o.decode, '--decode'),
        host: o.host,
        port: o.port,
        maxBodyBytes: o.maxBodyBytes,
        access,
        tls: tlsFiles(o),
      };
      await stopOnSignal('pd-proxy', startPdProxy(options), o.shutdownTimeout);
    });

  program
    .command('capture')
    .description('Proxy a real engine transparently and record every generation into a capture file.')
    .optionsGroup(GROUPS.upstream)
    .requiredOption('--upstream <url>', 'the engine to capture (e.g. http://gpu-box:8000)', urlFlag('--upstream'))
    .addOption(upstreamCaCerts())
    .option('--upstream-timeout <ms>', 'upstream inactivity timeout', number('--upstream-timeout', { integer: true, min: 1 }), DEFAULT_UPSTREAM_TIMEOUT_MS)
    .optionsGroup(GROUPS.recording)
    .option('--captures <file>', 'capture file (SQLite)', DEFAULT_CAPTURES)
    .addOption(
      laterDefault(
        new Option('--model <model>', 'tokenizer stored with the capture: local directory or HF id in the local cache'),
        "the upstream's model if cached, else bundled",
      ),
    )
    .option('--label <text>', 'free text stored with this capture run')
    .option('--redact-header <name>', 'also never store this header (Authorization, API keys and cookies never are)', collect, [...DEFAULT_REDACTED_HEADERS])
    .option('--redact-bodies', 'store token ids and timing only: no text, request body or response bytes (replay renders from the ids)')
    .optionsGroup(GROUPS.server)
    .option('--host <host>', 'address to listen on', '0.0.0.0')
    .option('--port <port>', 'port to listen on', port('--port'), 8001)
    .option('--max-body-bytes <n>', 'largest request body accepted', number('--max-body-bytes', { integer: true, min: 1 }), DEFAULT_MAX_BODY_BYTES)
    .addOption(shutdownTimeout())
    .optionsGroup(GROUPS.security)
    .option('--api-key <key>', 'require Authorization: Bearer <key> on /v1/* (the header is passed on to the upstream)')
    .addOption(apiKeyScope())
    .action(async (o) => stopOnSignal('capture', startCaptureWith(o), o.shutdownTimeout));

  // Every server takes vLLM's TLS flags (listed after its own).
  for (const server of ['serve', 'capture', 'pd-proxy'])
    for (const option of tlsOptions()) program.commands.find((c) => c.name() === server)!.addOption(option);

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
