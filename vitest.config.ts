import { defineConfig } from 'vitest/config';

/** Tests that measure wall-clock timing run last and alone: the other files would compete for the CPU. */
const TIMING = ['test/timing.test.ts', 'test/pd-capture.test.ts', 'test/engine-live.test.ts', 'test/metrics.test.ts', 'test/trace-live.test.ts', 'test/latency-knobs.test.ts', 'test/captures-fit.test.ts'];

export default defineConfig({
  test: {
    globalSetup: ['test/support/tempRoot.ts'],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: 'forks',
    projects: [
      { extends: true, test: { name: 'functional', include: ['test/**/*.test.ts'], exclude: TIMING, sequence: { groupOrder: 0 } } },
      { extends: true, test: { name: 'timing', include: TIMING, fileParallelism: false, sequence: { groupOrder: 1 } } },
    ],
  },
});
