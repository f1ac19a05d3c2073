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
# With uv, pip unpacks torch (and its dependencies) without compiling them, and their bytecode
# (thousands of files, half a minute on one core) is compiled on every core while uv installs the
# rest, which it compiles itself (--compile-bytecode): the bytecode matters
# where PYTHONDONTWRITEBYTECODE is set, as every process would otherwise compile torch again.
# For the same reason the project's own modules are compiled once here: an editable install leaves
# them as sources, and every process (each `fugu-lite`, `dagster dev`'s servers, each run and step)
# compiled the ~200 of them again: about 0.2 s of CPU each time (0.62 against 0.41 s of the
# modules' own import time, 3 tries each). Python ignores an edited file's stale bytecode (it
# checks the source's time stamp).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
"$VPY" -m pip install -q --upgrade pip
use_uv=no
[ "${FUGU_INSTALLER:-uv}" = uv ] && "$VPY" -m pip install -q uv && use_uv=yes
compile_torch=
if ! "$VPY" -c "import torch" 2>/dev/null; then
  spec=${FUGU_TORCH_SPEC:-torch==2.13.0}
  args=(-q "$spec")
  [ -n "${FUGU_TORCH_INDEX:-}" ] && args+=(--index-url "$FUGU_TORCH_INDEX")
  [ "$use_uv" = yes ] && args+=(--no-compile)
  "$VPY" -m pip install "${args[@]}"
  if [ "$use_uv" = yes ]; then
    # torch and what pip installed with it, as they are now (uv keeps them: they satisfy the project)
    mapfile -t installed < <("$VPY" -c "import sysconfig, pathlib; print(*(p for p in pathlib.Path(sysconfig.get_paths()['purelib']).iterdir() if p.is_dir() and not p.name.endswith('-info')), sep=chr(10))")
    "$VPY" -m compileall -q -j 0 "${installed[@]}" > /dev/null &
    compile_torch=$!
  fi
fi
extras=${FUGU_EXTRAS:-dev}
if [ "$use_uv" = yes ]; then
  .venv/bin/uv pip install -q --compile-bytecode --python "$VPY" -e ".[$extras]"
  # its status is not checked: torch ships a test file in Python 3.12 syntax, which pip's own compile skips too
  [ -z "$compile_torch" ] || wait "$compile_torch" || true
else
  [ "${FUGU_INSTALLER:-uv}" = uv ] && echo "setup: uv could not be installed; installing with pip (slower)" >&2
  "$VPY" -m pip install -q -e ".[$extras]"
fi
"$VPY" -m compileall -q -j 0 fugu_pipeline fugu_pipeline_tests > /dev/null  # the package and the tests' helper modules
"$VPY" -c "import torch, dagster; print(f'ready: torch {torch.__version__} (cuda: {torch.cuda.is_available()}), dagster {dagster.__version__}')"
