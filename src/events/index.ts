export { dynamoKvEventsConfigs, parseKvEventsConfig, type KvEventsConfig } from './config.js';
export type { KvEventsFormat } from './encoding.js';
export { KvEventStreams, KvTraceLog, kvTraceEnabled } from './kvEventStreams.js';
