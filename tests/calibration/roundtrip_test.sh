#!/usr/bin/env bash
# The calibration round trip as an operator runs it (label "mpi"), short:
#   roundtrip_test.sh MOEPLAN_PROFILE MOEPLAN_CLI MOEPLAN_EXEC SOURCE_DIR
# mpirun -np 4 moeplan-profile --quick -> moeplan calibrate -> moeplan validate
# (4 ranks, a 4-config layer grid, then 2 whole models x 5 variants): the
# samples are checked and complete, the fitted profile is measured and has the
# fits the planner needs, and the validations write their reports, plots and
# JSON summaries with the documented keys.
set -uo pipefail
PROFILE_BIN=$1 CLI=$2 EXEC=$3 SRC=$4
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
PY=/usr/bin/python3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
bad() { echo "FAIL: $*" >&2; fail=1; }

# 0. profile-check judges only what this run measured, and only with enough of it
# (no MPI: a profiler that measures nothing, and samples that are all invalid).
mkdir -p "$TMP/check"
cp "$SRC/calibration/profiles/measured/cpu-testbed-1x4/samples.jsonl" "$TMP/check/check.jsonl"
if "$CLI" profile-check --profile cpu-testbed-1x4 --profiler /bin/true --launcher "" \
    --out-dir "$TMP/check" >"$TMP/check/out.txt" 2>&1; then
  bad "profile-check judged an earlier run's check.jsonl: $(tail -3 "$TMP/check/out.txt")"
fi
grep -q "wrote no samples" "$TMP/check/out.txt" ||
  bad "profile-check did not say the profiler wrote nothing: $(tail -3 "$TMP/check/out.txt")"
$PY - "$SRC/calibration/profiles/measured/cpu-testbed-1x4/samples.jsonl" "$TMP/check/zero.jsonl" <<'PYEOF'
import json, sys
with open(sys.argv[2], "w") as out:
    for line in open(sys.argv[1]):
        s = json.loads(line)
        s["median_us"] = 0
        out.write(json.dumps(s) + "\n")
PYEOF
if "$CLI" profile-check --profile cpu-testbed-1x4 --samples "$TMP/check/zero.jsonl" \
    --out-dir "$TMP/check" >"$TMP/check/zero.txt" 2>&1; then
  bad "profile-check judged samples without a valid point: $(tail -3 "$TMP/check/zero.txt")"
fi
grep -q "needs at least 3 valid points" "$TMP/check/zero.txt" ||
  bad "profile-check did not name its minimum: $(tail -3 "$TMP/check/zero.txt")"

# profile-check without --out-dir writes nothing where it runs and leaves no
# temporary directory behind (a stand-in profiler writes the samples it is told to).
mkdir -p "$TMP/empty" "$TMP/tmpdir"
printf '#!/bin/sh\nwhile [ $# -gt 0 ]; do\n  if [ "$1" = --out ]; then cp "%s" "$2"; fi\n  shift\ndone\n' \
  "$SRC/calibration/profiles/measured/cpu-testbed-1x4/samples.jsonl" >"$TMP/check/fake-profiler"
chmod +x "$TMP/check/fake-profiler"
(cd "$TMP/empty" && TMPDIR="$TMP/tmpdir" "$CLI" profile-check --profile cpu-testbed-1x4 \
  --profiler "$TMP/check/fake-profiler" --launcher "" >"$TMP/check/fake.txt" 2>&1)
grep -q "drift" "$TMP/check/fake.txt" ||
  bad "profile-check did not judge the stand-in's samples: $(tail -3 "$TMP/check/fake.txt")"
[ -z "$(ls -A "$TMP/empty")" ] && [ -z "$(ls -A "$TMP/tmpdir")" ] ||
  bad "profile-check left files behind: $(ls -A "$TMP/empty" "$TMP/tmpdir")"

# 1. Profile.
if ! timeout 300 mpirun -np 4 "$PROFILE_BIN" --quick --out "$TMP/samples.jsonl" 2>"$TMP/profile.err"; then
  bad "moeplan-profile failed: $(tail -5 "$TMP/profile.err")"
