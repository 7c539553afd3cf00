/**
 * `startServe` in process completes the options it is given with the same defaults and rules as the CLI: a
 * caller that names only the engine type gets Dynamo's page-size rule (the SGLang page size is the block size,
 * mocker's default 64, when neither is given) and the table's other defaults, as `mocker serve --engine-type sglang`.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { serveInProcess, type Running } from '../support/inProcess.js';

const running: Running[] = [];
afterAll(async () => {
  await Promise.all(running.map((r) => r.close()));
});

describe('serve in process', () => {
  it('engine: { engineType: sglang } alone: page size = block size = 64, SGLang defaults 16384 / 8192 / 4096 / 1, fifo', async () => {
    const server = await serveInProcess({ mode: 'random', captures: ':memory:', timing: 'none', engine: { engineType: 'sglang' } });
    running.push(server);
    const view = (await (await fetch(`${server.url}/mocker/engine`)).json()) as { config: Record<string, unknown> };
    expect(view.config).toMatchObject({
      engine_type: 'sglang',
      block_size: 64,
      sglang_page_size: 64,
      sglang_schedule_policy: 'fifo',
      sglang_max_prefill_tokens: 16384,
      sglang_chunked_prefill_size: 8192,
      sglang_clip_max_new_tokens: 4096,
      sglang_schedule_conservativeness: 1,
    });
  });
});
