/**
 * The response shapes (`serve --wire`): which engine, and which release of it, the rendered answers of
 * `/v1/completions` and `/v1/chat/completions` imitate. vLLM's fields moved between releases
 * (vllm-wire-reference.md §1.3, §1.4, §9 and Appendix A); SGLang's are test/fixtures/engines/sglang-shapes.md §4.
 */
export const WIRE_SHAPES = [
  /** vLLM 0.10.2–0.11: `reasoning_content`, `tool_calls: []` kept, `stream_options: {}` turns usage on. */
  'vllm-0.11',
  /** vLLM 0.12–0.16 (PR #27752): the reasoning as both `reasoning` and `reasoning_content`. */
  'vllm-0.12',
  /**
   * vLLM main (2026): `reasoning` only, an empty `tool_calls` dropped, `routed_experts` per choice,
   * `ec_transfer_params` and `metrics` at the top level, `include_usage` off unless asked.
   */
  'vllm-main',
  /** SGLang's OpenAI server: `matched_stop`, `reasoning_content` in every chat delta, `metadata`, bare hex ids. */
  'sglang',
] as const;
export type WireShape = (typeof WIRE_SHAPES)[number];

/** The newest vLLM shape documented. */
export const DEFAULT_WIRE: WireShape = 'vllm-main';

/** vLLM's releases by the wire changes of vllm-wire-reference.md Appendix A: [first minor release, shape]. */
const VLLM_RELEASES: [number, WireShape][] = [
  [17, 'vllm-main'],
  [12, 'vllm-0.12'],
  [0, 'vllm-0.11'],
];

/**
 * The shape a captured engine answered in, from what the capture recorded of it (`runs.engine`,
 * `runs.engine_version`); null when no shape here is that engine's (llama.cpp, `transformers serve`, any other
 * OpenAI-compatible server, or a vLLM that did not say its version).
 */
export function wireOfEngine(engine: string | undefined, version: string | undefined): WireShape | null {
  if (engine === 'sglang') return 'sglang';
  if (engine !== 'vllm') return null;
  const match = /^(\d+)\.(\d+)/.exec(version ?? '');
  if (!match) return null;
  const [major, minor] = [Number(match[1]), Number(match[2])];
  if (major > 0) return 'vllm-main';
  return VLLM_RELEASES.find(([first]) => minor >= first)![1];
}

/**
 * The vLLM release `GET /version` names when no captured engine is imitated: one whose answers have the shape (a
 * capture of this server then replays in it, wireOfEngine). SGLang's shape keeps vLLM 0.11, the release whose
 * other routes mocker serves.
 */
const VERSION_OF_WIRE: Record<WireShape, string> = { 'vllm-0.11': '0.11.0', 'vllm-0.12': '0.12.0', 'vllm-main': '0.17.1', sglang: '0.11.0' };

export const vllmVersionOf = (wire: WireShape): string => VERSION_OF_WIRE[wire];

/** Whether answers in this shape carry vLLM's field set (else SGLang's). */
export const isVllm = (wire: WireShape) => wire !== 'sglang';