fi
[ -e "$TMP/samples.jsonl.partial" ] && bad "the .partial file was left behind"
$PY - "$TMP/samples.jsonl" <<'PYEOF' || fail=1
import json, sys
kinds, ok = {}, True
for line in open(sys.argv[1]):
    s = json.loads(line)
    kind = next(k for k in ("collective", "saa", "gemm", "memory") if k in s)
    kinds[kind] = kinds.get(kind, 0) + 1
    for key in ("host", "backend", "versions", "timestamp"):
        if not s["run"].get(key):
            print("FAIL: sample without run." + key, file=sys.stderr); ok = False
    if kind in ("collective", "saa") and (not s["checked"] or s["wrong_elements"] != "0"):
        print("FAIL: unchecked or wrong collective:", line, file=sys.stderr); ok = False
    if not (s["min_us"] <= s["median_us"] <= s["max_us"]) or s["median_us"] <= 0:
        print("FAIL: inconsistent times:", line, file=sys.stderr); ok = False
    if kind == "gemm" and not s["gemm"].get("probe_gflops", 0) > 0:
        print("FAIL: GEMM sample without its speed probe:", line, file=sys.stderr); ok = False
for k in ("collective", "saa", "gemm", "memory"):
    if kinds.get(k, 0) == 0:
        print("FAIL: no", k, "samples", file=sys.stderr); ok = False
sys.exit(0 if ok else 1)
PYEOF

# 2. Calibrate.
if ! "$CLI" calibrate --samples "$TMP/samples.jsonl" --out "$TMP/cpu-quick.json" >"$TMP/fit.txt" 2>&1; then
  bad "calibrate failed: $(cat "$TMP/fit.txt")"
fi
grep -q "R" "$TMP/fit.txt" || bad "no fit report printed"
$PY - "$TMP/cpu-quick.json" <<'PYEOF' || fail=1
import json, sys
p = json.load(open(sys.argv[1]))
ok = True
def check(cond, msg):
    global ok
    if not cond: print("FAIL:", msg, file=sys.stderr); ok = False
check(p["source"] == "PROFILE_SOURCE_MEASURED", "source is not measured")
check(p["name"] == "cpu-quick", "name is not the file's stem")
check(p["nodes"] == 1 and p["gpus_per_node"] == 4, "cluster shape is not 1 x 4")
shapes = {(f["collective"], f["shape"]["ranks"], f["shape"]["nodes"]) for f in p["collectives"]}
for c in ("COLLECTIVE_ALL_REDUCE", "COLLECTIVE_ALL_GATHER", "COLLECTIVE_REDUCE_SCATTER", "COLLECTIVE_ALL_TO_ALL"):
    for r in (2, 4):
        check((c, r, 1) in shapes, f"no fit for {c} on {r} ranks")
check(p["links"]["intra"]["beta_us_per_byte"] > 0, "no intra link beta")
check(p["gemm"]["peak_tflops"] > 0 and len(p["gemm"]["efficiency"]) == 27, "GEMM table is not 3x3x3")
check(p["memory"]["bandwidth_gbytes_per_s"] > 0, "no memory bandwidth")
check(p["provenance"].get("probe_gflops", 0) > 0, "no reference speed probe in the provenance")
sys.exit(0 if ok else 1)
PYEOF
# The profile plans.
"$CLI" plan-layer --layer "$SRC/tests/executor/layers/tiny-4.json" --cluster "$TMP/cpu-quick.json" \
  >"$TMP/plan.txt" 2>&1 || bad "plan-layer on the fitted profile failed: $(cat "$TMP/plan.txt")"

# 3. Validate.
if ! timeout 600 "$CLI" validate --profile "$TMP/cpu-quick.json" --layers "$SRC/tests/calibration/quick-grid.json" \
    --exec "$EXEC" --iters 5 --warmup 1 --out-dir "$TMP/val" --json >"$TMP/summary.json" 2>"$TMP/validate.err"; then
  bad "validate failed: $(tail -5 "$TMP/validate.err")"
fi
$PY - "$TMP/summary.json" <<'PYEOF' || fail=1
import json, sys
s = json.load(open(sys.argv[1]))
ok = True
for k in ("mape_pct", "p90_pct", "selection_accuracy_pct", "mean_regret_pct", "configs"):
    if k not in s:
        print("FAIL: summary without", k, file=sys.stderr); ok = False
