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
