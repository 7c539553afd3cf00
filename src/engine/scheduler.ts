import type { SchedulerCore } from './contract.js';
import { EngineCore, type SchedulerConfig } from './core.js';
import { LlamaCppCore, type LlamaCppSchedulerConfig } from './llamacpp/core.js';
import { SglangCore, type SglangSchedulerConfig } from './sglang/core.js';

/** A scheduler's configuration, tagged with its flavour (`--engine-type`); TRT-LLM's is a policy of the vLLM core. */
export type AnySchedulerConfig =
  | ({ engineType: 'vllm' | 'trtllm' } & SchedulerConfig)
  | ({ engineType: 'sglang' } & SglangSchedulerConfig)
  | ({ engineType: 'llamacpp' } & LlamaCppSchedulerConfig);

export function createSchedulerCore(config: AnySchedulerConfig): SchedulerCore {
  switch (config.engineType) {
    case 'sglang':
      return new SglangCore(config);
    case 'llamacpp':
      return new LlamaCppCore(config);
    default:
      return new EngineCore(config);
  }
}
