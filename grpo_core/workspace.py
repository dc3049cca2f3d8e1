"""Where local state lives: one folder (default ./.grpo) for the DuckDB store, MLflow,
checkpoints and cached built-in models. Resolution order: explicit argument, then
$GRPO_WORKDIR, then ./.grpo. Nothing is created until a stage asks for a path. Also the
small JSON state files kept there (read_state, write_state: runs/<config hash>.json, a
downloaded champion's marker), and where a config's MLflow store is (tracking_uri,
experiment_name, artifact_root)."""
from __future__ import annotations

import json
import os
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

DEFAULT_WORKDIR = ".grpo"


def resolve_workdir(explicit: str | os.PathLike | None = None) -> Path:
    raw = explicit or os.environ.get("GRPO_WORKDIR") or DEFAULT_WORKDIR
    return Path(raw).expanduser().resolve()


def resolve_data_dir(explicit: str | os.PathLike | None = None) -> Path | None:
    """Local copies of the presets (laid out like shared/data), or None for the hub."""
    raw = explicit or os.environ.get("GRPO_DATA_DIR")
    return Path(raw).expanduser().resolve() if raw else None


@dataclass(frozen=True)
class Workspace:
    root: Path

    @classmethod
    def at(cls, explicit: str | os.PathLike | None = None) -> Workspace:
        return cls(resolve_workdir(explicit))

    def ensure(self) -> Workspace:
        self.root.mkdir(parents=True, exist_ok=True)
        return self

    @property
    def db_path(self) -> Path:
        return self.root / "store.duckdb"

    @property
    def mlflow_db(self) -> Path:
        return self.root / "mlflow.db"

    @property
    def mlflow_artifacts(self) -> Path:
        return self.root / "mlartifacts"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def models(self) -> Path:
        return self.root / "models"


def workdir_of(workspace: Workspace | str | os.PathLike | None, cfg=None) -> Path:
    """The workdir folder of `workspace` (a Workspace or a path), else of the config."""
    if isinstance(workspace, Workspace):
        return workspace.root
    if workspace is not None:
        return Path(workspace).expanduser().resolve()
    return Workspace.at(cfg.project.workdir if cfg is not None else None).root


def read_state(path: Path) -> dict:
    """A JSON state file, {} when it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` through a temp file and a rename: a killed process leaves the
    old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_state(path: Path, state: dict) -> None:
    """Write a JSON state file atomically (write_atomic)."""
    write_atomic(path, json.dumps(state, indent=2, sort_keys=True))


def tracking_uri(cfg, workspace: Workspace | str | os.PathLike | None = None) -> str:
    """cfg.tracking.tracking_uri, else $MLFLOW_TRACKING_URI, else SQLite under the workdir."""
    explicit = cfg.tracking.tracking_uri if cfg is not None else None
    if explicit:
        return explicit
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{Workspace(workdir_of(workspace, cfg)).mlflow_db}"


def experiment_name(cfg) -> str:
    return cfg.tracking.experiment or cfg.project.name


def is_remote(uri: str) -> bool:
    return urllib.parse.urlparse(uri).scheme in ("http", "https", "databricks")


def artifact_root(uri: str, workspace: Workspace | str | os.PathLike | None, name: str,
                  cfg=None) -> str | None:
    """Where a new experiment keeps its artifacts: <workdir>/mlartifacts/<name> for local
    stores (never ./mlruns under whatever the current directory is); the server's choice
    for a tracking server."""
    if is_remote(uri):
        return None
    return (Workspace(workdir_of(workspace, cfg)).mlflow_artifacts / slug(name)).as_uri()


def slug(text: str) -> str:
    """`text` as a file/registry-safe name (runs of other characters -> "-")."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.") or "default"