# mp = 1 runs default and s1 but plans the default alone (one point each).
if s.get("configs") != 6 or s.get("points") != 14:
    print("FAIL: expected 4 configs x 3 schedules and 2 x 1, got", s.get("configs"), s.get("points"), file=sys.stderr); ok = False
if not s.get("ops"):
    print("FAIL: no per-op errors", file=sys.stderr); ok = False
# Interleaved iterations, 5 of them: every config gets the tie test, and the
# measured best is always among its own ties.
if s.get("paired_configs") != 4:
    print("FAIL: expected 4 configs with paired iterations, got", s.get("paired_configs"), file=sys.stderr); ok = False
for c in s.get("results", []):
    if c.get("measured_best") not in c.get("measured_tied", []):
        print("FAIL:", c["name"], "measured best not among measured_tied", file=sys.stderr); ok = False
sys.exit(0 if ok else 1)
PYEOF
grep -q "MAPE" "$TMP/val/report.md" || bad "report.md has no MAPE"
if command -v gnuplot >/dev/null; then
  head -c 8 "$TMP/val/plot.png" | od -An -tx1 | grep -q "89 50 4e 47" || bad "plot.png is not a PNG"
  grep -q "plot.png" "$TMP/val/report.md" || bad "report.md does not show the plot"
else
  bad "gnuplot is not installed (scripts/setup.sh installs gnuplot-nox)"
fi
[ "$(find "$TMP/val/exec" -name "*.json" | wc -l)" = 6 ] || bad "expected 6 saved moeplan-exec reports"

# 4. Re-predict the saved reports (--from-runs): nothing runs, the measured side
# and, with the same profile, every error are the first run's, and the report
# says where the measurements came from.
if ! "$CLI" validate --profile "$TMP/cpu-quick.json" --layers "$SRC/tests/calibration/quick-grid.json" \
    --from-runs "$TMP/val" --exec /nonexistent --out-dir "$TMP/val2" --json --replay >"$TMP/summary2.json" 2>"$TMP/validate2.err"; then
  bad "validate --from-runs failed: $(tail -5 "$TMP/validate2.err")"
fi
# --replay: every point's measured op durations on its plan, every op of the
# plan measured and named alike, and the error split as documented.
check_replays() {
  $PY - "$1" "$2" <<'PYEOF'
import json, sys
s, points = json.load(open(sys.argv[1])), int(sys.argv[2])
ok = s.get("replayed_points") == points
if not ok: print("FAIL: replayed points", s.get("replayed_points"), "of", points, file=sys.stderr)
for c in s.get("results", []):
    for p in c["points"]:
        r = p.get("replay", {})
        if r.get("unmeasured_ops", 0) or r.get("unplanned_ops", 0) or r.get("ops", 0) == 0:
            print("FAIL:", c["name"], p["candidate"], "replay ops", r, file=sys.stderr); ok = False
        lhs = 1 + p["error_pct"] / 100
        rhs = (1 + r.get("composition_error_pct", 0) / 100) * (1 + p.get("cost_error_pct", 0) / 100)
        if abs(lhs - rhs) > 1e-9:
            print("FAIL:", c["name"], p["candidate"], "error is not composition x cost", file=sys.stderr); ok = False
        if p.get("noise", {}).get("samples") != 5:
            print("FAIL:", c["name"], p["candidate"], "no noise floor of 5 iterations", file=sys.stderr); ok = False
        # The speed probes of run and profile: the drift and the corrected prediction.
        corrected = p.get("drift_corrected_us", 0)
        if not p.get("has_drift") or corrected <= 0 or abs(
                p.get("drift_corrected_error_pct", 1e9) - 100 * (corrected - p["measured_us"]) / p["measured_us"]) > 1e-6:
            print("FAIL:", c["name"], p["candidate"], "no drift-corrected prediction", file=sys.stderr); ok = False
if s.get("drift_points") != points:
    print("FAIL: drift points", s.get("drift_points"), "of", points, file=sys.stderr); ok = False
sys.exit(0 if ok else 1)
PYEOF
}
check_replays "$TMP/summary2.json" 14 || fail=1
$PY -c 'import json, sys; s = json.load(open(sys.argv[1])); sys.exit(0 if s.get("mpi_wait") == "spin" and s.get("host_cores", 0) >= 1 else 1)' \
  "$TMP/summary2.json" || bad "the summary does not say how the ranks waited and on how many cores"
