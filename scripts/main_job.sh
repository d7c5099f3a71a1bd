#!/usr/bin/env bash
# The main job: install, build, then edit the bundled sample template headlessly with the
# bundled model (infill-tiny-2) through the job file resources/jobs/sample.json.
# Writes out/after.png (and copies the inputs to out/before.png and out/mask.png).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
mkdir -p out
cp resources/templates/sample.png out/before.png
cp resources/templates/sample_mask.png out/mask.png
# --force: always render, even when out/after.png is already up to date (same job hash).
./build/release/app/infill-render resources/jobs/sample.json --force --cache-dir build/release/cache
