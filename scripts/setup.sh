#!/usr/bin/env bash
# Installs the Debian packages moeplan builds with, and checks its docs with (scripts/docs.sh),
# (idempotent: apt runs only when something is missing) and builds it with ccache into build/
# (or $BUILD_DIR).
#   bash scripts/setup.sh [extra cmake args...]
# Environment: BUILD_DIR (default build), BUILD_TARGETS (default all), JOBS,
# EXTRA_PACKAGES (more Debian packages this build needs, e.g. clang for fuzz/),
# WITH_TORCH=0 (leave out PyTorch and moeplan.torch: its packages are not
# installed and CMake says the extension is not built).
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build pkgconf ccache
  libboost-dev libeigen3-dev libabsl-dev
  libprotobuf-dev protobuf-compiler libgrpc++-dev protobuf-compiler-grpc
  libgtest-dev libgmock-dev libbenchmark-dev
  libfmt-dev libspdlog-dev libcli11-dev zlib1g-dev rapidjson-dev libcpp-httplib-dev
  libopenmpi-dev openmpi-bin
  python3 python3-grpcio python3-protobuf
  gnuplot-nox iproute2 openssl prometheus libjs-chart.js chromium
  mkdocs python3-pymdownx linkchecker universal-ctags
)
# moeplan.torch (pytorch/README.md): Debian's CPU libtorch 1.13 for
# /usr/bin/python3, pybind11, and what examples/train_gpt_moe.py draws with.
if [[ ${WITH_TORCH:-1} != 0 ]]; then
  PACKAGES+=(libtorch-dev python3-torch pybind11-dev python3-matplotlib python3-tqdm)
fi
# shellcheck disable=SC2206
PACKAGES+=(${EXTRA_PACKAGES:-})

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

BUILD_DIR="${BUILD_DIR:-build}"
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"  # cache hits across clones
# ...which -g defeats unless the working directory stays out of the hash: with
# it in, a clone in another folder (CI's, a worktree) missed on every file.
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
JOBS="${JOBS:-$(nproc)}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
# BUILD_TARGETS: build only these (space-separated); default everything.
# shellcheck disable=SC2086
cmake --build "$BUILD_DIR" -j "$JOBS" ${BUILD_TARGETS:+--target $BUILD_TARGETS}
