#!/bin/sh
# The container image's entrypoint: `mocker COMMAND [flags]`; no arguments, or a first argument that is a flag,
# means `serve`. `exec` makes node the container's main process, so SIGTERM from the runtime reaches mocker's
# own drain (--shutdown-timeout) instead of stopping at a shell.
set -e
case "${1:-}" in
  '' | -*) set -- serve "$@" ;;
esac
exec node "$(dirname "$0")/../dist/cli/main.js" "$@"
