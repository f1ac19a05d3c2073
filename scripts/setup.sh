#!/usr/bin/env bash
# Create .venv and install fugu_pipeline with its dev tools.
#
# torch is installed first, by pip and pinned, so no build is ever picked by accident:
#   - default: torch==2.13.0 (on Linux from PyPI this is the CUDA build, right for a GPU box;
#     on a machine with a local CPU wheel, pip takes that file)
#   - CPU-only machine, smaller download:  FUGU_TORCH_INDEX=https://download.pytorch.org/whl/cpu
#   - any other build:                    FUGU_TORCH_SPEC='torch==2.x.y' FUGU_TORCH_INDEX=<index url>
# A torch that is already importable in .venv is kept.
# The rest (about 190 packages) is installed by uv, which fetches them in parallel: a few tens of
# seconds for the downloads where pip, one at a time, took 3 to 10 minutes here. uv keeps the torch installed
# above (it satisfies the project's range). FUGU_INSTALLER=pip installs with pip instead (uv reads
# UV_INDEX_URL, not pip's configuration, for a private index). FUGU_EXTRAS picks the extras (default dev).
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
extras=${FUGU_EXTRAS:-dev}
if [ "${FUGU_INSTALLER:-uv}" = uv ] && "$VPY" -m pip install -q uv; then
  .venv/bin/uv pip install -q --compile-bytecode --python "$VPY" -e ".[$extras]"
else
  [ "${FUGU_INSTALLER:-uv}" = uv ] && echo "setup: uv could not be installed; installing with pip (slower)" >&2
  "$VPY" -m pip install -q -e ".[$extras]"
fi
"$VPY" -c "import torch, dagster; print(f'ready: torch {torch.__version__} (cuda: {torch.cuda.is_available()}), dagster {dagster.__version__}')"
