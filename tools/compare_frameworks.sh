#!/usr/bin/env bash
# Train one preset in TensorFlow (hpcai500-tf train) and in PyTorch (hpcai500-tf train --framework pytorch) on
# this machine, then compare the two records: only the framework layer (L5) should differ.
#
#   bash tools/compare_frameworks.sh [PRESET] [OUT_DIR] [--set SECTION.KEY=VALUE ...]
#
# Needs the package and PyTorch in .venv (or the virtual environment named by $VENV):
# pip install -e ".[cpu,torch]". Each side's output goes to OUT_DIR/SIDE.log; if either side
# fails, this says which, with its exit code and the end of its log, and writes no comparison.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PRESET=${1:-smoke}
OUT=${2:-runs/frameworks-$(date +%Y%m%d-%H%M%S)}
shift $(( $# > 2 ? 2 : $# ))
if [ -e "$OUT" ]; then echo "compare_frameworks: $OUT exists; choose another" >&2; exit 2; fi
mkdir -p "$OUT"

run_side() {  # NAME COMMAND...: run one side, its output to the terminal and OUT/NAME.log
  local name=$1; shift
  echo "== $name: $*"
  "$@" 2>&1 | tee "$OUT/$name.log"
  local code=${PIPESTATUS[0]}
  if [ "$code" -ne 0 ]; then
    local why=""
    [ "$code" -gt 128 ] && why=" (killed by signal $((code - 128)): $(kill -l $((code - 128)) 2>/dev/null))"
    echo "compare_frameworks: the $name side failed with exit code $code$why;" \
      "its log: $OUT/$name.log; no comparison written" >&2
    exit "$code"
  fi
}

# TensorFlow on its stock Keras layers, as PyTorch runs on its own (L7 records the kernels);
# its CPU workarounds would make the model layer (L7) differ too.
run_side tensorflow "$VENV/bin/hpcai500-tf" train image_classification --preset "$PRESET" \
  --out "$OUT/tensorflow" --set model.kernels=stock "$@"
run_side pytorch "$VENV/bin/hpcai500-tf" train image_classification --framework pytorch --preset "$PRESET" \
  --out "$OUT/pytorch" "$@"
"$VENV/bin/hpcai500-tf" compare "$OUT"/tensorflow/*/record.json "$OUT"/pytorch/*/record.json || exit
"$VENV/bin/hpcai500-tf" compare --json "$OUT"/tensorflow/*/record.json \
  "$OUT"/pytorch/*/record.json > "$OUT/comparison.json" || { rm -f "$OUT/comparison.json"; exit 1; }
echo "comparison: $OUT/comparison.json"
