#!/usr/bin/env bash
# Keeps the libraries readable (docs/conventions.md "Size"): no source file of
# planner/, proto/, requests/, calibration/, server/ or executor/ over MAX_FILE_LINES
# lines and no function there over MAX_FUNCTION_LINES lines, generated code
# and tests aside. Function extents come from universal-ctags (its `end:`
# field), so the count runs from the signature's first line to the closing
# brace. Exits 1 naming every offender.
#   bash scripts/check-size.sh              check the repository
#   bash scripts/check-size.sh --self-test  show it failing under limits the code exceeds
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ${1:-} == --self-test ]]; then
  out=$(MAX_FILE_LINES=100 MAX_FUNCTION_LINES=20 bash "$0" 2>&1) && {
    echo "check-size self-test: passed under limits of 100 lines a file and 20 a function" >&2
    exit 1
  }
  grep -q "planner/src/layout_search.cc has .* lines (limit 100)" <<<"$out" &&
    grep -q "is .* lines (limit 20): split it" <<<"$out" || {
    echo "check-size self-test: the failure does not name the file and the function:" >&2
    echo "$out" | head -5 >&2
    exit 1
  }
  echo "check-size self-test: ok (fails naming files and functions over the limits)"
  exit 0
fi
MAX_FILE_LINES="${MAX_FILE_LINES:-600}"
MAX_FUNCTION_LINES="${MAX_FUNCTION_LINES:-85}"
FOLDERS=(planner proto requests calibration server executor)
# Files exempt from the file limit, each with its reason (functions still count).
declare -A EXEMPT=(
  [executor/src/cuda/cuda_kernels.cu]="compiled only where CUDA is found (no nvcc here or in CI):
    split it in a session that can build and run the GPU tests"
)

if ! command -v ctags >/dev/null || ! ctags --version 2>/dev/null | grep -q "Universal Ctags"; then
  echo "check-size: needs universal-ctags (scripts/setup.sh installs it)" >&2
  exit 2
fi
mapfile -t files < <(git ls-files "${FOLDERS[@]/%//*.cc}" "${FOLDERS[@]/%//*.h}" "${FOLDERS[@]/%//*.cu}" |
  grep -v '/fixtures/' || true)
status=0
for f in "${files[@]}"; do
  n=$(wc -l <"$f")
  if ((n > MAX_FILE_LINES)) && [[ -z ${EXEMPT[$f]:-} ]]; then
    echo "check-size: $f has $n lines (limit $MAX_FILE_LINES): split it by job" >&2
    status=1
  fi
done
while IFS=$'\t' read -r lines where name; do
  echo "check-size: $where $name is $lines lines (limit $MAX_FUNCTION_LINES): split it" >&2
  status=1
done < <(ctags --fields=+ne --c++-kinds=f --language-force=C++ -o - "${files[@]}" 2>/dev/null |
  awk -F'\t' -v max="$MAX_FUNCTION_LINES" '{
    line = ""; end = "";
    for (i = 4; i <= NF; i++) {
      if ($i ~ /^line:/) line = substr($i, 6);
      if ($i ~ /^end:/) end = substr($i, 5);
    }
    if (line != "" && end != "" && end - line + 1 > max) print end - line + 1 "\t" $2 ":" line "\t" $1
  }')
if ((status == 0)); then
  echo "check-size: ${#files[@]} files within $MAX_FILE_LINES lines, every function within $MAX_FUNCTION_LINES"
fi
exit "$status"
