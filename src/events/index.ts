export { dynamoKvEventsConfigs, offsetEndpoint, parseKvEventsConfig, type KvEventsConfig } from './config.js';
export { encodeKvEventBatch, type KvEventsFormat } from './encoding.js';
export { KvEventStreams, KvTraceLog, kvTraceEnabled } from './kvEventStreams.js';
