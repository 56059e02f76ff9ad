#!/usr/bin/env bash
# Does a refit from reported runs lower the error on models that were never
# reported? Run inside the two-level testbed (docs/calibration.md "Refits
# from reported runs"):
#   sudo bash scripts/testbed/testbed.sh --rate 1gbit --delay 0 --nodes 2 --ranks-per-node 2 -- \
#       bash scripts/testbed/refit-demo.sh [OUT_DIR] [ITERS]
# 1. starts moeplan-server (loopback of node0, where rank 0 runs) and stores a
#    copy of the built-in profile cpu-testbed-2x2 as `testbed-live` version 1;
# 2. runs every variant of the grid's REPORTED models with moeplan-exec
#    --model --report-to (the jobs reporting back);
# 3. moeplan calibrate --from-server refits testbed-live into version 2;
# 4. moeplan validate --models on the HELD-OUT models, once with version 1
#    and once with version 2 (each run planned and measured anew).
# Prints both validations' summaries; everything lands in OUT_DIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-refit-demo}
ITERS=${2:-7}
GRID=${GRID:-examples/validation/testbed-4-ranks-models.json}
REPORTED=${REPORTED:-testbed-comm-ep4,testbed-comm-mp2,testbed-mp4}
HELD_OUT=${HELD_OUT:-testbed-compute-ep4,testbed-switch-shared-ep4}
B=${BUILD_DIR:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rm -rf "$OUT"
mkdir -p "$OUT/models"

# shellcheck source=scripts/lib/server.sh
source scripts/lib/server.sh
start_server "$B/server/moeplan-server" "$OUT" >&2 ||
  { echo "refit-demo: moeplan-server did not start" >&2; exit 1; }
server=$server_pid
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT

# The profile jobs plan and report with, and the two grids.
"$B/client/moeplan" profiles get cpu-testbed-2x2 | python3 -c '
import json, sys
p = json.load(sys.stdin); p["name"] = "testbed-live"; p["version"] = 1
json.dump(p, open(sys.argv[1], "w"), indent=1)' "$OUT/live-v1.json"
"$B/client/moeplan" profiles put "$OUT/live-v1.json" --server "$addr"
python3 - "$GRID" "$REPORTED" "$HELD_OUT" "$OUT" <<'PYEOF'
import json, sys
grid, reported, held, out = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(","), sys.argv[4]
g = json.load(open(grid))
by = {m["name"]: m for m in g["models"]}
for n in reported + held:
    if n not in by: sys.exit(f"refit-demo: {n} is not a model of {grid}")
for n in reported:
    json.dump(by[n], open(f"{out}/models/{n}.json", "w"))
json.dump({"schema_version": 1, "name": "held-out", "models": [by[n] for n in held]},
          open(f"{out}/held-out.json", "w"))
PYEOF

# 2. The reported runs.
for n in ${REPORTED//,/ }; do
  echo "refit-demo: reporting $n" >&2
  mpirun -np 4 "$B/executor/moeplan-exec" --model "$OUT/models/$n.json" --variant all \
    --iters "$ITERS" --warmup 2 --profile "$OUT/live-v1.json" --report-to "$addr" \
    >"$OUT/models/$n.txt"
done

# 3. The refit.
"$B/client/moeplan" calibrate --from-server "$addr" --profile testbed-live \
  --out "$OUT/live-v2.json" >"$OUT/refit.md"
tail -1 "$OUT/refit.md"

# 4. The held-out models with each version.
for v in v1 v2; do
  echo "refit-demo: validating the held-out models with $v" >&2
  "$B/client/moeplan" validate --profile "$OUT/live-$v.json" --models "$OUT/held-out.json" \
    --iters "$ITERS" --warmup 2 --out-dir "$OUT/validate-$v" | sed "s/^/$v: /"
done
