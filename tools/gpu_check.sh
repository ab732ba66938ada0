#!/usr/bin/env bash
# The checks that need a GPU node, under one deadline (600 s), with one JSON summary that is
# rewritten after every check:
#   bash tools/gpu_check.sh [--install] [--out gpu_check.json] [--steps 200] [--batch 256]
#       [--deadline 600]
# Run it from the repository root. --install first makes a virtual environment of its own
# (GPU_CHECK_VENV, default .venv-gpu-check) with this package and its cuda extra, never
# touching the machine's other Python packages; without --install it runs in the environment
# the benchmark is installed in (PYTHON, default python). See tools/gpu_check.py for what each
# check measures.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
if [[ ${1:-} == --install ]]; then
    shift
    VENV="${GPU_CHECK_VENV:-.venv-gpu-check}"
    log="$(mktemp -t gpu-check-install.XXXXXX)"
    created=0
    [[ -d $VENV ]] || created=1
    if ! { python3 -m venv "$VENV" && "$VENV/bin/pip" install --quiet --timeout 30 -e ".[cuda]"; } \
        >"$log" 2>&1; then
        [[ $created == 1 ]] && rm -rf "$VENV"  # nothing half-installed left behind
        echo "gpu_check.sh: error: could not install the package with its cuda extra into" \
            "$VENV (is the package index reachable? pip's log: $log)" >&2
        exit 2
    fi
    rm -f "$log"
    PYTHON="$VENV/bin/python"
fi
# The outer limit only backs up the harness's own deadline (which it passes to each check).
deadline=600
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    [[ ${args[i]} == --deadline && $((i + 1)) -lt ${#args[@]} ]] && deadline=${args[i + 1]%.*}
done
[[ $deadline =~ ^[0-9]+$ ]] || deadline=600
exec timeout -k 10 $((deadline + 60)) "$PYTHON" tools/gpu_check.py "$@"
