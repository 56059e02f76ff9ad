#!/usr/bin/env bash
# moeplan installed like a tool (README.md "Install"):
#   install_test.sh BUILD_DIR
# 1. `cmake --install` into a temporary prefix; 2. CPack's Debian package(s),
# unpacked into a scratch root with dpkg-deb. From an empty directory, with
# a bare environment (no build tree, no repository on any path), each
# installation's binaries print their version and complete help, list the
# built-in profiles, plan a layer and a model from the installed examples, serve
# a plan to the installed Python client, and leave the directory empty.
set -uo pipefail
BUILD=$(cd "$1" && pwd)
TMP=$(mktemp -d)
server_pid=""
cleanup() {
  [[ -n $server_pid ]] && kill -TERM "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
fail=0
bad() { echo "FAIL: $*" >&2; fail=1; }

cmake --install "$BUILD" --prefix "$TMP/prefix" >"$TMP/install.log" 2>&1 ||
  { cat "$TMP/install.log" >&2; exit 1; }
(cd "$TMP" && cpack -G DEB --config "$BUILD/CPackConfig.cmake" -B "$TMP/pkg") \
  >"$TMP/cpack.log" 2>&1 || { cat "$TMP/cpack.log" >&2; exit 1; }
debs=("$TMP"/pkg/*.deb)
[[ -e ${debs[0]} ]] || { echo "FAIL: cpack made no .deb: $(cat "$TMP/cpack.log")" >&2; exit 1; }
for deb in "${debs[@]}"; do
  dpkg-deb -x "$deb" "$TMP/root" || bad "dpkg-deb -x $deb"
done
main_deb=$(ls "$TMP"/pkg/moeplan_*.deb 2>/dev/null | head -1)
[[ -n $main_deb ]] || bad "no moeplan_*.deb among: ${debs[*]}"
depends=$(dpkg-deb -f "$main_deb" Depends 2>/dev/null)
for dep in libgrpc++ libprotobuf python3-grpcio; do
  [[ $depends == *"$dep"* ]] || bad "the package does not depend on $dep: $depends"
done
[[ $depends == *libtorch* ]] && bad "the main package depends on libtorch: $depends"

check_install() {  # root: the installation's prefix (PREFIX, or ROOT/usr)
  local root=$1 name=$2 out="$TMP/out-$2"
  local empty="$TMP/empty-$2"
  mkdir -p "$empty" "$out" "$TMP/home-$2"
  run() {
    (cd "$empty" && exec env -i PATH="$root/bin:/usr/bin:/bin" HOME="$TMP/home-$name" \
      PYTHONPATH="$root/lib/python3/dist-packages" OMPI_ALLOW_RUN_AS_ROOT=1 \
      OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$@")
  }
  for bin in moeplan moeplan-server moeplan-profile moeplan-exec; do
    [[ -x $root/bin/$bin ]] || bad "$name: bin/$bin not installed"
    run "$bin" --version >"$out/$bin.version" 2>&1 || bad "$name: $bin --version failed"
    grep -q "^$bin [0-9]" "$out/$bin.version" || bad "$name: $bin --version: $(cat "$out/$bin.version")"
  done
  run moeplan --help >"$out/help" 2>&1 || bad "$name: moeplan --help failed"
  for cmd in plan-layer plan-model sweep profiles calibrate validate profile-check import-hf; do
    grep -q "^  $cmd" "$out/help" || bad "$name: moeplan --help does not list $cmd"
  done
  run moeplan profiles list >"$out/profiles" 2>&1 || bad "$name: moeplan profiles list failed"
  grep -q "a100-8x8" "$out/profiles" || bad "$name: the built-in profiles are not listed"
  [[ -f $root/share/moeplan/profiles/a100-8x8.json ]] || bad "$name: profiles not installed"
  local ex="$root/share/moeplan/examples"
  run moeplan plan-layer --layer "$ex/gpt2-moe-layer.json" --html "$out/layer.html" >"$out/layer" 2>&1 ||
    bad "$name: plan-layer failed: $(tail -3 "$out/layer")"
  grep -qi "best" "$out/layer" || bad "$name: plan-layer printed no plan: $(tail -3 "$out/layer")"
  grep -q "Chart.js v" "$out/layer.html" 2>/dev/null || bad "$name: plan-layer --html wrote no report"
  run moeplan plan-model --model "$ex/models/gpt3-medium-moe.json" --cluster v100-8x8 \
    >"$out/model" 2>&1 || bad "$name: plan-model failed: $(tail -3 "$out/model")"
  grep -q "AlltoAll algorithms" "$out/model" || bad "$name: plan-model printed no plan"
  # The installed server and Python client (the launcher from the examples).
  run moeplan-server --listen 127.0.0.1:0 --data-dir "$TMP/data-$name" --no-request-log \
    >"$out/server.out" 2>"$out/server.err" &
  server_pid=$!
  local port=""
  for _ in $(seq 100); do
    [[ $(head -n1 "$out/server.out" 2>/dev/null) =~ listening\ on\ 127\.0\.0\.1:([0-9]+) ]] &&
      port=${BASH_REMATCH[1]} && break
    sleep 0.1
  done
  if [[ -z $port ]]; then
    bad "$name: the installed server did not start: $(cat "$out/server.err")"
  else
    run /usr/bin/python3 "$ex/launcher.py" --server "127.0.0.1:$port" >"$out/launcher" 2>&1 ||
      bad "$name: the launcher failed: $(tail -3 "$out/launcher")"
    grep -q "training flags:" "$out/launcher" || bad "$name: launcher: $(tail -3 "$out/launcher")"
    # A model's layout search on the server, its time reported back.
    run /usr/bin/python3 "$ex/launcher.py" --server "127.0.0.1:$port" --model \
      "$ex/models/gpt3-medium-moe.json" --cluster v100-8x8 --gpus 32 --top 3 \
      >"$out/launcher-model" 2>&1 || bad "$name: the launcher's model search failed: $(tail -3 "$out/launcher-model")"
    grep -Eq "^search: .* in [0-9.]+ ms" "$out/launcher-model" && ! grep -q " in 0.0 ms" "$out/launcher-model" ||
      bad "$name: the launcher's search: $(grep "^search" "$out/launcher-model")"
    run /usr/bin/python3 -c "import moeplan_client, moeplan.v1.service_pb2_grpc" ||
      bad "$name: the Python client does not import"
  fi
  kill -TERM "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  server_pid=""
  [[ -z $(ls -A "$empty") ]] || bad "$name: files left in the working directory: $(ls -A "$empty")"
}

check_install "$TMP/prefix" prefix
check_install "$TMP/root/usr" deb
if [[ -d $BUILD/client/python/moeplan/torch ]]; then
  [[ -f $TMP/prefix/lib/python3/dist-packages/moeplan/torch/__init__.py ]] ||
    bad "moeplan.torch was built but not installed"
  ls "$TMP"/pkg/moeplan-torch_*.deb >/dev/null 2>&1 || bad "no moeplan-torch package"
  (cd "$TMP/empty-prefix" && env -i PATH=/usr/bin:/bin HOME="$TMP/home-prefix" \
    PYTHONPATH="$TMP/prefix/lib/python3/dist-packages" /usr/bin/python3 -c \
    "import moeplan.torch, sys; sys.exit(0 if hasattr(moeplan.torch, 'MoE') else 1)") \
    >"$TMP/torch.log" 2>&1 || bad "the installed moeplan.torch does not import: $(tail -3 "$TMP/torch.log")"
fi
[[ $fail == 0 ]] && echo "install_test: the prefix and the package (${debs[*]##*/}) work from an empty directory"
exit $fail
