/**
 * The import rules (`npm run lint:deps`, part of `npm test`): no import cycles, type-only imports included, and no
 * import from a higher layer. The layers of src/, bottom to top; a folder may import its own layer and those below.
 */
const LAYERS = [
  ['util'],
  // The engine does no I/O and reads no clock; the tokenizers; the capture file.
  ['engine', 'tokenizer', 'store'],
  // What every server speaks and shares: vLLM's error format, the API-key policy, TLS, listening and draining.
  ['wire'],
  ['generation', 'events', 'metrics'],
  // The OpenAI/vLLM API as every server speaks it: request schemas and response rendering.
  ['api'],
  // The recording proxy and the prefill/decode pieces.
  ['capture', 'pd'],
  // The mocker's server.
  ['http'],
  ['trace', 'captures', 'rerun'],
  // The settings: one table (flag, Dynamo key, schema, default, help) and the step that resolves raw values.
  ['config'],
  // Composition roots: servers, threads and runners assembled from resolved settings.
  ['app'],
  // Flags in, library calls out.
  ['cli'],
];

const folders = (layers) => `^src/(${layers.flat().join('|')})/`;

module.exports = {
  forbidden: [
    {
      name: 'no-circular',
      comment: 'An import cycle (type-only imports count): put what both sides need in its own module.',
      severity: 'error',
      from: {},
      to: { circular: true },
    },
    ...LAYERS.slice(0, -1).map((layer, i) => ({
      name: 'no-upward-import',
      comment: `${layer.join(', ')} may import only from ${LAYERS.slice(0, i + 1).flat().join(', ')} (see LAYERS in .dependency-cruiser.cjs).`,
      severity: 'error',
      from: { path: folders([layer]) },
      to: { path: folders(LAYERS.slice(i + 1)) },
    })),
    {
      name: 'folder-without-layer',
      comment: 'Every folder of src/ has a place in LAYERS (.dependency-cruiser.cjs).',
      severity: 'error',
      from: { path: '^src/', pathNot: folders(LAYERS) },
      to: {},
    },
  ],
  options: {
    // TypeScript 7 has no compiler API for dependency-cruiser to parse with: swc does it. Without it nothing
    // is cruised, hence the floor on the module count in scripts/lint-deps.mjs.
    parser: 'swc',
    tsPreCompilationDeps: true,
    doNotFollow: { path: 'node_modules' },
  },
};
