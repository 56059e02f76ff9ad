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
# Whole models (docs/model.md): <model file stem>.<cluster>.json
mkdir -p tests/golden/models
for pair in gpt2-s-moe.a100:a100-8x8 gpt2-l-moe-bpr.a100:a100-8x8 fine-grained-moe:a100-8x8; do
  model=${pair%%:*}
  cluster=${pair##*:}
  out=tests/golden/models/$model.$cluster.json
  "$cli" plan-model --model "examples/models/$model.json" --cluster "$cluster" --format json \
    > "$out.tmp"
  mv "$out.tmp" "$out"
  echo "wrote $out"
done
