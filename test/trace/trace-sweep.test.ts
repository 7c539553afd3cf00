/**
 * `mocker trace --sweep` and `--slo` as users run them: the built CLI. A sweep's runs are checked against the
 * same settings run alone without --sweep (the plain path is the oracle), KV-aware routing against round robin on
 * an agentic trace (Dynamo's agentic_mooncake: each request waits for the previous turn of its agent, whose
 * history it extends; issue 40's bound: ≥ 1.5× the prefix reuse at the smallest KV cache), and goodput against a
 * count worked out from a serial schedule.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { writeAgentTrace } from '../support/agentTrace.js';
import { reportPages } from '../support/chromiumPage.js';
import { runMockerToExit } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';

const dir = mkdtempSync(join(testTmpdir(), 'trace-sweep-'));
const pages = reportPages('trace-sweep-html-');
afterAll(async () => {
  await pages.close();
  rmSync(dir, { recursive: true, force: true });
});

type Report = Record<string, number>;
interface SweepFile {
  settings: Record<string, unknown>;
  slo: Record<string, number> | null;
  runs: { values: Record<string, unknown>; report: Report }[];
}

const trace = (args: string[]) => runMockerToExit(['trace', ...args], { cwd: dir });

/** 32 sessions of 6 turns, each turn adding 4 blocks of 64 tokens to its session's history. */
const AGENT = { sessions: 32, turns: 6, blocksPerTurn: 4, blockTokens: 64, outputTokens: 16, gapMs: 200, delayMs: 2000, seed: 40, agentic: true };
const KV_SIZES = [256, 1024, 4096];
const BASE = ['--trace-format', 'agentic_mooncake', '--trace-block-size', '64', '--num-workers', '4'];

describe('mocker trace --sweep', () => {
  it('runs 2 router modes × 3 KV sizes: each run as the same settings alone, kv_router reusing ≥ 1.5× round robin at the smallest KV', async () => {
    const file = join(dir, 'agent.agentic.jsonl');
    writeAgentTrace(file, AGENT);
    const json = join(dir, 'sweep.json');
    const sweep = await trace([
      file,
      ...BASE,
      '--sweep',
      'router-mode=round_robin,kv_router',
      '--sweep',
      `num_gpu_blocks=${KV_SIZES.join(',')}`,
      '--report-json',
      json,
      '--no-progress',
    ]);
    expect(sweep.stderr).toBe('');
    expect(sweep.code).toBe(0);
    const result = JSON.parse(readFileSync(json, 'utf8')) as SweepFile;
    expect(result.runs.map((r) => r.values)).toEqual(
      ['round_robin', 'kv_router'].flatMap((mode) => KV_SIZES.map((blocks) => ({ 'router-mode': mode, num_gpu_blocks: blocks }))),
    );
    expect(result.settings).toMatchObject({ workload: file, requests: AGENT.sessions * AGENT.turns, workers: 4 });

    // The oracle: each combination run alone, through the plain path.
    for (const { values, report } of result.runs) {
      const alone = join(dir, `alone-${values['router-mode']}-${values.num_gpu_blocks}.json`);
      const run = await trace([
        file,
        ...BASE,
        '--router-mode',
        String(values['router-mode']),
        '--extra-engine-args',
        JSON.stringify({ num_gpu_blocks: values.num_gpu_blocks }),
        '--report-json',
        alone,
        '--no-progress',
      ]);
      expect(run.code, run.stderr).toBe(0);
      const { wall_time_ms: _wall, ...expected } = JSON.parse(readFileSync(alone, 'utf8')) as Report;
      const { wall_time_ms: _sweepWall, ...got } = report;
      expect(got).toEqual(expected);
      expect(report.completed_requests).toBe(AGENT.sessions * AGENT.turns);
    }

    const reuse = (mode: string, blocks: number) =>
      result.runs.find((r) => r.values['router-mode'] === mode && r.values.num_gpu_blocks === blocks)!.report.first_admission_prefix_cache_reused_ratio;
    expect(reuse('kv_router', KV_SIZES[0])).toBeGreaterThanOrEqual(1.5 * reuse('round_robin', KV_SIZES[0]));

    // The table: a row per run, with its swept values.
    const rows = sweep.stdout.split('\n').filter((line) => /^┃ (round_robin|kv_router) /.test(line));
    expect(
      rows.map((line) =>
        line
          .split('┃')
          .slice(1, 3)
          .map((c) => c.trim()),
      ),
    ).toEqual(result.runs.map((r) => [r.values['router-mode'], String(r.values.num_gpu_blocks)]));
    expect(sweep.stdout).toContain(`Saved sweep report to: ${json}`);
  });

  it.each([
    [
      'an unknown key, listing the valid ones',
      ['--sweep', 'num_gpu_block=64,128'],
      /--sweep: unknown key "num_gpu_block"; valid keys: num-workers, router-mode.*num_gpu_blocks/,
    ],
    [
      'a bad engine-args value, naming key and value',
      ['--sweep', 'num_gpu_blocks=64,lots'],
      /--sweep num_gpu_blocks=lots: --extra-engine-args: "num_gpu_blocks": .*\(got "lots"\)/,
    ],
    [
      'a bad flag value',
      ['--sweep', 'router-mode=round_robin,least_loaded'],
      /--sweep router-mode=least_loaded: --router-mode must be one of round_robin, kv_router/,
    ],
    ['a bad router-config value', ['--sweep', 'overlap_score_weight=1,-2'], /--sweep overlap_score_weight=-2: --router-config: "overlap_score_weight"/],
    [
      'a combination the plain run refuses',
      ['--sweep', 'router-mode=kv_router', '--num-workers', '1'],
      /--sweep router-mode=kv_router: offline --router-mode kv_router needs --num-workers > 1/,
    ],
    ['a key swept twice', ['--sweep', 'num-workers=1', '--sweep', 'num_workers=2'], /--sweep: num-workers is swept twice/],
    [
      'live targets',
      ['--sweep', 'num-workers=1,2', '--target', 'http://127.0.0.1:9'],
      /^mocker: --sweep replays offline only: leave out --target and --replay-mode online\n$/,
    ],
    ['a malformed SLO', ['--slo', 'ttft=fast'], /--slo: ttft must be a number of ms > 0, got "fast"/],
  ])('refuses %s', async (_label, args, message) => {
    const { code, stdout, stderr } = await trace(['--input-tokens', '32', '--output-tokens', '2', '--request-count', '2', ...args, '--no-progress']);
    expect(code).toBe(1);
    expect(stderr).toMatch(message);
    expect(stdout).toBe('');
  });

  it('writes one HTML page comparing the runs, with progress a line per finished run', async () => {
    const json = join(dir, 'html.json');
    const html = join(dir, 'sweep.html');
    const { code, stderr } = await trace([
      ...['--input-tokens', '256', '--output-tokens', '8', '--request-count', '40', '--turns-per-session', '2'],
      ...['--shared-prefix-ratio', '0.5', '--num-prefix-groups', '4', '--slo', 'ttft=50'],
      ...['--sweep', 'num-workers=1,2', '--sweep', 'enable_prefix_caching=true,false', '--report-json', json, '--report-html', html],
    ]);
    expect(code, stderr).toBe(0);
    expect(stderr.match(/^mocker trace: sweep \d\/4 done: num-workers=\d enable_prefix_caching=(true|false) \(\d+\.\d s\)$/gm)).toHaveLength(4);
    const result = JSON.parse(readFileSync(json, 'utf8')) as SweepFile;
    expect(result.slo).toEqual({ ttft: 50 });
    const { page, errors, offFileRequests } = await pages.open('sweep', readFileSync(html, 'utf8'));
    const rows = await page.locator('table.sweep tr').evaluateAll((trs) => trs.map((tr) => [...tr.children].map((cell) => cell.textContent)));
    expect(rows[0].slice(0, 5)).toEqual(['run', 'num-workers', 'enable_prefix_caching', 'completed', 'output tok/s']);
    expect(rows.slice(1).map((row) => row.slice(0, 4))).toEqual(
      result.runs.map((r, i) => [String(i + 1), String(r.values['num-workers']), String(r.values.enable_prefix_caching), String(r.report.completed_requests)]),
    );
    expect(rows[0]).toContain('goodput req/s');
    // One bar chart per figure, each drawn.
    expect(await page.locator('section.chart canvas').count()).toBe(4);
    expect(errors).toEqual([]);
    expect(offFileRequests).toEqual([]);
  });
});

