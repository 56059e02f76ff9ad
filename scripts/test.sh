#!/usr/bin/env bash
# Installs, builds and runs every test: the docs' links and anchors (scripts/docs.sh), the
# libraries' file and function sizes (scripts/check-size.sh), the full
# suite (ctest), a short soak of the server, then the unit tests again under ASan+UBSan in
# build-asan/, then the fuzz harnesses for a bounded time in build-fuzz/, then the server tests
# under TSan in build-tsan/.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${JOBS:-$(nproc)}"

bash scripts/setup.sh
# No merge left half-done: a conflict marker at the start of a line in any tracked file.
if git grep -nE '^(<<<<<<<|>>>>>>>)( |$)|^=======$' -- . ':!*.rst'; then
  echo "test.sh: error: merge conflict markers above" >&2
  exit 1
fi
# The docs site (scripts/docs.sh): a strict MkDocs build and LinkChecker over it; any broken
# link or #anchor in README.md, docs/ or a folder README fails here. Then the checker's own
# fixtures: a broken link and a broken anchor must fail it.
bash scripts/docs.sh
bash scripts/docs.sh --self-test
# Source size (docs/conventions.md "Size"): no library file over 600 lines, no function over
# about 80; its self-test shows it failing under tighter limits.
bash scripts/check-size.sh
bash scripts/check-size.sh --self-test
(cd build && ctest --output-on-failure -j "$JOBS")

# A short soak of the server (scripts/soak.sh; 600 s is the reported run):
# mixed traffic with no failed call and bounded RSS, then a burst of
# worst-case requests during which cheap calls are still answered.
# A 20 s window measures RSS growth coarsely: 20 % there, 10 % over the 600 s run.
# Refits and whole-model plans run here too; the PyTorch example (4 MPI ranks a
# run, its own ctest tests above) only in the full-length soak.
DURATION="${SOAK_SECONDS:-20}" WORST_S=5 RSS_LIMIT_PCT=20 TORCH=0 bash scripts/soak.sh

# ASan+UBSan: unit tests only (the CLI tests run the release binary above).
export BUILD_DIR=build-asan
BUILD_TARGETS="base_test planner_test proto_test requests_test calibration_test profiler_test executor_kernels_test" bash scripts/setup.sh -DMOEPLAN_SANITIZER=asan -DMOEPLAN_BUILD_BENCH=OFF
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
(cd build-asan && ctest --output-on-failure -j "$JOBS" -L unit)

# Fuzzing (fuzz/README.md): every harness's regression inputs replayed, then a
# bounded run of each (clang, ASan+UBSan, build-fuzz/).
FUZZ_JOBS="$JOBS" bash scripts/fuzz.sh "${FUZZ_SECONDS:-15}"

# TSan: the server tests (in-process server, client threads, a real process).
export BUILD_DIR=build-tsan
BUILD_TARGETS="server_test server_process_test moeplan-server moeplan" bash scripts/setup.sh -DMOEPLAN_SANITIZER=tsan -DMOEPLAN_BUILD_BENCH=OFF
# Debian's gRPC/abseil/protobuf are not instrumented: ignore their own accesses
# (ignore_noninstrumented_modules) and mixed atomic/plain races from gRPC's
# header code (our server code uses no atomics); see tests/tsan.supp.
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:report_atomic_races=0:suppressions=$PWD/tests/tsan.supp}"
(cd build-tsan && ctest --output-on-failure -j "$JOBS" -L server)
