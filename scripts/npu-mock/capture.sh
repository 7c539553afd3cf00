#!/usr/bin/env bash
# vLLM's NPU mock model's capture_mock_model: every request and answer of the real engine at UPSTREAM is recorded into
# MOCK_CAPTURE_DIR/MOCK_CAPTURE_FILE while clients talk to PORT.
set -euo pipefail
source "$(dirname "$0")/common.sh"
export CAPTURE_MODE=1
: "${UPSTREAM:?set UPSTREAM to the real engine, e.g. UPSTREAM=http://gpu-box:8000}"
mkdir -p "$MOCK_CAPTURE_DIR"
exec $MOCKER serve --upstream "$UPSTREAM" --port "${PORT:-8001}" "$@"
