#!/usr/bin/env bash
# Fuzz one target for a while: scripts/fuzz.sh PKG FUNC FUZZTIME.
#
# Go 1.26's fuzzing coordinator can fail a run at the -fuzztime boundary with a bare "context
# deadline exceeded" although no input failed (go.dev/issue/75804, fixed in Go 1.27). A real
# finding always writes its input ("Failing input written to testdata/fuzz/..."), and the
# written corpus is replayed by every plain `go test` run. So: a failure that wrote an input, or
# failed any other way, fails; a bare deadline failure is run once more, and fails if it recurs.
set -uo pipefail
pkg=$1 fn=$2 fuzztime=$3
go=${GO:-go}
for attempt in 1 2; do
  out=$(mktemp)
  "$go" test "$pkg" -run '^$' -fuzz "^$fn\$" -fuzztime "$fuzztime" -fuzzminimizetime 5s 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 0 ]; then rm -f "$out"; exit 0; fi
  if grep -q 'Failing input written to' "$out" || ! grep -q '^    context deadline exceeded$' "$out" ||
     grep -Eq 'panic:|--- FAIL: .*\(.*\)$' <(grep -v "^--- FAIL: $fn " "$out"); then
    rm -f "$out"; exit "$rc"
  fi
  rm -f "$out"
  echo "fuzz $pkg $fn: the coordinator's deadline race (go.dev/issue/75804), no failing input; attempt $attempt of 2"
done
exit 1
