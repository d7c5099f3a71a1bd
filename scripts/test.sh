#!/usr/bin/env bash
# Install, build and run every test (ctest). Tests that need ../shared report themselves as
# skipped when it is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
ctest --preset release
