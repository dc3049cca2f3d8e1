"""Content-keyed stage results, so re-running a config skips what is done.

A key hashes the stage name with everything its output depends on: the relevant config
section, the input model's fingerprint, the data fingerprint and the code version. A
value is a small JSON document (paths to checkpoints, metrics). Writes are atomic, so a
run killed mid-stage leaves no half-written entry: the stage simply runs again (GRPO
rounds then resume from their last checkpoint)."""
from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import grpo_core


@lru_cache(maxsize=1)
def code_version() -> str:
    """Hash of the grpo_core sources: a change to the algorithm invalidates the cache."""
    h = hashlib.sha256()
    root = Path(grpo_core.__file__).parent
    for f in sorted(root.glob("*.py")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def stage_key(stage: str, **inputs: Any) -> str:
    blob = json.dumps({"stage": stage, "code": code_version(), **inputs}, sort_keys=True, default=str)
    return f"{stage.replace('/', '-')}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


class StageCache:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    def get(self, key: str) -> dict | None:
        path = self.root / f"{key}.json"
        try:
            value = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        # An entry whose checkpoint was deleted is stale: run the stage again.
        for p in value.get("_paths", []):
            if not Path(p).exists():
                return None
        return value

    def put(self, key: str, value: dict, paths: list[str] | None = None) -> dict:
        self.root.mkdir(parents=True, exist_ok=True)
        doc = {**value, "_paths": list(paths or [])}
        tmp = self.root / f".{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(doc, indent=1, default=str))
        os.replace(tmp, self.root / f"{key}.json")
        return doc
