import type { SchedulerCore } from './contract.js';
import { EngineCore, type SchedulerConfig } from './core.js';
import { SglangCore, type SglangSchedulerConfig } from './sglang/core.js';

/** A scheduler's configuration, tagged with its flavour (`--engine-type`). */
export type AnySchedulerConfig = ({ engineType: 'vllm' } & SchedulerConfig) | ({ engineType: 'sglang' } & SglangSchedulerConfig);

export function createSchedulerCore(config: AnySchedulerConfig): SchedulerCore {
  return config.engineType === 'sglang' ? new SglangCore(config) : new EngineCore(config);
}
