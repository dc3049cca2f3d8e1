"""The main job for real: `grpo run` in a subprocess (a real temporary Prefect server,
MLflow on SQLite, a DuckDB file, TRL steps on a tiny random model). Checks the MLflow
layout, that a second run is served from the cache, and that a run SIGKILLed during
round 2 resumes from its last checkpoint under the same parent run."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
import yaml

pytest_plugins = ["fixtures_models"]
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
GRPO = str(Path(sys.executable).with_name("grpo"))


def _config(tmp_path: Path, model: str, max_steps: int = 3) -> Path:
    cfg = yaml.safe_load((ROOT / "configs/recipes/r1_zero.yaml").read_text())
    cfg["extends"] = str(ROOT / "configs/quickstart.yaml")
    cfg.update({
        "project": {"name": "itest", "recipe": "r1_zero"},
        "model": {"name_or_path": model, "template": "r1_zero"},
        "data": {"train": [{"source": "synthetic:arith", "limit": 40, "levels": [1, 2]}]},
        "filter": {"k": 2, "max_problems": 8},
        "grpo": {"rounds": 2, "max_steps": max_steps, "save_steps": 1, "prompts_per_step": 2,
                 "num_generations": 2, "max_completion_length": 8, "learning_rate": 1e-3},
        "eval": {"benchmarks": ["synthetic"], "limit": 8, "samples": 2, "max_new_tokens": 8,
                 "bootstrap": 50},
    })
    path = tmp_path / "itest.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _env(workdir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update(GRPO_WORKDIR=str(workdir), GRPO_TORCH_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def _runs(workdir: Path):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    exp = client.get_experiment_by_name("itest")
    return client, client.search_runs([exp.experiment_id], max_results=200)


def test_pipeline_layout_and_cache(tiny_model_path, tmp_path):
    workdir = tmp_path / "ws"
    cfg = _config(tmp_path, tiny_model_path)
    t0 = time.time()
    first = subprocess.run([GRPO, "run", str(cfg), "--quiet"], env=_env(workdir), cwd=ROOT,
                           capture_output=True, text=True, timeout=900, check=False)
    first_s = time.time() - t0
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "mlflow ui --backend-store-uri" in first.stdout

    client, runs = _runs(workdir)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.data.tags["recipe"] == "r1_zero" and parent.data.tags["config_hash"]
    assert parent.data.params["grpo.beta"] == "0.04"
    children = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert {"data", "eval/base", "filter/round-1", "grpo/round-1", "eval/round-1", "filter/round-2",
            "grpo/round-2", "eval/round-2", "eval/final"} <= set(children)
    grpo1 = children["grpo/round-1"]
    assert {"reward", "reward_std", "frac_reward_zero_std", "kl"} <= set(grpo1.data.metrics)
    assert len(client.get_metric_history(grpo1.info.run_id, "reward")) == 3  # streamed per step
    art = lambda run, d="": [a.path for a in client.list_artifacts(run.info.run_id, d)]
    assert "config/resolved.yaml" in art(parent, "config")
    assert any(p.endswith(".png") for p in art(grpo1, "plots"))
    assert any(p.endswith(".png") for p in art(children["filter/round-1"], "plots"))
    assert any(p.startswith("eval") for p in art(children["eval/final"]))
    model = client.get_model_version_by_alias("itest-r1_zero", "champion")
    assert model.run_id == parent.info.run_id

    with duckdb.connect(str(workdir / "store.duckdb"), read_only=True) as con:
        rollouts = con.execute("SELECT count(*) FROM rollouts").fetchone()[0]
    assert rollouts == 2 * 3 * 2 * 2  # rounds x steps x prompts x G

    t0 = time.time()
    second = subprocess.run([GRPO, "run", str(cfg), "--quiet"], env=_env(workdir), cwd=ROOT,
                            capture_output=True, text=True, timeout=900, check=False)
    second_s = time.time() - t0
    assert second.returncode == 0, second.stderr[-3000:]
    _, again = _runs(workdir)
    assert len([r for r in again if "mlflow.parentRunId" not in r.data.tags]) == 1  # same parent
    with duckdb.connect(str(workdir / "store.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM rollouts").fetchone()[0] == rollouts  # nothing re-ran
    print(f"first run {first_s:.1f} s, cached re-run {second_s:.1f} s ({second_s / first_s:.0%})")
    assert second_s < first_s


def test_sigkill_in_round_two_resumes_under_same_parent(tiny_model_path, tmp_path):
    workdir = tmp_path / "ws"
    cfg = _config(tmp_path, tiny_model_path, max_steps=8)
    proc = subprocess.Popen([GRPO, "run", str(cfg), "--quiet"], env=_env(workdir), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 600
    killed_at = None
    try:
        while time.time() < deadline and proc.poll() is None:
            rounds = sorted((workdir / "checkpoints").glob("*/grpo-*"), key=lambda p: p.stat().st_mtime)
            if len(rounds) == 2 and not (rounds[1] / "final").exists():
                ckpts = sorted(rounds[1].glob("checkpoint-*"))
                if len(ckpts) >= 2:
                    killed_at = max(int(c.name.split("-")[1]) for c in ckpts)
                    os.killpg(proc.pid, signal.SIGKILL)
                    break
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert killed_at is not None, "never saw round 2 checkpoints before the run ended"
    state = json.loads(next((workdir / "runs").glob("*.json")).read_text())

    rerun = subprocess.run([GRPO, "run", str(cfg), "--quiet"], env=_env(workdir), cwd=ROOT,
                           capture_output=True, text=True, timeout=900, check=False)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    client, runs = _runs(workdir)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert [p.info.run_id for p in parents] == [state["run_id"]]
    round2 = next(r for r in runs if r.info.run_name == "grpo/round-2")
    steps = [m.step for m in client.get_metric_history(round2.info.run_id, "reward")]
    assert max(steps) == 8 and killed_at + 1 in steps
    with duckdb.connect(str(workdir / "store.duckdb"), read_only=True) as con:
        dup = con.execute("SELECT count(*) FROM (SELECT run_id, step, idx FROM rollouts "
                          "GROUP BY ALL HAVING count(*) > 1)").fetchone()[0]
        total = con.execute("SELECT count(*) FROM rollouts").fetchone()[0]
    assert dup == 0 and total == 2 * 8 * 2 * 2
