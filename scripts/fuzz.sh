#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/README.md) into build-fuzz/ with clang++
# and ASan+UBSan, replays every saved regression input, then fuzzes each
# harness for SECONDS (seeded from the repository's examples, goldens and
# profiles; dictionary of the protos' field names).
#   bash scripts/fuzz.sh [SECONDS] [HARNESS...]     (default 20 s, every harness)
# Environment: FUZZ_JOBS (parallel harnesses, default nproc), FUZZ_RSS_MB (2048),
# FUZZ_TIMEOUT_S (per input, 10). Exits non-zero on the first finding; the
# input is left in build-fuzz/artifacts/ and the command to replay it printed.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH="${1:-20}"
shift || true
ALL=(layer_json grid_json model_json profile_json store_file samples_jsonl server_requests
  hf_config_json pipeline_layout layout_spec)
HARNESSES=("${@:-${ALL[@]}}")
for h in "${HARNESSES[@]}"; do
  [[ " ${ALL[*]} " == *" $h "* ]] || { echo "fuzz.sh: unknown harness '$h' (one of: ${ALL[*]})" >&2; exit 2; }
done
if ! [[ "$SECONDS_EACH" =~ ^[0-9]+$ ]] || ((SECONDS_EACH < 1)); then
  echo "fuzz.sh: SECONDS must be a whole number >= 1 (got '$SECONDS_EACH')" >&2
  exit 2
fi

targets=()
for h in "${HARNESSES[@]}"; do targets+=("fuzz_$h"); done
# Debian's clang 14 and its runtime (libFuzzer, sanitizers).
EXTRA_PACKAGES="clang libclang-rt-14-dev" BUILD_DIR=build-fuzz BUILD_TARGETS="${targets[*]}" \
  bash scripts/setup.sh \
  -DCMAKE_CXX_COMPILER=clang++ -DMOEPLAN_FUZZ=ON -DMOEPLAN_BUILD_TESTS=OFF -DMOEPLAN_BUILD_BENCH=OFF

OUT=build-fuzz
DICT="$OUT/fuzz.dict"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
mkdir -p "$OUT/artifacts"

# Seeds: the files of the repository a harness's input looks like.
seeds() {
  case "$1" in
    layer_json) ls examples/*-layer.json ;;
    grid_json) ls examples/*grid*.json examples/validation/*.json ;;
    model_json) ls examples/models/*.json ;;
    profile_json | store_file) ls calibration/profiles/*.json ;;
    samples_jsonl) ls calibration/profiles/measured/*/samples.jsonl ;;
    hf_config_json) ls examples/hf/*/config.json ;;
    pipeline_layout) ls fuzz/seeds/pipeline_layout/* ;;
    layout_spec) ls fuzz/seeds/layout_spec/* ;;
    server_requests) ls examples/*-layer.json examples/models/*.json calibration/profiles/*.json ;;
  esac
}
corpus() {
  local h=$1 dir="$OUT/corpus/$1"
  mkdir -p "$dir"
  local f i=0
  for f in $(seeds "$h"); do
    i=$((i + 1))
    case "$h" in
      # Byte 0 of a store input: odd = a body given a correct header.
      store_file) { printf '\001'; cat "$f"; } >"$dir/seed-$i" ;;
      # Slices of a few lines each: libFuzzer keeps inputs small.
      samples_jsonl) split -l 4 -d -a 3 "$f" "$dir/seed-$i-" ;;
      # Byte 0 picks the handler ('0' PlanLayer, '1' PlanModel, '4' PutProfile;
      # JSON requests); each file becomes the request that carries it.
      server_requests)
        case "$f" in
          examples/models/*)
            { printf '1{"profile_name":"a100-8x8","model":'; cat "$f"; printf '}'; } >"$dir/seed-$i"
            { printf '1{"profile_name":"a100-8x8","layout":{"dp":8,"tp":8,"pp":1,"ep":8,"esp":8,"microbatches":1},"model":'
              cat "$f"; printf '}'; } >"$dir/seed-$i-layout" ;;
          examples/*)
            { printf '0{"profile_name":"a100-8x8","include_timeline":true,"layer":'; cat "$f"; printf '}'; } >"$dir/seed-$i" ;;
          *) { printf '4{"profile":'; cat "$f"; printf '}'; } >"$dir/seed-$i" ;;
        esac ;;
      *) cp "$f" "$dir/seed-$i" ;;
    esac
  done
  echo "$dir"
}

if [[ " ${HARNESSES[*]} " == *" server_requests "* ]]; then
  dir="$OUT/corpus/server_requests"
  mkdir -p "$dir"
  printf '2{}' >"$dir/seed-list"
  printf '3{"name":"a100-8x8"}' >"$dir/seed-get"
  printf '5{"profile_name":"a100-8x8","profile_version":1,"schedule":"SCHEDULE_S2","plan":{"layer":' >"$dir/seed-report"
  cat examples/gpt2-moe-layer.json >>"$dir/seed-report"
  printf '},"ops":[{"name":"fwd.gate","duration_us":25.5}],"total_us":9000}' >>"$dir/seed-report"
fi

# Regression inputs: every finding fixed so far, replayed first.
for h in "${HARNESSES[@]}"; do
  reg="fuzz/regressions/$h"
  if [ -d "$reg" ] && [ -n "$(ls -A "$reg")" ]; then
    echo "fuzz: replaying $(ls "$reg" | wc -l) regression input(s) of $h" >&2
    "$OUT/fuzz/fuzz_$h" -rss_limit_mb="${FUZZ_RSS_MB:-2048}" -timeout="${FUZZ_TIMEOUT_S:-10}" \
      "$reg"/* >"$OUT/artifacts/$h.regressions.log" 2>&1 ||
      { tail -40 "$OUT/artifacts/$h.regressions.log" >&2; echo "fuzz: $h regression failed" >&2; exit 1; }
  fi
done

run() {
  local h=$1 dir
  dir=$(corpus "$h")
  if "$OUT/fuzz/fuzz_$h" "$dir" -dict="$DICT" -max_total_time="$SECONDS_EACH" \
      -rss_limit_mb="${FUZZ_RSS_MB:-2048}" -timeout="${FUZZ_TIMEOUT_S:-10}" -max_len=16384 \
      -print_final_stats=1 -artifact_prefix="$OUT/artifacts/$h-" >"$OUT/artifacts/$h.log" 2>&1; then
    echo "fuzz: $h: $(grep -aE '^stat::number_of_executed_units' "$OUT/artifacts/$h.log" | awk '{print $2}') runs in ${SECONDS_EACH} s, corpus $(ls "$dir" | wc -l), no finding"
  else
    tail -60 "$OUT/artifacts/$h.log" >&2
    echo "fuzz: $h FOUND something; replay: $OUT/fuzz/fuzz_$h $(ls -t "$OUT"/artifacts/"$h"-* 2>/dev/null | head -1)" >&2
    return 1
  fi
}

JOBS="${FUZZ_JOBS:-$(nproc)}"
pids=()
status=0
for h in "${HARNESSES[@]}"; do
  run "$h" &
  pids+=($!)
  if ((${#pids[@]} >= JOBS)); then
    wait "${pids[0]}" || status=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
