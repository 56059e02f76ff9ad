#!/usr/bin/env bash
# The main job on the built-in default: installs, builds, and plans the
# GPT-2-style example layer on the default cluster profile (a100-8x8), writing a
# Perfetto-ready timeline to build/gpt2-moe-trace.json.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
./build/client/moeplan plan-layer --layer examples/gpt2-moe-layer.json \
  --trace build/gpt2-moe-trace.json "$@"
echo "timeline written to build/gpt2-moe-trace.json (open it in https://ui.perfetto.dev)" >&2
