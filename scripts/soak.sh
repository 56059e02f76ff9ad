#!/usr/bin/env bash
# Soak test of moeplan-server (docs/service.md): mixed traffic for DURATION
# seconds against one server on loopback, then a burst of worst-case requests.
#
#   bash scripts/soak.sh            # 600 s, the figure reported
#   DURATION=20 bash scripts/soak.sh   # what CI runs (scripts/test.sh)
#
# Traffic, all at once:
#   - moeplan-loadgen, cached PlanLayer, CACHED_CLIENTS (32) calls outstanding;
#   - moeplan-loadgen, uncached PlanLayer, UNCACHED_CLIENTS (32);
#     both against profile "soak", so that every put below invalidates their
#     cache entries;
#   - a writer (Python client): a new version of "soak" every PUT_EVERY_S (2 s),
#     REPORTS_PER_S (20) ReportMeasurement calls per second, and a RefitProfile
#     every REFIT_EVERY_S (5 s; 0: none), whose version the next put builds on;
#   - a modeller (Python client): PlanModel searches and timelines, back to
#     back, 4 requests in turn: every put drops their cached plans, so they are
#     planned, cached and freed all along, while what the cache holds stays
#     small and RSS growth measures leaks, not a cache filling up (the cache's
#     byte bound is tested in tests/server/plan_cache_test.cc);
#   - examples/train_gpt_moe.py on 4 MPI ranks with --server, run after run
#     (planned by the server, reporting its measured ops), when moeplan.torch
#     is built (TORCH=0 leaves it out);
#   - the server's RSS sampled every second.
# Then WORST_CLIENTS (64) threads send worst-case PlanModel requests for
# WORST_S (10 s: exhaustive layout searches of 4,096 GPUs with up to 4,096
# micro-batches, each stopped by its call's 5 s deadline, and 1,024-layer models
# with timelines, refused at the timeline limit) while one thread times cached PlanLayer calls.
#
# Passes (exit 0) when no call failed in the soak (worst-case requests may be
# refused with RESOURCE_EXHAUSTED or DEADLINE_EXCEEDED, never anything else),
# the RSS grew less than RSS_LIMIT_PCT (10) % from the end of the warm-up (WARMUP_S, 60 s; a
# third of DURATION when shorter) to the end (peak to peak: the highest RSS of the first
# minute after it against the highest of the last) and never passed the cache bound
# (CACHE_MIB, 256) + 100 MiB during the soak, the cached calls during the
# burst were all answered, and the server stops with exit 0 on SIGTERM.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-600}
WARMUP_S=${WARMUP_S:-60}
CACHED_CLIENTS=${CACHED_CLIENTS:-32}
UNCACHED_CLIENTS=${UNCACHED_CLIENTS:-32}
PUT_EVERY_S=${PUT_EVERY_S:-2}
REPORTS_PER_S=${REPORTS_PER_S:-20}
WORST_CLIENTS=${WORST_CLIENTS:-64}
WORST_S=${WORST_S:-10}
RSS_LIMIT_PCT=${RSS_LIMIT_PCT:-10}
REFIT_EVERY_S=${REFIT_EVERY_S:-5}
CACHE_MIB=${CACHE_MIB:-256}
BUILD_DIR=${BUILD_DIR:-build}
# A short run warms up for a third of it (the plan cache fills, the
# allocator's arenas settle), a long one for WARMUP_S.
if ((WARMUP_S * 3 > DURATION)); then WARMUP_S=$((DURATION / 3 > 0 ? DURATION / 3 : 1)); fi

server_bin=$BUILD_DIR/server/moeplan-server
loadgen_bin=$BUILD_DIR/bench/moeplan-loadgen
stubs=$BUILD_DIR/client/python
for b in "$server_bin" "$loadgen_bin"; do
  [[ -x $b ]] || { echo "soak.sh: error: $b not built" >&2; exit 2; }
