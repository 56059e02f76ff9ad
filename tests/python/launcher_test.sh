#!/usr/bin/env bash
# The Python client against the real server, as ctest runs it (label "python"):
#   launcher_test.sh SERVER_BIN STUB_DIR SOURCE_DIR
# Starts moeplan-server on 127.0.0.1:0 with a temporary data dir, runs
# examples/launcher.py (a good and a bad layer; a model's layout search, a bad
# --layout key, a layout the server refuses) and tests/python/client_test.py
# under /usr/bin/python3, then stops the server with SIGTERM and expects exit 0.
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: $0 SERVER_BIN STUB_DIR SOURCE_DIR" >&2
  exit 2
fi
server_bin=$1
stubs=$2
src=$3
py=/usr/bin/python3  # Debian's: sees python3-grpcio and python3-protobuf

work=$(mktemp -d "${TMPDIR:-/tmp}/moeplan-python-test.XXXXXX")
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
  if [[ -s $work/server.err ]]; then
    echo "--- server stderr (last 20 lines) ---" >&2
    tail -n 20 "$work/server.err" >&2
  fi
  exit 1
}

[[ -x $server_bin ]] || fail "no server binary at $server_bin"
[[ -f $stubs/moeplan/v1/service_pb2_grpc.py ]] ||
  fail "no generated stubs in $stubs (build the moeplan_python_stubs target)"
"$py" -c 'import grpc, google.protobuf' ||
  fail "$py cannot import grpc/protobuf (install python3-grpcio python3-protobuf)"

# --- start the server and wait (bounded) for its one stdout line --------------
start_server "$server_bin" "$work" || fail "the server did not start"

# --- the launcher: a good layer ------------------------------------------------
rc=0
"$py" "$src/examples/launcher.py" --server "$addr" --stubs "$stubs" \
  >"$work/launch.out" 2>"$work/launch.err" || rc=$?
cat "$work/launch.out"
[[ $rc -eq 0 ]] || fail "launcher exited $rc: $(cat "$work/launch.err")"
schedule=$(sed -n 's/^schedule: \([a-z0-9]*\)$/\1/p' "$work/launch.out")
[[ $schedule =~ ^(default|s1|s2)$ ]] || fail "no 'schedule: NAME' line in the launcher output"
grep -q -- "--moe-schedule $schedule\$" "$work/launch.out" ||
  fail "launcher output lacks '--moe-schedule $schedule'"
grep -q -- "--tensor-model-parallel-size 4 --expert-parallel-size 16 --expert-slicing-size 4 --data-parallel-size 16 " \
  "$work/launch.out" || fail "launcher output lacks the example layer's parallel flags"
grep -q '^predicted iteration time: [0-9.]* us' "$work/launch.out" ||
  fail "launcher output lacks the predicted iteration time"
grep -q '^margin: ' "$work/launch.out" || fail "launcher output lacks the margin"

# --- the launcher: a bad layer (top_k > num_experts), stubs via the env var ----
cat >"$work/bad-layer.json" <<'JSON'
{
  "name": "bad-top-k",
  "batch_size": 8, "seq_len": 1024, "model_dim": 1024, "hidden_dim": 4096,
  "num_experts": 2, "top_k": 4, "capacity_factor": 1.2,
  "parallel": {"mp": 1, "ep": 2, "esp": 1}
}
JSON
rc=0
MOEPLAN_PYTHONPATH=$stubs "$py" "$src/examples/launcher.py" --server "$addr" \
  --layer "$work/bad-layer.json" >"$work/bad.out" 2>"$work/bad.err" || rc=$?
echo "bad layer: exit $rc, stderr: $(cat "$work/bad.err")"
[[ $rc -ne 0 ]] || fail "launcher accepted top_k > num_experts"
grep -q 'top_k' "$work/bad.err" || fail "the error does not name top_k"
grep -q 'INVALID_ARGUMENT' "$work/bad.err" || fail "the error is not INVALID_ARGUMENT"
[[ $(wc -l <"$work/bad.err") -eq 1 ]] || fail "the error is not one line"
[[ ! -s $work/bad.out ]] || fail "the launcher printed a plan for a bad layer"

