#!/usr/bin/env bash
# Load test of moeplan-server on loopback: starts a server from build/ on
# 127.0.0.1:0 with a temporary data dir, runs build/bench/moeplan-loadgen for
# every clients x mode pair against it, prints a Markdown table, and stops the
# server with SIGTERM (also on error or Ctrl-C).
#
# Build first:  cmake -S . -B build && ninja -C build moeplan-loadgen moeplan-server
#
# Environment (all optional):
#   DURATION=10        measured seconds per run (60 for the report run)
#   WARMUP=1           unmeasured seconds before each run's window
#   CLIENTS="1 8 64"   outstanding calls per run
#   ROUNDS=1           sweeps of every clients x mode pair, one after another
#                      (interleaved repeats: each plan mode's ratio to Check is
#                      taken within its round, then summarised as median, min
#                      and max over the rounds)
#   MODES="check cached uncached"   check: the health service's empty Check, gRPC's
#                      own cost; each plan mode is also reported as a ratio of it
#   CHANNELS=2         gRPC channels (TCP connections) of the load generator
#   THREADS=0          its completion-queue threads (0: min(CHANNELS, 2))
#   CACHE_ENTRIES=     server --cache-entries (unset: the server's default)
#   BUILD_DIR=build
#   LAYER=examples/gpt2-moe-layer.json   PROFILE=a100-8x8
#   JSON_DIR=          keep each run's loadgen JSON there (rROUND-cCLIENTS-MODE.json)
#   SERVER_CPUS= LOADGEN_CPUS=   pin each side to CPUs (taskset lists, e.g. 0 and 1)
#   RATE=              open loop: calls per second (moeplan-loadgen --rate); unset: closed loop
#   RATE_CACHED= RATE_UNCACHED=   per-mode rates (override RATE)
#
# Exit status: 0 when every run had zero failed calls.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10}
WARMUP=${WARMUP:-1}
CLIENTS=${CLIENTS:-"1 8 64"}
ROUNDS=${ROUNDS:-1}
if ! [[ $ROUNDS =~ ^[1-9][0-9]*$ ]]; then
  echo "load.sh: error: ROUNDS must be a whole number >= 1 (got '$ROUNDS')" >&2
  exit 2
fi
MODES=${MODES:-"check cached uncached"}
CHANNELS=${CHANNELS:-2}
THREADS=${THREADS:-0}
CACHE_ENTRIES=${CACHE_ENTRIES:-}
BUILD_DIR=${BUILD_DIR:-build}
LAYER=${LAYER:-examples/gpt2-moe-layer.json}
PROFILE=${PROFILE:-a100-8x8}
JSON_DIR=${JSON_DIR:-}

