/** SGLang's own server defaults (engine-reference §2.1; Dynamo's `sglang/config.rs`): the core takes complete settings. */
export const SGLANG_SERVER_DEFAULTS = {
  pageSize: 1,
  schedulePolicy: 'fifo',
  maxPrefillTokens: 16384,
  chunkedPrefillSize: 8192,
  clipMaxNewTokens: 4096,
  scheduleConservativeness: 1,
} as const;
