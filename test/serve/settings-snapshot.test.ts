/**
 * The settings as users see them stay what they were before issue 37 moved them into one table: `serve --help`,
 * the settings `/mocker/engine` reports for flags, for Dynamo's `--extra-engine-args` keys (vLLM and SGLang
 * flavours), and the errors a wrong Dynamo key gets. The oracle is a snapshot of the CLI taken before that change
 * (test/fixtures/settings-snapshot/, taken from commit 1dbc5da's build, the cases in test/support/settingsCases.ts),
 * plus, line by line, the settings added since through the table: `--long-prefill-token-threshold` (one help line,
 * `long_prefill_token_threshold: 0` in each settings view) and `--wire` (one help line, `wire: "vllm-main"`).
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { runMockerToExit, startMockerProcess, type MockerProcess } from '../support/mockerProcess.js';
import { ENGINE_CASES, REFUSED_CASES } from '../support/settingsCases.js';

const SNAPSHOT = join(import.meta.dirname, '..', 'fixtures', 'settings-snapshot');
const expected = JSON.parse(readFileSync(join(SNAPSHOT, 'engine-settings.json'), 'utf8')) as Record<string, unknown>;

const processes: MockerProcess[] = [];
afterAll(async () => {
  for (const p of processes) await p.stop();
});

async function engineSettings(flags: string[]): Promise<unknown> {
  const serve = await startMockerProcess(['serve', '--host', '127.0.0.1', ...flags]);
  processes.push(serve);
  const view = (await (await fetch(`http://127.0.0.1:${serve.port}/mocker/engine`)).json()) as { config: unknown };
  await serve.stop();
  return view.config;
}

describe('settings as before the one-table change', () => {
  it('serve --help prints the same text', async () => {
    const help = await runMockerToExit(['serve', '--help'], { env: { ...process.env, COLUMNS: '120' } });
    expect(help.code).toBe(0);
    expect(help.stdout).toBe(readFileSync(join(SNAPSHOT, 'serve-help.txt'), 'utf8'));
  });

  it.each(Object.keys(ENGINE_CASES))(
    '/mocker/engine reports the same settings: %s',
    async (name) => {
      expect(await engineSettings(ENGINE_CASES[name])).toEqual(expected[name]);
    },
    30_000,
  );

  it.each(Object.keys(REFUSED_CASES))(
    'refused with the same message: %s',
    async (name) => {
      const run = await runMockerToExit(['serve', '--host', '127.0.0.1', '--port', '0', ...REFUSED_CASES[name]]);
      expect(run.code).not.toBe(0);
      expect(run.stderr.trim()).toBe((expected.refused as Record<string, string>)[name]);
    },
    30_000,
  );
});
