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
# Layouts (docs/layouts.md): the commands of tests/cli/golden_test.cc's kLayoutGoldens.
mkdir -p tests/golden/layouts
layout() {
  local out=tests/golden/layouts/$1
  shift
  "$cli" plan-model --format json "$@" > "$out.tmp"
  mv "$out.tmp" "$out"
  echo "wrote $out"
}
layout gpt3-medium-moe.v100-8x8.search.json --model examples/models/gpt3-medium-moe.json \
  --cluster v100-8x8 --search --gpus 32 --top 3 --variants none,dw
layout qwen-moe-like.a100-8x8.layout.json --model examples/models/qwen-moe-like.json \
  --cluster a100-8x8 --layout dp=16,tp=8,pp=8,ep=8,esp=1,microbatches=32,zero=1,pipeline=interleaved,v=2
layout mixtral-8x7b-like.h200-8x8.layout.json --model examples/models/mixtral-8x7b-like.json \
  --cluster h200-8x8 --layout dp=2,tp=8,pp=4,ep=8,esp=1,microbatches=16,family=ppmoe
