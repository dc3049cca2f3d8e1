"""The first contact of a GPU machine: its NVIDIA driver against the CUDA build of torch in the
lock (grpo_core/driver.py), as `grpo doctor` and `make setup` (infra/setup.sh) check it.

There is no GPU here: only `nvidia-smi` is faked, a script on PATH in a tmp folder that lists a
GPU (`-L`) and prints a driver version (`--query-gpu=driver_version`). Everything else is real:
the locks, doctor's version lookups, setup.sh. setup.sh runs with VENV in tmp and PY a wrapper
around this Python that refuses `-m venv`, so it can never create or install anything: where
it stops shows where the check sits (before the venv)."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grpo_core import driver, versions
from grpo_core.versions import parse_lock

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "locks" / "gpu.txt"
OLD, NEW = "550.54.15", "580.65.06"


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _fake_nvidia_smi(folder: Path, version: str) -> Path:
    folder.mkdir(exist_ok=True)
    _executable(folder / "nvidia-smi", "#!/bin/sh\n"
                'if [ "$1" = -L ]; then echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-fake)"; exit 0; fi\n'
                f'case "$*" in *driver_version*) echo {version}; echo {version}; exit 0;; esac\n'
                "exit 9\n")
    return folder


# --------------------------------------------------------------------------- the table


def test_cuda_major_from_a_locks_torch_and_runtime_pins():
    assert driver.MIN_DRIVER[13] == 580 and driver.MIN_DRIVER[12] == 525
    pins = parse_lock(GPU).pins
    assert pins["nvidia-cuda-runtime"].startswith("13.") and driver.cuda_major(pins) == 13
    assert driver.cuda_major({"torch": "2.11.0+cu128", "nvidia-cuda-runtime-cu12": "12.8.90"}) == 12
    assert driver.cuda_major({"torch": "2.11.0", "nvidia-cuda-runtime-cu12": "12.8.90"}) == 12
    assert driver.cuda_major({"torch": "2.11.0+cu130"}) == 13
    assert driver.cuda_major(parse_lock(ROOT / "locks" / "cpu.txt").pins) is None  # +cpu
    assert driver.cuda_major({"torch": "2.11.0+rocm6.4"}) is None
    assert driver.cuda_major({"torch": None, "nvidia-cuda-runtime": None}) is None
    # The script's reader of a lock agrees with the project's parser where it matters.
    text = GPU.read_text()
    assert {n: v for n, v in driver.lock_pins(text).items() if n in driver.CUDA_DISTS} == \
        {n: v for n, v in pins.items() if n in driver.CUDA_DISTS}


def test_parse_driver_version():
    assert driver.parse_driver_version(f"{NEW}\n{NEW}\n") == NEW
    assert driver.parse_driver_version("535.104.05") == "535.104.05"
    assert driver.parse_driver_version("") is None
    assert driver.parse_driver_version("NVIDIA-SMI has failed because it couldn't "
                                        "communicate with the NVIDIA driver.") is None


def test_driver_check_names_the_driver_the_need_and_the_fix():
    pins = parse_lock(GPU).pins
    status, text = driver.driver_check(OLD, pins, "locks/gpu.txt's")
    assert status == "FAIL"
    assert text.startswith(f"NVIDIA driver {OLD} is too old for locks/gpu.txt's torch "
                           f"{pins['torch']}, a CUDA 13 build, which needs >= 580. Fix:")
    assert "upgrade the NVIDIA driver to >= 580" in text
    # 550 runs CUDA 12.x: the other way, with the lock's own torch and vLLM versions.
    assert "CUDA 12.x build" in text and f"torch {pins['torch']} from PyTorch's index" in text
    assert f"vLLM {pins['vllm']} built for that CUDA" in text and "LOCK=<your lock>" in text
    assert "LOCK=locks/cpu.txt make setup" in text
    # Too old even for CUDA 12: no CUDA 12 way offered.
    status, text = driver.driver_check("515.65.01", pins, "locks/gpu.txt's")
    assert status == "FAIL" and "CUDA 12.x" not in text and ">= 580" in text
    assert driver.driver_check(NEW, pins, "locks/gpu.txt's") == (
        "ok", f"NVIDIA driver {NEW}: locks/gpu.txt's torch {pins['torch']}, a CUDA 13 build, "
              "needs >= 580")
    # A CUDA 12 lock of the user's own runs on 550.
    assert driver.driver_check(OLD, {"torch": "2.11.0+cu128"}, "the installed")[0] == "ok"
    assert driver.driver_check(None, pins, "x")[0] == "WARN"
    assert driver.driver_check(OLD, {"torch": "2.13.0+cpu"}, "x") is None


# --------------------------------------------------------------------------- grpo doctor


@pytest.mark.parametrize("version", [OLD, NEW])
def test_doctor_checks_the_driver_against_the_gpu_lock(monkeypatch, tmp_path, version):
    """With the fake nvidia-smi this is a GPU machine: doctor compares against locks/gpu.txt
    (many WARN lines: this venv holds the CPU lock) and checks the driver first."""
    monkeypatch.setenv("PATH", f"{_fake_nvidia_smi(tmp_path / 'bin', version)}{os.pathsep}"
                               f"{os.environ['PATH']}")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    from flows.cli import app

    res = CliRunner().invoke(app, ["doctor", "--workdir", str(tmp_path / "ws")])
    torch = parse_lock(GPU).pins["torch"]
    if version == OLD:
        assert res.exit_code == 1, res.output
        assert (f"[FAIL] NVIDIA driver {OLD} is too old for locks/gpu.txt's torch {torch}, "
                "a CUDA 13 build, which needs >= 580. Fix:\n"
                "  - upgrade the NVIDIA driver to >= 580") in res.output
    else:
        assert f"[ok] NVIDIA driver {NEW}: locks/gpu.txt's torch {torch}, a CUDA 13 build" \
            in res.output, res.output
        assert "NVIDIA driver" not in "".join(
            line for line in res.output.splitlines() if line.startswith("[FAIL]"))
    lines = res.output.splitlines()
    first_lock_line = next(k for k, line in enumerate(lines) if "locks/gpu.txt (" in line)
    driver_line = next(k for k, line in enumerate(lines) if "NVIDIA driver" in line)
    assert driver_line < first_lock_line  # before the version differences


def test_doctor_lines_check_the_installed_cuda_build_before_the_lock():
    """A CUDA 12 torch the user installed (their own lock) is what runs: 550 is enough for it."""
    installed = {"torch": "2.11.0+cu128", "nvidia-cuda-runtime-cu12": "12.8.90", "trl": "1.16.0"}
    lines = versions.doctor_lines(gpu=True, lookup=installed.get, python="3.12",
                                  driver=lambda: OLD)
    assert ("ok", f"NVIDIA driver {OLD}: the installed torch 2.11.0+cu128, a CUDA 12 build, "
                  "needs >= 525") in lines
    lines = versions.doctor_lines(gpu=False, lookup=installed.get, driver=lambda: OLD)
    assert not [t for _, t in lines if "NVIDIA driver" in t]


# --------------------------------------------------------------------------- make setup


def _setup(tmp_path: Path, version: str) -> subprocess.CompletedProcess:
    bin_dir = _fake_nvidia_smi(tmp_path / "bin", version)
    py = _executable(tmp_path / "py", "#!/bin/sh\n"
                     'if [ "$1" = -m ] && [ "$2" = venv ]; then echo "test: venv refused"; exit 97; fi\n'
                     f'exec "{sys.executable}" "$@"\n')
    env = {k: v for k, v in os.environ.items() if k not in ("LOCK", "VENV", "PY")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", VENV=str(tmp_path / "venv"), PY=str(py))
    return subprocess.run(["bash", str(ROOT / "infra" / "setup.sh")], capture_output=True,
                          text=True, timeout=120, check=False, env=env, cwd=tmp_path)


def test_setup_stops_on_an_old_driver_before_creating_anything(tmp_path):
    res = _setup(tmp_path, OLD)
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    assert "setup: NVIDIA GPU found: installing locks/gpu.txt" in res.stdout
    assert (f"setup: NVIDIA driver {OLD} is too old for locks/gpu.txt's torch "
            f"{parse_lock(GPU).pins['torch']}, a CUDA 13 build, which needs >= 580. Fix:") in res.stderr
    assert "upgrade the NVIDIA driver to >= 580" in res.stderr
    assert "venv refused" not in out and not (tmp_path / "venv").exists()


def test_setup_passes_a_new_driver_on_to_the_venv(tmp_path):
    res = _setup(tmp_path, NEW)
    out = res.stdout + res.stderr
    assert res.returncode == 97 and "test: venv refused" in out, out  # the next step: the venv
    assert f"setup: NVIDIA driver {NEW}: locks/gpu.txt's torch" in res.stdout