grep -q "Ranks waited for their collectives with \`--mpi-wait spin\`" "$TMP/val2/report.md" ||
  bad "the report does not say how the ranks waited"
grep -q "## Replay: composition and cost" "$TMP/val2/report.md" || bad "the --replay report has no replay section"
grep -q "### Machine drift" "$TMP/val2/report.md" || bad "the --replay report has no machine drift section"
$PY - "$TMP/summary.json" "$TMP/summary2.json" <<'PYEOF' || fail=1
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
ok = a.get("points") == b.get("points") == 14 and abs(a["mape_pct"] - b["mape_pct"]) < 1e-9
for x, y in zip(a.get("results", []), b.get("results", [])):
    ok = ok and [p["measured_us"] for p in x["points"]] == [p["measured_us"] for p in y["points"]]
if not ok:
    print("FAIL: --from-runs did not reproduce the first run's points and errors", file=sys.stderr)
sys.exit(0 if ok else 1)
PYEOF
grep -q "Measured earlier: these are the moeplan-exec reports in \`$TMP/val/exec\`" "$TMP/val2/report.md" ||
  bad "the --from-runs report does not name the earlier run"
grep -q "Measured with" "$TMP/val2/report.md" && bad "the --from-runs report shows a command it did not run"

# 5. Whole models: every variant of 2 models and of one pipelined layout
# (two stages, 1F1B), interleaved, then re-predicted.
if ! timeout 600 "$CLI" validate --profile "$TMP/cpu-quick.json" --models "$SRC/tests/calibration/quick-models.json" \
    --exec "$EXEC" --iters 5 --warmup 1 --out-dir "$TMP/valm" --json >"$TMP/models.json" 2>"$TMP/validatem.err"; then
  bad "validate --models failed: $(tail -5 "$TMP/validatem.err")"
fi
if ! "$CLI" validate --profile "$TMP/cpu-quick.json" --models "$SRC/tests/calibration/quick-models.json" \
    --from-runs "$TMP/valm" --exec /nonexistent --out-dir "$TMP/valm2" --json --replay >"$TMP/models2.json" 2>"$TMP/validatem2.err"; then
  bad "validate --models --from-runs failed: $(tail -5 "$TMP/validatem2.err")"
fi
check_replays "$TMP/models2.json" 15 || fail=1
$PY - "$TMP/models.json" "$TMP/models2.json" <<'PYEOF' || fail=1
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
ok = True
def check(cond, msg):
    global ok
    if not cond: print("FAIL:", msg, file=sys.stderr); ok = False
check(a.get("models") is True, "the summary does not say it is of models")
check(a.get("configs") == 3 and a.get("points") == 15,
      f"expected (2 models + 1 layout) x 5 variants, got {a.get('configs')} x {a.get('points')}")
check(a.get("paired_configs") == 3, "expected every config's iterations paired")
check(a.get("unmatched_ops", 0) == 0, "measured ops the planner does not name")
for c in a.get("results", []):
    names = [p["candidate"] for p in c["points"]]
    check(names == ["none", "tutel", "dw", "partition", "lancet"], f"{c['name']}: variants {names}")
    check("model" in c and "layer" not in c, f"{c['name']}: not a model config")
    check(c.get("measured_best_candidate") in c.get("measured_tied_candidates", []),
          f"{c['name']}: measured best not among its ties")
ops = {o["op"] for o in a.get("ops", [])}
for op in ("fwd.qkv", "fwd.ep_alltoall_dispatch", "bwd.grad_allreduce", "optimizer.step",
           "pipe.send_fwd", "pipe.send_bwd"):
    check(op in ops, f"no per-op error for {op}")
check(abs(a["mape_pct"] - b.get("mape_pct", -1)) < 1e-9 and a.get("points") == b.get("points"),
      "--from-runs did not reproduce the models' errors")