# --- the launcher: unknown profile -> NOT_FOUND ----------------------------------
rc=0
"$py" "$src/examples/launcher.py" --server "$addr" --stubs "$stubs" --cluster no-such-cluster \
  >/dev/null 2>"$work/nf.err" || rc=$?
[[ $rc -ne 0 ]] && grep -q 'NOT_FOUND' "$work/nf.err" ||
  fail "unknown cluster: want NOT_FOUND, got exit $rc: $(cat "$work/nf.err")"

# --- the launcher: a whole model (layout search) ------------------------------------
rc=0
"$py" "$src/examples/launcher.py" --server "$addr" --stubs "$stubs" \
  --model "$src/examples/models/gpt3-medium-moe.json" --cluster v100-8x8 --gpus 32 --top 3 \
  >"$work/model.out" 2>"$work/model.err" || rc=$?
cat "$work/model.out"
[[ $rc -eq 0 ]] || fail "launcher --model exited $rc: $(cat "$work/model.err")"
grep -q '^megatron flags: .*--pipeline-model-parallel-size [0-9]' "$work/model.out" ||
  fail "launcher --model output lacks --pipeline-model-parallel-size"
grep -q '^megatron flags: .*--expert-model-parallel-size [0-9]' "$work/model.out" ||
  fail "launcher --model output lacks --expert-model-parallel-size"
grep -q '^megatron flags: .*--global-batch-size 256 ' "$work/model.out" ||
  fail "launcher --model output lacks the model's --global-batch-size 256"
sed -n 's/^deepspeed config: //p' "$work/model.out" | "$py" -c '
import json, sys
c = json.load(sys.stdin)
assert c["train_batch_size"] == 256, c
assert c["train_micro_batch_size_per_gpu"] >= 1 and c["gradient_accumulation_steps"] >= 1, c
assert c["moe"]["num_experts"] == 64 and c["moe"]["top_k"] == 2, c
' || fail "launcher --model: no valid 'deepspeed config: {json}' line"

# --- the launcher: one --layout evaluated, its flags printed back -------------------
# layout_case NAME CLUSTER MODEL LAYOUT: runs the launcher into $work/NAME.out and
# fails unless it exits 0.
layout_case() {
  local name=$1 cluster=$2 model=$3 layout=$4 rc=0
  "$py" "$src/examples/launcher.py" --server "$addr" --stubs "$stubs" --cluster "$cluster" \
    --model "$src/examples/models/$model" --layout "$layout" \
    >"$work/$name.out" 2>"$work/$name.err" || rc=$?
  [[ $rc -eq 0 ]] || fail "launcher --layout $layout exited $rc: $(cat "$work/$name.err")"
}
# expect NAME PATTERN WHAT: the launcher's output of case NAME holds PATTERN (grep -e).
expect() {
  grep -q -e "$2" "$work/$1.out" || fail "launcher ($1): $3: $(cat "$work/$1.out")"
}

# An uneven pipeline layout (layout= last, written back).
layout_case pplayout v100-8x8 gpt3-medium-moe.json \
  'dp=16,tp=1,pp=2,ep=16,esp=1,microbatches=16,layout=Et*14|t*10,L'
expect pplayout '--pipeline-model-parallel-layout Et\{14\}|t\{10\}L' \
  'no --pipeline-model-parallel-layout'

# Sequence parallelism (sp=1 -> --sequence-parallel).
layout_case sp v100-8x8 gpt3-medium-moe.json 'dp=8,tp=4,pp=1,ep=8,esp=4,microbatches=4,sp=1'
expect sp '^megatron flags: .*--sequence-parallel' 'no --sequence-parallel'
expect sp '+sp' 'the table does not mark sp'

