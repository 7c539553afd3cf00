/**
 * Which shape a capture is replayed in, from the engine and version its run recorded: vLLM's releases by the
 * wire changes of shared/spec/vllm-wire-reference.md Appendix A (`reasoning` beside `reasoning_content` from
 * ≈0.12, PR #27752; `reasoning_content` gone by 0.17.1, PR #33402), SGLang's own; engines without a shape here
 * (llama.cpp, `transformers serve`, any other server) and a vLLM that did not say its version get none.
 */
import { describe, expect, it } from 'vitest';
import { wireOfEngine } from '../../src/wire/shapes.js';

describe('wireOfEngine', () => {
  it.each([
    ['0.10.1.1', 'vllm-0.11'],
    ['0.10.2', 'vllm-0.11'],
    ['0.11.0', 'vllm-0.11'],
    ['0.11.1rc2.dev14+g3f1d2a', 'vllm-0.11'],
    ['0.12.0', 'vllm-0.12'],
    ['0.16.0', 'vllm-0.12'],
    ['0.17.1', 'vllm-main'],
    ['0.26.0', 'vllm-main'],
    ['1.0.0', 'vllm-main'],
  ])('vLLM %s answers in %s', (version, wire) => {
    expect(wireOfEngine('vllm', version)).toBe(wire);
  });

  it('SGLang in its own shape, whatever its version', () => {
    expect(wireOfEngine('sglang', undefined)).toBe('sglang');
    expect(wireOfEngine('sglang', '0.5.3rc2')).toBe('sglang');
  });

  it('none for engines without a shape here, and for a vLLM of unknown version', () => {
    for (const engine of ['llama.cpp', 'transformers', 'openai', 'unknown', undefined]) expect(wireOfEngine(engine, '1.2.3')).toBeNull();
    expect(wireOfEngine('vllm', undefined)).toBeNull();
    expect(wireOfEngine('vllm', 'dev')).toBeNull();
  });
});
