#!/bin/sh
# Runs infill-model-check ($1) on reference files ($2...); exit 4 (ctest: skipped) when one is
# missing, so that a machine without ../shared never reports a pass.
set -u
check=$1
shift
for f in "$@"; do
  if [ ! -f "$f" ]; then
    echo "SKIPPED: shared test data $f not found" >&2
    exit 4
  fi
done
exec "$check" --blocks "$@"