sys.exit(0 if ok else 1)
PYEOF
grep -q "| points (config × variant) | 15 |" "$TMP/valm/report.md" || bad "the models' report has no variant points"
grep -q -- "--model 'CONFIG' --variant all \[--layout LAYOUT\]" "$TMP/valm/report.md" || bad "the models' report does not show the command"
grep -q "layouts\[0\] tiny-ep4 dp=2,tp=1,pp=2" "$TMP/valm/report.md" || bad "the models' report does not name the layout"
[ "$(find "$TMP/valm/exec" -name "*.json" | wc -l)" = 3 ] || bad "expected 3 saved moeplan-exec --model reports"

# 6. Bad grids and flags: one line naming the field, nothing run.
expect_error() {  # expect_error WANT ARGS...: fails unless the CLI fails saying WANT
  local want=$1; shift
  if "$CLI" validate --profile "$TMP/cpu-quick.json" --exec /nonexistent --out-dir "$TMP/bad" "$@" \
      >"$TMP/bad.out" 2>"$TMP/bad.err"; then
    bad "validate $* succeeded"
  elif ! grep -qF -- "$want" "$TMP/bad.err"; then
    bad "validate $*: expected '$want', got: $(cat "$TMP/bad.err")"
  fi
}
expect_error "give one of --layers GRID (layer configs), --models GRID (whole models) or --published DATASET"
expect_error "excludes" --layers "$SRC/tests/calibration/quick-grid.json" \
  --models "$SRC/tests/calibration/quick-models.json"
echo '{"name": "g", "models": []}' >"$TMP/empty.json"
expect_error "empty.json: models: must list a model" --models "$TMP/empty.json"
echo '{"models": [{"name": "a", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 128, "seq_length": 32, "micro_batch_size": 2, "moe": {"layer_freq": 1, "num_experts": 8, "top_k": 2, "capacity_factor": 1, "expert_ffn_hidden_size": 64, "gate": "GATE_TOP_K"}, "parallel": {"mp": 1, "ep": 4, "esp": 1, "dp": 4}}]}' >"$TMP/one.json"
$PY - "$TMP/one.json" "$TMP/twice.json" "$TMP/zero.json" <<'PYEOF'
import json, sys
g = json.load(open(sys.argv[1]))
json.dump({"models": g["models"] * 2}, open(sys.argv[2], "w"))
g["models"][0]["num_layers"] = 0
json.dump(g, open(sys.argv[3], "w"))
PYEOF
expect_error "twice.json: models[1].name: 'a' is also models[0]'s name" --models "$TMP/twice.json"
$PY - "$TMP/one.json" "$TMP/nolayoutmodel.json" "$TMP/badlayout.json" "$TMP/layouttwice.json" <<'PYEOF'
import json, sys
g = json.load(open(sys.argv[1]))
g["layouts"] = [{"model": "b", "layout": "dp=2,tp=1,pp=2,ep=2,esp=1"}]
json.dump(g, open(sys.argv[2], "w"))
g["layouts"] = [{"model": "a", "layout": "dp=2,pp=2"}]
json.dump(g, open(sys.argv[3], "w"))
g["layouts"] = [{"model": "a", "layout": "dp=2,tp=1,pp=2,ep=2,esp=1"},
                {"model": "a", "layout": "dp=2,tp=1,pp=2,ep=2,esp=1,microbatches=2,pipeline=1f1b"}]
json.dump(g, open(sys.argv[4], "w"))
PYEOF
expect_error "nolayoutmodel.json: layouts[0].model: 'b' is not the name of one of models" --models "$TMP/nolayoutmodel.json"
expect_error "badlayout.json: layouts[0].layout: --layout: tp= is required" --models "$TMP/badlayout.json"
expect_error "layouttwice.json: layouts[1]: 'a' dp=2,tp=1,pp=2,ep=2,esp=1,microbatches=2,zero=0,family=parm,pipeline=1f1b is also layouts[0]" --models "$TMP/layouttwice.json"
expect_error "zero.json: models[0].num_layers: must be between 1 and" --models "$TMP/zero.json"
[ -e "$TMP/bad/report.md" ] && bad "a rejected grid wrote a report"

[ $fail = 0 ] && echo "roundtrip: all checks passed"
exit $fail
