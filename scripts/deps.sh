#!/usr/bin/env bash
# Installs what the test suite needs on a fresh Debian machine (idempotent).
set -euo pipefail
need=()
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
[ -x /usr/bin/chromium ] || need+=(chromium)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)   # prometheus + promtool (package slo tests)
/usr/bin/python3 -c 'import prometheus_client.openmetrics.parser' >/dev/null 2>&1 || need+=(python3-prometheus-client)   # the strict OpenMetrics parser (e2e)
command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 || need+=(redis-server redis-tools)   # the fleet tier tests (blend/fleet, blend, e2e)
if ((${#need[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${need[@]}"
fi
go mod download
go tool -C "$(dirname "$0")/../tools" -n jaeger >/dev/null # builds Jaeger into the Go build cache (cold: ~10 min on 2 cores)
# The reference implementations the model tests compare against (issue 23): llama.cpp's prebuilt
# CPU libraries through node-llama-cpp and Hugging Face's Jinja, pinned by scripts/ref's lock file,
# and llama.cpp's source (its real vocabularies, tokenizer test vectors and chat templates) from the
# git bundle node-llama-cpp ships. Installed once into a cache directory (CB_REF_DIR).
REF_DIR="${CB_REF_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cacheblend/ref}"
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$REF_DIR"
if ! cmp -s "$here/ref/package-lock.json" "$REF_DIR/package-lock.json" || [ ! -d "$REF_DIR/node_modules/node-llama-cpp" ]; then
  cp "$here/ref/package.json" "$here/ref/package-lock.json" "$REF_DIR/"
  (cd "$REF_DIR" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
fi
if [ ! -d "$REF_DIR/llama.cpp/models" ]; then
  rm -rf "$REF_DIR/llama.cpp"
  git clone -q "$REF_DIR/node_modules/node-llama-cpp/llama/gitRelease.bundle" "$REF_DIR/llama.cpp"
fi
