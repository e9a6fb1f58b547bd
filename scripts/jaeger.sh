#!/usr/bin/env bash
# Jaeger (github.com/jaegertracing/jaeger/cmd/jaeger, pinned in tools/go.mod) built with
# `go tool` from the tools module, so the binary lives in the Go build cache: the first
# build takes minutes, later calls only print the cached path.
#   scripts/jaeger.sh                       print the binary's path (building it if needed)
#   scripts/jaeger.sh --config FILE ...     run Jaeger with these arguments
#   CB_JAEGER_BIN=$(scripts/jaeger.sh) go test ./e2e/ -run TestJaeger
set -euo pipefail
bin=$(go tool -C "$(dirname "$0")/../tools" -n jaeger)
if (($#)); then
  exec "$bin" "$@"
fi
echo "$bin"
