#!/usr/bin/env bash
# Two-level MPI testbed on one machine: N network namespaces act as "nodes"
# (ranks inside one namespace use shared memory), joined through a switch whose
# links are shaped to a given rate and latency (ranks in different namespaces
# use TCP over those links). Runs COMMAND inside node0 with the environment
# set so that a plain `mpirun -np P ...` spreads ranks over the nodes; tears
# everything down when COMMAND ends, fails, or the script is signalled.
#
#   bash scripts/testbed/testbed.sh [--nodes 2] [--ranks-per-node 2] \
#     [--rate 1gbit] [--delay 50us] [--prefix mpt] -- COMMAND...
#   bash scripts/testbed/testbed.sh --cleanup [--prefix mpt] [--force]
#
# See scripts/testbed/README.md for the topology, every flag and the
# environment COMMAND sees.
set -euo pipefail

SELF_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

usage() {
  cat <<'EOF'
usage: testbed.sh [options] -- COMMAND [ARGS...]
       testbed.sh --cleanup [--prefix P] [--force]

  --nodes N            namespaces ("nodes") to create (default 2; 1 = all shared memory)
  --ranks-per-node R   slots per node in the hostfile (default 2)
  --rate RATE          per-node link rate, each direction: 1gbit, 100mbit, 125mbps
                       (bytes/s), ... ; 0 = unshaped (default 1gbit)
  --delay D            one-way node-to-node latency added (RTT grows by 2*D):
                       50us, 1ms, ... ; 0 = none (default 50us)
  --shaper S           auto | tc | user (default auto: tc unless a delay is asked
                       for and the kernel lacks sch_netem, then user)
  --mtu BYTES          MTU of the node links (default 1500)
  --cpus C             own | shared (default own: each node runs on its own share of
                       this machine's CPUs, as nodes of a cluster do: node k gets
                       CPUs k*R..k*R+R-1 when there are enough, else an equal
                       share, else CPU k mod n; shared: every node may use every
                       CPU, and Open MPI binds each node's ranks from CPU 0 up,
                       so ranks of different nodes share cores)
  --subnet A.B.C       /24 used inside the testbed (default 10.213.0)
  --prefix P           namespace name prefix (default mpt); names are P-<pid>-hub,
                       P-<pid>-n0, P-<pid>-n1, ...
  --quiet              no progress messages
  --cleanup            remove namespaces, processes and temp dirs left by killed
                       runs with this prefix, then exit
  --force              with --cleanup: also remove runs whose owner is still alive
  -h, --help           this text

COMMAND runs in node0 (network and hostname); its exit status is returned.
EOF
}

die() {
  echo "testbed: error: $*" >&2
  exit 2
}
log() { [[ $QUIET == 1 ]] || echo "testbed: $*" >&2; }

NODES=2 RPN=2 RATE_ARG=1gbit DELAY_ARG=50us SHAPER=auto MTU=1500 CPUS=own
SUBNET=10.213.0 PREFIX=mpt QUIET=0 CLEANUP=0 FORCE=0

need_arg() { [[ $# -ge 2 && -n $2 ]] || die "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --nodes) need_arg "$@"; NODES=$2; shift 2 ;;
    --ranks-per-node) need_arg "$@"; RPN=$2; shift 2 ;;
    --rate) need_arg "$@"; RATE_ARG=$2; shift 2 ;;
    --delay) need_arg "$@"; DELAY_ARG=$2; shift 2 ;;
    --shaper) need_arg "$@"; SHAPER=$2; shift 2 ;;
    --mtu) need_arg "$@"; MTU=$2; shift 2 ;;
    --cpus) need_arg "$@"; CPUS=$2; shift 2 ;;
    --subnet) need_arg "$@"; SUBNET=$2; shift 2 ;;
    --prefix) need_arg "$@"; PREFIX=$2; shift 2 ;;
    --quiet) QUIET=1; shift ;;
    --cleanup) CLEANUP=1; shift ;;
    --force) FORCE=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    *) usage >&2; die "unknown argument '$1' (put COMMAND after --)" ;;
  esac
done

# Only [A-Za-z0-9_] so "<prefix>-<pid>-<role>" splits unambiguously in --cleanup.
[[ $PREFIX =~ ^[A-Za-z0-9_]{1,20}$ ]] || die "--prefix must be 1-20 of [A-Za-z0-9_]"

