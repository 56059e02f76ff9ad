#!/usr/bin/env bash
# moeplan-exec as users run it, under mpirun (label "mpi"):
#   exec_cli_test.sh MOEPLAN_EXEC MOEPLAN_CLI SOURCE_DIR MOEPLAN_SERVER
# - a dropless layer with a skewed gate: --check against the padded default
#   that drops nothing, token_skew reported as measured;
# - --check --json on 4 ranks: exit 0, three schedules, check passed, and every
#   schedule's measured op names equal `moeplan plan-layer`'s, in order; the
#   schedules were interleaved and each one's per-iteration totals are reported,
#   their median being its total; --sequential likewise, not interleaved;
# - bad inputs: exit 1 on every rank within the timeout (no rank left waiting),
#   one error line naming the field;
# - a rank stopped or killed mid-run: the job ends non-zero within 30 s;
# - --report-to a moeplan-server on loopback: one stored measurement per
#   schedule, op for op under the plan's names; --model --report-to one per
#   variant against a stored profile, then `moeplan calibrate --from-server`
#   refits it into version 2, which the server then serves; an unreachable
#   server: exit 1;
# - --model on 4 ranks: every variant predicted and measured in plan-model's
#   shape, op for op under the same names; its bad inputs named;
# - --model --layout: a two-stage 1F1B program, both stages' ops and the
#   transfers measured under the predicted names; bad layouts named;
#   --check of sequence parallelism, a folded expert grid and the A2A
#   overlap against the plain layout: every MoE layer's tensors agree;
# - --plan: a plan saved by plan-model --format json runs as saved (its
#   variants, op for op its names), --variant auto its best; a plan that
#   another profile would not rebuild, without its model, a search, or a
#   variant it does not hold, refused naming why.
set -uo pipefail
EXEC=$1 CLI=$2 SRC=$3 SERVER=$4
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
PY=/usr/bin/python3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
LAYER=$SRC/tests/executor/layers/tiny-4.json
fail=0
bad() { echo "FAIL: $*" >&2; fail=1; }

# 1. A good run.
if ! timeout 120 mpirun -np 4 "$EXEC" --layer "$LAYER" --check --json --iters 3 --warmup 1 \
    >"$TMP/exec.json" 2>"$TMP/exec.err"; then
  bad "moeplan-exec --check failed: $(cat "$TMP/exec.err")"
fi
if ! timeout 120 mpirun -np 4 "$EXEC" --layer "$LAYER" --check --json --iters 4 --warmup 0 \
    --sequential >"$TMP/seq.json" 2>"$TMP/seq.err"; then
  bad "moeplan-exec --check --sequential failed: $(cat "$TMP/seq.err")"
fi
"$CLI" plan-layer --layer "$LAYER" --format json >"$TMP/plan.json" || bad "plan-layer failed"
$PY - "$TMP/exec.json" "$TMP/plan.json" "$TMP/seq.json" <<'PYEOF' || fail=1
import json, statistics, sys
exe = json.load(open(sys.argv[1]))
plan = json.load(open(sys.argv[2]))
seq = json.load(open(sys.argv[3]))
ok = True
def check(cond, msg):
    global ok
    if not cond:
        print("FAIL:", msg, file=sys.stderr); ok = False
check(exe["check"]["passed"], "check did not pass")
check(len(exe["candidates"]) == 3, "expected three schedules")
predicted = {c["schedule"]: [o["name"] for o in c["ops"]] for c in plan["candidates"]}
for c in exe["candidates"]:
    names = [o["name"] for o in c["ops"]]
    check(names == predicted[c["schedule"]], f'{c["schedule"]}: op names differ from the planner\'s:\n {names}\n {predicted[c["schedule"]]}')
    check(c["total_us"] > c["forward_us"] > 0, f'{c["schedule"]}: totals')
    for o in c["ops"]:
        check(o["end_us"] >= o["start_us"] >= 0, f'{o["name"]}: times')
        check(o["resource"] != "", f'{o["name"]}: no metadata from the planner')
for rep, iters, interleaved in ((exe, 3, True), (seq, 4, False)):
    check(rep.get("interleaved", False) == interleaved, f"interleaved should be {interleaved}")
    its = rep.get("iterations", [])
    check([i["schedule"] for i in its] == [c["schedule"] for c in rep["candidates"]],
          "iterations: one entry per candidate, same order")
    for i, c in zip(its, rep["candidates"]):
        check(len(i["total_us"]) == iters, f'{i["schedule"]}: {len(i["total_us"])} totals, expected {iters}')
        # The speed probe after every timed iteration: a GEMM rate, GFLOP/s.
        probes = i.get("probe_gflops", [])
        check(len(probes) == iters and all(0 < g < 1e6 for g in probes),
              f'{i["schedule"]}: speed probes {probes}, expected {iters} rates > 0')
        check(abs(statistics.median(i["total_us"]) - c["total_us"]) <= 1e-6 * c["total_us"],
              f'{i["schedule"]}: total_us is not the median of the iterations')
