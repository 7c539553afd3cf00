#!/usr/bin/env bash
# vLLM's NPU mock model's prompt.sh: one chat completion (temperature 0) against the server on PORT.
set -euo pipefail
curl -sS "http://127.0.0.1:${PORT:-8000}/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "{\"messages\":[{\"role\":\"user\",\"content\":\"${PROMPT:-What is the capital of France?}\"}],\"max_tokens\":${MAX_TOKENS:-32},\"temperature\":0}"
echo
