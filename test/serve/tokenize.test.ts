/** `POST /tokenize` and `/detokenize` in vLLM's shapes, against the Qwen3 tokenizer oracle fixtures. */
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { serveInProcess, type Running } from '../support/inProcess.js';

interface Row {
  kind: 'encode' | 'chat' | 'decode';
  text?: string;
  ids_with_special?: number[];
  ids_without_special?: number[];
  request?: Record<string, unknown>;
  ids?: number[];
  skip_special_tokens?: boolean;
  full?: string;
}

const rows = readFileSync(new URL('../fixtures/tokenizer/qwen3.jsonl', import.meta.url), 'utf8')
  .trim()
  .split('\n')
  .map((l) => JSON.parse(l) as Row);

describe('/tokenize and /detokenize', () => {
  let server: Running;
  let url: string;
  beforeAll(async () => {
    server = await serveInProcess({ mode: 'random', captures: ':memory:' });
    url = `http://127.0.0.1:${server.port}`;
  });
  afterAll(async () => {
    await server?.close();
  });
  const post = async (path: string, body: unknown) => {
    const res = await fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    return { status: res.status, json: (await res.json()) as Record<string, unknown> };
  };

  it('tokenizes every text of the fixtures, with and without special tokens', async () => {
    const encodes = rows.filter((r) => r.kind === 'encode');
    expect(encodes.length).toBeGreaterThan(100);
    for (const r of encodes) {
      const withSpecial = await post('/tokenize', { prompt: r.text });
      expect(withSpecial.json, JSON.stringify(r.text)).toEqual({
        count: r.ids_with_special!.length,
        max_model_len: 40960,
        tokens: r.ids_with_special,
        token_strs: null,
      });
      const without = await post('/tokenize', { prompt: r.text, add_special_tokens: false });
      expect(without.json.tokens).toEqual(r.ids_without_special);
    }
  });

  it('tokenizes every chat request of the fixtures after the chat template', async () => {
    for (const r of rows.filter((x) => x.kind === 'chat')) {
      const res = await post('/tokenize', r.request);
      expect(res.status).toBe(200);
      expect(res.json.tokens, JSON.stringify(r.request)).toEqual(r.ids);
    }
  });

  it('returns token strings when asked', async () => {
    const res = await post('/tokenize', { prompt: 'Hello world', return_token_strs: true });
    expect(res.json.token_strs).toEqual(['Hello', 'Ġworld']);
  });

  it('detokenizes the fixtures the way the tokenizer decodes them (special tokens kept)', async () => {
    for (const r of rows.filter((x) => x.kind === 'decode' && x.skip_special_tokens === false)) {
      const res = await post('/detokenize', { tokens: r.ids });
      expect(res.json).toEqual({ prompt: r.full });
    }
  });

  it('answers bad input in vLLM error format', async () => {
    expect((await post('/tokenize', { model: 'nope', prompt: 'x' })).status).toBe(404);
    expect((await post('/tokenize', {})).status).toBe(400);
    expect((await post('/detokenize', { tokens: [1, 'a'] })).status).toBe(400);
    const out = await post('/detokenize', { tokens: [999_999_999] });
    expect(out.status).toBe(400);
    expect((out.json.error as { message: string }).message).toMatch(/out of vocabulary/);
  });
});
