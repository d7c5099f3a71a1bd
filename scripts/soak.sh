#!/usr/bin/env bash
# Runs the whole test suite N times in a row (default 5) with both cores kept busy by
# stress-ng, and fails on the first failure: the suite must pass on a loaded machine.
# Prints one line per run and, at the end, how long it all took.
#   bash scripts/soak.sh [N] [BUILD_DIR]     (default: 5 build/release)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
build=${2:-build/release}
command -v stress-ng >/dev/null || { echo "soak: stress-ng is missing (Debian package stress-ng)" >&2; exit 2; }
[ -f "$build/CTestTestfile.cmake" ] || { echo "soak: no test tree in $build (build it first)" >&2; exit 2; }
workers=$(nproc)
# CPU hogs at full load on every core, for as long as the soak runs.
stress-ng --cpu "$workers" --cpu-load 100 --quiet &
stress=$!
trap 'kill "$stress" 2>/dev/null || true; wait "$stress" 2>/dev/null || true' EXIT
start=$(date +%s)
for i in $(seq 1 "$runs"); do
  t0=$(date +%s)
  log="$build/soak-run-$i.log"
  if ctest --test-dir "$build" -j2 --output-on-failure >"$log" 2>&1; then
    echo "soak: run $i/$runs passed in $(( $(date +%s) - t0 )) s ($(grep -E 'tests passed' "$log" | tail -1))"
  else
    echo "soak: run $i/$runs FAILED after $(( $(date +%s) - t0 )) s; see $log" >&2
    grep -E '\*\*\*Failed|\*\*\*Timeout|Exception' "$log" >&2 || true
    exit 1
  fi
done
echo "soak: $runs runs passed under stress-ng --cpu $workers in $(( $(date +%s) - start )) s"
