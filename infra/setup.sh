#!/usr/bin/env bash
# Creates .venv/ in the project root and installs the project with its dev and dask extras
# (dask: the filter.shard_runner=dask runner, tested by tests/test_dask_runner.py).
# Without an NVIDIA GPU it installs the CPU build of torch first, so that pip never
# resolves the bare `torch` requirement to a multi-GB CUDA build (see FIELD-NOTES).
# With a GPU it installs the `gpu` extra (vLLM, which brings its own CUDA torch).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
TORCH_CPU=${TORCH_CPU:-torch==2.13.0}

[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=".venv/bin/python -m pip"
$PIP install -q --upgrade pip >/dev/null 2>&1 || true

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "setup: NVIDIA GPU found: installing the project with the gpu extra (vLLM + CUDA torch)"
  $PIP install -e '.[dev,dask,gpu]'
else
  if ! .venv/bin/python -c 'import torch' >/dev/null 2>&1; then
    echo "setup: no GPU: installing CPU torch ($TORCH_CPU)"
    # A local wheel (pip's find-links) first: instant and offline. Else PyTorch's CPU index.
    # Its dependencies come from the normal index afterwards; torch itself is then satisfied.
    if $PIP install -q --no-index --no-deps "$TORCH_CPU" 2>/dev/null; then
      $PIP install "$TORCH_CPU"
    else
      $PIP install "$TORCH_CPU" --index-url https://download.pytorch.org/whl/cpu \
        --extra-index-url https://pypi.org/simple
    fi
  fi
  $PIP install -e '.[dev,dask]'
fi
.venv/bin/grpo --help >/dev/null && echo "setup: done (.venv ready; try: .venv/bin/grpo --help)"
