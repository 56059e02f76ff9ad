#!/usr/bin/env bash
# examples/train_gpt_moe.py on the two-level testbed, once per schedule, every
# run planned by and reporting to a moeplan-server (pytorch/README.md):
#   sudo bash scripts/testbed/testbed.sh --rate 1gbit --delay 0 --nodes 2 --ranks-per-node 2 -- \
#       bash scripts/testbed/train-gpt.sh [OUT_DIR] [STEPS] [ROUNDS]
# 1. starts moeplan-server on node0's loopback (rank 0 runs there) and stores
#    a copy of the built-in profile cpu-testbed-2x2 as `testbed-train`;
# 2. trains with --schedule default, s1, s2 and auto (the server's choice),
#    ROUNDS times in rounds (default, s1, s2, auto, default, ...: a slow spell
#    of the machine lands on every schedule alike); each run's JSON line
#    (tokens/s, each MoE layer's measured and predicted time) lands in
#    OUT_DIR/<schedule>.<round>.json, its loss curve in <schedule>.<round>.png;
# 3. asks the server to refit testbed-train from what the runs reported and
#    keeps its report (OUT_DIR/refit.md), then prints a summary table (medians
#    over the rounds; OUT_DIR/summary.md).
# TRAIN_ARGS overrides the model and layout flags below; PROFILE names the
# profile to copy (a built-in name or a profile file; default cpu-testbed-2x2).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-train-gpt}
STEPS=${2:-30}
ROUNDS=${3:-2}
B=${BUILD_DIR:-build}
PY=/usr/bin/python3
read -r -a ARGS <<<"${TRAIN_ARGS:---mp 2 --esp 2 --model-dim 128 --hidden-dim 512 --batch 8 --seq-len 64 --warmup 5}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export PYTHONPATH=$PWD/$B/client/python
# gloo picks its interface from this; the testbed's nodes reach each other on eth0.
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-eth0}
rm -rf "$OUT"
mkdir -p "$OUT"

# shellcheck source=scripts/lib/server.sh
source scripts/lib/server.sh
start_server "$B/server/moeplan-server" "$OUT" >&2 ||
  { echo "train-gpt: moeplan-server did not start" >&2; exit 1; }
server=$server_pid
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
PROFILE=${PROFILE:-cpu-testbed-2x2}
if [[ -f $PROFILE ]]; then cat "$PROFILE"; else "$B/client/moeplan" profiles get "$PROFILE"; fi | $PY -c '
import json, sys
p = json.load(sys.stdin); p["name"] = "testbed-train"; p["version"] = 1
json.dump(p, open(sys.argv[1], "w"), indent=1)' "$OUT/profile-v1.json"
"$B/client/moeplan" profiles put "$OUT/profile-v1.json" --server "$addr"

for round in $(seq 1 "$ROUNDS"); do
  for s in default s1 s2 auto; do
    echo "train-gpt: round $round, --schedule $s" >&2
    mpirun -np 4 -x PYTHONPATH -x GLOO_SOCKET_IFNAME "$PY" examples/train_gpt_moe.py \
      --server "$addr" --profile testbed-train --schedule "$s" --steps "$STEPS" "${ARGS[@]}" \
      --no-progress --png "$OUT/$s.$round.png" >"$OUT/$s.$round.out" 2>"$OUT/$s.$round.err" </dev/null
    tail -n 1 "$OUT/$s.$round.out" >"$OUT/$s.$round.json"
  done
done

$PY - "$addr" "$OUT" "$ROUNDS" <<'EOF' | tee "$OUT/summary.md"
import json, statistics, sys
import moeplan_client
addr, out, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
with moeplan_client.PlannerClient(addr, timeout_s=120) as c:
    r = c.refit_profile("testbed-train")
open(f"{out}/refit.md", "w").write(r["report"])
print(f"refit: {r['used']} of {r['measurements']} reported runs used; report in refit.md\n")
# Composition (the server's replay of each reported layer against its
# measured time) and cost (its prediction against the replay): medians.
print("| run | ran | tokens/s (each round) | loss first → last | MoE layer measured µs | predicted µs | error | composition | cost |")
print("|---|---|---|---|---:|---:|---:|---:|---:|")
for s in ("default", "s1", "s2", "auto"):
    runs = [json.load(open(f"{out}/{s}.{i}.json")) for i in range(1, rounds + 1)]
    layers = [l for j in runs for l in j["moe_layers"]]
    m = statistics.median(l["measured_us"] for l in layers)
    p = statistics.median(l["predicted_us"] for l in layers)
    rep = [r for j in runs for r in (j.get("reported") or []) if "replayed_us" in r]
    comp = f"{statistics.median(r['composition_error_pct'] for r in rep):+.1f} %" if rep else "-"
    cost = f"{statistics.median(r['cost_error_pct'] for r in rep):+.1f} %" if rep else "-"
    tps = ", ".join(f"{j['tokens_per_s']:.0f}" for j in runs)
    print(f"| {s} | {runs[0]['schedule']} | {tps} | {runs[0]['first_loss']:.4f} → "
          f"{runs[0]['last_loss']:.4f} | {m:.0f} | {p:.0f} | {100 * (p - m) / m:+.1f} % | {comp} | {cost} |")
EOF
