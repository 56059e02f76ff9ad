#!/usr/bin/env bash
# examples/train_gpt_moe.py on 4 MPI ranks, as ctest runs it (label "torch"):
#   torch_train_test.sh SERVER_BIN STUB_DIR SOURCE_DIR
# - default, s1 and s2 each train 30 steps on the mp=2 ep=2 esp=2 layout at
#   capacity factor 2 (E/k: nothing dropped, so the schedules compute the same
#   function): the loss falls, and the three curves agree step by step within
#   fp32 tolerance (same seed, same data);
# - --server on a real moeplan-server: "auto" takes the server's schedule, the
#   measured op times are reported (ReportMeasurement stores them) and the loss
#   curve PNG is written;
# - a server that does not answer: a warning and the local profile, or exit 2
#   with --require-server.
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: $0 SERVER_BIN STUB_DIR SOURCE_DIR" >&2
  exit 2
fi
server_bin=$1
stubs=$2
src=$3
py=/usr/bin/python3
export PYTHONPATH=$stubs
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none

work=$(mktemp -d "${TMPDIR:-/tmp}/moeplan-torch-train.XXXXXX")
server_pid=""
# shellcheck source=scripts/lib/server.sh
source "$src/scripts/lib/server.sh"
cleanup() {
  kill_server
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

train() {  # train NAME ARGS...: the run's JSON line in $work/NAME.json
  local name=$1 rc=0
  shift
  timeout 300 mpirun -np 4 "$py" "$src/examples/train_gpt_moe.py" --no-progress "$@" \
    >"$work/$name.out" 2>"$work/$name.err" </dev/null || rc=$?
  if [[ $rc -ne 0 ]]; then
    tail -n 20 "$work/$name.err" >&2
    return $rc
  fi
  tail -n 1 "$work/$name.out" >"$work/$name.json"
}

# --- the three schedules agree ----------------------------------------------------
layout=(--mp 2 --esp 2 --capacity-factor 2 --steps 30 --seed 3)
for s in default s1 s2; do
  train "$s" --schedule "$s" "${layout[@]}" || fail "training with --schedule $s failed"
done
"$py" - "$work" <<'EOF' || fail "the schedules' loss curves"
import json, sys
runs = {s: json.load(open(f"{sys.argv[1]}/{s}.json")) for s in ("default", "s1", "s2")}
for s, r in runs.items():
    assert r["schedule"] == s, (s, r["schedule"])
    assert len(r["losses"]) == 30, len(r["losses"])
    # Cross-entropy over 256 bytes starts near ln(256) = 5.5 and must fall.
    assert r["first_loss"] > 5.0 and r["last_loss"] < r["first_loss"] - 1.0, (s, r["first_loss"], r["last_loss"])
    assert r["tokens_per_s"] > 0, r
    print(f"{s}: loss {r['first_loss']:.4f} -> {r['last_loss']:.4f}, {r['tokens_per_s']:.0f} tokens/s")
ref = runs["default"]["losses"]
for s in ("s1", "s2"):
    for step, (a, b) in enumerate(zip(ref, runs[s]["losses"])):
        assert abs(a - b) <= 1e-4 * abs(a) + 2e-6, f"{s} step {step + 1}: {b} vs default {a}"
print("default, s1 and s2 agree at every step")
EOF

# --- auto from a real server, measurements reported, the PNG ---------------------------
start_server "$server_bin" "$work" || fail "the server did not start"
train server --server "$addr" --profile cpu-testbed-2x2 --steps 8 --warmup 2 \
  --png "$work/loss.png" || fail "training with --server failed"
"$py" - "$work/server.json" "$addr" <<'EOF' || fail "the --server run's report"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["schedule"] in ("default", "s1", "s2"), r["schedule"]
for l in r["moe_layers"]:
    assert l["planned_by"] == f"server {sys.argv[2]}", l
    assert l["measured_us"] > 0 and l["predicted_us"] > 0, l
assert [x.get("stored") for x in r["reported"]] == [1, 2], r["reported"]
for x in r["reported"]:  # the server's replay of each layer's measured op times
    assert x["replayed_us"] > 0 and "composition_error_pct" in x and "cost_error_pct" in x, x
print(f"server chose {r['schedule']}; reported {len(r['reported'])} layers")
EOF
[[ $(head -c 8 "$work/loss.png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] ||
  fail "no PNG at --png"
kill -TERM "$server_pid"
wait "$server_pid" || fail "server exited $? after SIGTERM"
server_pid=""

# --- a server that does not answer ------------------------------------------------
dead=127.0.0.1:1
train fallback --server "$dead" --server-timeout 2 --steps 2 --warmup 0 || fail "the fallback run failed"
grep -q "did not answer" "$work/fallback.err" || fail "no warning about the silent server"
grep -q '"planned_by": "local profile cpu-testbed-2x2"' "$work/fallback.json" ||
  fail "the fallback run did not plan on the local profile: $(cat "$work/fallback.json")"
rc=0
train required --server "$dead" --server-timeout 2 --require-server --steps 2 --warmup 0 || rc=$?
[[ $rc -eq 2 ]] || fail "--require-server with a silent server exited $rc, not 2"
grep -q "did not answer" "$work/required.err" || fail "no error naming the silent server"
echo PASS
