"""The main job for real: `grpo run` in a subprocess (a real temporary Prefect server,
MLflow on SQLite, a DuckDB file, TRL steps on a tiny random model). Checks the MLflow
layout, that a second run is served from the cache, and that secrets given through the
environment or the config appear nowhere: not in MLflow (params, tags, metrics,
artifacts), not in Prefect's database, not in the workspace, not in the output; among them
the credentials of the tracking and Prefect servers (tests/test_auth.py and
tests/test_deployment.py scan the same way against real servers that check them).
(SIGKILL resume: tests/test_crash_resume.py.)"""
import json
import re
import subprocess
import time
from pathlib import Path

import duckdb
import pytest
from pipeline_runs import (
    GRPO,
    ROOT,
    mlflow_runs,
    prefect_task_states,
    run_env,
    scan_for_secrets,
    write_config,
)

from tasks.tracking.mlflow_client import stage_of

pytest_plugins = ["fixtures_models"]
pytestmark = pytest.mark.integration

_config, _env, _runs = write_config, run_env, mlflow_runs

# Secret-named variables a user may well have set (the servers' credentials among them:
# the client libraries read these two), and one secret config field.
SECRET_ENV = {"HF_TOKEN": "hf_envtoken_5b1e", "WANDB_API_KEY": "wandbkey_9c0d",
              "GRPO_SERVICE_PASSWORD": "grpopass_77aa", "AWS_SECRET_ACCESS_KEY": "awssecret_3f2e",
              "MLFLOW_TRACKING_PASSWORD": "mlflowpass_e20b", "PREFECT_API_AUTH_STRING": "grpo:prefauth_81c6"}
CONFIG_SECRET = "hf_cfgtoken_d41c"


def _scan_for_secrets(root, outputs: str) -> list[str]:
    return scan_for_secrets(root, outputs, [*SECRET_ENV.values(), CONFIG_SECRET])


STAGES = ["data", "model", "eval/base", "filter/round-1", "grpo/round-1", "eval/round-1",
          "filter/round-2", "grpo/round-2", "eval/round-2", "eval/final"]


def _check_stage_lines(log: str) -> None:
    """A non-TTY log of `grpo run`: one start and one end line per stage, in order; no
    library FutureWarning, no third-party progress bar."""
    assert "FutureWarning" not in log, log[-3000:]
    assert "it/s]" not in log and "Downloading artifacts" not in log, log[-3000:]
    lines = log.splitlines()
    order = []
    for stage in STAGES:
        starts = [i for i, line in enumerate(lines) if line.endswith(f" - {stage}: started")]
        ends = [i for i, line in enumerate(lines)
                if re.search(rf" - {re.escape(stage)}: (computed|cached|reused from eval/[\w-]+) "
                             r"in [0-9.]+ s", line)]
        assert len(starts) == 1 and len(ends) == 1, (stage, log[-3000:])
        assert starts[0] < ends[0]
        order.append(starts[0])
    assert order == sorted(order)
    # the key numbers: kept/considered, steps, the primary metric with its CI
    assert re.search(r"filter/round-1: (computed|cached) in [0-9.]+ s: kept \d+ of \d+", log)
    assert re.search(r"grpo/round-1: computed in [0-9.]+ s: 3 steps", log)
    assert re.search(r"eval/base: computed in [0-9.]+ s: synthetic \S+ [0-9.]+ \[", log)


