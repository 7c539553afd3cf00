# Sourced by the NPU mock model's scripts: how to run mocker from this checkout (override with MOCKER="mocker" when installed).
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MOCKER="${MOCKER:-node $here/../../dist/cli/main.js}"
export MOCK_CAPTURE_DIR="${MOCK_CAPTURE_DIR:-captures/}"
export MOCK_CAPTURE_FILE="${MOCK_CAPTURE_FILE:-mocker.db}"