check(seq["check"]["passed"], "--sequential: check did not pass")
sys.exit(0 if ok else 1)
PYEOF

# 1b. Skewed routing: the report gives each schedule's measured load. Top-1,
# so the favourite expert's EP rank gets nearly every token whichever it is.
sed 's/"top_k": 2/"top_k": 1/' "$LAYER" >"$TMP/top1.json"
if ! timeout 120 mpirun -np 4 "$EXEC" --layer "$TMP/top1.json" --schedule default --skew 2 --json \
    --iters 1 --warmup 0 >"$TMP/skew.json" 2>"$TMP/skew.err"; then
  bad "moeplan-exec --skew 2 failed: $(cat "$TMP/skew.err")"
fi
$PY - "$TMP/exec.json" "$TMP/skew.json" <<'PYEOF' || fail=1
import json, sys
flat, skew = (json.load(open(f)) for f in sys.argv[1:3])
ok = True
def check(cond, msg):
    global ok
    if not cond:
        print("FAIL:", msg, file=sys.stderr); ok = False
check([r["schedule"] for r in flat["routing"]] == [c["schedule"] for c in flat["candidates"]],
      "routing: one entry per candidate, same order")
check(skew.get("skew_exponent") == 2, "skew_exponent not reported")
r = skew["routing"][0]
# Zipf 2 over 8 experts on 2 EP ranks, top-1: nearly every token picks the
# favourite, so its rank carries close to all (2x its balanced share) and the
# capacity (T = 1 * 4 * 32 / 8 = 16 of 32 tokens) drops about half.
check(r["rank_load_ratio"] > 1.6, f"skew 2: rank load ratio {r['rank_load_ratio']}")
check(r["expert_load_ratio"] > 6, f"skew 2: expert load ratio {r['expert_load_ratio']}")
check(r.get("dropped_pct", 0) > 30, f"skew 2: dropped {r.get('dropped_pct', 0)}%")
check(all(x["rank_load_ratio"] < r["rank_load_ratio"] for x in flat["routing"]),
      "unbiased routing should be more even than skew 2")
sys.exit(0 if ok else 1)
PYEOF

# 1b. A dropless layer with a skewed gate (mp=1, ep=4, top-1: the popular
# experts' ranks get several times their share): only the default runs, its
# --check compares it with the padded default that drops nothing, the report
# spells out the measured heaviest-rank load as the layer's token_skew, and
# the count exchange is timed under the planner's name.
sed -e 's/"top_k": 2, "capacity_factor": 4.0/"top_k": 1, "dropless": true/' \
    -e 's/"mp": 2, "ep": 2, "esp": 2/"mp": 1, "ep": 4, "esp": 1/' "$LAYER" >"$TMP/dl-skew.json"
if ! timeout 120 mpirun -np 4 "$EXEC" --layer "$TMP/dl-skew.json" --check --json --iters 3 \
    --warmup 1 --skew 2 >"$TMP/dl.json" 2>"$TMP/dl.err"; then
  bad "moeplan-exec dropless --check failed: $(cat "$TMP/dl.err")"
fi
$PY - "$TMP/dl.json" <<'PYEOF' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
ok = True
def check(cond, msg):
    global ok
    if not cond:
        print("FAIL: dropless:", msg, file=sys.stderr); ok = False
check(r["check"]["passed"], "check did not pass")
check([c["schedule"] for c in r["candidates"]] == ["SCHEDULE_DEFAULT"], "only the default runs")
notes = {t.get("note", "") for t in r["check"]["tensors"]}
check(any("padded default at capacity_factor E/k" in n for n in notes), f"reference not named: {notes}")
check(len(r["check"]["tensors"]) == 6, "routing and five tensors compared")
ratio = r["routing"][0]["rank_load_ratio"]
check(ratio >= 2.0, f"skew 2 on top-1 should load a rank at least 2x (got {ratio})")
check(abs(r["layer"]["token_skew"] - ratio) < 1e-9, "token_skew is not the measured load")
check(r["routing"][0].get("dropped_pct", 0) == 0, "dropless dropped tokens")
names = [o["name"] for o in r["candidates"][0]["ops"]]
check("fwd.ep_alltoall_counts" in names, f"no count exchange in {names}")
sys.exit(0 if ok else 1)
PYEOF

