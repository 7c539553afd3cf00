/**
 * Configuration by environment, through spawned processes: `MOCKER_<FLAG>` variables and the variables of vLLM's NPU mock model
 * (vLLM's mock model for NPUs) start the same server the equivalent flags do (the oracle: a second process
 * started with those flags), flags win over variables, and the NPU mock model's scripts under scripts/npu-mock/ run.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import { afterEach, describe, expect, it } from 'vitest';
import { freePorts } from '../support/kvEventsClient.js';
import { runMockerToExit, mockerProcesses, type SpawnOptions } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';
import { startUpstream, type Upstream } from '../support/vllmUpstream.js';

type Json = Record<string, unknown>;

const SEED_004 = [
  'CAPTURE_MODE',
  'REPLAY_MODE',
  'RANDOM_MODE',
  'FORWARD_TIME',
  'SIMULATE_ELAPSED_TIME',
  'MOCK_CAPTURE_DIR',
  'MOCK_CAPTURE_FILE',
  'KV_CACHE_MODE',
  'PREFILL_PROCESS',
];
/** The user's environment without anything that stands in for a flag. */
const CLEAN = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^(VLLM_|DYN_MOCKER_|MOCKER_|PYTHONHASHSEED$)/.test(k) && !SEED_004.includes(k)));
const SCRIPTS = join(import.meta.dirname, '..', '..', 'scripts', 'npu-mock');

const mockers = mockerProcesses();
const upstreams: Upstream[] = [];
const dirs: string[] = [];
afterEach(async () => {
  await mockers.stopAll();
  await Promise.all(upstreams.splice(0).map((u) => u.close()));
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

function tempDir(): string {
  const dir = mkdtempSync(join(testTmpdir(), 'mocker-env-'));
  dirs.push(dir);
  return dir;
}

/** The CLI started with `env` over the clean environment, in a directory of its own unless `cwd` is given. */
const serve = (args: string[], env: Json = {}, options: Omit<SpawnOptions, 'env'> & { port?: number } = {}) =>
  mockers.start(args, { ...options, cwd: options.cwd ?? tempDir(), env: { ...CLEAN, ...env } as NodeJS.ProcessEnv });

/** What a server was started with (GET /mocker/engine's settings) and the models it serves. */
async function startedWith(url: string): Promise<{ config: Json; models: string[] }> {
  const engine = (await (await fetch(`${url}/mocker/engine`)).json()) as { config: Json };
  const models = (await (await fetch(`${url}/v1/models`)).json()) as { data: { id: string }[] };
  return { config: engine.config, models: models.data.map((m) => m.id) };
}

/** Two servers, one configured by `env`, one by `flags`: they must be the same server. */
async function expectSameServer(env: Json, flags: string[], common: string[] = []) {
  const byEnv = await serve(['serve', ...common], env);
  const byFlags = await serve(['serve', ...common, ...flags]);
  const [a, b] = await Promise.all([startedWith(byEnv.url), startedWith(byFlags.url)]);
  expect(a).toEqual(b);
  return { byEnv, settings: a };
}

const refused = (env: Json, args: string[] = ['serve']) => runMockerToExit(args, { cwd: tempDir(), env: { ...CLEAN, ...env } as NodeJS.ProcessEnv });

describe('MOCKER_<FLAG>', () => {
  it('sets values, choices, lists and both spellings of a boolean as the flags do', async () => {
    const { byEnv, settings } = await expectSameServer(
      {
        MOCKER_MODE: 'random',
        MOCKER_FORWARD_TIME_MS: '7',
        MOCKER_MAX_NUM_SEQS: '8',
        MOCKER_PREEMPTION_MODE: 'fifo',
        MOCKER_NO_ENABLE_PREFIX_CACHING: '1',
        MOCKER_ENABLE_CHUNKED_PREFILL: 'false',
        MOCKER_SERVED_MODEL_NAME: 'alpha,beta',
        MOCKER_SEED: '9',
      },
      [
        '--mode',
        'random',
        '--forward-time-ms',
        '7',
        '--max-num-seqs',
        '8',
        '--preemption-mode',
        'fifo',
        '--no-enable-prefix-caching',
        '--no-enable-chunked-prefill',
        '--served-model-name',
        'alpha',
        'beta',
        '--seed',
        '9',
      ],
    );
    // Not the defaults (docs/cli.md): the variables did something.
    expect(settings.config).toMatchObject({
      mode: 'random',
      forward_time_ms: 7,
      max_num_seqs: 8,
      preemption_mode: 'fifo',
      enable_prefix_caching: false,
      enable_chunked_prefill: false,
      seed: 9,
    });
    expect(settings.models).toEqual(['alpha', 'beta']);
    // Which variables took effect is said by name (never their values: they may be keys).
    const said = /settings from the environment: (.*)/.exec(byEnv.stderr())![1].split(', ');
    expect(said.sort()).toEqual([
      'MOCKER_ENABLE_CHUNKED_PREFILL',
      'MOCKER_FORWARD_TIME_MS',
      'MOCKER_MAX_NUM_SEQS',
      'MOCKER_MODE',
      'MOCKER_NO_ENABLE_PREFIX_CACHING',
      'MOCKER_PREEMPTION_MODE',
      'MOCKER_SEED',
      'MOCKER_SERVED_MODEL_NAME',
    ]);
  });

  it('gives the port, a secret and a repeatable flag; a flag on the command line wins', async () => {
    const [port] = await freePorts(1);
    const { url } = await serve(
      ['serve', '--mode', 'random', '--max-num-seqs', '9'],
      { MOCKER_PORT: String(port), MOCKER_API_KEY: 'sk-env', MOCKER_MAX_NUM_SEQS: '7' },
      { port, portFlag: false },
    );
    expect(url).toBe(`http://127.0.0.1:${port}`);
    expect((await fetch(`${url}/v1/models`)).status).toBe(401);
    const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'sk-env', maxRetries: 0 });
    expect((await client.completions.create({ model: 'Qwen/Qwen3-0.6B', prompt: 'Hi', max_tokens: 2 })).usage?.completion_tokens).toBe(2);
    const engine = (await (await fetch(`${url}/mocker/engine`)).json()) as { config: Json };
    expect(engine.config.max_num_seqs).toBe(9);
  });

  it('refuses a bad value naming the variable and the flag, and warns of a variable no flag has', async () => {
    const bad = await refused({ MOCKER_MAX_NUM_SEQS: 'zero' });
    expect(bad.code).toBe(1);
    expect(bad.stderr).toMatch(/MOCKER_MAX_NUM_SEQS: --max-num-seqs must be an integer/);
    const choice = await refused({ MOCKER_MODE: 'fast' });
    expect(choice.code).toBe(1);
    expect(choice.stderr).toMatch(/MOCKER_MODE: .*simulate, replay, random/);
    const both = await refused({ MOCKER_ENABLE_PREFIX_CACHING: '1', MOCKER_NO_ENABLE_PREFIX_CACHING: '1' });
    expect(both.stderr).toContain('MOCKER_ENABLE_PREFIX_CACHING and MOCKER_NO_ENABLE_PREFIX_CACHING both set --enable-prefix-caching');
    const typo = await serve(['serve', '--mode', 'random'], { MOCKER_MAX_NUM_SEQ: '3' });
    expect(typo.stderr()).toContain('MOCKER_MAX_NUM_SEQ names no flag of any command');
  });
});

