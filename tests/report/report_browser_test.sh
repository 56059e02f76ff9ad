#!/usr/bin/env bash
# The HTML reports in a real browser (docs/report.md):
#   report_browser_test.sh MOEPLAN_CLI SOURCE_DIR ARTIFACT_DIR
# Writes the reports of a 1,024-GPU layout search, a layer plan, a validation
# (re-predicted from the recorded 2 x 1 testbed runs) and a model whose name is
# markup, opens each in Debian's headless Chromium and checks that:
# - the page logs nothing to the console (no error, no exception);
# - report.js finished (body data-ready="1") and each chart drew as many points
#   as the report's own JSON holds (the search's top ten pipelines: a bar per
#   span, as Chart.js built them);
# - the markup in the model's name is shown as text and never runs.
# Each page's screenshot is kept in ARTIFACT_DIR.
set -uo pipefail
CLI=$1 SRC=$2 ART=$3
PY=/usr/bin/python3
CHROMIUM=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
[[ -n $CHROMIUM ]] || {
  echo "FAIL: chromium not found (Debian's chromium; scripts/setup.sh installs it)" >&2
  exit 1
}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$ART"
fail=0
bad() { echo "FAIL: $*" >&2; fail=1; }

# 1. The reports.
"$CLI" plan-model --model "$SRC/examples/models/qwen-moe-like.json" --cluster a100-8x8 \
  --search --gpus 1024 --top 50 --html "$TMP/search.html" >/dev/null 2>"$TMP/search.err" ||
  bad "plan-model --search --html failed: $(tail -3 "$TMP/search.err")"
"$CLI" plan-layer --layer "$SRC/examples/gpt2-moe-layer.json" --html "$TMP/layer.html" \
  >/dev/null 2>"$TMP/layer.err" || bad "plan-layer --html failed: $(tail -3 "$TMP/layer.err")"
runs="$SRC/calibration/profiles/measured/cpu-testbed-2x1/run1"
"$CLI" validate --profile "$runs/cpu-testbed-2x1.json" \
  --layers "$SRC/examples/validation/testbed-2-ranks.json" --from-runs "$runs/layers" \
  --exec /nonexistent --out-dir "$TMP/val" --replay --html "$TMP/validate.html" \
  >/dev/null 2>"$TMP/validate.err" || bad "validate --html failed: $(tail -3 "$TMP/validate.err")"
# A model named with markup: an image whose error handler would mark the page,
# and a script that would retitle it.
$PY - "$SRC/examples/models/gpt3-medium-moe.json" "$TMP/evil.json" <<'PYEOF'
import json, sys
m = json.load(open(sys.argv[1]))
m["name"] = ('<img src=x onerror="document.body.dataset.pwned=1">'
             '<script>document.title="pwned"</script>')
json.dump(m, open(sys.argv[2], "w"))
PYEOF
"$CLI" plan-model --model "$TMP/evil.json" --cluster v100-8x8 --html "$TMP/evil.html" \
  >/dev/null 2>"$TMP/evil.err" || bad "plan-model --html (markup in the name) failed: $(tail -3 "$TMP/evil.err")"

# 2. Each in the browser: the DOM after the scripts ran, the console, a screenshot.
chromium() {  # name, then extra flags
  local name=$1
  shift
  timeout 120 "$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync --hide-scrollbars \
    --user-data-dir="$TMP/profile-$name-$RANDOM" --virtual-time-budget=5000 "$@"
}
for name in search layer validate evil; do
  [[ -f $TMP/$name.html ]] || continue
  chromium "$name" --enable-logging=stderr --log-level=0 --dump-dom "file://$TMP/$name.html" \
    >"$TMP/$name.dom" 2>"$TMP/$name.console" || bad "$name: chromium --dump-dom failed"
  # The search page is long: its pipelines come after the tables and charts.
  height=3600
  [[ $name == search ]] && height=9000
  chromium "$name" --window-size=1300,$height --screenshot="$ART/$name.png" \
    "file://$TMP/$name.html" >/dev/null 2>&1 || bad "$name: chromium --screenshot failed"
  [[ -s $ART/$name.png ]] || bad "$name: no screenshot"
  if grep -q ":CONSOLE" "$TMP/$name.console"; then
    bad "$name: the page wrote to the console: $(grep ":CONSOLE" "$TMP/$name.console" | head -3)"
  fi
