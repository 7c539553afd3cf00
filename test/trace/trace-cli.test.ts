/**
 * `mocker trace` as users run it: the built CLI, with the flags of Dynamo's `python -m dynamo.replay`
 * (engine-reference §10.2), on a real Mooncake trace and on synthetic workloads.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { runMockerToExit } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';

const ROOT = join(import.meta.dirname, '..', '..');
const TRACE = join(ROOT, 'test', 'fixtures', 'traces', 'conversation_trace_200.jsonl');
const dir = mkdtempSync(join(testTmpdir(), 'trace-cli-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Every key of Dynamo's report (§8.8), written out from the spec. */
const DISTRIBUTIONS = ['ttft', 'ttst', 'tpot', 'itl', 'e2e_latency'];
const STATS = ['mean', 'min', 'max', 'median', 'p75', 'p90', 'p95', 'p99', 'std'];
const REPORT_KEYS = [
  'num_requests',
  'completed_requests',
  'total_input_tokens',
  'total_output_tokens',
  'duration_ms',
  'wall_time_ms',
  'request_throughput_rps',
  'input_throughput_tok_s',
  'output_throughput_tok_s',
  'total_throughput_tok_s',
  'total_reused_input_tokens',
  'total_first_admission_reused_input_tokens',
  'prefix_cache_reused_ratio',
  'first_admission_prefix_cache_reused_ratio',
  ...DISTRIBUTIONS.flatMap((d) => STATS.map((s) => `${s}_${d}_ms`)),
  ...STATS.map((s) => `${s}_output_token_throughput_per_user`),
].sort();

const rows = readFileSync(TRACE, 'utf8')
  .trim()
  .split('\n')
  .map((line) => JSON.parse(line) as { input_length: number; output_length: number });

async function trace(args: string[], cwd = dir) {
  const result = await runMockerToExit(['trace', ...args, '--no-progress'], { cwd });
  return result;
}

const readReport = (path: string) => JSON.parse(readFileSync(path, 'utf8')) as Record<string, number>;

