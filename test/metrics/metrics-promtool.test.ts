/**
 * Mocker's own metrics pass Prometheus' own linter: `promtool check metrics` (Debian's `prometheus` package) on
 * what the spawned `serve` and a `capture` in front of it expose. Prometheus reserves colons in metric names for
 * recording rules, so promtool flags every `vllm:` name too: those are vLLM's names, kept exactly as vLLM has
 * them (vllm-wire-reference.md §4), and are the only ones it may complain about.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { startMockerProcess, type MockerProcess } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';
import { MODEL } from '../support/vllmUpstream.js';

const dir = mkdtempSync(join(testTmpdir(), 'mocker-promtool-'));
const processes: MockerProcess[] = [];
afterAll(async () => {
  for (const p of processes.reverse()) await p.stop();
  rmSync(dir, { recursive: true, force: true });
});

/** promtool's complaints about `text`, one `{ name, problem }` per line it printed. */
function promtoolProblems(text: string): { name: string; problem: string }[] {
  const run = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' });
  if (run.error)
    throw new Error(`promtool could not run (${run.error.message}): install Debian's prometheus package (apt-get install prometheus), which this test needs`);
  // Exit 0: no problem; 3: lint problems found (listed on stderr); anything else: promtool itself failed.
  if (run.status !== 0 && run.status !== 3) throw new Error(`promtool check metrics exited with ${run.status}: ${run.stderr}`);
  return run.stderr
    .split('\n')
    .filter((line) => line.trim() !== '')
    .map((line) => ({ name: line.slice(0, line.indexOf(' ')), problem: line.slice(line.indexOf(' ') + 1) }));
}

/** The metric names of an exposition (families named by their TYPE lines). */
const familyNames = (text: string) => [...text.matchAll(/^# TYPE (\S+) /gm)].map((m) => m[1]);

const MOCKER_METRICS = [
  'mocker_capture_hits_total',
  'mocker_capture_prefix_hits_total',
  'mocker_capture_misses_total',
  'mocker_captures_written_total',
  'mocker_upstream_errors_total',
  'mocker_kv_pulls_total',
  'mocker_kv_pull_failures_total',
  'mocker_injected_errors_total',
];

describe("promtool check metrics on the spawned CLI: nothing but vLLM's own `vllm:` names", () => {
  it('serve (a capture lookup missed, a failure injected) and a capture proxy in front of it', async () => {
    // The default mode looks every request up in the capture file: an empty one misses, and --fail-first fails the first.
    const serve = await startMockerProcess(['serve', '--captures', join(dir, 'empty.db'), '--fail-first', '1']);
    processes.push(serve);
    const capture = await startMockerProcess(['capture', '--upstream', `http://127.0.0.1:${serve.port}`, '--captures', join(dir, 'capture.db')]);
    processes.push(capture);
    for (let i = 0; i < 2; i++) {
      const res = await fetch(`http://127.0.0.1:${capture.port}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, prompt: 'Hello', max_tokens: 4 }),
      });
      await res.arrayBuffer();
    }

    for (const [what, port] of [
      ['serve', serve.port],
      ['capture', capture.port],
    ] as const) {
      const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
      const names = familyNames(text);
      expect(names, what).toEqual(expect.arrayContaining(MOCKER_METRICS));
      expect(
        names.filter((n) => n.startsWith('mocker:')),
        what,
      ).toEqual([]);
      // What was counted is there: the miss and the injected failure.
      expect(text, what).toMatch(/^mocker_capture_misses_total\{[^}]*reason="no_match"[^}]*\} [1-9]/m);
      expect(text, what).toMatch(/^mocker_injected_errors_total\{[^}]*\} [1-9]/m);
      const problems = promtoolProblems(text);
      // promtool did lint this text: vLLM's colon names are what it always flags.
      expect(
        problems.some((p) => p.name.startsWith('vllm:')),
        what,
      ).toBe(true);
      expect(
        problems.filter((p) => !p.name.startsWith('vllm:')),
        what,
      ).toEqual([]);
    }
  });
});
