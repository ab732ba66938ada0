#!/usr/bin/env bash
# Train one preset in TensorFlow (hpcai500-tf train) and in PyTorch (tools/torch_train.py) on
# this machine, then compare the two records: only the framework layer (L5) should differ.
#
#   bash tools/compare_frameworks.sh [PRESET] [OUT_DIR] [--set SECTION.KEY=VALUE ...]
#
# Needs the package and PyTorch in .venv: pip install -e ".[cpu,torch]".
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${1:-smoke}
OUT=${2:-runs/frameworks-$(date +%Y%m%d-%H%M%S)}
shift $(( $# > 2 ? 2 : $# ))
if [ -e "$OUT" ]; then echo "compare_frameworks: $OUT exists; choose another" >&2; exit 2; fi
.venv/bin/hpcai500-tf train image_classification --preset "$PRESET" --out "$OUT/tensorflow" "$@"
.venv/bin/python tools/torch_train.py image_classification --preset "$PRESET" --out "$OUT/pytorch" "$@"
.venv/bin/hpcai500-tf compare "$OUT"/tensorflow/*/record.json "$OUT"/pytorch/*/record.json
