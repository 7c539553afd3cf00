import { availableParallelism } from 'node:os';
import { defineConfig } from 'vitest/config';

/** Tests that measure wall-clock timing run last and alone: the other files would compete for the CPU. */
const TIMING = [
  'test/capture/timing.test.ts',
  'test/pd/pd-capture.test.ts',
  'test/engine/engine-live.test.ts',
  'test/metrics/metrics.test.ts',
  'test/trace/trace-live.test.ts',
  'test/engine/latency-knobs.test.ts',
  'test/captures/captures-fit.test.ts',
  'test/serve/dialect-replay-timing.test.ts',
  'test/captures/captures-fit-validate.test.ts',
];

export default defineConfig({
  test: {
    globalSetup: ['test/support/tempRoot.ts'],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: 'forks',
    projects: [
      // One worker at a time (vitest's default on 2 cores) leaves a core idle while a file waits on the processes and
      // sockets it starts; two fill both cores: about 900 s of these files serially, 600 s measured with two (and with three).
      {
        extends: true,
        test: {
          name: 'functional',
          include: ['test/**/*.test.ts'],
          exclude: TIMING,
          maxWorkers: Math.max(2, availableParallelism() - 1),
          sequence: { groupOrder: 0 },
        },
      },
      { extends: true, test: { name: 'timing', include: TIMING, fileParallelism: false, sequence: { groupOrder: 1 } } },
    ],
  },
});
