#!/bin/sh
# Runs infill-model-check ($1) on the FLUX.2 reference files in $2; exit 4 (ctest: skipped)
# when one is missing, so that a machine without ../shared never reports a pass.
set -u
check=$1
dir=$2
files="$dir/flux2_dit_klein.safetensors $dir/flux2_dit_dev.safetensors $dir/flux2_ae.safetensors"
for f in $files; do
  if [ ! -f "$f" ]; then
    echo "SKIPPED: shared test data $f not found" >&2
    exit 4
  fi
done
# shellcheck disable=SC2086
exec "$check" --blocks $files
