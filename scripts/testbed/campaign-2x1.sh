#!/usr/bin/env bash
# One profile-and-validate run on the testbed of two hosts with one rank each
# (one rank per core on a 2-core machine), from the repository root:
#   bash scripts/testbed/testbed.sh --nodes 2 --ranks-per-node 1 --rate 1gbit --delay 0 -- \
#       bash scripts/testbed/campaign-2x1.sh OUT
# OUT gets samples.jsonl, fit.txt, cpu-testbed-2x1.json, and the validations of
# examples/validation/testbed-2-ranks.json (layers/, layers.json) and
# testbed-2-ranks-models.json (models/, models.json), each with --replay.
# About 40 minutes; the stage times are printed as they end.
set -u
OUT=${1:?usage: campaign-2x1.sh OUT}
B=${MOEPLAN_BUILD:-build}
mkdir -p "$OUT"
start=$(date +%s)
stage() { echo "$1: $(($(date +%s) - start)) s"; }
mpirun -np 2 "$B/profiler/moeplan-profile" --max-bytes 16MiB --iters 10 --budget 1 \
  --out "$OUT/samples.jsonl" 2>"$OUT/profile.err" || echo "profile failed (see $OUT/profile.err)"
stage profile
"$B/client/moeplan" calibrate --samples "$OUT/samples.jsonl" --out "$OUT/cpu-testbed-2x1.json" \
  --name cpu-testbed-2x1 >"$OUT/fit.txt" 2>&1 || echo "calibrate failed (see $OUT/fit.txt)"
stage calibrate
"$B/client/moeplan" validate --profile "$OUT/cpu-testbed-2x1.json" \
  --layers examples/validation/testbed-2-ranks.json --iters 10 --warmup 2 --replay \
  --out-dir "$OUT/layers" --json >"$OUT/layers.json" 2>"$OUT/layers.err" || echo "layers failed"
stage layers
"$B/client/moeplan" validate --profile "$OUT/cpu-testbed-2x1.json" \
  --models examples/validation/testbed-2-ranks-models.json --iters 6 --warmup 2 --replay \
  --out-dir "$OUT/models" --json >"$OUT/models.json" 2>"$OUT/models.err" || echo "models failed"
stage models
