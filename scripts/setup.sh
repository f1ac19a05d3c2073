#!/usr/bin/env bash
# Create .venv and install fugu_pipeline with its dev tools.
#
# torch is installed first, pinned, so pip never picks a build by accident:
#   - default: torch==2.13.0 (on Linux from PyPI this is the CUDA build, right for a GPU box;
#     on a machine with a local CPU wheel, pip takes that file)
#   - CPU-only machine, smaller download:  FUGU_TORCH_INDEX=https://download.pytorch.org/whl/cpu
#   - any other build:                    FUGU_TORCH_SPEC='torch==2.x.y' FUGU_TORCH_INDEX=<index url>
# A torch that is already importable in .venv is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
"$VPY" -m pip install -q --upgrade pip
if ! "$VPY" -c "import torch" 2>/dev/null; then
  spec=${FUGU_TORCH_SPEC:-torch==2.13.0}
  if [ -n "${FUGU_TORCH_INDEX:-}" ]; then
    "$VPY" -m pip install -q "$spec" --index-url "$FUGU_TORCH_INDEX"
  else
    "$VPY" -m pip install -q "$spec"
  fi
fi
"$VPY" -m pip install -q -e '.[dev]'
"$VPY" -c "import torch, dagster; print(f'ready: torch {torch.__version__} (cuda: {torch.cuda.is_available()}), dagster {dagster.__version__}')"
