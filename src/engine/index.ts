export { LiveEngine } from './liveEngine.js';
export { tokenDueTimes } from './timing.js';
export type { Engine, EngineRequest, EngineSequence, TimingConfig, TimingMode, TokenEvent } from './types.js';
