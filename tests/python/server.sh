# Sourced by the Python tests: starts moeplan-server on 127.0.0.1:0 with a data
# dir under $work and waits (bounded) for its "listening on" line.
#   start_server SERVER_BIN [extra server flags...]
# Sets server_pid and addr; calls fail (the caller's) on any problem.
start_server() {
  local bin=$1 line
  shift
  mkdir -p "$work/data"
  "$bin" --listen 127.0.0.1:0 --data-dir "$work/data" "$@" \
    >"$work/server.out" 2>"$work/server.err" &
  server_pid=$!
  addr=""
  for _ in $(seq 1 200); do  # 200 x 0.1 s = 20 s
    line=$(grep -m1 '^moeplan-server listening on ' "$work/server.out" || true)
    if [[ -n $line ]]; then
      addr=${line#moeplan-server listening on }
      break
    fi
    kill -0 "$server_pid" 2>/dev/null || fail "server exited before listening"
    sleep 0.1
  done
  [[ -n $addr ]] || fail "server did not print 'listening on' within 20 s"
  [[ $addr =~ ^127\.0\.0\.1:[0-9]+$ ]] || fail "unexpected listen address '$addr'"
  [[ $addr != 127.0.0.1:0 ]] || fail "server reported port 0"
  echo "server listening on $addr"
}
