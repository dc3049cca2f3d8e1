#!/usr/bin/env bash
# GPU smoke (infra/device/gpu_smoke.py): install what it needs from carried wheels, then run it with a
# timeout. Run from anywhere; it works in the repository root.
#
#   bash infra/gpu_smoke.sh                      # on the GPU machine (no network needed)
#   bash infra/gpu_smoke.sh --parts hf,grpo_hf   # arguments go to infra/device/gpu_smoke.py (the lent
#                                                # machine has no vLLM: these two parts)
#   bash infra/gpu_smoke.sh --fetch              # HERE, with PyPI: fill the wheel folder
#                                                # (infra/device/fetch_wheels.sh)
#
# Wheels: $GRPO_WHEELS, else the first of .whl and shared/wheels that holds *.whl
# (infra/wheels/README.md says what goes in, and why vLLM rarely fits the device tool's 64 MiB).
# Install, into the environment of $GRPO_SMOKE_PYTHON (default python3, the image's torch python),
# with --no-index only: first resolved (pip installs just what is missing or too old, keeping the
# image's torch unless a carried vllm pins another), else every carried wheel with --no-deps.
# Skipped when everything needed imports already, or with GRPO_SMOKE_INSTALL=0.
# Time: GRPO_SMOKE_TIMEOUT (default 480 s) bounds the script; it gets 30 s less as its own
# deadline, so it can still write $OUT/gpu_smoke.json (and gpu_smoke.log) when parts run long.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${GRPO_SMOKE_PYTHON:-python3}
# The project's imports that the device image lacks (infra/device/requirements.txt lists the
# wheels, with their needs).
NEED="trl datasets math-verify duckdb pydantic"

if [ "${1:-}" = "--fetch" ]; then
  W=${GRPO_WHEELS:-.whl}
  bash infra/device/fetch_wheels.sh "$W" || exit 1
  if [ -n "${GRPO_SMOKE_VLLM:-}" ]; then  # e.g. vllm==0.22.1 (locks/gpu.txt): with ALL its deps, gigabytes
    PLAT="--only-binary=:all: --python-version ${GRPO_SMOKE_PYVER:-3.12} --implementation cp"
    for t in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do
      PLAT="$PLAT --platform ${t}_x86_64"
    done
    # shellcheck disable=SC2086
    python3 -m pip download -q $PLAT -d "$W" "$GRPO_SMOKE_VLLM" || exit 1
    echo "gpu_smoke: with vllm: $(du -sh "$W" | cut -f1) in $W (over the device tool's 64 MiB)"
  fi
  exit 0
fi

W=${GRPO_WHEELS:-}
if [ -z "$W" ]; then
  for d in .whl shared/wheels; do
    if compgen -G "$d/*.whl" >/dev/null; then W=$d; break; fi
  done
fi
echo "gpu_smoke: $($PY -c 'import sys; print(sys.executable, sys.version.split()[0])'), wheels: ${W:-none}"
nvidia-smi -L 2>/dev/null || echo "gpu_smoke: nvidia-smi lists no GPU"
want=$NEED
if [ -n "$W" ] && compgen -G "$W/vllm-*.whl" >/dev/null; then want="$want vllm"; fi
# module names: math-verify -> math_verify
mods=$(echo "$want" | tr '-' '_')
# shellcheck disable=SC2086
if [ "${GRPO_SMOKE_INSTALL:-1}" = 0 ] || $PY -c 'import importlib.util as u, sys
sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))' $mods; then
  echo "gpu_smoke: no install ($want importable, or GRPO_SMOKE_INSTALL=0)"
elif [ -z "$W" ]; then
  echo "gpu_smoke: $want not all importable and no wheel folder: the script reports what fails"
else
  t0=$SECONDS
  PIPI="$PY -m pip install -q --no-index --disable-pip-version-check --no-cache-dir"
  # shellcheck disable=SC2086
  $PIPI --find-links "$W" $want \
    || { echo "gpu_smoke: resolving install failed; installing every wheel with --no-deps"
         $PIPI --no-deps "$W"/*.whl; } \
    || echo "gpu_smoke: install failed: the script reports what is missing"
  echo "gpu_smoke: install took $((SECONDS - t0)) s"
fi

T=${GRPO_SMOKE_TIMEOUT:-480}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout -k 15 "$T" $PY infra/device/gpu_smoke.py --deadline $((T - 30)) "$@"
rc=$?
[ "$rc" = 124 ] && echo "gpu_smoke: stopped after $T s (GRPO_SMOKE_TIMEOUT)"
exit "$rc"
