#!/usr/bin/env bash
# The checks that need a GPU node, in under 10 minutes, with one JSON summary:
#   bash tools/gpu_check.sh [--out gpu_check.json] [--steps 30] [--batch 256]
# Run it from the repository root in the environment the benchmark is installed in
# (pip install -e '.[cuda]'); see tools/gpu_check.py for what each check measures.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
exec timeout -k 10 600 "$PYTHON" tools/gpu_check.py "$@"
