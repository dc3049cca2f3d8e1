"""Content-keyed stage results, so re-running a config skips what is done.

A key hashes the stage name with everything its output depends on: the config fields
that change the result (tasks/stages.py says which, per stage), the input model's
fingerprint, the content of the problems it reads, and the code version. What only
changes where or how visibly a stage runs (shards, ports, MLflow settings, progress bars)
stays out, so such a change is served from the cache. A value is a stage's typed result
(tasks/stage_results.py), saved as a small JSON document (paths to checkpoints, metrics).
Writes are atomic, so a run killed mid-stage leaves no half-written entry: the stage
simply runs again (GRPO rounds then resume from their last checkpoint, found under the
same key).

The code version is deliberately coarse: every .py file under grpo_core/ and tasks/
(subpackages included) plus the installed versions of the packages that compute results
(torch, transformers, trl, vllm, accelerate, math-verify; "none" when absent). Any edit
to those sources, or an upgrade of those packages, therefore re-runs every stage: we
cannot tell which edits change numbers, and a stale cached number is worse than a
re-run. Within one code version keys are stable across processes, which is what a
killed run's resume relies on."""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import grpo_core

if TYPE_CHECKING:
    from tasks.stage_results import StageResult

R = TypeVar("R", bound="StageResult")

# Packages whose version can change a stage's numbers (sampling, training, verification).
RESULT_PACKAGES = ("torch", "transformers", "trl", "vllm", "accelerate", "math-verify")
CODE_ROOTS = (Path(grpo_core.__file__).parent, Path(__file__).parent)  # grpo_core/, tasks/


def source_hash(*roots: Path) -> str:
    """Hash of every .py file under `roots`, recursively, by path relative to its root."""
    h = hashlib.sha256()
    for root in roots:
        for f in sorted(root.rglob("*.py")):
            if "__pycache__" in f.parts:
                continue
            h.update(f"{root.name}/{f.relative_to(root).as_posix()}".encode())
            h.update(b"\0")
            h.update(f.read_bytes())
            h.update(b"\0")
    return h.hexdigest()


@lru_cache(maxsize=1)
def _sources() -> str:
    return source_hash(*CODE_ROOTS)


@lru_cache(maxsize=1)
def package_versions() -> dict[str, str]:
    """Installed version of each of RESULT_PACKAGES; "none" when not installed."""
    out = {}
    for name in RESULT_PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "none"
    return out


def code_version() -> str:
    """The sources of grpo_core and tasks plus the result packages' versions."""
    blob = json.dumps({"sources": _sources(), "packages": package_versions()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def stage_key(stage: str, **inputs: Any) -> str:
    blob = json.dumps({"stage": stage, "code": code_version(), **inputs}, sort_keys=True, default=str)
    return f"{stage.replace('/', '-')}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


class StageCache:
    """Stage results (tasks/stage_results.py) saved under their content key."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def get(self, key: str, result_type: type[R]) -> R | None:
        """The result saved under `key`, with `cached` set; None when there is none, or it
        is stale (a checkpoint it points at was deleted: the stage runs again)."""
        return result_type.load(self.path(key), cached=True)

    def drop(self, key: str) -> None:
        """Forget `key` (its stage runs again), e.g. when what it points at is gone."""
        self.path(key).unlink(missing_ok=True)

    def put(self, key: str, result: StageResult) -> None:
        result.save(self.path(key))
