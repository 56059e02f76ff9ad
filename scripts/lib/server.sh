# Sourced by tests and testbed scripts: starts moeplan-server on 127.0.0.1:0
# with its data under DIR and waits (bounded) for its "listening on" line.
#   start_server SERVER_BIN DIR [extra server flags...]
# Sets server_pid and addr (host:port); server.out / server.err land in DIR.
# Returns 1 with the reason on stderr when it does not come up in 20 s.
# kill_server: SIGKILLs it if it still runs (for EXIT traps).
start_server() {
  local bin=$1 dir=$2 line
  shift 2
  mkdir -p "$dir/data"
  "$bin" --listen 127.0.0.1:0 --data-dir "$dir/data" "$@" \
    >"$dir/server.out" 2>"$dir/server.err" &
  server_pid=$!
  addr=""
  for _ in $(seq 1 200); do  # 200 x 0.1 s = 20 s
    line=$(grep -m1 '^moeplan-server listening on ' "$dir/server.out" || true)
    if [[ -n $line ]]; then
      addr=${line#moeplan-server listening on }
      break
    fi
    if ! kill -0 "$server_pid" 2>/dev/null; then
      echo "moeplan-server exited before listening: $(tail -n 5 "$dir/server.err")" >&2
      return 1
    fi
    sleep 0.1
  done
  if [[ ! $addr =~ ^127\.0\.0\.1:[0-9]+$ || $addr == 127.0.0.1:0 ]]; then
    echo "moeplan-server did not print a 'listening on 127.0.0.1:PORT' line within 20 s" >&2
    return 1
  fi
  echo "server listening on $addr"
}

kill_server() {
  if [[ -n ${server_pid:-} ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -KILL "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
}