# 1c. A whole model: every variant planned, run and reported in plan-model's
# shape, the measured ops under the predicted names, in order.
MODEL=$SRC/tests/executor/models/tiny-model-4.json
if ! timeout 120 mpirun -np 4 "$EXEC" --model "$MODEL" --json --iters 3 --warmup 1 \
    >"$TMP/model.json" 2>"$TMP/model.err"; then
  bad "moeplan-exec --model failed: $(cat "$TMP/model.err")"
fi
$PY - "$TMP/model.json" <<'PYEOF' || fail=1
import json, statistics, sys
r = json.load(open(sys.argv[1]))
ok = True
def check(cond, msg):
    global ok
    if not cond:
        print("FAIL:", msg, file=sys.stderr); ok = False
pred, meas = r["predicted"]["variants"], r["measured"]["variants"]
names = ["none", "tutel", "dw", "partition", "lancet"]
check([v["name"] for v in pred] == names, f"predicted variants {[v['name'] for v in pred]}")
check([v["name"] for v in meas] == names, f"measured variants {[v['name'] for v in meas]}")
for p, m, its in zip(pred, meas, r["iterations"]):
    check([o["name"] for o in m["ops"]] == [o["name"] for o in p["ops"]],
          f'{m["name"]}: measured op names differ from the prediction\'s')
    check(m["num_ops"] == p["num_ops"] == len(p["ops"]), f'{m["name"]}: op counts')
    check(m["ops"][-1]["name"] == "optimizer.step", f'{m["name"]}: last op')
    check(m["iteration_us"] > m["forward_us"] > 0, f'{m["name"]}: totals')
    check(len(its["total_us"]) == 3 and its["variant"] == m["name"], f'{m["name"]}: iterations')
    check(len(its.get("probe_gflops", [])) == 3 and all(g > 0 for g in its["probe_gflops"]),
          f'{m["name"]}: speed probes {its.get("probe_gflops")}')
    check(abs(statistics.median(its["total_us"]) - m["iteration_us"]) <= 1e-6 * m["iteration_us"],
          f'{m["name"]}: iteration_us is not the median')
    for o in m["ops"]:
        check(o["end_us"] >= o["start_us"] >= 0, f'{o["name"]}: times')
check(r.get("interleaved", False), "the variants' iterations were not interleaved")
best = min(meas, key=lambda v: v["iteration_us"])["name"]
check(r["measured"]["best_variant"] == best, "measured best_variant")
check(r["predicted"]["best_variant"] in names, "predicted best_variant")
check(r["model"]["bytes_per_element"] == 4 and r["dtype"] == "f32", "dtype")
sys.exit(0 if ok else 1)
PYEOF

# 1e. A pipelined layout's program: two stages of two ranks, 1F1B over 2
# micro-batches; every op of both stages measured under the predicted names
# (stage and micro-batch in front), and the transfers between them.
if ! timeout 120 mpirun -np 4 "$EXEC" --model "$MODEL" --layout dp=2,tp=1,pp=2,ep=2,esp=1,microbatches=2 \
    --variant none --json --iters 3 --warmup 1 >"$TMP/layout.json" 2>"$TMP/layout.err"; then
  bad "moeplan-exec --layout failed: $(cat "$TMP/layout.err")"
fi
$PY - "$TMP/layout.json" <<'PYEOF' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
ok = True
def check(cond, msg):
    global ok
    if not cond:
        print("FAIL:", msg, file=sys.stderr); ok = False
check(r["layout"]["pp"] == 2 and r["layout"]["pipeline"] == "1f1b" and r["layout"]["microbatches"] == 2,
      f'layout {r["layout"]}')
check(r["model"]["parallel"]["pp"] == 2 and r["model"]["micro_batch_size"] == 1, "the model as it ran")
p, m = r["predicted"]["variants"][0], r["measured"]["variants"][0]
names = [o["name"] for o in p["ops"]]
check([o["name"] for o in m["ops"]] == names, "measured op names differ from the prediction's")
check(any(n.startswith("s0.mb1.b0.moe.") for n in names), "stage 0 runs block 0's MoE layer")
check(any(n.startswith("s1.mb1.b1.") for n in names), "stage 1 runs block 1")
check(names.count("s0.optimizer.step") == 1 and names.count("s1.optimizer.step") == 1, "one step per stage")
sends = [o for o in m["ops"] if o["name"].endswith("pipe.send_fwd") or o["name"].endswith("pipe.send_bwd")]
check(len(sends) == 4, f"{len(sends)} transfers, expected 2 each way")
for o in m["ops"]:
    check(o["end_us"] >= o["start_us"] >= 0, f'{o["name"]}: times')
