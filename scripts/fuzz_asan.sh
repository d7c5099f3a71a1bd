#!/usr/bin/env bash
# The request fuzzer under AddressSanitizer and UBSan: builds the server tests in the asan
# preset and sends 100000 mutated requests (INFILL_FUZZ_REQUESTS overrides) to a real engine.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset asan -DINFILL_BUILD_BENCH=OFF >/dev/null
cmake --build --preset asan --target infill_tests_server
export INFILL_FUZZ_REQUESTS="${INFILL_FUZZ_REQUESTS:-100000}"
# libtorch is not instrumented: leak reports from its static initialisers are noise.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
./build/asan/tests/infill_tests_server "[fuzz]"