done
[[ -f $stubs/moeplan/v1/service_pb2_grpc.py ]] || { echo "soak.sh: error: no Python stubs in $stubs" >&2; exit 2; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/moeplan-soak.XXXXXX")
server_pid=""
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -KILL "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

mkdir -p "$tmp/data"
"$server_bin" --listen 127.0.0.1:0 --data-dir "$tmp/data" --no-request-log \
  --cache-mib "$CACHE_MIB" \
  >"$tmp/server.out" 2>"$tmp/server.err" &
server_pid=$!
addr=""
for _ in $(seq 200); do
  line=$(grep -m1 '^moeplan-server listening on ' "$tmp/server.out" || true)
  [[ -n $line ]] && { addr=${line#moeplan-server listening on }; break; }
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.1
done
[[ -n $addr ]] || { echo "soak.sh: the server did not start: $(cat "$tmp/server.err")" >&2; exit 2; }
echo "soak.sh: server pid $server_pid on $addr; ${DURATION} s of mixed traffic (warm-up ${WARMUP_S} s)" >&2

export MOEPLAN_PYTHONPATH=$stubs
py() { /usr/bin/python3 - "$@"; }

# The profile the traffic plans against.
py "$addr" <<'EOF'
import sys
sys.path.insert(0, "client/python")
from moeplan_client import PlannerClient
with PlannerClient(sys.argv[1]) as c:
    p = c.get_profile("a100-8x8")
    p["name"], p["version"] = "soak", 1
    c.put_profile(p)
EOF

# RSS sampler: "seconds-since-start kib" lines, every second of wall time.
t0=$(date +%s.%N)
(
  while kill -0 "$server_pid" 2>/dev/null; do
    echo "$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN{printf "%.1f", a-b}') $(awk '/^VmRSS:/ {print $2}' "/proc/$server_pid/status" 2>/dev/null || echo 0)"
    sleep 1
  done
) >"$tmp/rss" &
pids+=($!)

common=(--server "$addr" --profile soak --duration-s "$DURATION" --warmup-s 0 --deadline-ms 10000 --json)
"$loadgen_bin" "${common[@]}" --mode cached --clients "$CACHED_CLIENTS" >"$tmp/cached.json" 2>"$tmp/cached.err" &
cached_pid=$!
"$loadgen_bin" "${common[@]}" --mode uncached --clients "$UNCACHED_CLIENTS" >"$tmp/uncached.json" 2>"$tmp/uncached.err" &
uncached_pid=$!

# The writer: puts, measurement reports and refits for DURATION seconds.
py "$addr" "$DURATION" "$PUT_EVERY_S" "$REPORTS_PER_S" "$REFIT_EVERY_S" >"$tmp/writer.json" <<'EOF' &
import json, sys, time
sys.path.insert(0, "client/python")
from moeplan_client import PlannerClient, PlannerError
addr, (duration, put_every, reports_per_s, refit_every) = sys.argv[1], map(float, sys.argv[2:6])
with open("examples/gpt2-moe-layer.json") as f:
    layer = json.load(f)
puts = reports = refits = 0
errors = []
# A refit plans up to --refit-window (1,000) reports again, several times:
# seconds when the machine is busy, so its calls may take a minute.
with PlannerClient(addr, timeout_s=60.0) as c:
    profile = c.get_profile("soak")
    start = time.monotonic()
    next_put, next_refit = start + put_every, start + refit_every
    while time.monotonic() - start < duration:
        now = time.monotonic()
        try:
            if now >= next_put:
                profile["version"] += 1
                profile["links"]["inter"]["alpha_us"] = 1.0 + profile["version"] * 1e-3
                c.put_profile(profile)
                puts += 1
                next_put += put_every
            if refit_every > 0 and now >= next_refit:
                profile = c.refit_profile("soak")["profile"]
                refits += 1
                next_refit += refit_every
            c.report_measurement("soak", profile["version"], layer, "s2",
                                 {"fwd.gate": 25.0 + reports % 7}, 9000.0)
            reports += 1
        except PlannerError as e:
            errors.append(f"{e.code}: {e.message}")
        time.sleep(1.0 / reports_per_s)
print(json.dumps({"puts": puts, "reports": reports, "refits": refits, "errors": len(errors),
                  "first_error": errors[:1]}))
EOF
writer_pid=$!

# The modeller: whole-model searches and timelines, 4 requests in turn.
models_pid=""
if [[ ${MODELLER:-1} == 0 ]]; then
  echo '{"skipped": true, "errors": 0}' >"$tmp/models.json"
else
py "$addr" "$DURATION" >"$tmp/models.json" <<'EOF' &
import json, sys, time
sys.path.insert(0, "client/python")
from moeplan_client import PlannerClient, PlannerError
addr, duration = sys.argv[1], float(sys.argv[2])
with open("examples/models/gpt3-medium-moe.json") as f:
    model = json.load(f)
searches = timelines = 0
errors = []
with PlannerClient(addr, timeout_s=60.0) as c:
    start, i = time.monotonic(), 0
    while time.monotonic() - start < duration:
        i += 1
        try:
            if i % 2:
                c.plan_model(dict(model, global_batch_size=256 + 32 * (i % 4)), profile="soak",
                             search={"gpus": 16, "max_microbatches": 8, "top": 3})
                searches += 1
            else:
                c.plan_model(dict(model, num_layers=24 + 12 * (i % 4)), profile="soak",
                             include_timeline=True)
                timelines += 1
        except PlannerError as e:
            errors.append(f"{e.code}: {e.message}")
print(json.dumps({"searches": searches, "timelines": timelines, "errors": len(errors),
                  "first_error": errors[:1]}))
EOF
models_pid=$!
fi

# The PyTorch example against the server, run after run, while the soak lasts.
torch_pid=""
if [[ ${TORCH:-1} != 0 ]] && PYTHONPATH=$stubs /usr/bin/python3 -c "import moeplan.torch" 2>/dev/null; then
  (
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
    export PYTHONPATH=$stubs
    end=$((SECONDS + DURATION)) runs=0 failed=0
    while ((SECONDS < end)); do
      if timeout 300 mpirun -np 4 /usr/bin/python3 examples/train_gpt_moe.py --no-progress \
          --server "$addr" --require-server --profile cpu-testbed-2x2 --steps 4 --warmup 1 \
          >"$tmp/torch.out" 2>"$tmp/torch.err" </dev/null; then
        runs=$((runs + 1))
      else
        failed=$((failed + 1))
        tail -3 "$tmp/torch.err" >&2
      fi
    done
    echo "{\"runs\": $runs, \"errors\": $failed}"
  ) >"$tmp/torch.json" &
  torch_pid=$!
else
  echo '{"skipped": "moeplan.torch is not built (or TORCH=0)", "errors": 0}' >"$tmp/torch.json"
fi

cached_rc=0; wait "$cached_pid" || cached_rc=$?
uncached_rc=0; wait "$uncached_pid" || uncached_rc=$?
wait "$writer_pid" || true
[[ -z $models_pid ]] || wait "$models_pid" || true
[[ -z $torch_pid ]] || wait "$torch_pid" || true
# Where the soak ends and the burst begins, on the sampler's clock.
soak_end=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN{printf "%.1f", a-b}')

# The burst of worst-case requests, with a cheap caller timing cached plans.
py "$addr" "$WORST_CLIENTS" "$WORST_S" >"$tmp/worst.json" <<'EOF'
import json, sys, threading, time
sys.path.insert(0, "client/python")
from moeplan_client import PlannerClient, PlannerError
addr, clients, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
with open("examples/models/gpt3-medium-moe.json") as f:
    model = json.load(f)
with open("examples/gpt2-moe-layer.json") as f:
    layer = json.load(f)
big = dict(model, num_layers=1024, moe=dict(model["moe"], layer_freq=1))
codes, lock, stop = {}, threading.Lock(), time.monotonic() + seconds
def worst(i):
    # The call's 5 s deadline stops each plan on the server (the earlier of
    # it and --max-plan-seconds, 60 s); the modeller's ordinary plans get the
    # server's default.
    with PlannerClient(addr, timeout_s=5.0) as c:
        while time.monotonic() < stop:
            try:
                if i % 2:
                    c.plan_model(model, search={"gpus": 4096, "max_microbatches": 4096,
                                                "top": 1000, "exhaustive": True})
                else:
                    c.plan_model(big, include_timeline=True)
                code = "OK"
            except PlannerError as e:
                code = e.code
            with lock:
                codes[code] = codes.get(code, 0) + 1
threads = [threading.Thread(target=worst, args=(i,)) for i in range(clients)]
for t in threads:
    t.start()
lat, failed = [], 0
with PlannerClient(addr, timeout_s=10.0) as c:
    c.plan_layer(layer)
    while time.monotonic() < stop:
        t0 = time.monotonic()
        try:
            c.plan_layer(layer)
            lat.append((time.monotonic() - t0) * 1e3)
        except PlannerError:
            failed += 1
        time.sleep(0.01)
for t in threads:
    t.join()
lat.sort()
q = lambda p: round(lat[min(len(lat) - 1, int(p * len(lat)))], 2) if lat else None
print(json.dumps({"worst_codes": codes, "cheap_calls": len(lat), "cheap_failed": failed,
                  "cheap_p50_ms": q(0.5), "cheap_p99_ms": q(0.99), "cheap_max_ms": q(1.0)}))
EOF

kill -0 "$server_pid" 2>/dev/null || { echo "soak.sh: the server died: $(tail -5 "$tmp/server.err")" >&2; exit 1; }
kill -TERM "$server_pid"
server_rc=0
wait "$server_pid" || server_rc=$?
server_pid=""

# Verdict.
/usr/bin/python3 - "$tmp" "$WARMUP_S" "$DURATION" "$cached_rc" "$uncached_rc" "$server_rc" "$soak_end" "$RSS_LIMIT_PCT" "$CACHE_MIB" <<'EOF'
import json, sys
tmp, warmup, duration = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cached_rc, uncached_rc, server_rc = map(int, sys.argv[4:7])
soak_end, rss_limit, cache_mib = float(sys.argv[7]), float(sys.argv[8]), float(sys.argv[9])
def load(name):
    try:
        with open(f"{tmp}/{name}") as f:
            return json.loads(f.read().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return {}
cached, uncached, writer, worst = load("cached.json"), load("uncached.json"), load("writer.json"), load("worst.json")
models, torch = load("models.json"), load("torch.json")
rss = [(float(l.split()[0]), int(l.split()[1])) for l in open(f"{tmp}/rss")
       if len(l.split()) == 2 and l.split()[1] != "0"]
soak = [kib for t, kib in rss if t <= soak_end]
# Growth, peak to peak: the highest RSS of the first window after the warm-up
# against the highest of the last (each a third of what follows the warm-up,
# at most 60 s). A leak raises both the floor and the peaks; the working set
# of one refit, model plan or PyTorch run in flight is in both windows alike.
window = min(60.0, max(1.0, (soak_end - warmup) / 3))
first = [kib for t, kib in rss if warmup <= t <= warmup + window]
last = [kib for t, kib in rss if soak_end - window <= t <= soak_end]
base = max(first, default=soak[0] if soak else 0)
end_max = max(last, default=base)
growth = 100.0 * (end_max - base) / base if base else float("nan")
minutes = {}
for t, kib in rss:
    if warmup <= t <= soak_end:
        minutes[int((t - warmup) // 60)] = max(minutes.get(int((t - warmup) // 60), 0), kib)
peak = max((kib for _, kib in rss), default=0)
ok = True
print(f"soak: {duration} s, loopback, {cached.get('clients', '?')} cached + {uncached.get('clients', '?')} uncached PlanLayer clients, a writer")
for name, r, rc in (("cached", cached, cached_rc), ("uncached", uncached, uncached_rc)):
    errs = r.get("errors_total", "?")
    lat = r.get("latency_us", {})
    print(f"  {name:9s} {r.get('throughput_rps', '?')} req/s, p50 {lat.get('p50', '?')} us, p99 {lat.get('p99', '?')} us, errors {errs} (exit {rc})")
    ok &= rc == 0 and errs == 0
print(f"  writer    {writer.get('puts', '?')} profile puts (each invalidating the plans), {writer.get('reports', '?')} measurement reports, errors {writer.get('errors', '?')} {writer.get('first_error', '')}")
ok &= writer.get("errors") == 0
print(f"  writer    {writer.get('refits', '?')} refits (each a new version)")
print(f"  modeller  {'skipped (MODELLER=0); ' if models.get('skipped') else ''}{models.get('searches', '?')} PlanModel searches, {models.get('timelines', '?')} timelines, errors {models.get('errors', '?')} {models.get('first_error', '')}")
ok &= models.get("errors") == 0
print(f"  pytorch   {torch.get('skipped') or str(torch.get('runs', '?')) + ' runs of examples/train_gpt_moe.py on 4 ranks'}, errors {torch.get('errors', '?')}")
ok &= torch.get("errors") == 0
soak_peak = max(soak, default=0)
bound = cache_mib + 100
print(f"  RSS       peak {base / 1024:.1f} MiB in the {window:.0f} s after the {warmup} s warm-up, {end_max / 1024:.1f} MiB in the last {window:.0f} s: growth {growth:.1f} % (limit {rss_limit:g} %); "
      f"soak peak {soak_peak / 1024:.1f} MiB (limit: --cache-mib {cache_mib:g} + 100 = {bound:g} MiB)")
print("  RSS       peak per minute after the warm-up (MiB): " + " ".join(f"{minutes[m] / 1024:.1f}" for m in sorted(minutes)))
ok &= growth < rss_limit and soak_peak / 1024 <= bound
codes = worst.get("worst_codes", {})
print(f"  burst     worst-case answers {codes}; cached plans meanwhile: {worst.get('cheap_calls')} answered, "
      f"{worst.get('cheap_failed')} failed, p50 {worst.get('cheap_p50_ms')} ms, p99 {worst.get('cheap_p99_ms')} ms, max {worst.get('cheap_max_ms')} ms; peak RSS {peak / 1024:.1f} MiB")
ok &= worst.get("cheap_failed") == 0 and (worst.get("cheap_calls") or 0) > 0
ok &= set(codes) <= {"OK", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"}
print(f"  server    exit {server_rc} on SIGTERM")
ok &= server_rc == 0
print("soak: PASS" if ok else "soak: FAIL")
sys.exit(0 if ok else 1)
EOF
