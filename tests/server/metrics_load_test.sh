#!/usr/bin/env bash
# /metrics under load (docs/service.md "Metrics"):
#   metrics_load_test.sh MOEPLAN_SERVER MOEPLAN_LOADGEN SOURCE_DIR
# Starts moeplan-server with --metrics on loopback, runs the load generator
# (cached, then uncached PlanLayer calls, then a preflight against an unknown
# profile), scrapes /metrics while it runs and after, and checks that:
# - every scrape passes `promtool check metrics` (Debian's prometheus);
# - PlanLayer's OK count is exactly the calls the load generator completed
#   (its ok_all plus its preflight calls), NOT_FOUND exactly the one bad call;
# - the latency histogram counts every call, and cache hits plus misses are
#   the OK plans;
# - counters never go down between scrapes.
set -euo pipefail
SERVER=$1 LOADGEN=$2 SRC=$3
PY=/usr/bin/python3
command -v promtool >/dev/null || {
  echo "FAIL: promtool not found (Debian's prometheus; scripts/setup.sh installs it)" >&2
  exit 1
}
# shellcheck source=scripts/lib/server.sh
source "$SRC/scripts/lib/server.sh"
TMP=$(mktemp -d)
server_pid=""
cleanup() {
  [[ -n $server_pid ]] && kill -TERM "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT

# The metrics line reaches stderr before the "listening on" line reaches stdout.
start_server "$SERVER" "$TMP" --metrics 127.0.0.1:0 --no-request-log >/dev/null ||
  { echo "FAIL: the server did not start" >&2; exit 1; }
port=${addr#127.0.0.1:}
url=""
[[ $(cat "$TMP/server.err") =~ metrics\ at\ (http://[^[:space:]]+) ]] && url=${BASH_REMATCH[1]}
[[ -n $url ]] || {
  echo "FAIL: the server did not report its metrics address: $(cat "$TMP/server.err")" >&2
  exit 1
}

n=0
scrape() {
  n=$((n + 1))
  $PY -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' \
    "$url" >"$TMP/scrape$n.txt"
  promtool check metrics <"$TMP/scrape$n.txt" >"$TMP/promtool$n.txt" 2>&1 || {
    echo "FAIL: promtool check metrics on scrape $n: $(cat "$TMP/promtool$n.txt")" >&2
    exit 1
  }
}

load() {  # mode, output json
  "$LOADGEN" --server "127.0.0.1:$port" --clients 8 --mode "$1" --duration-s 2 --warmup-s 0.5 \
    --layer "$SRC/examples/gpt2-moe-layer.json" --json >"$2"
}

scrape
load cached "$TMP/cached.json" &
lg=$!
sleep 1.2
scrape  # in the middle of the cached run
wait $lg
load uncached "$TMP/uncached.json" &
lg=$!
sleep 1.2
scrape
wait $lg
# One call that fails: the preflight of a run against an unknown profile.
if "$LOADGEN" --server "127.0.0.1:$port" --clients 1 --mode cached --duration-s 1 \
  --layer "$SRC/examples/gpt2-moe-layer.json" --profile no-such-profile >/dev/null 2>&1; then
  echo "FAIL: the load generator planned with an unknown profile" >&2
  exit 1
fi
scrape

$PY - "$TMP" "$n" <<'PYEOF'
import json, re, sys
tmp, n = sys.argv[1], int(sys.argv[2])

def samples(i):
    out = {}
    for line in open(f"{tmp}/scrape{i}.txt"):
        if line.startswith("#") or not line.strip():
            continue
        series, value = line.rsplit(" ", 1)
        out[series] = float(value)
    return out

scrapes = [samples(i) for i in range(1, n + 1)]
fail = []
# Counters (and histogram parts) never go down between scrapes.
for a, b in zip(scrapes, scrapes[1:]):
    for k, v in a.items():
        name = k.split("{")[0]
        if (name.endswith("_total") or name.endswith("_bucket") or name.endswith("_count")) and b.get(k, -1) < v:
            fail.append(f"{k} went from {v} to {b.get(k)}")
last = scrapes[-1]
sent_ok = 0
runs = {}
for mode in ("cached", "uncached"):
    r = runs[mode] = json.load(open(f"{tmp}/{mode}.json"))
    if r["errors_total"] != 0:
        fail.append(f"{mode}: the load generator saw {r['errors_total']} errors")
    sent_ok += r["ok_all"] + r["preflight_calls"]
ok = last.get('moeplan_requests_total{method="PlanLayer",code="OK"}')
bad = last.get('moeplan_requests_total{method="PlanLayer",code="NOT_FOUND"}')
count = last.get('moeplan_request_duration_seconds_count{method="PlanLayer"}')
inf = last.get('moeplan_request_duration_seconds_bucket{method="PlanLayer",le="+Inf"}')
hits = last.get('moeplan_plan_cache_hits_total{level="raw"}', 0) + last.get(
    'moeplan_plan_cache_hits_total{level="canonical"}', 0)
misses = last.get("moeplan_plan_cache_misses_total")
if ok != sent_ok:
    fail.append(f"PlanLayer OK: the server counted {ok}, the load generator completed {sent_ok}")
if bad != 1:
    fail.append(f"PlanLayer NOT_FOUND: {bad}, expected the 1 bad preflight")
if count != ok + bad or inf != count:
    fail.append(f"latency histogram: count {count}, +Inf {inf}, calls {ok + bad}")
if hits + misses != ok:
    fail.append(f"cache: {hits} hits + {misses} misses != {ok} OK plans")
mid = scrapes[1].get('moeplan_requests_total{method="PlanLayer",code="OK"}', 0)
if not 0 < mid < ok:
    fail.append(f"the scrape during the cached run saw {mid} calls (of {ok} in all)")
# The cached run repeats its preflight's bytes: after the first calls (at most one
# per client, found by the canonical key) every call is found by them.
raw = last.get('moeplan_plan_cache_hits_total{level="raw"}', 0)
if raw < runs["cached"]["ok_all"] - runs["cached"]["clients"]:
    fail.append(f"{raw} raw hits for the cached run's {runs['cached']['ok_all']} repeated calls")
for f in fail:
    print("FAIL:", f, file=sys.stderr)
print(f"metrics_load_test: {int(ok)} PlanLayer OK over {n} scrapes, "
      f"{int(hits)} hits, {int(misses)} misses")
sys.exit(1 if fail else 0)
PYEOF
