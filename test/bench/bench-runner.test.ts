/**
 * `npm run bench`'s table and results file (bench/lib/report.ts, bench/lib/suite.ts) on canned benchmark
 * output: the stdout of replay-throughput and proxy-overhead as they print it (text, then the JSON line), with
 * numbers chosen by hand; every expected cell is computed here from those numbers. No timing.
 */
import { describe, expect, it } from 'vitest';
import {
  formatTable,
  HEADLINE_BLOCK,
  headlineSection,
  jsonLinesOf,
  lastRun,
  met,
  TABLE_BLOCK,
  tableSection,
  toJsonl,
  type Figure,
  type RunLine,
} from '../../bench/lib/report.js';
import { replaceBetweenMarkers } from '../../scripts/generatedBlock.js';
import { BENCHMARKS, selectBenchmarks } from '../../bench/lib/suite.js';

const REPLAY_STDOUT = [
  'replay throughput: 16 concurrent clients, 256-token chat stream',
  '{ not json: a progress line',
  'server     tokens/s',
  JSON.stringify({
    bench: 'replay-throughput',
    config: { concurrency: 16 },
    bare: { tokensPerS: 400000 },
    bareTurn: { tokensPerS: 300000 },
    replay: { tokensPerS: 240000 },
    ratio: 0.6,
    ratios: [0.55, 0.6, 0.72],
    ratioToPerTurn: 0.8,
  }),
  '',
].join('\n');

const proxyMetric = (direct: number, added: number, min: number, max: number) => ({
  direct,
  relay: direct + 0.05,
  relayAdded: 0.05,
  relayAddedMin: 0.02,
  relayAddedMax: 0.08,
  pipe: direct + 0.1,
  pipeAdded: 0.1,
  pipeAddedMin: 0.05,
  pipeAddedMax: 0.2,
  capture: direct + added,
  captureAdded: added,
  captureAddedMin: min,
  captureAddedMax: max,
});
const PROXY_STDOUT = `proxy overhead\n${JSON.stringify({
  bench: 'proxy-overhead',
  ms: { ttftP50: proxyMetric(4, 0.4, 0.3, 0.6), ttftP99: proxyMetric(10, 2.5, 1.5, 4), perTokenP99: proxyMetric(8, 1, 0.5, 3) },
  loops: { relay: { cpuUsPerToken: 8 }, capture: { cpuUsPerToken: 12, cpuUsPerTokenMin: 11, cpuUsPerTokenMax: 14, mainThreadUsPerToken: 10 } },
})}\n`;

const RUN: RunLine = {
  kind: 'run',
  run: '2026-11-24T10:00:00.000Z',
  date: '2026-11-24',
  machine: { cpu: 'Test CPU', cores: 2, ramGiB: 23, node: 'v20.0.0' },
  loadAverage: { start: [1.5, 1.25, 1], end: [2, 1.5, 1.125] },
  seconds: 42.4,
  benches: [{ name: 'replay-16', script: 'bench/replay-throughput.ts', args: [], exitCode: 0, seconds: 20 }],
};

const figuresOf = (name: string, stdout: string): Figure[] => {
  const bench = BENCHMARKS.find((b) => b.name === name)!;
  return bench.figures(jsonLinesOf(stdout)).map((f) => ({ bench: name, ...f }));
};