# --- rate / delay parsing --------------------------------------------------
# tc's SI units (k=1000); "bit" = bits/s, "bps" = bytes/s as in tc(8).
parse_rate() {
  local v=${1,,} mult
  [[ $v =~ ^0+(\.0*)?$ ]] && { echo 0; return 0; }
  [[ $v =~ ^([0-9]+(\.[0-9]+)?)([kmgt]?)(bit|bps)$ ]] || return 1
  case ${BASH_REMATCH[3]} in
    '') mult=1 ;; k) mult=1e3 ;; m) mult=1e6 ;; g) mult=1e9 ;; t) mult=1e12 ;;
  esac
  [[ ${BASH_REMATCH[4]} == bps ]] && mult="$mult*8"
  awk -v n="${BASH_REMATCH[1]}" "BEGIN { printf \"%.0f\n\", n * $mult }"
}
# Prints microseconds.
parse_delay() {
  local v=${1,,} mult
  [[ $v =~ ^0+(\.0*)?$ ]] && { echo 0; return 0; }
  [[ $v =~ ^([0-9]+(\.[0-9]+)?)(us|ms|s)$ ]] || return 1
  case ${BASH_REMATCH[3]} in us) mult=1 ;; ms) mult=1e3 ;; s) mult=1e6 ;; esac
  awk -v n="${BASH_REMATCH[1]}" "BEGIN { printf \"%.0f\n\", n * $mult }"
}

