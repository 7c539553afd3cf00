/** The cases of test/serve/settings-snapshot.test.ts (apart, so that the snapshot was made from the same cases). */
/** Each case: the serve flags whose /mocker/engine settings were snapshotted. */
export const ENGINE_CASES: Record<string, string[]> = {
  'no flag': [],
  'engine flags': [
    '--num-gpu-blocks-override',
    '1024',
    '--block-size',
    '16',
    '--max-num-seqs',
    '32',
    '--max-num-batched-tokens',
    '2048',
    '--no-enable-prefix-caching',
    '--preemption-mode',
    'fifo',
    '--watermark',
    '0.02',
    '--data-parallel-size',
    '2',
    '--speedup-ratio',
    '3',
    '--decode-speedup-ratio',
    '1.5',
  ],
  'mode and timing flags': ['--mode', 'random', '--timing', 'fixed', '--forward-time-ms', '10', '--max-model-len', '8192', '--seed', '7'],
  'Dynamo keys, vLLM flavour': [
    '--extra-engine-args',
    JSON.stringify({
      num_gpu_blocks: 4096,
      block_size: 32,
      max_num_seqs: 64,
      max_num_batched_tokens: 4096,
      enable_prefix_caching: false,
      enable_chunked_prefill: false,
      preemption_mode: 'fifo',
      speedup_ratio: 2,
      decode_speedup_ratio: 1.5,
      dp_size: 2,
      watermark: 0.05,
    }),
  ],
  'Dynamo keys, SGLang flavour': [
    '--extra-engine-args',
    JSON.stringify({
      engine_type: 'sglang',
      sglang: {
        schedule_policy: 'fcfs',
        page_size: 16,
        max_prefill_tokens: 8192,
        chunked_prefill_size: 2048,
        clip_max_new_tokens: 1024,
        schedule_conservativeness: 0.5,
      },
    }),
  ],
  'SGLang flags': [
    '--engine-type',
    'sglang',
    '--sglang-page-size',
    '32',
    '--sglang-schedule-policy',
    'lpm',
    '--sglang-max-prefill-tokens',
    '4096',
    '--sglang-chunked-prefill-size',
    '1024',
    '--sglang-schedule-conservativeness',
    '0.3',
  ],
};

/** Each case: serve flags that must be refused, with the error line snapshotted. */
export const REFUSED_CASES: Record<string, string[]> = {
  'an unknown Dynamo key': ['--extra-engine-args', '{"no_such_key": 1}'],
  'a Dynamo key mocker does not simulate': ['--extra-engine-args', '{"aic_backend": "vllm"}'],
  'a Dynamo key that is a serve flag here': ['--extra-engine-args', '{"is_prefill": true}'],
  'a Dynamo key of the wrong type': ['--extra-engine-args', '{"block_size": "64"}'],
};
