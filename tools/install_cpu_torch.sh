#!/usr/bin/env bash
# Install a CPU-only PyTorch into a virtual environment, for the framework comparison on a
# machine without GPUs (PyPI's default Linux build is a CUDA build: about 4 GB with its CUDA
# libraries and triton). Tries, in order:
#   1. PyTorch's CPU index (download.pytorch.org/whl/cpu), with nothing but that index;
#   2. a CPU build (a "+cpu" release) that pip already sees, e.g. in a local wheel folder;
#   3. the torch extra as pip resolves it (on Linux x86-64: the CUDA build).
#
#   bash tools/install_cpu_torch.sh [VENV]      (default .venv)
set -euo pipefail
VENV=${1:-}
[[ -z $VENV || $VENV == /* ]] || VENV=$PWD/$VENV  # relative to where it was run, not the repo
TESTED=(2.14.1 2.14.0 2.13.1 2.13.0)  # the releases the extra admits, newest first
cd "$(dirname "$0")/.."
VENV=${VENV:-$PWD/.venv}
PIP="$VENV/bin/pip"
if "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  how="(already installed)"
elif "$PIP" install --quiet --isolated --timeout 20 --retries 0 \
    --index-url https://download.pytorch.org/whl/cpu "torch>=2.13,<2.15" 2>/dev/null; then
  how="from PyTorch's CPU index"
else
  how=""
  for version in "${TESTED[@]}"; do
    if "$PIP" install --quiet "torch==$version+cpu" 2>/dev/null; then
      how="from a local CPU build"
      break
    fi
  done
  if [ -z "$how" ]; then
    "$PIP" install --quiet -e ".[torch]"
    how="from the default build (no CPU-only build was reachable)"
  fi
fi
"$VENV/bin/python" -c "import torch; print('installed torch', torch.__version__, \
'(CUDA ' + torch.version.cuda + ' build)' if torch.version.cuda else '(CPU-only build)')" \
  | sed "s|\$| $how|"
