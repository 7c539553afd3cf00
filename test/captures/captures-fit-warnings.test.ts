/**
 * `mocker captures fit`: what it refuses, and the warnings it gives for a capture too small or too odd to trust (a
 * prefill form with more terms than points, a negative per-token cost). Kept apart from captures-fit.test.ts, whose
 * fit is held to the double's wall-clock timing and runs alone: these read counts and signs, not milliseconds.
 */
import { existsSync, mkdtempSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { runMockerToExit, startMockerProcess } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';
import { MODEL, startUpstream, type Answer } from '../support/vllmUpstream.js';

describe('mocker captures fit: refusals', () => {
  it('names a missing capture file and a bad flag, exit code 1, no NPZ written', async () => {
    const dir = mkdtempSync(join(testTmpdir(), 'mocker-captures-fit-'));
    const missing = await runMockerToExit(['captures', 'fit', join(dir, 'none.db'), '-o', join(dir, 'p.npz')]);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toContain(`capture file ${join(dir, 'none.db')}: no such file`);
    const block = await runMockerToExit(['captures', 'fit', join(dir, 'none.db'), '-o', join(dir, 'p.npz'), '--block-size', '1']);
    expect(block.code).toBe(1);
    expect(block.stderr).toContain('--block-size must be an integer >= 2, got "1"');
    expect(existsSync(join(dir, 'p.npz'))).toBe(false);
    // Where the profile goes is needed unless the fit is only validated.
    const nowhere = await runMockerToExit(['captures', 'fit', join(dir, 'none.db')]);
    expect(nowhere.code).toBe(1);
    expect(nowhere.stderr).toContain('-o, --output is required (where the NPZ goes), unless --validate');
    const fraction = await runMockerToExit(['captures', 'fit', join(dir, 'none.db'), '--validate', '--holdout-fraction', '1']);
    expect(fraction.code).not.toBe(0);
    expect(fraction.stderr).toContain('--holdout-fraction must be a number > 0 and < 1, got "1"');
  });
});

describe('mocker captures fit: too few points, or a negative cost, is said on stderr (issue 36)', () => {
  /**
   * A capture of streamed completions sent one at a time (each meets an idle engine: one prefill point each) to the
   * vLLM double, whose first token comes after `ttftMs(prompt words)`, then one token every 20 ms. Prompts and
   * answers stay within one KV block of 64 tokens, so the decode step's form is its base alone.
   */
  async function fitOf(promptWords: number[], ttftMs: (words: number) => number) {
    const dir = mkdtempSync(join(testTmpdir(), 'mocker-captures-fit-'));
    const words = (body: Record<string, unknown>) => String(body.prompt).split(' ').length;
    const upstream = await startUpstream(
      (body): Answer => ({ content: 'one two three four five six', finish: 'length', ttftMs: ttftMs(words(body)), gapMs: () => 20 }),
    );
    const capture = await startMockerProcess(['capture', '--upstream', upstream.url, '--captures', join(dir, 'capture.db')]);
    try {
      for (const n of promptWords) {
        const res = await fetch(`http://127.0.0.1:${capture.port}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ model: MODEL, prompt: Array.from({ length: n }, () => 'cat').join(' '), max_tokens: 6, stream: true }),
        });
        expect(res.status).toBe(200);
        await res.text();
      }
    } finally {
      await capture.stop();
      await upstream.close();
    }
    const profile = join(dir, 'profile.npz');
    const run = await runMockerToExit(['captures', 'fit', join(dir, 'capture.db'), '-o', profile, '--json']);
    return {
      ...run,
      written: existsSync(profile),
      report: JSON.parse(run.stdout) as { warnings: string[]; prefill: { points: number; source: string; coefficients: Record<string, number> } },
    };
  }

  it('3 prefill points for the 3 terms of base + per token + per token × context: warned, the context term left out, the profile written', async () => {
    const fit = await fitOf([4, 12, 24], (words) => 30 + 4 * words);
    expect(fit.code).toBe(0);
    expect(fit.written).toBe(true);
    // The oracle: 3 requests, sent one at a time.
    expect(fit.report.prefill).toMatchObject({ points: 3, source: 'idle first tokens' });
    expect(Object.keys(fit.report.prefill.coefficients)).toEqual(['base', 'per_token']);
    const warnings = fit.stderr
      .trim()
      .split('\n')
      .filter((line) => line.startsWith('mocker captures fit: warning: prefill'));
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toContain(
      'only 3 point(s) for the 3 term(s) of its form (base, per_token, per_token_context): per_token_context not learnt; 4 points are needed',
    );
    expect(warnings[0]).toContain('capture more streamed requests one at a time, with several prompt lengths');
    expect(fit.report.warnings.map((w) => `mocker captures fit: warning: ${w}`)).toEqual(fit.stderr.trim().split('\n'));
  }, 60_000);

  it('a first token that comes sooner for a longer prompt: the negative per-token cost is warned, the profile written', async () => {
    // The double's TTFT falls 3 ms per prompt word: no engine prefills like that.
    const fit = await fitOf([4, 10, 16, 22, 28, 34], (words) => 150 - 3 * words);
    expect(fit.code).toBe(0);
    expect(fit.written).toBe(true);
    expect(fit.report.prefill.points).toBe(6);
    expect(fit.report.prefill.coefficients.per_token).toBeLessThan(0);
    expect(fit.stderr).toMatch(
      /^mocker captures fit: warning: prefill \(requests that met an idle engine\): the per_token cost is fitted negative \(-[\d.]+ ms per prompt token\): .*not to be trusted; capture more streamed requests/m,
    );
  }, 60_000);
});
