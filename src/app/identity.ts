/** The vLLM release whose wire formats mocker reproduces when it has no captured engine to imitate. */
export const EMULATED_VLLM_VERSION = '0.11.0';