done

# 3. What the pages drew, against the data they carry.
$PY - "$TMP" <<'PYEOF' || fail=1
import html, json, re, sys
tmp = sys.argv[1]
fail = []

def page(name):
    src = open(f"{tmp}/{name}.html", encoding="utf-8").read()
    dom = open(f"{tmp}/{name}.dom", encoding="utf-8").read()
    data = json.loads(re.search(r'<script type="application/json" id="moeplan-data">(.*?)</script>',
                                src, re.S).group(1))
    body = re.search(r"<body([^>]*)>", dom).group(1)
    attrs = {k: html.unescape(v) for k, v in re.findall(r'([\w-]+)="([^"]*)"', body)}
    return data, dom, attrs

def expect(name, charts):
    data, dom, attrs = page(name)
    if attrs.get("data-ready") != "1":
        fail.append(f"{name}: report.js did not finish (body: {attrs})")
        return data, dom, attrs
    drawn = json.loads(attrs.get("data-charts", "{}"))
    for chart, want in charts(data).items():
        if drawn.get(chart) != want:
            fail.append(f"{name}: {chart} drew {drawn.get(chart)} points, the data holds {want}")
    return data, dom, attrs

expect("search", lambda d: dict({
    "chart-throughput-memory": len(d["plan"]["candidates"]) + sum(
        1 for p in d["plan"]["search_points"] if p["kind"] != "skipped"),
    "chart-time": min(10, len(d["plan"]["candidates"])),
    "chart-memory": min(10, len(d["plan"]["candidates"]))}, **{
    # Each of the top ten's pipeline: a bar per span.
    f"chart-pipeline-{c['rank']}": len(c["pipeline"]) for c in d["plan"]["candidates"][:10]}))
data, _, _ = page("search")
cands = data["plan"]["candidates"]
if data["plan"]["gpus"] != 1024 or len(cands) < 10:
    fail.append(f"search: {data['plan']['gpus']} GPUs, {len(cands)} candidates")
if any(not c["megatron_args"] or not c["deepspeed_config"] for c in cands):
    fail.append("search: not every candidate has its launcher arguments")
if any(not c["pipeline"] for c in cands[:10]) or any(c["pipeline"] for c in cands[10:]):
    fail.append("search: the page should carry the pipelines of the top ten only")
if not any(int(c["layout"]["pp"]) > 1 for c in cands[:10]):
    fail.append("search: no top-ten candidate has a pipeline of several stages to draw")
stats = data["plan"]["search_stats"]
if len(data["plan"]["search_points"]) != int(stats["enumerated"]):
    fail.append(f"search: {len(data['plan']['search_points'])} points for {stats['enumerated']} enumerated")
kinds = {}
for p in data["plan"]["search_points"]:
    kinds[p["kind"]] = kinds.get(p["kind"], 0) + 1
if kinds.get("over_memory", 0) != int(stats["pruned_memory"]) or \
        kinds.get("simulated", 0) != int(stats["simulated"]):
    fail.append(f"search: points by kind {kinds} against the stats {stats}")
expect("layer", lambda d: {
    "chart-terms": len(d["plan"]["candidates"]),
    "chart-timeline": len(d["plan"]["candidates"][0]["ops"])})
expect("validate", lambda d: {
    "chart-predicted-measured": sum(len(c.get("points", [])) for c in d["summary"]["results"]),
    "chart-ops": len(d["summary"]["ops"])})
data, dom, attrs = expect("evil", lambda d: {"chart-variants": len(d["plan"]["variants"])})
if "data-pwned" in attrs or "<title>pwned" in dom:
    fail.append("evil: the markup in the model's name ran")
if "&lt;img src=x onerror=" not in dom or "&lt;script&gt;document.title" not in dom:
    fail.append("evil: the model's name is not shown as text")
if re.search(r"<img[^>]*onerror", dom):
    fail.append("evil: the model's name became an element")
for f in fail:
    print("FAIL:", f, file=sys.stderr)
sys.exit(1 if fail else 0)
PYEOF
[[ $fail == 0 ]] && echo "report_browser_test: 4 reports rendered in $("$CHROMIUM" --version 2>/dev/null | head -1); screenshots in $ART"
exit $fail