# Context parallelism and the etp alias (cp=2 -> --context-parallel-size).
layout_case cp h100-8x8 llama3-8b-dense.json 'dp=8,tp=4,cp=2,pp=1,ep=1,etp=1,microbatches=4,sp=1'
expect cp '^megatron flags: .*--expert-tensor-parallel-size 1 .*--context-parallel-size 2' \
  'no --context-parallel-size 2'
expect cp '+sp+cp2' 'the table does not mark cp'

# Selective recomputation (recompute=MODULES -> --recompute-modules).
layout_case rc v100-8x8 gpt3-medium-moe.json \
  'dp=8,tp=4,pp=1,ep=8,esp=4,microbatches=4,recompute=core_attn+moe_act'
expect rc '^megatron flags: .*--recompute-granularity selective --recompute-modules core_attn moe_act' \
  'no --recompute-modules'
expect rc '+rc:core_attn+moe_act' 'the table does not mark the recomputed modules'

# A2A overlap across micro-batches (a2a_overlap=1 -> --overlap-moe-expert-parallel-comm).
layout_case a2a v100-8x8 gpt3-medium-moe.json \
  'dp=32,tp=1,pp=1,ep=32,esp=1,microbatches=8,a2a_overlap=1'
expect a2a '^megatron flags: .*--moe-token-dispatcher-type alltoall --overlap-moe-expert-parallel-comm' \
  'no --overlap-moe-expert-parallel-comm'
expect a2a '+a2a' 'the table does not mark the overlap'

# Megatron-Core's communication overlaps (overlap_param_gather=1, tp_comm_overlap=1).
layout_case overlaps v100-8x8 gpt3-medium-moe.json \
  'dp=8,tp=4,pp=1,ep=8,esp=4,microbatches=4,zero=1,sp=1,overlap_param_gather=1,tp_comm_overlap=1'
expect overlaps '^megatron flags: .*--overlap-grad-reduce --overlap-param-gather --tp-comm-overlap' \
  'no --overlap-param-gather --tp-comm-overlap'

# DeepEP's dispatcher (dispatcher=deepep -> the flex dispatcher with its backend).
layout_case deepep v100-8x8 gpt3-medium-moe.json \
  'dp=32,tp=1,pp=1,ep=32,esp=1,microbatches=8,dispatcher=deepep'
expect deepep '^megatron flags: .*--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep' \
  'no --moe-flex-dispatcher-backend deepep'
expect deepep '+deepep' 'the table does not mark the dispatcher'

# The allgather dispatcher (dispatcher=allgather -> --moe-token-dispatcher-type allgather).
layout_case allgather v100-8x8 gpt3-medium-moe.json \
  'dp=32,tp=1,pp=1,ep=32,esp=1,microbatches=8,dispatcher=allgather'
expect allgather '^megatron flags: .*--moe-token-dispatcher-type allgather' \
  'no --moe-token-dispatcher-type allgather'
expect allgather '+allgather' 'the table does not mark the dispatcher'

# DualPipe: no Megatron-LM schedule, said in a note before the degrees.
layout_case dual v100-8x8 gpt3-medium-moe.json 'dp=16,tp=1,pp=4,ep=16,esp=1,microbatches=16,pipeline=dualpipe'
expect dual '^note: pipeline=dualpipe is DeepSeek' 'no note that Megatron-LM has no DualPipe'
expect dual 'dualpipe' 'the table does not name dualpipe'

# FP8 training, a model field (fp8_format -> --fp8-format, --fp8-recipe, --fp8-param-gather).
"$py" -c '
import json, sys
m = json.load(open(sys.argv[1]))
m.update(fp8_format="hybrid", fp8_recipe="blockwise", fp8_param_gather=True)
json.dump(m, open(sys.argv[2], "w"))
' "$src/examples/models/gpt3-medium-moe.json" "$work/fp8-model.json"
"$py" "$src/examples/launcher.py" --server "$addr" --stubs "$stubs" --cluster h100-8x8 \
  --model "$work/fp8-model.json" --layout 'dp=32,tp=1,pp=1,ep=32,esp=1,microbatches=8,zero=1' \
  >"$work/fp8.out" 2>"$work/fp8.err" || fail "launcher (fp8) failed: $(cat "$work/fp8.err")"