describe("the variables of vLLM's NPU mock model", () => {
  it('RANDOM_MODE with FORWARD_TIME is random mode with that step time', async () => {
    const { settings } = await expectSameServer({ RANDOM_MODE: '1', FORWARD_TIME: '40' }, ['--mode', 'random', '--forward-time-ms', '40']);
    expect(settings.config).toMatchObject({ mode: 'random', timing: 'fixed', forward_time_ms: 40 });
  });

  it('REPLAY_MODE replays as fast as possible, or as captured with SIMULATE_ELAPSED_TIME', async () => {
    // vLLM's NPU mock model: "SIMULATE_ELAPSED_TIME on REPLAY_MODE will simulate time for computing output as it took on the NPUs".
    const fast = await expectSameServer({ REPLAY_MODE: '1' }, ['--mode', 'replay', '--timing', 'none'], ['--on-miss', 'random']);
    expect(fast.settings.config).toMatchObject({ mode: 'replay', timing: 'none' });
    const timed = await expectSameServer(
      { REPLAY_MODE: '1', SIMULATE_ELAPSED_TIME: '1' },
      ['--mode', 'replay', '--timing', 'captured'],
      ['--on-miss', 'random'],
    );
    expect(timed.settings.config).toMatchObject({ mode: 'replay', timing: 'captured' });
  });

  it('KV_CACHE_MODE makes a PD node: prefill with PREFILL_PROCESS, decode without', async () => {
    const prefill = await expectSameServer({ KV_CACHE_MODE: '1', PREFILL_PROCESS: '1', RANDOM_MODE: '1' }, [
      '--disaggregation-mode',
      'prefill',
      '--mode',
      'random',
    ]);
    expect(prefill.settings.config.disaggregation_mode).toBe('prefill');
    const decode = await expectSameServer({ KV_CACHE_MODE: '1', RANDOM_MODE: '1' }, ['--disaggregation-mode', 'decode', '--mode', 'random']);
    expect(decode.settings.config.disaggregation_mode).toBe('decode');
  });

  it('yield to MOCKER_ variables and flags; contradictions are refused', async () => {
    const { url } = await serve(['serve', '--forward-time-ms', '11'], { RANDOM_MODE: '1', MOCKER_MODE: 'simulate', FORWARD_TIME: '40' });
    expect((await startedWith(url)).config).toMatchObject({ mode: 'simulate', forward_time_ms: 11 });
    const two = await refused({ REPLAY_MODE: '1', RANDOM_MODE: '1' });
    expect(two.code).toBe(1);
    expect(two.stderr).toContain('REPLAY_MODE and RANDOM_MODE are exclusive');
    const alone = await refused({ PREFILL_PROCESS: '1' });
    expect(alone.stderr).toContain('needs KV_CACHE_MODE=1');
    const notBoolean = await refused({ RANDOM_MODE: 'maybe' });
    expect(notBoolean.stderr).toMatch(/RANDOM_MODE must be one of 1, true/);
    const noUpstream = await refused({ CAPTURE_MODE: '1' });
    expect(noUpstream.stderr).toContain('CAPTURE_MODE=1 records a real engine: give its URL with --upstream');
  });

  it('the scripts: capture.sh records a real engine into MOCK_CAPTURE_DIR/MOCK_CAPTURE_FILE, replay.sh answers from it', async () => {
    const engine = await startUpstream(() => ({ content: 'Paris is the capital of France.' }));
    upstreams.push(engine);
    const cwd = tempDir();
    const files = { MOCK_CAPTURE_DIR: join(cwd, 'golden'), MOCK_CAPTURE_FILE: 'run1.db' };
    const ask = async (url: string) => {
      const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0 });
      const answer = await client.chat.completions.create({
        model: 'Qwen/Qwen3-0.6B',
        messages: [{ role: 'user', content: 'Capital of France?' }],
        max_tokens: 16,
        temperature: 0,
      });
      return answer.choices[0].message.content;
    };
    const capture = await serve([], { ...files, UPSTREAM: engine.url }, { cwd, launcher: ['bash', join(SCRIPTS, 'capture.sh')] });
    expect(capture.stdout()).toContain('CAPTURE_MODE=1: running as mocker capture');
    expect(await ask(capture.url)).toBe('Paris is the capital of France.');
    await capture.stop();
    await engine.close();
    // The engine is gone: the answer can only come from the file the variables named.
    const replay = await serve([], files, { cwd, launcher: ['bash', join(SCRIPTS, 'replay.sh')] });
    expect(replay.stdout()).toContain(`from ${join(files.MOCK_CAPTURE_DIR, files.MOCK_CAPTURE_FILE)}`);
    expect(await ask(replay.url)).toBe('Paris is the capital of France.');
  });

  it('the scripts: random.sh and pd_1p1d.sh answer a chat completion', async () => {
    const random = await serve([], { FORWARD_TIME: '1' }, { launcher: ['bash', join(SCRIPTS, 'random.sh')] });
    expect((await startedWith(random.url)).config).toMatchObject({ mode: 'random', forward_time_ms: 1 });
    const [port, prefillPort, decodePort] = await freePorts(3);
    // The proxy listens last (its line names every address): waited for by its port.
    const pd = await serve(
      [],
      { HOST: '127.0.0.1', PORT: String(port), PREFILL_PORT: String(prefillPort), DECODE_PORT: String(decodePort), FORWARD_TIME: '1' },
      { port, portFlag: false, launcher: ['bash', join(SCRIPTS, 'pd_1p1d.sh')] },
    );
    // The proxy may listen before the engines behind it do.
    for (const node of [prefillPort, decodePort])
      await expect
        .poll(
          () =>
            fetch(`http://127.0.0.1:${node}/health`).then(
              (r) => r.status,
              () => 0,
            ),
          { timeout: 20_000 },
        )
        .toBe(200);
    const client = new OpenAI({ baseURL: `${pd.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    const answer = await client.chat.completions.create({
      model: 'Qwen/Qwen3-0.6B',
      messages: [{ role: 'user', content: 'Hello' }],
      max_tokens: 5,
      ignore_eos: true,
    } as OpenAI.ChatCompletionCreateParamsNonStreaming);
    expect(answer.usage?.completion_tokens).toBe(5);
    // The nodes behind the proxy are the two PD roles.
    expect((await startedWith(`http://127.0.0.1:${prefillPort}`)).config.disaggregation_mode).toBe('prefill');
    expect((await startedWith(`http://127.0.0.1:${decodePort}`)).config.disaggregation_mode).toBe('decode');
  });
});