def test_pipeline_layout_and_cache(tiny_model_path, tmp_path):
    workdir = tmp_path / "ws"
    cfg = _config(tmp_path, tiny_model_path, model={
        "name_or_path": tiny_model_path, "template": "r1_zero", "hub_token": CONFIG_SECRET})
    t0 = time.time()
    first = subprocess.run([GRPO, "run", str(cfg), "--quiet"], env=_env(workdir, **SECRET_ENV), cwd=ROOT,
                           capture_output=True, text=True, timeout=900, check=False)
    first_s = time.time() - t0
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "mlflow ui --backend-store-uri" in first.stdout
    leaks = _scan_for_secrets(workdir, first.stdout + first.stderr)
    assert not leaks, leaks
    _check_stage_lines(first.stdout + first.stderr)

    client, runs = _runs(workdir)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.data.tags["recipe"] == "r1_zero" and parent.data.tags["config_hash"]
    assert parent.data.params["grpo.beta"] == "0.04"
    assert parent.data.params["model.hub_token"] in ("***", "**********")  # there, hidden
    (tmp_path / "dl").mkdir()
    env_file = client.download_artifacts(parent.info.run_id, "config/environment.json",
                                         str(tmp_path / "dl"))
    snapshot = json.loads(Path(env_file).read_text())["env"]
    assert snapshot["HF_TOKEN"] == snapshot["GRPO_SERVICE_PASSWORD"] == "***"
    assert snapshot["MLFLOW_TRACKING_PASSWORD"] == snapshot["PREFECT_API_AUTH_STRING"] == "***"
    children = {stage_of(r): r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
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
    # One orchestration layer (tasks/runner.py): a stage the cache served is a task run
    # in Prefect's `Cached` state (type COMPLETED), one that computed is `Completed`.
    tasks = prefect_task_states(workdir / "prefect")
    flows = list(dict.fromkeys(t["flow_run"] for t in tasks))
    assert len(flows) == 2, flows  # the first run and the re-run
    first, rerun = ([t for t in tasks if t["flow_run"] == f] for f in flows)
    assert {t["name"] for t in first if t["task_run"] == "grpo/round-1"} == {"Completed"}
    stages = {"data", "filter/round-1", "grpo/round-1", "eval/round-2", "eval/final"}
    assert stages <= {t["task_run"] for t in rerun}
    assert {(t["type"], t["name"]) for t in rerun if t["task_run"] in stages} == \
        {("COMPLETED", "Cached")}, rerun


def test_a_regressed_round_rolls_back_to_the_best_model(tmp_path):
    """The round gate (rounds.rollback_on_regression, on by default) in a real two-round run
    of the built-in model: a learning rate that wrecks it (0.05, three steps) leaves 0 greedy
    accuracy, below the base's CI, so each round rolls back. Round 2 trains from the base:
    its finding compares it with the base's CI (round 1's is [0, 0], nothing falls below
    it); the final evaluation is the base's (served from its cache) and so is the model
    registered."""
    workdir = tmp_path / "ws"
    cfg = _config(tmp_path, "builtin:tiny-arith",
                  data={"train": [{"source": "synthetic:arith", "limit": 64, "levels": [1, 2]}]},
                  filter={"enabled": False},
                  grpo={"max_steps": 3, "save_steps": 100, "per_device_train_batch_size": 16,
                        "num_generations": 4, "max_completion_length": 24, "learning_rate": 0.05},
                  rewards={"funcs": ["repetition"], "weights": [1.0]},  # varies in every group
                  eval={"benchmarks": ["synthetic"], "limit": 100, "samples": 2,
                        "max_new_tokens": 24, "bootstrap": 200})
    run = subprocess.run([GRPO, "run", str(cfg), "--quiet"], env=_env(workdir), cwd=ROOT,
                         capture_output=True, text=True, timeout=1500, check=False)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-3000:]
    base_lo = re.search(r"eval/base: computed in [0-9.]+ s: synthetic greedy_accuracy "
                        r"[0-9.]+ \[([0-9.]+),", log).group(1)
    assert float(base_lo) > 0
    falls = set(re.findall(r"round (\d): round_regressed \[warn\]: synthetic greedy_accuracy fell "
                           r"below the previous CI "
                           r"\(([0-9.]+) < ([0-9.]+)\); rolled back: what follows starts from "
                           r"eval/base's model", log))
    assert {(r, lo) for r, _, lo in falls} == {("1", base_lo), ("2", base_lo)}, log[-3000:]
    assert re.search(r"eval/final: reused from eval/base in [0-9.]+ s", log), log[-3000:]
    assert re.search(r"^model: .*grpo_core/builtin_models/tiny-arith$", run.stdout, re.M), run.stdout