server_bin=$BUILD_DIR/server/moeplan-server
loadgen_bin=$BUILD_DIR/bench/moeplan-loadgen
for b in "$server_bin" "$loadgen_bin"; do
  if [[ ! -x $b ]]; then
    echo "load.sh: error: $b not built (ninja -C $BUILD_DIR moeplan-loadgen moeplan-server)" >&2
    exit 2
  fi
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/moeplan-load.XXXXXX")
server_pid=""
cleanup() {
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    # The server drains for up to 10 s; do not wait longer than that.
    for _ in $(seq 120); do
      kill -0 "$server_pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$server_pid" 2>/dev/null; then
      echo "load.sh: server $server_pid did not stop on SIGTERM; killing it" >&2
      kill -KILL "$server_pid" 2>/dev/null || true
    fi
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

server_args=(--listen 127.0.0.1:0 --data-dir "$tmp/data" --no-request-log)
[[ -n $CACHE_ENTRIES ]] && server_args+=(--cache-entries "$CACHE_ENTRIES")
mkdir -p "$tmp/data"
${SERVER_CPUS:+taskset -c "$SERVER_CPUS"} "$server_bin" "${server_args[@]}" >"$tmp/server.out" 2>"$tmp/server.err" &
server_pid=$!

port=""
for _ in $(seq 100); do
  if [[ $(head -n1 "$tmp/server.out" 2>/dev/null) =~ listening\ on\ 127\.0\.0\.1:([0-9]+) ]]; then
    port=${BASH_REMATCH[1]}
    break
  fi
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.1
done
if [[ -z $port ]]; then
  echo "load.sh: error: the server did not report its port; its stderr:" >&2
  cat "$tmp/server.err" >&2
  exit 2
fi
echo "load.sh: moeplan-server pid $server_pid on 127.0.0.1:$port;" \
  "${DURATION} s per run after ${WARMUP} s warmup, channels=$CHANNELS" >&2

# One field of the loadgen's flat JSON.
jget() {
  local re="\"$1\":([-0-9.]+|null)"
  if [[ $2 =~ $re ]]; then echo "${BASH_REMATCH[1]}"; else echo "-"; fi
}

rows=()
ratios=()
declare -A check_rps check_p99 rps_ratios p99_ratios
failed=0
uncached_runs=0
for round in $(seq "$ROUNDS"); do
for c in $CLIENTS; do
  for m in $MODES; do
    args=(--server "127.0.0.1:$port" --clients "$c" --mode "$m" --duration-s "$DURATION"
          --warmup-s "$WARMUP" --channels "$CHANNELS" --threads "$THREADS" --layer "$LAYER" --profile "$PROFILE"
          --server-pid "$server_pid" --json)
    rate_var="RATE_${m^^}"
    rate="${!rate_var:-${RATE:-}}"
    if [[ -n $rate ]]; then args+=(--rate "$rate"); fi
    if [[ $m == uncached ]]; then
      # Disjoint stretches of the batch_size sequence, so one run cannot hit what
      # an earlier run left in the server's cache.
      args+=(--uncached-offset $((uncached_runs * 700000)))
      uncached_runs=$((uncached_runs + 1))
    fi
    echo "load.sh: round $round/$ROUNDS clients=$c mode=$m ..." >&2
    rc=0
    out=$(${LOADGEN_CPUS:+taskset -c "$LOADGEN_CPUS"} "$loadgen_bin" "${args[@]}") || rc=$?
    if [[ -n $JSON_DIR ]]; then
      mkdir -p "$JSON_DIR"
      printf '%s\n' "$out" >"$JSON_DIR/r${round}-c${c}-${m}.json"
    fi
    if [[ -z $out ]]; then
      echo "load.sh: loadgen failed (exit $rc) for clients=$c mode=$m" >&2
      rows+=("| $round | $c | $m | - | - | - | - | loadgen exit $rc | - |")
      failed=1
      continue
    fi
    echo "$out" >&2
    [[ $rc -ne 0 ]] && failed=1
    errs=$(jget errors_total "$out")
    [[ $errs != 0 && $errs != - ]] && failed=1
    growth=$(jget growth_pct "$out")
    rps=$(jget throughput_rps "$out")
    p99=$(jget p99 "$out")
    rows+=("| $round | $c | $m | $rps | $(jget p50 "$out") | $p99 | $(jget max "$out") | $errs | $growth |")
    if [[ $m == check ]]; then
      check_rps[$c]=$rps
      check_p99[$c]=$p99
    elif [[ -n ${check_rps[$c]:-} && $rps != - ]]; then
      r_rps=$(awk -v a="$rps" -v b="${check_rps[$c]}" 'BEGIN{printf "%.1f", 100*a/b}')
      r_p99=$(awk -v a="$p99" -v b="${check_p99[$c]}" 'BEGIN{printf "%.2f", a/b}')
      ratios+=("| $round | $c | $m | $r_rps % | $r_p99 |")
      rps_ratios[$c:$m]+="$r_rps "
      p99_ratios[$c:$m]+="$r_p99 "
    fi
  done
done
check_rps=()  # each round's plan modes compare with that round's Check
done

# "median (min-max)" of a list of numbers.
spread() {
  tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{v[NR]=$1} END {
    m = NR % 2 ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2
    printf "%s (%s-%s)", m, v[1], v[NR]}'
}

if ! kill -0 "$server_pid" 2>/dev/null; then
  echo "load.sh: error: the server died during the runs; its stderr:" >&2
  cat "$tmp/server.err" >&2
  failed=1
fi

echo
echo "moeplan-server load, ${DURATION} s per run (after ${WARMUP} s warmup), loopback, channels=$CHANNELS, $(nproc) CPU(s)"
echo
echo "| round | clients | mode | req/s | p50 µs | p99 µs | max µs | errors | server RSS growth % |"
echo "|--:|--:|---|--:|--:|--:|--:|--:|--:|"
printf '%s\n' "${rows[@]}"
if [[ ${#ratios[@]} -gt 0 ]]; then
  echo
  echo "Against gRPC itself (the health service's Check, same clients, same run):"
  echo
  echo "| round | clients | mode | req/s as % of Check's | p99 / Check's p99 |"
  echo "|--:|--:|---|--:|--:|"
  printf '%s\n' "${ratios[@]}"
  if [[ $ROUNDS -gt 1 ]]; then
    echo
    echo "Over the $ROUNDS rounds, median (min-max):"
    echo
    echo "| clients | mode | req/s as % of Check's | p99 / Check's p99 |"
    echo "|--:|---|--:|--:|"
    for c in $CLIENTS; do
      for m in $MODES; do
        [[ -n ${rps_ratios[$c:$m]:-} ]] || continue
        echo "| $c | $m | $(spread "${rps_ratios[$c:$m]}") % | $(spread "${p99_ratios[$c:$m]}") |"
      done
    done
  fi
fi

# Stop the server now (the trap does the same on every other path) and check
# that SIGTERM gives exit 0.
kill -TERM "$server_pid"
server_rc=0
wait "$server_pid" || server_rc=$?
server_pid=""
if [[ $server_rc -ne 0 ]]; then
  echo "load.sh: server exited $server_rc on SIGTERM" >&2
  failed=1
fi
exit $failed
