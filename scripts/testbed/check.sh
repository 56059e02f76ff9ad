#!/usr/bin/env bash
# Checks a testbed: ranks land on distinct hosts, and the inter-node link has
# the configured rate and latency while shared memory inside a node is far
# faster. Takes testbed.sh's flags (at least 2 nodes, 2 ranks per node):
#
#   bash scripts/testbed/check.sh [--nodes 2] [--rate 1gbit] [--delay 50us] ...
#
# CHECK_TCP_MB (default 200) sizes the bulk TCP transfer; lower it for slow links.
# Prints: the rank -> host layout, the `hosts` moeplan-exec reports (when it
# is built), a raw TCP round trip and bulk rate node0 -> node1 (no MPI), and
# an MPI ping-pong node0-node0 (shared memory) and node0-node1 (TCP).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)

if [[ ${1:-} != --inside ]]; then
  command -v mpicc >/dev/null || { echo "check: mpicc not found" >&2; exit 2; }
  BIN=$(mktemp -d "${TMPDIR:-/tmp}/testbed-check.XXXXXX")
  trap 'rm -rf -- "$BIN"' EXIT
  mpicc -O2 -o "$BIN/pingpong" "$HERE/pingpong.c"
  rc=0
  bash "$HERE/testbed.sh" "$@" -- bash "$HERE/check.sh" --inside "$BIN/pingpong" || rc=$?
  exit "$rc"
fi

PINGPONG=$2
((TESTBED_NODES >= 2 && TESTBED_RANKS_PER_NODE >= 2)) || {
  echo "check: needs --nodes >= 2 and --ranks-per-node >= 2" >&2
  exit 2
}
read -r -a ns <<<"$TESTBED_NS"
peer=${TESTBED_SUBNET%.0/24}.2

echo "== rank -> host (mpirun -np $TESTBED_NP hostname)"
mpirun -np "$TESTBED_NP" hostname | sort | uniq -c

EXEC=$ROOT/build/executor/moeplan-exec
if [[ -x $EXEC ]]; then
  echo "== moeplan-exec on $TESTBED_NP ranks (MPI_COMM_TYPE_SHARED groups)"
  mpirun -np 4 "$EXEC" --layer "$ROOT/tests/executor/layers/tiny-4.json" --json --iters 2 --warmup 1 |
    grep -o '"hosts": *[0-9]*'
fi

mb=${CHECK_TCP_MB:-200}
echo "== raw TCP node0 -> node1 (1-byte echo, then $mb MiB bulk)"
ip netns exec "${ns[1]}" python3 -B "$HERE/tcpbench.py" serve 5001 &
python3 -B "$HERE/tcpbench.py" run "$peer" 5001 --mb "$mb"
wait

echo "== MPI ping-pong, node0-node0: shared memory (vader)"
mpirun -np 2 "$PINGPONG" 1
echo "== MPI ping-pong, node0-node1: TCP over the shaped link"
mpirun -np 2 --map-by node "$PINGPONG" 1
