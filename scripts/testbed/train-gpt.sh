#!/usr/bin/env bash
# examples/train_gpt_moe.py on the two-level testbed, once per schedule, every
# run planned by and reporting to a moeplan-server (pytorch/README.md):
#   sudo bash scripts/testbed/testbed.sh --rate 1gbit --delay 0 --nodes 2 --ranks-per-node 2 -- \
#       bash scripts/testbed/train-gpt.sh [OUT_DIR] [STEPS]
# 1. starts moeplan-server on node0's loopback (rank 0 runs there) and stores
#    a copy of the built-in profile cpu-testbed-2x2 as `testbed-train`;
# 2. trains with --schedule default, s1, s2 and auto (the server's choice):
#    each run's JSON line (tokens/s, each MoE layer's measured and predicted
#    time) lands in OUT_DIR/<schedule>.json, its loss curve in <schedule>.png;
# 3. asks the server to refit testbed-train from what the runs reported and
#    keeps its report (OUT_DIR/refit.md), then prints a summary table.
# TRAIN_ARGS overrides the model and layout flags below.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-train-gpt}
STEPS=${2:-30}
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
"$B/client/moeplan" profiles get cpu-testbed-2x2 | $PY -c '
import json, sys
p = json.load(sys.stdin); p["name"] = "testbed-train"; p["version"] = 1
json.dump(p, open(sys.argv[1], "w"), indent=1)' "$OUT/profile-v1.json"
"$B/client/moeplan" profiles put "$OUT/profile-v1.json" --server "$addr"

for s in default s1 s2 auto; do
  echo "train-gpt: --schedule $s" >&2
  mpirun -np 4 -x PYTHONPATH -x GLOO_SOCKET_IFNAME "$PY" examples/train_gpt_moe.py \
    --server "$addr" --profile testbed-train --schedule "$s" --steps "$STEPS" "${ARGS[@]}" \
    --no-progress --png "$OUT/$s.png" >"$OUT/$s.out" 2>"$OUT/$s.err" </dev/null
  tail -n 1 "$OUT/$s.out" >"$OUT/$s.json"
done

$PY - "$addr" "$OUT" <<'EOF'
import json, sys
import moeplan_client
addr, out = sys.argv[1], sys.argv[2]
with moeplan_client.PlannerClient(addr, timeout_s=120) as c:
    r = c.refit_profile("testbed-train")
open(f"{out}/refit.md", "w").write(r["report"])
print(f"refit: {r['used']} of {r['measurements']} reported runs used; report in {out}/refit.md")
print(f"{'run':8} {'ran':8} {'tokens/s':>9} {'first':>7} {'last':>7} "
      f"{'MoE measured us':>16} {'predicted us':>13} {'error':>7}")
for s in ("default", "s1", "s2", "auto"):
    j = json.load(open(f"{out}/{s}.json"))
    m = sum(l["measured_us"] for l in j["moe_layers"]) / len(j["moe_layers"])
    p = sum(l["predicted_us"] for l in j["moe_layers"]) / len(j["moe_layers"])
    print(f"{s:8} {j['schedule']:8} {j['tokens_per_s']:9.1f} {j['first_loss']:7.3f} "
          f"{j['last_loss']:7.3f} {m:16.0f} {p:13.0f} {100 * (p - m) / m:+6.1f}%")
EOF