# --- cleanup of leftovers ----------------------------------------------------
# Kills every process whose network namespace is NS (orteds and ranks that a
# dead mpirun left behind, the link emulator), politely first.
kill_ns_procs() {
  local ns=$1 pids i
  pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ') || true
  [[ -n ${pids// /} ]] || return 0
  # shellcheck disable=SC2086 # word splitting of the pid list is intended
  kill -TERM $pids 2>/dev/null || true
  for i in 1 2 3 4 5 6 7 8 9 10; do
    pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ') || true
    [[ -n ${pids// /} ]] || return 0
    sleep 0.2
  done
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null || true
  sleep 0.2
}

cleanup_prefix() {
  local ns owner removed=0 skipped=0 d
  # Node namespaces first, the hub last: the hub's emulator holds the nodes' TAPs.
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | sort -r); do
    [[ $ns =~ ^${PREFIX}-([0-9]+)-(hub|n[0-9]+)$ ]] || continue
    owner=${BASH_REMATCH[1]}
    if [[ $FORCE == 0 ]] && kill -0 "$owner" 2>/dev/null; then
      log "skipping $ns: its testbed (pid $owner) is still running (--force to remove)"
      skipped=$((skipped + 1))
      continue
    fi
    kill_ns_procs "$ns"
    ip netns del "$ns" && removed=$((removed + 1))
  done
  for d in "${TMPDIR:-/tmp}"/testbed-"${PREFIX}"-*; do
    [[ -d $d && $d =~ -([0-9]+)\.[^/]*$ ]] || continue
    if [[ $FORCE == 1 ]] || ! kill -0 "${BASH_REMATCH[1]}" 2>/dev/null; then rm -rf -- "$d"; fi
  done
  log "cleanup: removed $removed namespace(s) with prefix '$PREFIX', skipped $skipped"
}

# --- preflight ----------------------------------------------------------------
[[ $EUID -eq 0 ]] || die "must run as root (it creates network namespaces and qdiscs)"
for tool in ip tc unshare awk; do
  command -v "$tool" >/dev/null || die "'$tool' not found (need iproute2 and util-linux)"
done
ip netns list >/dev/null 2>&1 || die "'ip netns' does not work here"

if [[ $CLEANUP == 1 ]]; then
  cleanup_prefix
  exit 0
fi

[[ $# -gt 0 ]] || { usage >&2; die "no COMMAND given (put it after --)"; }
in_range() { [[ $1 =~ ^[0-9]{1,6}$ ]] && (($1 >= $2 && $1 <= $3)); }
in_range "$NODES" 1 200 || die "--nodes must be 1..200"
in_range "$RPN" 1 999999 || die "--ranks-per-node must be >= 1"
in_range "$MTU" 576 65000 || die "--mtu must be 576..65000"
[[ $SUBNET =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ ]] || die "--subnet must look like 10.213.0"
RATE=$(parse_rate "$RATE_ARG") || die "bad --rate '$RATE_ARG' (e.g. 1gbit, 100mbit, 125mbps, 0)"
DELAY_US=$(parse_delay "$DELAY_ARG") || die "bad --delay '$DELAY_ARG' (e.g. 50us, 1ms, 0)"
case $SHAPER in auto | tc | user) ;; *) die "--shaper must be auto, tc or user" ;; esac
case $CPUS in own | shared) ;; *) die "--cpus must be own or shared" ;; esac

# --- CPUs per node ------------------------------------------------------------
# The CPUs this script may use, from its affinity list ("0-3,6" -> 0 1 2 3 6).
ALLOWED=()
IFS=, read -ra parts <<<"$(awk '/^Cpus_allowed_list/ {print $2}' /proc/self/status)"
for p in "${parts[@]}"; do
  if [[ $p == *-* ]]; then
    for ((c = ${p%-*}; c <= ${p#*-}; c++)); do ALLOWED+=("$c"); done
  else
    ALLOWED+=("$p")
  fi
done
NCPU=${#ALLOWED[@]}
((NCPU > 0)) || die "cannot read this process's CPU affinity from /proc/self/status"
# NODE_CPUS[k]: node k's CPU list for taskset -c ("" with --cpus shared).
NODE_CPUS=()
for ((k = 0; k < NODES; k++)); do
  if [[ $CPUS == shared ]]; then
    NODE_CPUS+=("")
    continue
  fi
  if ((NODES * RPN <= NCPU)); then
    first=$((k * RPN)) count=$RPN
  elif ((NODES <= NCPU)); then
    first=$((k * NCPU / NODES)) count=$(((k + 1) * NCPU / NODES - k * NCPU / NODES))
  else
    first=$((k % NCPU)) count=1
  fi
  list=""
  for ((c = first; c < first + count; c++)); do list+="${list:+,}${ALLOWED[c]}"; done
  NODE_CPUS+=("$list")
done

BASE=$PREFIX-$$
HUB=$BASE-hub
NS=()
for ((k = 0; k < NODES; k++)); do NS+=("$BASE-n$k"); done
# An existing name means a previous run reused our pid and died uncleaned.
for ns in "$HUB" "${NS[@]}"; do
  [[ ! -e /run/netns/$ns ]] || die "namespace $ns already exists; run: $0 --cleanup --prefix $PREFIX"
done

# --- tear-down --------------------------------------------------------------
CHILD='' EMU='' WORK='' CREATED=() SIGNALLED=''
# shellcheck disable=SC2317 # reached through the traps below
teardown() {
  local rc=$? ns
  trap - EXIT INT TERM HUP
  set +e
  if [[ -n $CHILD ]] && kill -0 "$CHILD" 2>/dev/null; then kill -KILL "$CHILD" 2>/dev/null; fi
  # Nodes before the hub: killing the emulator first would pull the NICs out
  # from under ranks that might still be exiting cleanly.
  for ((i = ${#CREATED[@]} - 1; i >= 0; i--)); do
    ns=${CREATED[i]}
    kill_ns_procs "$ns"
    ip netns del "$ns" 2>/dev/null
  done
  if [[ -n $EMU ]]; then
    kill -TERM "$EMU" 2>/dev/null && wait "$EMU" 2>/dev/null
    [[ -s $WORK/linkemu.log ]] && [[ $QUIET == 0 ]] && sed 's/^/testbed: /' "$WORK/linkemu.log" >&2
  fi
  [[ -n $WORK ]] && rm -rf -- "$WORK"
  ((${#CREATED[@]})) && log "torn down ${#CREATED[@]} namespace(s)"
  exit "$rc"
}
# COMMAND runs in its own session (process group = CHILD), so that signals
# its tools send to "their" group (mpirun does on abort) do not hit us, and
# Ctrl-C reaches only us. First INT/TERM/HUP: send SIGTERM to COMMAND's group
# (not INT: bash starts background jobs with INT ignored) and let the main
# flow collect its status; a second one, or one during set-up, ends at once
# (SIGKILL to COMMAND; the EXIT trap tears down).
# shellcheck disable=SC2317
on_signal() {
  local sig=$1
  if [[ -n $CHILD && -z $SIGNALLED ]] && kill -0 "$CHILD" 2>/dev/null; then
    SIGNALLED=$sig
    log "SIG$sig: stopping COMMAND with SIGTERM (signal again to kill it)"
    kill -TERM -- "-$CHILD" 2>/dev/null || kill -TERM "$CHILD" 2>/dev/null || true
    return
  fi
  if [[ -n $CHILD ]]; then kill -KILL -- "-$CHILD" 2>/dev/null || true; fi
  case $sig in INT) exit 130 ;; HUP) exit 129 ;; *) exit 143 ;; esac
}
trap teardown EXIT
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM
trap 'on_signal HUP' HUP

WORK=$(mktemp -d "${TMPDIR:-/tmp}/testbed-$BASE.XXXXXX")

# --- hub ("switch") namespace -------------------------------------------------
mkns() {
  ip netns add "$1" || die "cannot create network namespace $1"
  CREATED+=("$1")
  ip -n "$1" link set lo up
  # No IPv6: its router/neighbour solicitations would be the only other
  # traffic on the links, and Open MPI need not try v6 addresses.
  # shellcheck disable=SC2016 # expanded by the inner sh
  ip netns exec "$1" sh -c 'for f in /proc/sys/net/ipv6/conf/*/disable_ipv6; do echo 1 >"$f"; done' 2>/dev/null || true
}
mkns "$HUB"

# Decide the shaper. netem is the only qdisc that adds latency; tbf only limits
# rate. Probe on a scratch veth in the hub so the answer is this kernel's.
have_qdisc() {
  ip -n "$HUB" link add name probe0 type veth peer name probe1 2>/dev/null || return 1
  local ok=0
  tc -n "$HUB" qdisc add dev probe0 root "$@" 2>/dev/null || ok=1
  ip -n "$HUB" link del probe0 2>/dev/null || true
  return $ok
}
if [[ $SHAPER != user ]] && { ((RATE > 0)) || ((DELAY_US > 0)); }; then
  if ((DELAY_US > 0)) && ! have_qdisc netem delay 1ms; then
    [[ $SHAPER == tc ]] && die "--shaper tc: this kernel has no sch_netem, so tc cannot add delay; use --delay 0 or --shaper user"
    SHAPER=user
  fi
  if [[ $SHAPER != user ]] && ((RATE > 0)) && ! have_qdisc tbf rate 1gbit burst 32kb limit 64kb; then
    [[ $SHAPER == tc ]] && die "--shaper tc: this kernel has no sch_tbf (tc qdisc add ... tbf fails); use --rate 0 or --shaper user"
    SHAPER=user
  fi
fi
[[ $SHAPER == auto ]] && SHAPER=tc

for ((k = 0; k < NODES; k++)); do mkns "${NS[k]}"; done

addr() { echo "$SUBNET.$(($1 + 1))"; }
# Locally administered MACs that spell the node index: easy to read in dumps.
mac() { printf '02:74:62:00:%02x:%02x\n' $(($1 / 256)) $(($1 % 256)); }

# tbf's bucket. Timers fire some tens of us late on a loaded (virtual)
# machine, and every late tick loses tokens a small bucket cannot hold, so
# at high rates the link then carries less than RATE. Measured here at
# 1gbit (MPI ping-pong, 16 MB): a 6 KB bucket gives 87 MB/s, 62 KB 99 MB/s,
# 70 KB 119.7 of the ~119.6 possible; at 100mbit even 6 KB is exact. So:
# 500 us of the rate, raised to 1 ms or one 64 KiB TCP (GSO) burst + headers,
# whichever is smaller. The price: a message smaller than the bucket passes
# at memory speed after an idle period (the user shaper has no such burst).
# The queue is deep (32 MiB) so the link does not drop: a tail drop costs TCP
# a 200 ms retransmission timeout, which an MPI collective then waits out
# (seen as 10-20x slow outliers in moeplan validate with a 5 ms queue);
# training fabrics (InfiniBand, RoCE with PFC) are lossless too.
tbf_args() {
  local bytes_s=$((RATE / 8)) burst floor limit
  burst=$((bytes_s / 2000))
  floor=$((bytes_s / 1000))
  ((floor <= 70000)) || floor=70000
  ((burst >= floor)) || burst=$floor
  ((burst >= 2 * (MTU + 14))) || burst=$((2 * (MTU + 14)))
  limit=$((32 * 1024 * 1024))
  ((limit >= 2 * burst)) || limit=$((2 * burst))
  echo "rate ${RATE}bit burst $burst limit $limit"
}

if [[ $SHAPER == tc ]]; then
  # Kernel path: a Linux bridge in the hub, one veth per node. Shaped on both
  # ends: node egress (its uplink; netem adds the one-way delay here, once per
  # node-to-node trip) and the bridge port's egress (the downlink, where
  # incast from several nodes queues).
  ip -n "$HUB" link add name br0 type bridge
  ip -n "$HUB" link set br0 up
  for ((k = 0; k < NODES; k++)); do
    ip -n "$HUB" link add name "p$k" mtu "$MTU" type veth peer name eth0 netns "${NS[k]}"
    ip -n "$HUB" link set "p$k" master br0 up
    if ((DELAY_US > 0)); then
      if ((RATE > 0)); then
        tc -n "${NS[k]}" qdisc add dev eth0 root netem delay "${DELAY_US}us" rate "${RATE}bit" limit 100000
      else
        tc -n "${NS[k]}" qdisc add dev eth0 root netem delay "${DELAY_US}us" limit 100000
      fi
    elif ((RATE > 0)); then
      # shellcheck disable=SC2046 # tbf_args is a word list
      tc -n "${NS[k]}" qdisc add dev eth0 root tbf $(tbf_args)
    fi
    if ((RATE > 0)); then
      # shellcheck disable=SC2046
      tc -n "$HUB" qdisc add dev "p$k" root tbf $(tbf_args)
    fi
  done
else
  # User path: the emulator creates a TAP "eth0" in every node and switches
  # between them itself (see linkemu.py). It runs in the hub namespace so
  # that --cleanup finds it, under SCHED_FIFO when allowed so spinning ranks
  # on a small machine do not delay its timers, and in its own session so
  # that signals sent to our process group (Ctrl-C, timeout(1)) cannot take
  # the links down under a COMMAND that is still shutting down.
  command -v python3 >/dev/null || die "--shaper user needs python3"
  [[ -c /dev/net/tun ]] || die "--shaper user needs /dev/net/tun (CONFIG_TUN)"
  rt=()
  if command -v chrt >/dev/null && chrt -f 10 true 2>/dev/null; then rt=(chrt -f 10); fi
  setsid ip netns exec "$HUB" "${rt[@]}" python3 -B "$SELF_DIR/linkemu.py" --rate "$RATE" \
    --delay-us "$DELAY_US" --ready "$WORK/linkemu.ready" --parent $$ --stats \
    "${NS[@]}" </dev/null 2>"$WORK/linkemu.log" &
  EMU=$!
  for ((i = 0; i < 100; i++)); do
    [[ -e $WORK/linkemu.ready ]] && break
    kill -0 "$EMU" 2>/dev/null || { cat "$WORK/linkemu.log" >&2; die "link emulator failed to start"; }
    sleep 0.05
  done
  [[ -e $WORK/linkemu.ready ]] || die "link emulator did not come up"
fi

for ((k = 0; k < NODES; k++)); do
  ip -n "${NS[k]}" link set eth0 mtu "$MTU"
  ip -n "${NS[k]}" link set eth0 address "$(mac "$k")"
  ip -n "${NS[k]}" addr add "$(addr "$k")/24" dev eth0
  ip -n "${NS[k]}" link set eth0 up
done

# --- Open MPI plumbing ----------------------------------------------------------
# Each namespace is a host "nodeK". Open MPI's rsh launcher runs
# `AGENT nodeK <orted command line>`; the agent starts that command inside
# namespace K under its own UTS namespace with hostname nodeK, so the orted,
# and the ranks it forks, report nodeK (the namespaces otherwise all share the
# machine's hostname) and use per-host session directories.
HOSTFILE=$WORK/hostfile
AGENT=$WORK/agent
for ((k = 0; k < NODES; k++)); do echo "node$k slots=$RPN"; done >"$HOSTFILE"
cat >"$AGENT" <<EOF
#!/bin/sh
# Generated by testbed.sh: Open MPI plm_rsh_agent mapping nodeK to a namespace.
while [ \$# -gt 0 ]; do case \$1 in -*) shift ;; *) break ;; esac; done
host=\$1; shift
case \$host in
  node[0-9]*) k=\${host#node} ;;
  *) echo "testbed agent: unknown host '\$host'" >&2; exit 255 ;;
esac
ns=$BASE-n\$k
[ -e "/run/netns/\$ns" ] || { echo "testbed agent: no namespace for \$host" >&2; exit 255; }
# The node's own CPUs (--cpus own): its daemon, and so its ranks, run there.
cpus=\$(sed -n "\$((k + 1))p" "$WORK/node-cpus")
pin=""
[ -z "\$cpus" ] || pin="taskset -c \$cpus"
# Like ssh: the words after the host form one shell command line.
exec \$pin ip netns exec "\$ns" unshare --uts sh -c 'hostname "\$1"; shift; eval "\$*"' sh "\$host" "\$@"
EOF
printf '%s\n' "${NODE_CPUS[@]}" >"$WORK/node-cpus"
chmod +x "$AGENT"

export OMPI_MCA_plm_rsh_agent=$AGENT
export OMPI_MCA_orte_default_hostfile=$HOSTFILE
# mpirun itself starts every orted: a tree spawn would launch from inside
# other nodes, which works but makes failures harder to read.
export OMPI_MCA_plm_rsh_no_tree_spawn=1
export OMPI_MCA_oob_tcp_if_include=$SUBNET.0/24
export OMPI_MCA_btl_tcp_if_include=$SUBNET.0/24
# ob1 + these BTLs: shared memory inside a node, TCP between nodes, nothing
# else (UCX/OFI would pick their own transports and bypass the shaping).
export OMPI_MCA_pml=ob1
export OMPI_MCA_btl=self,vader,tcp
export OMPI_MCA_osc=^ucx
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1
# Ranks of a node (with --cpus shared, of every node) share cores, and a rank's
# lane threads share its core: a busy-polling rank would starve the others.
export OMPI_MCA_mpi_yield_when_idle=1
# Open MPI binds from the whole machine's topology, ignoring a daemon's
# affinity: node1's rank would be bound to CPU 0 like node0's. With --cpus own
# the ranks keep the CPUs of their node instead.
[[ $CPUS == shared ]] || export OMPI_MCA_hwloc_base_binding_policy=none
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export TESTBED_NODES=$NODES TESTBED_RANKS_PER_NODE=$RPN TESTBED_NP=$((NODES * RPN))
export TESTBED_RATE_BIT=$RATE TESTBED_DELAY_US=$DELAY_US TESTBED_SHAPER=$SHAPER
export TESTBED_HOSTFILE=$HOSTFILE TESTBED_HUB=$HUB TESTBED_NS="${NS[*]}"
export TESTBED_SUBNET=$SUBNET.0/24

shaping="rate $([[ $RATE == 0 ]] && echo unshaped || echo "$RATE_ARG"), delay $([[ $DELAY_US == 0 ]] && echo none || echo "${DELAY_US}us one-way")"
cpus_note="every node on CPUs $(IFS=,; echo "${ALLOWED[*]}")"
if [[ $CPUS == own ]]; then
  cpus_note="node CPUs"
  for ((k = 0; k < NODES && k < 8; k++)); do cpus_note+=" n$k:${NODE_CPUS[k]}"; done
  ((NODES <= 8)) || cpus_note+=" ..."
fi
export TESTBED_CPUS=$CPUS
log "$NODES node(s) x $RPN rank(s), $shaping, shaper $SHAPER, $cpus_note, namespaces $BASE-{hub,n0..n$((NODES - 1))}"

# --- run COMMAND in node0 ---------------------------------------------------------
# In the background so that our traps run while it is going (bash defers
# them while a foreground command runs); <&0 keeps its stdin (a background
# job would otherwise get /dev/null). setsid runs in place (we are not a
# group leader), so CHILD is also COMMAND's process group id.
# shellcheck disable=SC2016 # expanded by the inner sh
PIN0=()
[[ -z ${NODE_CPUS[0]} ]] || PIN0=(taskset -c "${NODE_CPUS[0]}")
setsid "${PIN0[@]}" ip netns exec "${NS[0]}" unshare --uts sh -c 'hostname "$1"; shift; exec "$@"' sh node0 "$@" <&0 &
CHILD=$!
while :; do
  # Not `wait || rc=$?`: under set -e, bash 5.2 exits when a trapped signal
  # interrupts a wait, || or not.
  set +e
  wait "$CHILD"
  rc=$?
  set -e
  # Above 128 may only mean a trapped signal interrupted wait.
  ((rc > 128)) || break
  kill -0 "$CHILD" 2>/dev/null && continue
  # It ended meanwhile: fetch its own status if wait has not consumed it.
  r=0
  wait "$CHILD" 2>/dev/null || r=$?
  ((r == 127)) || rc=$r
  break
done
CHILD=''
exit "$rc"