check(m["iteration_us"] > m["forward_us"] > 0, "totals")
sys.exit(0 if ok else 1)
PYEOF

# 1e'. An uneven pipeline layout (Megatron-Core's string): both layers on the
# first stage, the loss alone on the second; the program runs as planned.
if ! timeout 120 mpirun -np 4 "$EXEC" --model "$MODEL" \
    --layout 'dp=2,tp=1,pp=2,ep=2,esp=1,microbatches=2,layout=Ett|L' \
    --variant none --json --iters 2 --warmup 1 >"$TMP/uneven.json" 2>"$TMP/uneven.err"; then
  bad "moeplan-exec --layout ...,layout=Ett|L failed: $(cat "$TMP/uneven.err")"
fi
$PY - "$TMP/uneven.json" <<'PYEOF' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
names = [o["name"] for o in r["measured"]["variants"][0]["ops"]]
blocks = {(n.split(".")[0], p) for n in names for p in n.split(".") if p[:1] == "b" and p[1:].isdigit()}
ok = r["layout"]["pipeline_model_parallel_layout"] == "Ett|L" and blocks == {("s0", "b0"), ("s0", "b1")}
ok = ok and any(n.startswith("s1.mb1.") and "loss" in n for n in names)
if not ok:
    print("FAIL: uneven layout ran", r["layout"], sorted(blocks), file=sys.stderr)
sys.exit(0 if ok else 1)
PYEOF

# 1e''. --check: sequence parallelism with the expert grid folded over TP and
# DP (ep=4, etp=1) and the A2A overlap, held against the plain layout on the
# same seeded inputs: every MoE layer's tensors, assembled over the ranks.
CHECKM=$SRC/tests/executor/models/tiny-check.json
if ! timeout 120 mpirun -np 4 "$EXEC" --model "$CHECKM" --check --json --iters 1 --warmup 0 \
    --variant none --layout dp=2,tp=2,pp=1,ep=4,etp=1,microbatches=2,sp=1,a2a_overlap=1 \
    >"$TMP/lcheck.json" 2>"$TMP/lcheck.err"; then
  bad "moeplan-exec --layout --check failed: $(cat "$TMP/lcheck.err")"
fi
$PY - "$TMP/lcheck.json" <<'PYEOF' || fail=1
import json, sys
c = json.load(open(sys.argv[1]))["check"]
ref = c["reference"]
ok = (c.get("passed") and len(c["instances"]) == 8
      and all(len(i["tensors"]) == 5 and i["passed"] for i in c["instances"])
      and (ref["ep"], ref["esp"], ref.get("sequence_parallel", False)) == (2, 2, False))
if not ok:
    print("FAIL: --layout --check:", json.dumps(c)[:600], file=sys.stderr)
sys.exit(0 if ok else 1)
PYEOF

# 1d. A saved plan runs as saved.
"$CLI" plan-model --model "$MODEL" --cluster cpu-testbed-1x4 --variants none,dw,lancet --timeline \
  --format json >"$TMP/saved.json" || bad "plan-model --format json failed"
if ! timeout 120 mpirun -np 4 "$EXEC" --plan "$TMP/saved.json" --json --iters 2 --warmup 0 \
    >"$TMP/fromplan.json" 2>"$TMP/fromplan.err"; then
  bad "moeplan-exec --plan failed: $(cat "$TMP/fromplan.err")"
fi
timeout 120 mpirun -np 4 "$EXEC" --plan "$TMP/saved.json" --variant auto --json --iters 1 \
  --warmup 0 >"$TMP/planauto.json" 2>"$TMP/planauto.err" || bad "--plan --variant auto failed: $(cat "$TMP/planauto.err")"
$PY - "$TMP/saved.json" "$TMP/fromplan.json" "$TMP/planauto.json" <<'PYEOF' || fail=1
import json, sys
saved, r, auto = (json.load(open(f)) for f in sys.argv[1:4])
ok = True
def check(cond, msg):
    global ok
    if not cond: print("FAIL: --plan:", msg, file=sys.stderr); ok = False
