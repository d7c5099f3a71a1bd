#!/usr/bin/env bash
# The main job: install, build, then edit the bundled sample template headlessly.
# Writes out/before.png, out/mask.png and out/after.png.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
model=build/release/models/infill-random
./build/release/app/infill-render --model "$model" \
  --template resources/templates/sample.png --mask resources/templates/sample_mask.png \
  --out-dir out --seed 1 --cache-dir build/release/cache
