#!/usr/bin/env bash
# The checks that need a GPU node, under one deadline (600 s), with one JSON summary that is
# rewritten after every check:
#   bash tools/gpu_check.sh [--install] [--out gpu_check.json] [--steps 200] [--batch 256]
#       [--deadline 600]
# Run it from the repository root. --install first makes a virtual environment of its own
# (GPU_CHECK_VENV, default .venv-gpu-check) with this package and its cuda extra, never
# touching the machine's other Python packages, from PYTHON (default python3); without
# --install it runs in the environment the benchmark is installed in (PYTHON, default python).
# Either Python must be 3.11 or newer: one line says so and names PYTHON= otherwise. See
# tools/gpu_check.py for what each check measures.
set -euo pipefail
cd "$(dirname "$0")/.."

# The package needs Python 3.11 or newer (Ubuntu 22.04 and DGX OS 6 have 3.10 as python3):
# one line naming the version and the fix (by default PYTHON= naming a newer one).
check_python() { # PYTHON [FIX]
    local version fix=${2:-"install one and name it with PYTHON=/path/to/python3.11"}
    version=$("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || true
    if [[ ! $version =~ ^3\.([0-9]+)$ ]] || ((BASH_REMATCH[1] < 11)); then
        echo "gpu_check.sh: error: $1 is ${version:+Python }${version:-not a Python that runs};" \
            "the package needs 3.11 or newer: $fix" >&2
        exit 2
    fi
}

if [[ ${1:-} == --install ]]; then
    shift
    base=${PYTHON:-python3}
    VENV="${GPU_CHECK_VENV:-.venv-gpu-check}"
    if [[ -x $VENV/bin/python ]]; then # made before: its own Python must do too
        check_python "$VENV/bin/python" "remove $VENV and rerun with PYTHON=/path/to/python3.11"
    else
        check_python "$base"
    fi
    log="$(mktemp -t gpu-check-install.XXXXXX)"
    created=0
    [[ -d $VENV ]] || created=1
    # A venv made before is reused as it is: `venv` over it from another Python (python3 3.10
    # on a second run without PYTHON=) would point it at that Python and its packages.
    if ! { { [[ $created == 0 && -x $VENV/bin/python ]] || "$base" -m venv "$VENV"; } \
        && "$VENV/bin/python" -m pip install --quiet --timeout 30 -e ".[cuda]"; } >"$log" 2>&1; then
        [[ $created == 1 ]] && rm -rf "$VENV"  # nothing half-installed left behind
        echo "gpu_check.sh: error: could not install the package with its cuda extra into" \
            "$VENV (is the package index reachable? pip's log: $log)" >&2
        exit 2
    fi
    rm -f "$log"
    PYTHON="$VENV/bin/python"
else
    PYTHON="${PYTHON:-python}"
    check_python "$PYTHON"
fi
# The outer limit only backs up the harness's own deadline (which it passes to each check).
deadline=600
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    [[ ${args[i]} == --deadline && $((i + 1)) -lt ${#args[@]} ]] && deadline=${args[i + 1]%.*}
    [[ ${args[i]} == --deadline=* ]] && deadline=${args[i]#--deadline=} && deadline=${deadline%.*}
done
[[ $deadline =~ ^[0-9]+$ ]] || deadline=600
exec timeout -k 10 $((deadline + 60)) "$PYTHON" tools/gpu_check.py "$@"