check(r["predicted"]["profile_name"] == "cpu-testbed-1x4", "not predicted on the plan's own profile")
check([v["name"] for v in r["measured"]["variants"]] == ["none", "dw", "lancet"], "variants")
for s, m in zip(saved["variants"], r["measured"]["variants"]):
    check([o["name"] for o in m["ops"]] == [o["name"] for o in s["ops"]], f'{s["name"]}: ops differ')
    check(m["dw_placements"] == s.get("dw_placements", []), f'{s["name"]}: dW placements')
check([v["name"] for v in auto["measured"]["variants"]] == [saved["best_variant"]], "auto")
sys.exit(0 if ok else 1)
PYEOF

# 2. Bad inputs: every rank exits 1, promptly, one message naming the field.
expect_error() {  # name, np, pattern, args...
  local name=$1 np=$2 pattern=$3
  shift 3
  timeout 60 mpirun -np "$np" "$EXEC" "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if [ $rc -eq 124 ]; then bad "$name: hung (timeout)"; return; fi
  if [ $rc -eq 0 ]; then bad "$name: exit 0"; return; fi
  local n
  n=$(grep -c '^moeplan-exec: ' "$TMP/err")
  [ "$n" = 1 ] || bad "$name: expected one error line, got $n: $(cat "$TMP/err")"
  grep -q -- "$pattern" "$TMP/err" || bad "$name: no '$pattern' in: $(cat "$TMP/err")"
}
sed 's/"mp": 2, "ep": 2, "esp": 2/"mp": 2, "ep": 4, "esp": 2/' "$LAYER" >"$TMP/ranks.json"
expect_error "mp*dp != ranks" 4 "parallel: mp\*dp must equal the number of ranks" --layer "$TMP/ranks.json"
sed 's/"mp": 2, "ep": 2, "esp": 2/"mp": 2, "ep": 4, "esp": 1/' "$LAYER" >"$TMP/esp.json"
expect_error "s1 needs esp == mp" 4 "parallel.esp: schedules s1 and s2 need esp == mp" --layer "$TMP/esp.json" --schedule s1
sed 's/"mp": 2, "ep": 2, "esp": 2/"mp": 1, "ep": 2, "esp": 2/' "$LAYER" >"$TMP/def.json"
expect_error "default needs esp | mp" 4 "parallel.esp: must divide mp" --layer "$TMP/def.json"
sed 's/"top_k": 2/"top_k": 2, "bogus": 1/' "$LAYER" >"$TMP/unknown.json"
expect_error "unknown field" 4 "bogus" --layer "$TMP/unknown.json"
sed 's/"top_k": 2/"top_k": 2, "dropless": true/' "$LAYER" >"$TMP/dropless.json"
expect_error "dropless under s1" 4 "dropless: the executor runs dropless layers (an irregular AlltoAll) under the default schedule only" --layer "$TMP/dropless.json" --schedule s1
expect_error "missing file" 4 "no-such-file.json" --layer "$TMP/no-such-file.json"
expect_error "bad schedule" 4 "--schedule: must be" --layer "$LAYER" --schedule s3
expect_error "bad iters" 4 "^moeplan-exec: error: --iters: must be an integer in .1, 1000000. (got 0)" --layer "$LAYER" --iters 0
expect_error "bf16 on mpi" 4 "--dtype: the mpi backend computes in f32" --layer "$LAYER" --dtype bf16
expect_error "nccl without GPU" 4 "nccl" --layer "$LAYER" --backend nccl
expect_error "unknown profile" 4 "^moeplan-exec: --profile: .*nosuch" --layer "$LAYER" --profile nosuch
expect_error "endless input" 4 "larger than 67108864 bytes" --layer /dev/zero
sed 's/"dp": 2}/"dp": 2, "pp": 2}/' "$MODEL" >"$TMP/pp.json"
expect_error "pipelined model without a layout" 4 "parallel.pp: a pipelined model runs as a layout's program: pass --layout" --model "$TMP/pp.json"
expect_error "layout of other ranks" 4 "layout: dp\*tp\*pp must equal the ranks (4) (got 8)" --model "$MODEL" --layout dp=2,tp=2,pp=2,ep=4,esp=1
expect_error "ppmoe layout" 4 "layout.family: the executor runs parm and dpmoe layouts" --model "$MODEL" --layout dp=1,tp=2,pp=2,ep=2,esp=1
expect_error "--check with drops" 4 "--check: layouts are compared only when no token is dropped" --model "$MODEL" --check --layout dp=2,tp=2,pp=1,ep=2,esp=2,microbatches=1,sp=1
expect_error "--check-against other ranks" 4 "--check-against: must have the checked layout's tp, dp, cp, pp and microbatches" --model "$SRC/tests/executor/models/tiny-check.json" --check --layout dp=2,tp=2,pp=1,ep=2,esp=2,microbatches=2,sp=1 --check-against dp=4,tp=1,pp=1,ep=4,esp=1,microbatches=2
expect_error "bad layout spec" 4 "--layout: unknown key 'depth'" --model "$MODEL" --layout dp=2,tp=1,pp=2,ep=2,esp=1,depth=3
expect_error "bad variant" 4 "--variant: must be none, tutel, dw, partition, lancet, auto or all" --model "$MODEL" --variant fast
expect_error "variant not in the plan" 4 "--variant: tutel is not in $TMP/saved.json (it holds none, dw, lancet)" \
  --plan "$TMP/saved.json" --variant tutel
