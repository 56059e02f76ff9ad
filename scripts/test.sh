#!/usr/bin/env bash
# Installs, builds and runs every test: the full suite (ctest), then the unit
# tests again under ASan+UBSan in build-asan/.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${JOBS:-$(nproc)}"

bash scripts/setup.sh
(cd build && ctest --output-on-failure -j "$JOBS")

# ASan+UBSan: unit tests only (the CLI tests run the release binary above).
export BUILD_DIR=build-asan
bash scripts/setup.sh -DMOEPLAN_SANITIZER=asan -DMOEPLAN_BUILD_BENCH=OFF
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
(cd build-asan && ctest --output-on-failure -j "$JOBS" -L unit)
