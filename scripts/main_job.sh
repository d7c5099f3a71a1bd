#!/usr/bin/env bash
# The main job: install, build, then edit the bundled sample template headlessly.
# Writes out/before.png, out/mask.png and out/after.png.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
# The bundled, trained model; the random-weight stand-in only if it is missing.
model=resources/models/infill-tiny
prompt=(--prompt "green")
if [ ! -f "$model/manifest.json" ]; then
  model=build/release/models/infill-random
  prompt=()
fi
./build/release/app/infill-render --model "$model" "${prompt[@]}" \
  --template resources/templates/sample.png --mask resources/templates/sample_mask.png \
  --out-dir out --seed 1 --cache-dir build/release/cache