describe('bench runner', () => {
  it("takes only the JSON objects out of a benchmark's stdout", () => {
    expect(jsonLinesOf(REPLAY_STDOUT).map((j) => j.bench)).toEqual(['replay-throughput']);
  });

  it('maps replay-throughput to tokens/s against the bare server, judged on the ratio and its per-round spread', () => {
    const [f] = figuresOf('replay-16', REPLAY_STDOUT);
    expect(f).toMatchObject({ value: 240000, baselineValue: 400000, ratio: 0.6, judged: 'ratio', min: 0.55, max: 0.72, target: { op: '>=', bound: 0.7 } });
    expect(met(f)).toBe(false);
  });

  it("maps proxy-overhead to the capture proxy's added latencies with their per-round spread", () => {
    const figures = figuresOf('proxy-64', PROXY_STDOUT);
    expect(figures.map((f) => [f.value, f.baselineValue, f.min, f.max, f.target?.bound ?? null, met(f)])).toEqual([
      [0.4, 4, 0.3, 0.6, 0.5, true],
      [2.5, 10, 1.5, 4, 2, false],
      [1, 8, 0.5, 3, 2, true],
      [0.1, 10, 0.05, 0.2, null, null],
      [0.05, 4, 0.02, 0.08, null, null],
      [0.05, 10, 0.02, 0.08, null, null],
      [0.05, 8, 0.02, 0.08, null, null],
      // CPU per forwarded token against the raw relay's; issue 41's 6 µs is set at 256 streams.
      [12, 8, 11, 14, null, null],
    ]);
    // capture ÷ direct: (4 + 0.4) / 4
    expect(figures[0].ratio).toBeCloseTo(1.1, 12);
    expect(figures[7]).toMatchObject({ unit: 'µs', baseline: 'raw TCP relay', ratio: 1.5, judged: 'value' });
    // At 256 streams the CPU row carries issue 41's 6 µs, and the capture's main thread follows, against the relay's whole process.
    const [cpu256, mainThread256] = figuresOf('proxy-256', PROXY_STDOUT).slice(-2);
    expect(cpu256).toMatchObject({ target: { op: '<=', bound: 6 } });
    expect(met(cpu256)).toBe(false);
    expect(mainThread256).toMatchObject({ value: 10, unit: 'µs', baselineValue: 8, ratio: 1.25, target: null });
    expect(mainThread256.figure).toContain('main thread');
  });

  it('maps trace-sweep (and trace-sweep-64) to the sweep against the slowest combination alone, judged on the ratio (issue 40: ≤ 2)', () => {
    const stdout = `round 1: alone (ms) …\n${JSON.stringify({
      sweepMsMedian: 4000,
      slowestMsMedian: 1600,
      ratio: 2.5,
      ratios: [2.5, 2.2, 2.9],
      floorRatio: 2.1,
      floorRatios: [2.1, 2.05, 2.2],
    })}\n`;
    const [f, floor] = figuresOf('trace-sweep', stdout);
    expect(f).toMatchObject({ value: 4000, baselineValue: 1600, ratio: 2.5, judged: 'ratio', min: 2.2, max: 2.9, target: { op: '<=', bound: 2 } });
    expect(f.figure).toContain('6144 agentic requests');
    expect(met(f)).toBe(false);
    // Under it, the floor of that ratio (a perfect sweep), reported with its spread and judged against nothing.
    expect(floor).toMatchObject({ value: 2.1, min: 2.05, max: 2.2, target: null });
    expect(floor.figure).toContain('perfect sweep');
    const [small] = figuresOf('trace-sweep-64', stdout.replace('"ratio":2.5', '"ratio":1.8').replace('[2.5,', '[1.8,').replace('2.9]', '1.9]'));
    expect(small.figure).toContain('768 agentic requests');
    expect(met(small)).toBe(true);
  });

  it('says which number a benchmark failed to report', () => {
    expect(() => figuresOf('replay-16', '{"bench":"replay-throughput"}')).toThrow(/replay\.tokensPerS/);
  });

  it('prints one aligned row per figure with value, baseline, ratio, spread, target and verdict', () => {
    const lines = formatTable(figuresOf('replay-16', REPLAY_STDOUT)).split('\n');
    expect(lines).toHaveLength(3);
    const cells = lines[2].split(/ {2,}/);
    expect(cells).toEqual([
      'replay-16',
      'replay --timing none tokens/s, 16 streams',
      '240,000 tokens/s',
      'bare node:http SSE: 400,000 tokens/s',
      '0.6×',
      '0.55–0.72×',
      '≥ 0.7×',
      'NO',
    ]);
    // Columns line up: every cell of the data row starts where the header's does.
    expect(lines[2].indexOf('240,000')).toBe(lines[0].indexOf('value'));
  });

  it('writes a run line, the raw JSON and one line per figure, and reads the last run of a day back', () => {
    const figures = figuresOf('replay-16', REPLAY_STDOUT);
    const raw = jsonLinesOf(REPLAY_STDOUT).map((json) => ({ bench: 'replay-16', json }));
    const earlier = toJsonl({ ...RUN, run: '2026-11-24T08:00:00.000Z' }, figuresOf('proxy-64', PROXY_STDOUT), []);
    const text = earlier + toJsonl(RUN, figures, raw);
    const lines = text
      .trimEnd()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(lines.map((l) => l.kind)).toEqual(['run', ...Array(8).fill('figure'), 'run', 'raw', 'figure']);
    expect(lines[10]).toMatchObject({ run: RUN.run, bench: 'replay-16', json: { ratio: 0.6 } });
    expect(lines[11]).toMatchObject({ run: RUN.run, bench: 'replay-16', value: 240000, ratio: 0.6, met: false });
    const back = lastRun(text);
    expect(back.run.run).toBe(RUN.run);
    expect(back.figures.map((f) => f.figure)).toEqual(['replay --timing none tokens/s, 16 streams']);
  });

  it('rewrites only the text between the markers, with date, machine and load', () => {
    const figures = figuresOf('replay-16', REPLAY_STDOUT);
    const section = tableSection(lastRun(toJsonl(RUN, figures, [])), 'bench/results/2026-11-24.jsonl');
    expect(section.split('\n')[0]).toBe(
      'Measured 2026-11-24 by `npm run bench` in 42 s (results: `bench/results/2026-11-24.jsonl`) on Test CPU, 2 cores, 23 GiB RAM, Node v20.0.0; ' +
        'load average (1, 5, 15 min) 1.50 1.25 1.00 at the start, 2.00 1.50 1.13 at the end.',
    );
    expect(section).toContain(
      '| replay-16 | replay --timing none tokens/s, 16 streams | 240,000 tokens/s | bare node:http SSE: 400,000 tokens/s | 0.6× | 0.55–0.72× | ≥ 0.7× | NO |',
    );
    const doc = `# Title\n\nbefore\n${TABLE_BLOCK.begin}\nold table\n${TABLE_BLOCK.end}\n\nprose after\n`;
    const updated = replaceBetweenMarkers(doc, TABLE_BLOCK, section);
    expect(updated.startsWith(`# Title\n\nbefore\n${TABLE_BLOCK.begin}\nMeasured 2026-11-24`)).toBe(true);
    expect(updated.endsWith(`| NO |\n${TABLE_BLOCK.end}\n\nprose after\n`)).toBe(true);
    expect(updated).not.toContain('old table');
    expect(() => replaceBetweenMarkers('# no markers\n', TABLE_BLOCK, section)).toThrow(/markers/);
    // The README's markers are its own: the docs' table does not land there.
    expect(() => replaceBetweenMarkers(doc, HEADLINE_BLOCK, section)).toThrow(/markers/);
  });

  it("the README's short table keeps only the figures with a target: value, ratio, target, verdict", () => {
    const withTarget = figuresOf('replay-16', REPLAY_STDOUT);
    const without = { ...withTarget[0], figure: 'a figure without a target', target: null };
    const section = headlineSection(lastRun(toJsonl(RUN, [...withTarget, without], [])), 'bench/results/2026-11-24.jsonl');
    expect(section).toContain('| replay --timing none tokens/s, 16 streams | 240,000 tokens/s | 0.6× | ≥ 0.7× | NO |');
    expect(section).not.toContain('a figure without a target');
  });

  it('selects benchmarks by invocation or group and refuses unknown names', () => {
    expect(selectBenchmarks(['replay', 'engine-pass']).map((b) => b.name)).toEqual(['replay-16', 'replay-256', 'engine-pass']);
    expect(selectBenchmarks(['proxy-256']).map((b) => b.name)).toEqual(['proxy-256']);
    expect(() => selectBenchmarks(['nope'])).toThrow(/unknown benchmark nope/);
    expect(selectBenchmarks([])).toBe(BENCHMARKS);
  });
});
