#!/usr/bin/env bash
# vLLM's NPU mock model's replay_mock_model: captured answers for matching prompt token ids; SIMULATE_ELAPSED_TIME=1 takes the
# captured time, otherwise as fast as possible.
set -euo pipefail
source "$(dirname "$0")/common.sh"
export REPLAY_MODE=1
exec $MOCKER serve --port "${PORT:-8000}" "$@"