describe('mocker trace: a Mooncake trace offline', () => {
  it('replays every row with the defaults and writes the table, the JSON report and the HTML page', async () => {
    const json = join(dir, 'report.json');
    const html = join(dir, 'report.html');
    const { code, stdout, stderr } = await trace([TRACE, '--report-json', json, '--report-html', html]);
    expect(stderr).toBe('');
    expect(code).toBe(0);
    expect(stdout.split('\n')[0]).toBe('NVIDIA AIPerf | LLM Metrics');
    expect(stdout).toContain(`Saved full report to: ${json}`);
    const report = readReport(json);
    expect(Object.keys(report).sort()).toEqual(REPORT_KEYS);
    expect(report.num_requests).toBe(200);
    expect(report.completed_requests).toBe(200);
    expect(report.total_input_tokens).toBe(rows.reduce((n, r) => n + r.input_length, 0));
    expect(report.total_output_tokens).toBe(rows.reduce((n, r) => n + r.output_length, 0));
    // The conversation trace shares prefixes (hash id 0 opens most rows): prefix caching is on by default.
    expect(report.prefix_cache_reused_ratio).toBeGreaterThan(0);
    expect(report.duration_ms).toBeGreaterThan(0);
    expect(stdout).toMatch(/┃ Request Count \(requests\) +┃ +200\.00 ┃/);
    expect(readFileSync(html, 'utf8')).toMatch(/^<!DOCTYPE html>/i);
  });

  it('is deterministic: the same run gives the same report, byte for byte, wall time aside', async () => {
    const runs = await Promise.all(
      ['a', 'b'].map(async (name) => {
        const json = join(dir, `same-${name}.json`);
        const { code } = await trace([TRACE, '--router-mode', 'kv_router', '--num-workers', '3', '--arrival-speedup-ratio', '4', '--report-json', json]);
        expect(code).toBe(0);
        return readFileSync(json, 'utf8').replace(/"wall_time_ms": [^,\n]+/, '');
      }),
    );
    expect(runs[0]).toBe(runs[1]);
    expect(runs[0]).toMatch(/^\{\n {2}"completed_requests": 200,\n/);
  });

  it('says how far it got on stderr when not asked to be quiet (no terminal: lines, not a bar)', async () => {
    const { code, stderr } = await runMockerToExit(
      ['trace', '--input-tokens', '64', '--output-tokens', '2', '--request-count', '3', '--report-json', join(dir, 'progress.json')],
      { cwd: dir },
    );
    expect(code).toBe(0);
    const lines = stderr.trim().split('\n');
    expect(lines[0]).toBe('mocker trace: 3 requests');
    expect(lines.at(-1)).toMatch(/^mocker trace: 3\/3 requests done, simulated \d+\.\d s, \d+\.\d s elapsed$/);
  });

  it('prints each progress line once: the end just after a 5 s line is not said again', async () => {
    // Online, the second request arrives and ends 6 s in: the 5 s line and the end line would say the same.
    const { code, stderr } = await runMockerToExit(
      [
        'trace',
        '--replay-mode',
        'online',
        '--input-tokens',
        '16',
        '--output-tokens',
        '2',
        '--request-count',
        '2',
        '--arrival-interval-ms',
        '6000',
        '--report-json',
        join(dir, 'progress-once.json'),
      ],
      { cwd: dir },
    );
    expect(code).toBe(0);
    const done = stderr
      .split('\n')
      .map((line) => /^mocker trace: (\d+\/\d+) requests done, /.exec(line)?.[1])
      .filter((n) => n !== undefined);
    expect(done).toEqual(['2/2']);
  });

  it('writes the report into a directory under a timestamped name, and by default under reports/ (made when needed, git-ignored), beside an HTML report named there', async () => {
    const into = mkdtempSync(join(dir, 'into-'));
    expect((await trace(['--input-tokens', '256', '--output-tokens', '8', '--request-count', '20', '--report-json', into])).code).toBe(0);
    const [file] = readdirSync(into);
    expect(file).toMatch(/^dynamo_replay_report_\d{8}_\d{6}\.json$/);
    const report = readReport(join(into, file));
    expect([report.completed_requests, report.total_input_tokens, report.total_output_tokens]).toEqual([20, 5120, 160]);
    // As the docs run it in a fresh checkout: no reports/ yet; nothing is left in the working directory itself.
    const cwd = mkdtempSync(join(dir, 'cwd-'));
    const run = await trace(['--input-tokens', '64', '--output-tokens', '2', '--request-count', '3', '--report-html', 'reports/trace.html'], cwd);
    expect(run.code).toBe(0);
    expect(readdirSync(cwd)).toEqual(['reports']);
    const [json, html] = readdirSync(join(cwd, 'reports')).sort();
    expect(json).toMatch(/^dynamo_replay_report_\d{8}_\d{6}\.json$/);
    expect(html).toBe('trace.html');
    expect(run.stdout).toContain(`Saved full report to: reports/${json}`);
    expect(readReport(join(cwd, 'reports', json)).completed_requests).toBe(3);
    expect(readFileSync(join(cwd, 'reports', html), 'utf8')).toMatch(/^<!DOCTYPE html>/i);
    // The repository's .gitignore keeps them out of commits (git itself says so; exit 1 would be "not ignored").
    const ignored = spawnSync('git', ['check-ignore', '--no-index', `reports/${json}`, 'reports/trace.html'], { cwd: ROOT, encoding: 'utf8' });
    expect(ignored.status, ignored.stderr).toBe(0);
    expect(ignored.stdout.trim().split('\n')).toEqual([`reports/${json}`, 'reports/trace.html']);
  });

  it('runs sessions closed-loop, and a disaggregated fleet', async () => {
    const sessions = join(dir, 'sessions.jsonl');
    writeFileSync(
      sessions,
      [
        '{"session_id":"a","timestamp":0,"input_length":600,"output_length":4,"hash_ids":[1,2]}',
        '{"session_id":"a","delay":250,"input_length":900,"output_length":4,"hash_ids":[1,2,3]}',
        '{"session_id":"b","timestamp":10,"input_length":500,"output_length":4,"hash_ids":[4]}',
      ].join('\n'),
    );
    const json = join(dir, 'sessions.json');
    expect((await trace([sessions, '--replay-concurrency', '1', '--report-json', json])).code).toBe(0);
    const report = readReport(json);
    // One at a time, and a's second turn waits 250 ms after its first completes: the run lasts longer than that.
    expect(report.completed_requests).toBe(3);
    expect(report.duration_ms).toBeGreaterThan(250);
    const disagg = join(dir, 'disagg.json');
    const { code, stderr } = await trace([
      TRACE,
      '--router-mode',
      'kv_router',
      '--prefill-engine-args',
      '{"worker_type":"prefill","kv_bytes_per_token":131072,"kv_transfer_bandwidth":64}',
      '--decode-engine-args',
      '{"worker_type":"decode"}',
      '--num-prefill-workers',
      '2',
      '--num-decode-workers',
      '2',
      '--report-json',
      disagg,
    ]);
    expect(stderr).toBe('');
    expect(code).toBe(0);
    expect(readReport(disagg).completed_requests).toBe(200);
  });

  it('runs online in real time with simulated workers', async () => {
    const json = join(dir, 'online.json');
    const { code } = await trace([
      '--replay-mode',
      'online',
      '--input-tokens',
      '128',
      '--output-tokens',
      '4',
      '--request-count',
      '8',
      '--arrival-interval-ms',
      '5',
      '--speedup-ratio',
      '50',
      '--num-workers',
      '2',
      '--router-mode',
      'kv_router',
      '--report-json',
      json,
    ]);
    expect(code).toBe(0);
    const report = readReport(json);
    expect([report.completed_requests, report.total_output_tokens]).toEqual([8, 32]);
    // Real time: the last arrival alone is 35 ms in.
    expect(report.duration_ms).toBeGreaterThan(35);
  });
});

describe('mocker trace: what it refuses, naming the problem', () => {
  it.each([
    ['with no workload', [], /give a trace file, a synthetic workload/],
    [
      'with a trace and a synthetic workload',
      [TRACE, '--input-tokens', '5', '--output-tokens', '5', '--request-count', '5'],
      /give one workload, not a trace file and a synthetic workload/,
    ],
    [
      'with a partial synthetic workload',
      ['--input-tokens', '5'],
      /needs --input-tokens, --output-tokens and --request-count \(missing --output-tokens, --request-count\)/,
    ],
    ['offline kv_router with one worker', [TRACE, '--router-mode', 'kv_router'], /offline --router-mode kv_router needs --num-workers > 1/],
    [
      'online disaggregated replay',
      [TRACE, '--prefill-engine-args', '{}', '--decode-engine-args', '{}', '--router-mode', 'kv_router', '--replay-mode', 'online'],
      /disaggregated replay runs offline only/,
    ],
    ['half a disaggregated fleet', [TRACE, '--prefill-engine-args', '{}'], /needs both --prefill-engine-args and --decode-engine-args/],
    ['pool sizes without pools', [TRACE, '--num-decode-workers', '2'], /--num-prefill-workers \/ --num-decode-workers need --prefill-engine-args/],
    ['an unknown router setting', [TRACE, '--router-config', '{"overlap_score_wieght":1}'], /--router-config: unknown key "overlap_score_wieght"/],
    ['a bad engine arg', [TRACE, '--extra-engine-args', '{"block_size":"big"}'], /--extra-engine-args: "block_size"/],
    [
      'a bad router queue policy in the engine args',
      [TRACE, '--num-workers', '2', '--extra-engine-args', '{"router_queue_policy":"random"}'],
      /--extra-engine-args: "router_queue_policy" must be fcfs, lcfs or wspt/,
    ],
    ['a missing trace file', [join(dir, 'missing.jsonl')], /cannot read the trace .*missing\.jsonl/],
    [
      'a concurrency of 0',
      ['--replay-concurrency', '0', '--input-tokens', '5', '--output-tokens', '5', '--request-count', '5'],
      /--replay-concurrency must be an integer >= 1/,
    ],
    ['an unknown router mode', [TRACE, '--router-mode', 'least_loaded'], /argument 'least_loaded' is invalid/],
  ])('refuses %s', async (_label, args, message) => {
    const { code, stderr } = await trace(args);
    expect(code).toBe(1);
    expect(stderr).toMatch(message);
  });

  it('names the line of a malformed trace row', async () => {
    const bad = join(dir, 'bad.jsonl');
    writeFileSync(bad, '{"timestamp":0,"output_length":1,"hash_ids":[1]}\n{"timestamp":1,"hash_ids":[2]}\n');
    const { code, stderr } = await trace([bad]);
    expect(code).toBe(1);
    expect(stderr).toMatch(/line 2: output_length/);
  });
});