describe('mocker trace --slo', () => {
  /**
   * One worker that runs one request at a time (max_num_seqs 1), ten equal requests all arriving at 0: request k
   * waits for the k before it, so with E the end-to-end latency and F the time to first token of one such
   * request alone, request k's first token comes at k·E + F and its last at (k + 1)·E, and its gaps between
   * tokens are the lone request's.
   */
  const SERIAL = ['--input-tokens', '64', '--output-tokens', '8', '--arrival-interval-ms', '0', '--extra-engine-args', '{"max_num_seqs":1}', '--no-progress'];

  async function report(name: string, args: string[]): Promise<{ report: Report; stdout: string }> {
    const json = join(dir, `${name}.json`);
    const run = await trace([...SERIAL, ...args, '--report-json', json]);
    expect(run.code, run.stderr).toBe(0);
    return { report: JSON.parse(readFileSync(json, 'utf8')) as Report, stdout: run.stdout };
  }

  it('counts the requests within every target, as AIPerf: goodput per second of the run and the fraction', async () => {
    const { report: lone } = await report('lone', ['--request-count', '1']);
    const E = lone.mean_e2e_latency_ms;
    const F = lone.mean_ttft_ms;
    const itl = lone.mean_tpot_ms;
    const cases: [slo: string, good: number][] = [
      [`ttft=${3.5 * E + F}`, 4],
      // AISimulate's spelling too.
      [`e2e_ms=${5.5 * E}`, 5],
      [`ttft=${3.5 * E + F},e2e=${5.5 * E}`, 4],
      [`ttft=${8.5 * E + F},itl=${itl * 1.01}`, 9],
      [`itl=${itl * 0.99}`, 0],
    ];
    for (const [i, [slo, good]] of cases.entries()) {
      const { report: r, stdout } = await report(`slo-${i}`, ['--request-count', '10', '--slo', slo]);
      // The premise: the ten ran one after another.
      expect(r.duration_ms).toBeCloseTo(10 * E, 6);
      expect(r.goodput_completed_requests).toBe(good);
      expect(r.goodput_request_throughput_rps).toBeCloseTo(good / ((10 * E) / 1000), 9);
      expect(r.goodput_output_throughput_tok_s).toBeCloseTo((good * 8) / ((10 * E) / 1000), 9);
      expect(r.goodput_request_fraction).toBeCloseTo(good / 10, 12);
      expect(stdout).toContain(`Goodput (requests/sec): ${(good / ((10 * E) / 1000)).toFixed(2)} (${good} of 10 requests within the SLO)`);
    }
  });
});
