"""`grpo run` with train.num_processes=2: the GRPO stage goes through `accelerate launch`
(2 CPU processes on gloo; what a multi-GPU node does with NCCL). One set of per-step
metrics in MLflow (rank 0 only), one model, every rank's rollouts in DuckDB once."""
import json
import subprocess

import duckdb
import pytest
from pipeline_runs import GRPO, ROOT, mlflow_runs, run_env, write_config

from tasks.tracking.mlflow_client import stage_of

pytest_plugins = ["fixtures_models"]
pytestmark = pytest.mark.integration

STEPS, PROMPTS, G = 3, 2, 2


def test_grpo_round_on_two_processes(tiny_model_path, tmp_path):
    cfg = write_config(tmp_path, tiny_model_path, max_steps=STEPS,
                       train={"num_processes": 2})
    wd = tmp_path / "ws"
    proc = subprocess.run([GRPO, "run", str(cfg), "--quiet", "--set", "rounds.count=1",
                           # per device: 2 processes x 2 = PROMPTS x G completions per step
                           "--set", "grpo.per_device_train_batch_size=2"],
                          env=run_env(wd), cwd=ROOT, capture_output=True, text=True,
                          timeout=900, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]

    results = list((wd / "checkpoints").rglob("grpo-result.json"))
    assert len(results) == 1
    result = json.loads(results[0].read_text())
    assert result["world_size"] == 2 and result["steps"] == STEPS
    finals = [p for p in (wd / "checkpoints").rglob("final") if (p / "config.json").is_file()]
    assert len(finals) == 1 and any(finals[0].glob("*.safetensors"))

    client, runs = mlflow_runs(wd)
    assert len([r for r in runs if "mlflow.parentRunId" not in r.data.tags]) == 1
    grpo = next(r for r in runs if stage_of(r) == "grpo/round-1")
    steps = [m.step for m in client.get_metric_history(grpo.info.run_id, "reward")]
    assert sorted(steps) == list(range(1, STEPS + 1)), steps  # one point per step: rank 0 only
    with duckdb.connect(str(wd / "store.duckdb"), read_only=True) as con:
        n, ranks_rows = con.execute(
            "SELECT count(*), count(DISTINCT (step, idx)) FROM rollouts").fetchone()
    assert n == ranks_rows == STEPS * PROMPTS * G  # both ranks' completions, each once
