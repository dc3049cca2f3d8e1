"""Helpers for tests that run `grpo run` as a real subprocess on a tiny random model."""
from __future__ import annotations

import base64
import os
import sqlite3
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
GRPO = str(Path(sys.executable).with_name("grpo"))


def write_config(tmp_path: Path, model_path: str, max_steps: int = 3, **sections) -> Path:
    """r1_zero on quickstart, shrunk: 2 rounds, 2 prompts x G=2, 8 tokens, 8 eval problems,
    8 problems in each memorisation probe set.
    `sections` replace whole sections (e.g. filter={...})."""
    cfg = yaml.safe_load((ROOT / "configs/recipes/r1_zero.yaml").read_text())
    cfg["extends"] = str(ROOT / "configs/quickstart.yaml")
    cfg.update({
        "project": {"name": "itest", "recipe": "r1_zero"},
        "model": {"name_or_path": model_path, "template": "r1_zero"},
        # ~80 rows in the RL part: two rounds' fresh windows (up to 32), 8 held back for the probe
        "data": {"train": [{"source": "synthetic:arith", "limit": 160, "levels": [1, 2]}],
                 "sft_share": 0.5},
        "probe": {"problems": 8},
        "filter": {"k": 2, "max_problems": 8},
        "grpo": {"max_steps": max_steps, "save_steps": 1, "per_device_train_batch_size": 4,
                 "num_generations": 2, "max_completion_length": 8, "learning_rate": 1e-3},
        "rounds": {"count": 2},
        "eval": {"benchmarks": ["synthetic"], "limit": 8, "samples": 2, "max_new_tokens": 8,
                 "bootstrap": 50},
    })
    cfg.update(sections)
    path = tmp_path / "itest.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_env(workdir: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update(GRPO_WORKDIR=str(workdir), GRPO_TORCH_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def basic_auth_token(user: str, password: str) -> str:
    """What an `Authorization: Basic ...` header carries: a logged header leaks as much."""
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def scan_for_secrets(roots, outputs: str, secrets) -> list[str]:
    """Where any of `secrets` shows up: in `outputs` (process output, logs) or in any file
    under `roots` (SQLite/DuckDB databases, artifacts, checkpoints, caches, Prefect home,
    server logs) read as bytes. Empty when nothing leaked."""
    secrets = [s for s in secrets if s]
    found = [f"output: {s}" for s in secrets if s in outputs]
    for root in [roots] if isinstance(roots, (str, Path)) else roots:
        for path in Path(root).rglob("*"):
            if path.is_file():
                blob = path.read_bytes()
                found += [f"{path}: {s}" for s in secrets if s.encode() in blob]
    return found


def mlflow_runs(workdir: Path, experiment: str = "itest"):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    exp = client.get_experiment_by_name(experiment)
    return client, client.search_runs([exp.experiment_id], max_results=200)


def run_names(workdir: Path) -> set[str]:
    """Stages of the MLflow child runs so far (their grpo.stage tag; run names are
    <recipe>/<stage>), read with plain sqlite3 while a pipeline writes."""
    db = workdir / "mlflow.db"
    if not db.exists():
        return set()
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as con:
            return {r[0] for r in con.execute("SELECT value FROM tags WHERE key = 'grpo.stage'")}
    except sqlite3.Error:
        return set()


def prefect_task_states(prefect_home: Path) -> list[dict[str, str]]:
    """Every task run in Prefect's database: its flow run's id, its own name (the stage
    label), its state's type and name (`Cached` for a stage the cache served), in the
    order the flow runs and then the task runs started."""
    with sqlite3.connect(f"file:{prefect_home / 'prefect.db'}?mode=ro", uri=True) as con:
        rows = con.execute("SELECT f.id, t.name, t.state_type, t.state_name FROM task_run t "
                           "JOIN flow_run f ON t.flow_run_id = f.id "
                           "ORDER BY f.start_time, t.start_time").fetchall()
    return [dict(zip(("flow_run", "task_run", "type", "name"), r)) for r in rows]


def prefect_flow_runs(prefect_home: Path) -> dict[str, list[str]]:
    """Prefect flow name -> the final state of each of its runs, from Prefect's database."""
    with sqlite3.connect(f"file:{prefect_home / 'prefect.db'}?mode=ro", uri=True) as con:
        rows = con.execute("SELECT f.name, r.state_type FROM flow_run r JOIN flow f "
                           "ON r.flow_id = f.id").fetchall()
    out: dict[str, list[str]] = {}
    for name, state in rows:
        out.setdefault(name, []).append(state)
    return out
