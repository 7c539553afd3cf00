import { availableParallelism } from 'node:os';
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
      // The functional files spend most of their time waiting on the processes and sockets they start, so two run at
      // once even on 2 cores (vitest's default there is one: 900 s of them alone, against 600 s with two).
      { extends: true, test: { name: 'functional', include: ['test/**/*.test.ts'], exclude: TIMING, maxWorkers: Math.max(2, availableParallelism() - 1), sequence: { groupOrder: 0 } } },
      { extends: true, test: { name: 'timing', include: TIMING, fileParallelism: false, sequence: { groupOrder: 1 } } },
    ],
  },
});
