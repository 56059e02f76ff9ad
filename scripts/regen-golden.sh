#!/usr/bin/env bash
# Regenerates the golden plan dumps in tests/golden/ from the current build.
# Review the diff (git diff tests/golden) before committing: every change in a
# number is a change in what moeplan predicts.
set -euo pipefail
cd "$(dirname "$0")/.."
cli=./build/client/moeplan
[ -x "$cli" ] || bash scripts/setup.sh
for layer in examples/*-layer.json; do
  name=$(basename "$layer" .json)
  for cluster in a100-8x8 h200-8x8; do
    out=tests/golden/$name.$cluster.json
    "$cli" plan-layer --layer "$layer" --cluster "$cluster" --format json > "$out.tmp"
    mv "$out.tmp" "$out"
    echo "wrote $out"
  done
done
