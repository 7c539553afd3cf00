/**
 * `mocker trace --target` as a user runs it: two spawned `mocker serve` processes publishing KV events on
 * ZMQ, the trace sent to them over HTTP, and the servers' own /metrics as the oracle of where prompts were
 * computed and cached.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import parsePrometheusTextFormat from 'parse-prometheus-text-format';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { freePorts } from '../support/kvEventsClient.js';
import { runMockerToExit, startMockerProcess, type MockerProcess } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';

/** vLLM's prefix cache counters of one server (tokens). */
async function prefixCache(port: number): Promise<{ queries: number; hits: number }> {
  const families = parsePrometheusTextFormat(await (await fetch(`http://127.0.0.1:${port}/metrics`)).text());
  const value = (name: string) => families.find((f) => f.name === name)?.metrics.reduce((n, m) => n + Number(m.value), 0) ?? NaN;
  return { queries: value('vllm:prefix_cache_queries_total'), hits: value('vllm:prefix_cache_hits_total') };
}

describe('mocker trace --target: routing over live servers by the KV events they publish', () => {
  let dir: string;
  let servers: MockerProcess[] = [];
  let pubPorts: number[];

  beforeAll(() => {
    dir = mkdtempSync(join(testTmpdir(), 'trace-live-'));
  });

  // Fresh servers for each run: the workload's prompts are the same every time (a fixed seed).
  beforeEach(async () => {
    pubPorts = await freePorts(2);
    servers = await Promise.all(
      pubPorts.map((port) =>
        startMockerProcess(['serve', '--timing', 'none', '--block-size', '16', '--enable-prompt-tokens-details', '--zmq-kv-events-ports', String(port)], 0, {
          cwd: dir,
        }),
      ),
    );
  });

  afterEach(async () => {
    await Promise.all(servers.map((s) => s.stop()));
  });

  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  /** One run of 16 requests of 512 tokens sharing a 384-token prefix (24 blocks of 16), 100 ms apart: each done, and its KV events in, before the next. */
  async function run(routerMode: string) {
    const json = join(dir, `${routerMode}.json`);
    const { code, stdout, stderr } = await runMockerToExit(
      [
        'trace',
        '--target',
        servers.map((s) => `http://127.0.0.1:${s.port}`).join(','),
        '--kv-events',
        pubPorts.map((p) => `tcp://127.0.0.1:${p}`).join(','),
        '--router-mode',
        routerMode,
        '--extra-engine-args',
        '{"block_size":16}',
        '--input-tokens',
        '512',
        '--output-tokens',
        '4',
        '--request-count',
        '16',
        '--arrival-interval-ms',
        '100',
        '--shared-prefix-ratio',
        '0.75',
        '--num-prefix-groups',
        '1',
        '--report-json',
        json,
        '--no-progress',
      ],
      { cwd: dir },
    );
    expect(stderr).toBe('');
    expect(code).toBe(0);
    expect(stdout).toContain('NVIDIA AIPerf | LLM Metrics');
    const counted = await Promise.all(servers.map((s) => prefixCache(s.port)));
    return { counted, report: JSON.parse(readFileSync(json, 'utf8')) as Record<string, number> };
  }

  it('kv_router sends every request after the first to the server whose published KV holds the prefix', async () => {
    const { counted, report } = await run('kv_router');
    // Every request's 512 tokens were looked up on one server, which found the 384-token prefix for all but the first.
    const busy = counted.findIndex((d) => d.queries > 0);
    expect(counted[busy]).toEqual({ queries: 16 * 512, hits: 15 * 384 });
    expect(counted[1 - busy]).toEqual({ queries: 0, hits: 0 });
    expect(report.completed_requests).toBe(16);
    expect(report.total_output_tokens).toBe(64);
    // What the trace measured from the answers' cached_tokens is what the servers counted.
    expect(report.prefix_cache_reused_ratio).toBeCloseTo((15 * 384) / (16 * 512), 9);
  });

  it('round robin alternates, so each server computes the prefix once', async () => {
    const { counted, report } = await run('round_robin');
    expect(counted).toEqual([
      { queries: 8 * 512, hits: 7 * 384 },
      { queries: 8 * 512, hits: 7 * 384 },
    ]);
    expect(report.prefix_cache_reused_ratio).toBeCloseTo((14 * 384) / (16 * 512), 9);
  });
});
