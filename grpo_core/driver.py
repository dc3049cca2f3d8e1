"""The NVIDIA driver a lock's CUDA build of torch needs, against this machine's (`grpo doctor`,
`make setup`).

A CUDA build runs on a driver at least as new as its CUDA major needs (NVIDIA's minor-version
compatibility: any CUDA 13.x on a driver >= 580, any 12.x on >= 525). On an older driver torch
still imports, then reports no GPU or fails at the first CUDA call; this check says so first,
with the fix. The CUDA major comes from the lock (or the installed packages): torch's local
label (`2.11.0+cu128`) where there is one, else the pinned CUDA runtime wheel
(`nvidia-cuda-runtime==13.0.96`, `nvidia-cuda-runtime-cu12==12.8.90`). PyPI's torch 2.11.0
(locks/gpu.txt) carries no label and pulls the CUDA 13 runtime.

Standard library only: infra/setup.sh runs it with the Python it is about to build the venv
with, before anything is installed:

    python -m grpo_core.driver locks/gpu.txt    # exit 2 with the fix when the driver is too old
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

MIN_DRIVER = {13: 580, 12: 525, 11: 450}
"""CUDA major -> the oldest Linux driver branch that runs every minor release of it (NVIDIA's
CUDA Compatibility guide, "Minor Version Compatibility")."""

CUDA_DISTS = ("torch", "nvidia-cuda-runtime", "nvidia-cuda-runtime-cu12",
              "nvidia-cuda-runtime-cu11")
"""The distributions whose versions tell the CUDA major of an environment."""

_RUNTIME = re.compile(r"nvidia-cuda-runtime(-cu\d+)?")
_DRIVER = re.compile(r"\d+(\.\d+)+")


def cuda_major(pins: Mapping[str, str | None]) -> int | None:
    """The CUDA major of the torch that `pins` (canonical name -> version) install; None when
    they need no NVIDIA driver (a `+cpu` or ROCm torch, no CUDA runtime)."""
    torch = pins.get("torch") or ""
    label = torch.partition("+")[2]
    if label:
        m = re.fullmatch(r"cu(\d+)", label)
        return int(m.group(1)) // 10 if m else None  # cu130 -> 13, cu128 -> 12
    majors = [int(v.split(".")[0]) for name, v in pins.items()
              if v and _RUNTIME.fullmatch(name) and v.split(".")[0].isdigit()]
    return max(majors) if majors else None


def parse_driver_version(smi_output: str) -> str | None:
    """The driver version from `nvidia-smi --query-gpu=driver_version --format=csv,noheader`
    (a line per GPU, one driver for all); None when the output holds none."""
    for line in smi_output.splitlines():
        if _DRIVER.fullmatch(line.strip()):
            return line.strip()
    return None


def read_driver_version() -> str | None:
    """This machine's NVIDIA driver version; None without a working nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_driver_version(res.stdout) if res.returncode == 0 else None


def driver_check(driver: str | None, pins: Mapping[str, str | None],
                 source: str) -> tuple[str, str] | None:
    """("ok" | "WARN" | "FAIL", text) for `driver` against the torch of `pins`; None when that
    torch needs no NVIDIA driver. `source` names the pins in the text ("locks/gpu.txt's",
    "the installed"). A FAIL's text ends with the fix."""
    cuda = cuda_major(pins)
    if cuda is None:
        return None
    what = f"{source} torch {pins.get('torch') or '(not pinned)'}, a CUDA {cuda} build"
    need = MIN_DRIVER.get(cuda)
    if need is None:
        return "WARN", f"{what}: no minimum NVIDIA driver known for CUDA {cuda} (grpo_core/driver.py)"
    if driver is None:
        return "WARN", f"NVIDIA driver version unknown (nvidia-smi): not checked; {what}, needs >= {need}"
    if int(driver.split(".")[0]) >= need:
        return "ok", f"NVIDIA driver {driver}: {what}, needs >= {need}"
    fixes = [f"upgrade the NVIDIA driver to >= {need} (it runs every CUDA {cuda}.x), or"]
    older = MIN_DRIVER.get(cuda - 1)
    if older is not None and int(driver.split(".")[0]) >= older:
        torch = (pins.get("torch") or "").partition("+")[0] or "the same"
        vllm = (f"\n      and a vLLM {pins['vllm']} built for that CUDA (vLLM's GPU installation "
                "guide lists a release's builds)") if pins.get("vllm") else ""
        fixes.append(f"keep this driver with a CUDA {cuda - 1}.x build, in a lock of your own "
                     "installed by `LOCK=<your lock> make setup`:\n"
                     f"      torch {torch} from PyTorch's index (https://download.pytorch.org/whl/"
                     f"cu{cuda - 1}<x>){vllm};\n      not a pair this project locks or tests, or")
    fixes.append("`LOCK=locks/cpu.txt make setup`: the CPU build of torch, the GPU unused")
    return "FAIL", (f"NVIDIA driver {driver} is too old for {what}, which needs >= {need}. Fix:\n"
                    + "\n".join(f"  - {f}" for f in fixes))


def lock_pins(text: str) -> dict[str, str]:
    """canonical name -> version of a lock's `name==version` lines (the rest ignored)."""
    pins = {}
    for m in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;\\]+)", text, re.M):
        pins[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(3)
    return pins


def main(argv: list[str]) -> int:
    """`python -m grpo_core.driver LOCK`: exit 2 with the fix when this machine's driver is
    too old for LOCK's torch; 0 (a line, or nothing when LOCK needs no driver) otherwise."""
    if len(argv) != 1:
        print("usage: python -m grpo_core.driver LOCK", file=sys.stderr)
        return 64
    pins = lock_pins(Path(argv[0]).read_text())
    if cuda_major(pins) is None:
        return 0
    if shutil.which("nvidia-smi") is None:
        cuda = cuda_major(pins)
        print(f"NVIDIA driver not checked: no nvidia-smi here ({argv[0]}'s torch is a CUDA "
              f"{cuda} build, for a driver >= {MIN_DRIVER.get(cuda, '?')} where it uses a GPU)")
        return 0
    status, text = driver_check(read_driver_version(), pins, f"{argv[0]}'s")
    print(text, file=sys.stderr if status == "FAIL" else sys.stdout)
    return 2 if status == "FAIL" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
