#!/usr/bin/env bash
# Fill a wheel folder for the lent GPU machine (run HERE, where PyPI is reachable):
#
#   bash infra/device/fetch_wheels.sh [DIR]      # default: .whl (git-ignored), the folder
#                                                # infra/gpu_smoke.sh installs from
#
# Downloads infra/device/requirements.txt with --no-deps for python ${GRPO_SMOKE_PYVER:-3.12}
# manylinux x86-64 wheels only, then checks the folder fits the device tool's carry limit
# (GRPO_WHEELS_MAX_MIB, default 64): exit 1 when it does not. Prints the wheel count and size.
set -euo pipefail
cd "$(dirname "$0")/../.."
W=${1:-${GRPO_WHEELS:-.whl}}
MAX_MIB=${GRPO_WHEELS_MAX_MIB:-64}
REQ=infra/device/requirements.txt
PIP=${GRPO_PIP:-python3 -m pip}
mkdir -p "$W"
PLAT="--only-binary=:all: --python-version ${GRPO_SMOKE_PYVER:-3.12} --implementation cp"
for t in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do
  PLAT="$PLAT --platform ${t}_x86_64"
done
# shellcheck disable=SC2086
$PIP download -q --disable-pip-version-check --no-deps $PLAT -d "$W" -r "$REQ"
bytes=$(find "$W" -maxdepth 1 -name '*.whl' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
n=$(find "$W" -maxdepth 1 -name '*.whl' | wc -l)
mib=$(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1048576}')
echo "device wheels: $n wheels, $mib MiB ($bytes bytes) in $W (limit $MAX_MIB MiB)"
if [ "$bytes" -gt $((MAX_MIB * 1048576)) ]; then
  echo "device wheels: over the $MAX_MIB MiB carry limit" >&2
  exit 1
fi
