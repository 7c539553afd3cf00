#!/usr/bin/env bash
# vLLM's NPU mock model's PD separation on one node (1P1D): a prefill node (PREFILL_PROCESS=1), a decode node, both with
# KV_CACHE_MODE=1, and vLLM's disaggregation proxy in front on PORT. Mode variables (RANDOM_MODE, REPLAY_MODE,
# SIMULATE_ELAPSED_TIME…) apply to both nodes; RANDOM_MODE=1 unless one is set.
set -euo pipefail
source "$(dirname "$0")/common.sh"
if [ -z "${REPLAY_MODE:-}" ] && [ -z "${CAPTURE_MODE:-}" ]; then export RANDOM_MODE="${RANDOM_MODE:-1}"; fi
export KV_CACHE_MODE=1
prefill_port="${PREFILL_PORT:-8100}"
decode_port="${DECODE_PORT:-8200}"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait' EXIT INT TERM
PREFILL_PROCESS=1 $MOCKER serve --host 127.0.0.1 --port "$prefill_port" "$@" & pids+=($!)
$MOCKER serve --host 127.0.0.1 --port "$decode_port" --kv-transfer-allowed-hosts "127.0.0.1:$prefill_port" "$@" & pids+=($!)
$MOCKER pd-proxy --prefill "http://127.0.0.1:$prefill_port" --decode "http://127.0.0.1:$decode_port" --host "${HOST:-0.0.0.0}" --port "${PORT:-8000}" & pids+=($!)
wait -n "${pids[@]}"
