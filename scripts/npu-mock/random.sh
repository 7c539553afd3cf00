#!/usr/bin/env bash
# vLLM's NPU mock model's random_mock_model: random outputs, each engine step taking FORWARD_TIME ms.
set -euo pipefail
source "$(dirname "$0")/common.sh"
export RANDOM_MODE=1
export FORWARD_TIME="${FORWARD_TIME:-25}"
exec $MOCKER serve --port "${PORT:-8000}" "$@"
