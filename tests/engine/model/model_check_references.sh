#!/bin/sh
# Runs infill-model-check ($1) on reference files ($3...), given relative to the shared test
# data folder: $INFILL_SHARED_DIR when set and not empty, else the folder compiled in ($2), as
# the tests find it (tests/support/data_dirs.h). Exit 4 (ctest: skipped) when one is missing,
# so that a machine without ../shared never reports a pass.
set -u
check=$1
shared=${INFILL_SHARED_DIR:-$2}
shift 2
for f in "$@"; do
  if [ ! -f "$shared/$f" ]; then
    echo "SKIPPED: shared test data $shared/$f not found" >&2
    exit 4
  fi
  set -- "$@" "$shared/$f"  # each relative path rotated to the end as an absolute one
  shift
done
exec "$check" --blocks "$@"