$PY - "$TMP/saved.json" "$TMP/nomodel.json" "$TMP/moved.json" <<'PYEOF'
import json, sys
p = json.load(open(sys.argv[1]))
q = dict(p); q.pop("model"); json.dump(q, open(sys.argv[2], "w"))
dw = next(v for v in p["variants"] if v["name"] == "dw")
dw["dw_placements"][0]["dw_ops"].pop()  # a placement no profile plans for this model
json.dump(p, open(sys.argv[3], "w"))
PYEOF
expect_error "plan without its model" 4 "nomodel.json: model: not set (save the plan with moeplan plan-model --format json)" --plan "$TMP/nomodel.json"
expect_error "plan the profile does not rebuild" 4 "moved.json: its dw plan is not what profile cpu-testbed-1x4 v2 plans (dW placements" --plan "$TMP/moved.json"
"$CLI" plan-model --model "$MODEL" --cluster cpu-testbed-1x4 --search --format json >"$TMP/search.json" 2>/dev/null
expect_error "search plan" 4 "candidates: a layout or search plan is not run from the file; run its first layout with --model MODEL.json --layout dp=[0-9]*,tp=[0-9]*,pp=[0-9]*,ep=" --plan "$TMP/search.json"
# Command-line errors (CLI11): every rank stops, rank 0 explains.
expect_cli_error() {  # name, pattern, args...
  local name=$1 pattern=$2
  shift 2
  timeout 60 mpirun -np 4 "$EXEC" "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if [ $rc -eq 124 ]; then bad "$name: hung (timeout)"; return; fi
  if [ $rc -eq 0 ]; then bad "$name: exit 0"; return; fi
  grep -q -- "$pattern" "$TMP/err" || bad "$name: no '$pattern' in: $(cat "$TMP/err")"
}
expect_cli_error "model and layer" "excludes --model" --model "$MODEL" --layer "$LAYER"
expect_cli_error "--check with a model" "--check: with --model needs --layout" --model "$MODEL" --check
expect_cli_error "--check-against without --check" "--check-against requires --check" --model "$MODEL" --layout dp=2,tp=2,pp=1,ep=2,esp=2 --check-against dp=2,tp=2,pp=1,ep=2,esp=2
expect_cli_error "neither layer nor model" "--layer, --model or --plan is required" --iters 2
expect_cli_error "plan and model" "--model excludes --plan" --plan "$TMP/saved.json" --model "$MODEL"
expect_cli_error "variant without a model" "--variant: needs --model or --plan" --layer "$LAYER" --variant dw
# Memory is added up before anything is allocated: refused naming the largest tensor.
expect_error "memory over the limit" 4 \
  "memory: the default schedule needs .* GiB per rank, over the 0.00 GiB it may use (--max-memory-gib 0.0001); the largest tensor is" \
  --layer "$LAYER" --schedule default --max-memory-gib 0.0001
# A whole model counts every buffer, not only the MoE layers': a vocabulary of
# 200k makes the dense scratch (embedding and output GEMMs) about 100 MiB per
# rank, over a 0.01 GiB limit. Refused naming the flag and the bytes, with
# nothing allocated past the limit: each rank's peak RSS stays within 20 MiB of
# a normal tiny-model run's (both under /usr/bin/time -f %M, per rank, in KiB).
sed 's/"vocab_size": 256/"vocab_size": 200000/' "$MODEL" >"$TMP/bigvocab.json"
expect_error "whole model over the memory limit" 4 \
  "memory: tiny-model-4 needs [0-9]* bytes per rank (.*), over the [0-9]* bytes (0.010 GiB) it may use (--max-memory-gib 0.01); nothing was allocated" \
  --model "$TMP/bigvocab.json" --variant none --iters 1 --warmup 0 --max-memory-gib 0.01
