#!/usr/bin/env bash
# Train one preset in TensorFlow (hpcai500-tf train) and in PyTorch (hpcai500-tf train --framework pytorch) on
# this machine, then compare the two records: only the framework layer (L5) should differ.
# On a GPU node both sides train on every GPU this process may use (nvidia-smi's, narrowed by
# CUDA_VISIBLE_DEVICES): TensorFlow in one process with the kernels a real run uses there,
# PyTorch with one process per GPU (--workers N); the model layer (L7) then differs as well.
#
#   bash tools/compare_frameworks.sh [PRESET] [OUT_DIR] [--set SECTION.KEY=VALUE ...]
#
# Needs the package and PyTorch in .venv (or the virtual environment named by $VENV):
# pip install -e ".[cpu,torch]". Each side's output goes to OUT_DIR/SIDE.log; if either side
# fails, this says which, with its exit code and the end of its log, and writes no comparison.
set -uo pipefail
absolute() { [[ -z $1 || $1 == /* ]] && echo "$1" || echo "$PWD/$1"; }  # where it was run
VENV=$(absolute "${VENV:-}")
PRESET=${1:-smoke}
OUT=$(absolute "${2:-}")
shift $(( $# > 2 ? 2 : $# ))
cd "$(dirname "$0")/.."
VENV=${VENV:-$PWD/.venv}
OUT=${OUT:-runs/frameworks-$(date +%Y%m%d-%H%M%S)}
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

# The GPUs this process may use: those `nvidia-smi -L` lists, narrowed by CUDA_VISIBLE_DEVICES
# where it is set (up to its first empty or negative entry, as CUDA reads it).
gpu_count() {
  local count=0 entry listed=()
  if command -v nvidia-smi >/dev/null 2>&1; then
    count=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ') || count=0
  fi
  if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
    IFS=, read -ra entries <<<"$CUDA_VISIBLE_DEVICES"
    for entry in ${entries[@]+"${entries[@]}"}; do
      entry=${entry// /}
      { [ -z "$entry" ] || [ "${entry#-}" != "$entry" ] || [ "$entry" = NoDevFiles ]; } && break
      listed+=("$entry")
    done
    [ "${#listed[@]}" -lt "$count" ] && count=${#listed[@]}
  fi
  echo "$count"
}

gpus=$(gpu_count)
if [ "$gpus" -gt 0 ]; then
  # Both sides on every GPU: TensorFlow one replica per GPU in one process, with the kernels a
  # real run uses there (fused batch norm: L7 records them); PyTorch one process per GPU.
  tf_options=()
  torch_options=()
  [ "$gpus" -gt 1 ] && torch_options=(--workers "$gpus")
  echo "== $gpus GPUs: TensorFlow on all of them in one process, PyTorch with one process each"
else
  # On CPUs TensorFlow on its stock Keras layers, as PyTorch runs on its own (L7 records the
  # kernels); its CPU workarounds would make the model layer (L7) differ too.
  tf_options=(--set model.kernels=stock)
  torch_options=()
fi
run_side tensorflow "$VENV/bin/hpcai500-tf" train image_classification --preset "$PRESET" \
  --out "$OUT/tensorflow" ${tf_options[@]+"${tf_options[@]}"} "$@"
run_side pytorch "$VENV/bin/hpcai500-tf" train image_classification --framework pytorch --preset "$PRESET" \
  --out "$OUT/pytorch" ${torch_options[@]+"${torch_options[@]}"} "$@"
"$VENV/bin/hpcai500-tf" compare "$OUT"/tensorflow/*/record.json "$OUT"/pytorch/*/record.json || exit
"$VENV/bin/hpcai500-tf" compare --json "$OUT"/tensorflow/*/record.json \
  "$OUT"/pytorch/*/record.json > "$OUT/comparison.json" || { rm -f "$OUT/comparison.json"; exit 1; }
echo "comparison: $OUT/comparison.json"