expect fp8 '^megatron flags: .*--fp8-format hybrid --fp8-recipe blockwise --fp8-param-gather' \
  'no --fp8-format hybrid --fp8-recipe blockwise --fp8-param-gather'

# --- the launcher: a bad --layout key, and a layout the server refuses --------------
rc=0
"$py" "$src/examples/launcher.py" --server "$addr" --stubs "$stubs" \
  --model "$src/examples/models/gpt3-medium-moe.json" --layout dp=32,tp=1,pp=1,ep=32,esp=1,foo=2 \
  >"$work/badkey.out" 2>"$work/badkey.err" || rc=$?
[[ $rc -eq 1 ]] || fail "launcher accepted --layout key foo (exit $rc)"
grep -q "^launcher: error: --layout: unknown key 'foo' (known: dp, tp, " "$work/badkey.err" ||
  fail "bad --layout key: $(cat "$work/badkey.err")"
[[ $(wc -l <"$work/badkey.err") -eq 1 && ! -s $work/badkey.out ]] ||
  fail "bad --layout key: not one line on stderr alone"
rc=0
"$py" "$src/examples/launcher.py" --server "$addr" --stubs "$stubs" --cluster v100-8x8 \
  --model "$src/examples/models/gpt3-medium-moe.json" --layout dp=2,tp=16,pp=1,ep=8,esp=4 \
  >"$work/badtp.out" 2>"$work/badtp.err" || rc=$?
[[ $rc -eq 1 ]] && grep -q 'INVALID_ARGUMENT: layout.tp' "$work/badtp.err" ||
  fail "tp=16 on 8-GPU nodes: want INVALID_ARGUMENT naming layout.tp, got exit $rc: $(cat "$work/badtp.err")"

# --- a second server over TLS with a bearer token (throw-away CA) ---------------
bash "$src/tests/server/make_test_certs.sh" "$work/certs" || fail "cannot make test certificates (openssl)"
mkdir -p "$work/tls-data"
"$server_bin" --listen 127.0.0.1:0 --data-dir "$work/tls-data" --tls-cert "$work/certs/server.pem" \
  --tls-key "$work/certs/server.key" --token-file "$work/certs/token" \
  >"$work/tls.out" 2>"$work/tls.err" &
tls_pid=$!
tls_addr=""
for _ in $(seq 1 200); do
  line=$(grep -m1 '^moeplan-server listening on ' "$work/tls.out" || true)
  if [[ -n $line ]]; then
    tls_addr=localhost:${line##*:}
    break
  fi
  kill -0 "$tls_pid" 2>/dev/null || fail "TLS server exited before listening: $(cat "$work/tls.err")"
  sleep 0.1
done
[[ -n $tls_addr ]] || fail "TLS server did not print 'listening on' within 20 s"

# --- the client wrapper ------------------------------------------------------------
rc=0
MOEPLAN_SERVER=$addr MOEPLAN_PYTHONPATH=$stubs MOEPLAN_SOURCE_DIR=$src \
  MOEPLAN_TLS_SERVER=$tls_addr MOEPLAN_TLS_CA=$work/certs/ca.pem MOEPLAN_TOKEN_FILE=$work/certs/token \
  "$py" "$src/tests/python/client_test.py" -v || rc=$?
kill -TERM "$tls_pid" 2>/dev/null || true
wait "$tls_pid" 2>/dev/null || true
[[ $rc -eq 0 ]] || fail "client_test.py exited $rc"

# --- SIGTERM: the server drains and exits 0 ------------------------------------------
kill -TERM "$server_pid"
for _ in $(seq 1 150); do  # 15 s
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.1
done
kill -0 "$server_pid" 2>/dev/null && fail "server still running 15 s after SIGTERM"
rc=0
wait "$server_pid" || rc=$?
server_pid=""
[[ $rc -eq 0 ]] || fail "server exited $rc after SIGTERM"
echo "PASS"
