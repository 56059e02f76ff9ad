#!/usr/bin/env bash
# One profile-and-validate run on the testbed, from the repository root:
#   bash scripts/testbed/testbed.sh --nodes N --ranks-per-node R --rate 1gbit --delay 0 -- \
#       bash scripts/testbed/campaign.sh OUT [LAYERS_GRID|- [MODELS_GRID|-]]
# The profile is measured on all N x R ranks and fitted as cpu-testbed-NxR
# (OUT/samples.jsonl, OUT/fit.txt, OUT/cpu-testbed-NxR.json); then the grids are
# validated with --replay (OUT/layers/ + layers.json, OUT/models/ + models.json),
# each after a moeplan profile-check of the machine against the profile
# (OUT/check-N.txt), and one more at the end; the links' qdisc counters
# (drops) go to OUT/qdisc.txt.
# Default grids: 2 ranks, examples/validation/testbed-2-ranks.json and
# testbed-2-ranks-models.json; 4 ranks, testbed-4-ranks-small.json and
# testbed-4-ranks-layouts.json. "-" skips a grid. ITERS_LAYERS (10) and
# ITERS_MODELS (6) set the timed iterations. The stage times are printed as
# they end. 2 x 1: about 20 minutes.
set -u
OUT=${1:?usage: campaign.sh OUT [LAYERS_GRID|- [MODELS_GRID|-]]}
NP=${TESTBED_NP:?run campaign.sh inside scripts/testbed/testbed.sh}
NAME=cpu-testbed-${TESTBED_NODES}x${TESTBED_RANKS_PER_NODE}
case $NP in
  2) layers=examples/validation/testbed-2-ranks.json
     models=examples/validation/testbed-2-ranks-models.json ;;
  4) layers=examples/validation/testbed-4-ranks-small.json
     models=examples/validation/testbed-4-ranks-layouts.json ;;
  *) layers=- models=- ;;
esac
LAYERS=${2:-$layers}
MODELS=${3:-$models}
B=${MOEPLAN_BUILD:-build}
mkdir -p "$OUT"
start=$(date +%s)
stage() { echo "$1: $(($(date +%s) - start)) s"; }
mpirun -np "$NP" "$B/profiler/moeplan-profile" --max-bytes 16MiB --iters 10 --budget 1 \
  --out "$OUT/samples.jsonl" 2>"$OUT/profile.err" || echo "profile failed (see $OUT/profile.err)"
stage profile
"$B/client/moeplan" calibrate --samples "$OUT/samples.jsonl" --out "$OUT/$NAME.json" \
  --name "$NAME" >"$OUT/fit.txt" 2>&1 || echo "calibrate failed (see $OUT/fit.txt)"
stage calibrate
# The machine's drift from the profile, before and after each grid (a shared
# machine's speed moves; the validation's cost error includes that move).
check() {
  "$B/client/moeplan" profile-check --profile "$OUT/$NAME.json" --ranks "$NP" \
    --out-dir "$OUT/check-$1" >"$OUT/check-$1.txt" 2>&1
  echo "profile-check $1: exit $? (see $OUT/check-$1.txt)"
}
check 0
# validate KIND GRID ITERS CHECK: one grid (--layers or --models) with --replay.
validate() {
  [[ $2 != - ]] || return 0
  "$B/client/moeplan" validate --profile "$OUT/$NAME.json" "--$1" "$2" --iters "$3" --warmup 2 \
    --replay --out-dir "$OUT/$1" --json >"$OUT/$1.json" 2>"$OUT/$1.err" ||
    echo "$1 failed (see $OUT/$1.err)"
  stage "$1"
  check "$4"
}
validate layers "$LAYERS" "${ITERS_LAYERS:-10}" 1
validate models "$MODELS" "${ITERS_MODELS:-6}" 2
# The shaper's counters: a drop on a node link would show up as a transfer
# stalled for tens of milliseconds (TCP recovering the loss).
{
  for ns in ${TESTBED_HUB:-} ${TESTBED_NS:-}; do
    echo "== $ns"
    tc -n "$ns" -s qdisc 2>&1
  done
} >"$OUT/qdisc.txt"