peak_kib() {  # the largest per-rank peak RSS, in KiB, of moeplan-exec ARGS on 4 ranks
  timeout 120 mpirun -np 4 /usr/bin/time -f "peak-kib %M" "$EXEC" "$@" >/dev/null 2>"$TMP/peak.err"
  local rc=$?
  grep '^peak-kib ' "$TMP/peak.err" | awk '{ if ($2 > m) m = $2 } END { print m + 0 }'
  return $rc
}
if [ -x /usr/bin/time ]; then
  normal=$(peak_kib --model "$MODEL" --variant none --iters 1 --warmup 0 --max-memory-gib 0.01) ||
    bad "tiny model within 0.01 GiB failed: $(cat "$TMP/peak.err")"
  refused=$(peak_kib --model "$TMP/bigvocab.json" --variant none --iters 1 --warmup 0 \
    --max-memory-gib 0.01) && bad "the 200k-vocabulary model ran within 0.01 GiB"
  [ "$refused" -le $((normal + 20480)) ] ||
    bad "memory refused only after allocating: peak $refused KiB per rank, a normal run $normal KiB"
fi

# 3. A rank that stalls (SIGSTOP) or dies (SIGKILL) mid-run: the job ends
# non-zero within a bounded time, never hangs. A stall is caught by the other
# ranks' watchdogs (--watchdog-s), which name the rank and the op they wait in;
# a death by mpirun itself.
interrupt() {  # name, signal, pattern in stderr
  local name=$1 sig=$2 pattern=$3
  timeout 120 mpirun -np 4 "$EXEC" --layer "$LAYER" --schedule s2 --iters 1000000 --warmup 0 \
    --watchdog-s 5 >"$TMP/int.out" 2>"$TMP/int.err" &
  local tpid=$! mpid="" ranks="" _
  for _ in $(seq 1 200); do  # the ranks: children of mpirun, child of timeout
    mpid=$(pgrep -P "$tpid" | head -1)
    [ -n "$mpid" ] && ranks=$(pgrep -P "$mpid" -x moeplan-exec | sort -n)
    [ "$(echo "$ranks" | grep -c .)" = 4 ] && break
    sleep 0.1
  done
  if [ "$(echo "$ranks" | grep -c .)" != 4 ]; then
    bad "$name: the 4 ranks did not start"; kill -9 "$tpid" 2>/dev/null; wait "$tpid"; return
  fi
  sleep 3  # past setup, into the iterations
  local victim
  victim=$(echo "$ranks" | sed -n 2p)
  local t0=$SECONDS
  kill "-$sig" "$victim"
  wait "$tpid"
  local rc=$? took=$((SECONDS - t0))
  kill -CONT "$victim" 2>/dev/null; kill -9 "$victim" 2>/dev/null
  if [ $rc -eq 124 ]; then bad "$name: the job hung (timeout)"; return; fi
  [ $rc -ne 0 ] || bad "$name: exit 0"
  [ $took -le 30 ] || bad "$name: took $took s to end (want <= 30 s: watchdog 5 s)"
  grep -q -- "$pattern" "$TMP/int.err" || bad "$name: no '$pattern' in: $(tail -5 "$TMP/int.err")"
  echo "$name: job ended in $took s, exit $rc"
}
# Jobs report back: ReportMeasurement per schedule to a server on loopback.
mkdir -p "$TMP/data"
"$SERVER" --listen 127.0.0.1:0 --data-dir "$TMP/data" >"$TMP/server.out" 2>"$TMP/server.err" &
server_pid=$!
addr=""
for _ in $(seq 1 200); do  # 20 s
  line=$(grep -m1 '^moeplan-server listening on ' "$TMP/server.out" || true)
  [ -n "$line" ] && { addr=${line#moeplan-server listening on }; break; }
  sleep 0.1
done
if [ -z "$addr" ]; then
  bad "moeplan-server did not start: $(cat "$TMP/server.err")"
else
  if ! timeout 120 mpirun -np 4 "$EXEC" --layer "$LAYER" --iters 2 --warmup 0 --json \
      --report-to "$addr" >"$TMP/rep.json" 2>"$TMP/rep.err"; then
    bad "moeplan-exec --report-to failed: $(cat "$TMP/rep.err")"
  fi
  grep -q "reported 3 schedule(s) to $addr (profile a100-8x8 v[0-9]*: 3 stored)" "$TMP/rep.err" ||
    bad "no report line in: $(cat "$TMP/rep.err")"
  $PY - "$TMP/data/measurements/a100-8x8.jsonl" "$TMP/rep.json" <<'PYEOF' || fail=1
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
rep = json.load(open(sys.argv[2]))
ok = len(lines) == 3
if not ok: print("FAIL: expected 3 stored measurements, got", len(lines), file=sys.stderr)
for m, c in zip(lines, rep["candidates"]):
    names = [o["name"] for o in m["ops"]]
    if m["schedule"] != c["schedule"] or names != [o["name"] for o in c["ops"]]:
        print("FAIL: stored measurement differs from the measured timeline", file=sys.stderr); ok = False
    if abs(m["total_us"] - c["total_us"]) > 1e-6 * c["total_us"]:
        print("FAIL: total differs", m["total_us"], c["total_us"], file=sys.stderr); ok = False
sys.exit(0 if ok else 1)
PYEOF
  # Whole models report per variant against a stored profile, which the
  # server then refits from them. The lab is this CPU run's: its launch and
  # latency terms are a CPU's 0.1 us, not an A100's 3-8 us, whose tenth (the
  # shortest op the server believes) the tiny model's softmax and norms
  # undercut on a fast core (0.3-0.5 us measured).
  "$CLI" profiles get a100-8x8 | $PY -c '
import json, sys; p = json.load(sys.stdin); p["name"] = "lab"; p["version"] = 1
for link in p["links"].values(): link["alpha_us"] = 0.1
for part in ("gemm", "memory"): p[part]["launch_overhead_us"] = 0.1
for group in ("kernels", "activation"):
    for m in p.get(group, {}).values():
        if isinstance(m, dict) and "launch_overhead_us" in m: m["launch_overhead_us"] = 0.1
json.dump(p, open(sys.argv[1], "w"))' "$TMP/lab.json"
  "$CLI" profiles put "$TMP/lab.json" --server "$addr" >/dev/null || bad "profiles put lab failed"
  if ! timeout 120 mpirun -np 4 "$EXEC" --model "$SRC/tests/executor/models/tiny-model-4.json" \
      --variant all --iters 2 --warmup 0 --profile "$TMP/lab.json" --report-to "$addr" \
      >/dev/null 2>"$TMP/repm.err"; then
    bad "moeplan-exec --model --report-to failed: $(cat "$TMP/repm.err")"
  fi
  grep -q "reported 5 variant(s) to $addr (profile lab v1: 5 stored)" "$TMP/repm.err" ||
    bad "no model report line in: $(cat "$TMP/repm.err")"
  if ! "$CLI" calibrate --from-server "$addr" --profile lab --out "$TMP/lab-v2.json" \
      >"$TMP/refit.txt" 2>&1; then
    bad "calibrate --from-server failed: $(cat "$TMP/refit.txt")"
  fi
  grep -q "stored profile lab version 2 on $addr (fitted on 5 of 5 reported runs)" "$TMP/refit.txt" ||
    bad "no refit line in: $(tail -3 "$TMP/refit.txt")"
  grep -q "| models | v2 | 5 |" "$TMP/refit.txt" || bad "the refit report has no model rows"
  "$CLI" profiles get lab --server "$addr" >"$TMP/lab-served.json" 2>&1 || bad "profiles get lab failed"
  $PY - "$TMP/lab-v2.json" "$TMP/lab-served.json" <<'PYEOF' || fail=1
import json, sys
mine, served = (json.load(open(f)) for f in sys.argv[1:3])
ok = mine.get("version") == served.get("version") == 2 and len(served["context"]["ops"]) > 0
if not ok: print("FAIL: the server does not serve the refitted version 2", file=sys.stderr)
sys.exit(0 if ok else 1)
PYEOF
  "$CLI" calibrate --from-server "$addr" --profile a100-8x8 >"$TMP/ro.txt" 2>&1 &&
    bad "refitting a built-in profile succeeded"
  grep -q "built-in profile 'a100-8x8' is read-only" "$TMP/ro.txt" || bad "built-in refit: $(cat "$TMP/ro.txt")"
fi
kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null
timeout 60 mpirun -np 4 "$EXEC" --layer "$LAYER" --iters 1 --warmup 0 --report-to 127.0.0.1:1 \
  >"$TMP/out" 2>"$TMP/err"
rc=$?
[ $rc -eq 1 ] || bad "unreachable --report-to: exit $rc (want 1)"
grep -q -- "--report-to 127.0.0.1:1: " "$TMP/err" || bad "unreachable --report-to: $(cat "$TMP/err")"

interrupt "stalled rank" STOP "moeplan-exec: rank [0-9]: no progress for [0-9.]* s in '"
interrupt "killed rank" KILL "exited on signal 9"

exit $fail
