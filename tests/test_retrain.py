"""Scheduled retraining for real: `grpo run` registers a champion, then the deployment
entry point flows/deployments.py:retrain_config runs in a subprocess (Prefect's temporary
local server, MLflow on SQLite, the DuckDB store, TRL steps on a tiny random model).

While the pipeline holds the store's lock, a retrain waits `data.store_lock_timeout` and
stops with the store-locked error before it downloads the champion or starts an MLflow
run. Once the store is free a retrain runs to the end: its MLflow run records the decision
(report/retrain_decision.json) and the registry follows it, by the paired rule of
tasks/tracking/registry.py promote (the challenger wins only when the 95% CI of its
per-problem difference to the champion, on the same problems, lies above 0). The slow
variant shards the retrain's filter and evaluations."""
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pipeline_runs import GRPO, ROOT, mlflow_runs, prefect_flow_runs, run_env, write_config

from grpo_core.data.locks import lock_path
from grpo_core.workspace import Workspace
from tasks.tracking.mlflow_client import stage_of

pytest_plugins = ["fixtures_models"]
pytestmark = pytest.mark.integration

MODEL = "itest-r1_zero"
PRIMARY = "greedy_accuracy"  # eval.primary_metric's default
# As a Prefect worker runs the deployment: importing the entry point's module alone must
# put Prefect's home in the workspace (GRPO_WORKDIR), as `grpo run` does.
RETRAIN = """
import sys
from flows.deployments import retrain_config
retrain_config(config_path=sys.argv[1], overrides=sys.argv[2:])
"""


def _config(tmp_path: Path, model: str) -> Path:
    """The shrunk pipeline config, one GRPO round of 2 steps (retrain runs one round)."""
    return write_config(tmp_path, model, rounds={"count": 1}, grpo={
        "max_steps": 2, "save_steps": 1, "per_device_train_batch_size": 4, "num_generations": 2,
        "max_completion_length": 8, "learning_rate": 1e-3})


def _retrain(cfg: Path, workdir: Path, *overrides: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RETRAIN, str(cfg), *overrides],
                          env=run_env(workdir, **env), cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=False)


def _parents(workdir: Path) -> dict:
    _, runs = mlflow_runs(workdir)
    return {r.data.tags["recipe"]: r for r in runs if "mlflow.parentRunId" not in r.data.tags}


def _champion(client) -> str:
    return str(client.get_model_version_by_alias(MODEL, "champion").version)


def _check_retrain_run(workdir: Path, tmp_path: Path) -> dict:
    """The retrain run of champion v1 and the registry after it; returns the decision."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    parents = _parents(workdir)
    assert set(parents) == {"r1_zero", "r1_zero+retrain"}
    run = parents["r1_zero+retrain"]
    assert run.info.status == "FINISHED" and run.data.tags["grpo.champion_version"] == "1"
    _, runs = mlflow_runs(workdir)
    children = {stage_of(r) for r in runs if r.data.tags.get("mlflow.parentRunId") == run.info.run_id}
    assert children == {"data", "filter/round-1", "grpo/round-1", "eval/champion", "eval/final"}

    (tmp_path / "dl").mkdir()
    path = client.download_artifacts(run.info.run_id, "report/retrain_decision.json", str(tmp_path / "dl"))
    decision = json.loads(Path(path).read_text())
    assert decision["champion_version"] == "1" and isinstance(decision["promoted"], bool)
    champ, chall = decision["champion"][PRIMARY], decision["challenger"][PRIMARY]
    assert {"mean", "lo", "hi"} <= set(champ) and {"mean", "lo", "hi"} <= set(chall)
    # The champion, re-evaluated under today's protocol, is the model the pipeline evaluated;
    # the challenger's numbers are the retrain run's final metrics.
    assert champ["mean"] == pytest.approx(parents["r1_zero"].data.metrics[f"final/synthetic/{PRIMARY}"])
    assert chall["mean"] == pytest.approx(run.data.metrics[f"final/synthetic/{PRIMARY}"])

    # The paired rule: both scored on the same problems, promoted only when the lower bound
    # of the paired delta's 95% CI is above 0. The mean of per-problem differences is the
    # difference of the means.
    paired = decision["paired"]
    assert decision["rule"].startswith("paired") and paired is not None, decision
    assert paired["n"] == champ["n"] == chall["n"]
    assert paired["delta"] == pytest.approx(chall["mean"] - champ["mean"])
    assert paired["lo"] <= paired["delta"] <= paired["hi"]
    assert decision["promoted"] == (paired["lo"] > 0), decision
    version = client.get_model_version(MODEL, run.data.tags["grpo.model_version"])
    assert version.run_id == run.info.run_id and str(version.version) == "2"
    assert version.tags["grpo.decision"] == ("promoted" if decision["promoted"] else "rejected")
    assert version.tags["grpo.compared_with"] == "1"
    assert version.tags["grpo.decision_rule"] == decision["rule"]
    assert float(version.tags["grpo.paired_delta.ci_lo"]) == pytest.approx(paired["lo"])
    assert run.data.tags["grpo.promotion"] == version.tags["grpo.decision"]
    # The pipeline (base eval -> final eval) logged its paired final-vs-base delta where
    # `grpo compare` reads it; the retrain its challenger-vs-champion one, the decision's.
    final_of = {r.data.tags.get("mlflow.parentRunId"): r.data.metrics for r in runs
                if stage_of(r) == "eval/final"}
    key = f"synthetic/{PRIMARY}_delta"
    pipe = final_of[parents["r1_zero"].info.run_id]
    assert pipe[f"{key}_ci_lo"] <= pipe[key] <= pipe[f"{key}_ci_hi"]
    assert final_of[run.info.run_id][key] == pytest.approx(paired["delta"])
    # one name per run: MLflow's retrain parent is named as its Prefect flow run
    assert run.info.run_name.startswith("retrain-r1_zero-"), run.info.run_name
    assert list(decision)[:2] == ["decision", "promoted"], list(decision)  # it opens with it
    assert decision["decision"] == ("promoted v2" if decision["promoted"] else "kept champion v1")
    assert _champion(client) == ("2" if decision["promoted"] else "1")
    print(f"champion {champ['mean']:.3f} [{champ['lo']}, {champ['hi']}], challenger "
          f"{chall['mean']:.3f}, paired delta {paired['delta']:+.3f} [{paired['lo']:.3f}, "
          f"{paired['hi']:.3f}]: {'promoted' if decision['promoted'] else 'kept the champion'}")
    return decision


def test_retrain_waits_for_the_store_then_decides_by_the_paired_ci(tiny_model_path, tmp_path):
    workdir, cfg = tmp_path / "ws", _config(tmp_path, tiny_model_path)
    # The pipeline registers champion v1. While it holds the store, a retrain waits 2 s,
    # then gives up with the store-locked error, having written nothing.
    t0, other_home = time.time(), tmp_path / "prefect-retrain"
    log = (tmp_path / "pipeline.log").open("w+")
    pipeline = subprocess.Popen([GRPO, "run", str(cfg), "--quiet"], env=run_env(workdir), cwd=ROOT,
                                stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        holder = lock_path(Workspace.at(workdir).db_path)
        while f'"pid": {pipeline.pid},' not in (holder.read_text() if holder.exists() else ""):
            assert pipeline.poll() is None, "the pipeline ended before it held the store"
            assert time.time() - t0 < 120, "the pipeline never took the store's lock"
            time.sleep(0.1)
        # Its own Prefect home (as a worker has its own API): two temporary servers
        # starting at once on one SQLite file would be a test artefact.
        locked = _retrain(cfg, workdir, "data.store_lock_timeout=2", PREFECT_HOME=str(other_home))
        contended = pipeline.poll() is None
        pipeline.wait(timeout=600)
    finally:
        if pipeline.poll() is None:
            pipeline.kill()
    pipeline_s = time.time() - t0
    log.seek(0)
    assert pipeline.returncode == 0, log.read()[-4000:]
    assert contended, "the pipeline finished before the retrain reached the lock"
    assert locked.returncode != 0, locked.stdout[-3000:]
    # an expected refusal (flows/refusals.py): its one line, logged and as the run's state
    # message, no traceback of the error itself
    said = next(line for line in locked.stderr.splitlines() if "refused: " in line)
    assert "in use by another pipeline" in said, locked.stderr[-3000:]
    assert f"pid {pipeline.pid}" in said and "waited 2 s" in said, said
    assert "StoreLockedError" not in locked.stderr, locked.stderr[-3000:]
    assert set(_parents(workdir)) == {"r1_zero"}  # no retrain run started
    assert not (workdir / "champions").exists()  # the champion was not even downloaded
    # one flow run: the deployment runs the retrain body in its own run (flows/deployments.py)
    assert sorted(prefect_flow_runs(other_home)["grpo-retrain"]) == ["FAILED"]
    from mlflow import MlflowClient

    assert _champion(MlflowClient(f"sqlite:///{workdir}/mlflow.db")) == "1"

    t0 = time.time()
    done = _retrain(cfg, workdir)
    retrain_s = time.time() - t0
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(prefect_flow_runs(workdir / "prefect")["grpo-retrain"]) == ["COMPLETED"]
    _check_retrain_run(workdir, tmp_path)
    print(f"pipeline (with the locked-out retrain) {pipeline_s:.0f} s, retrain {retrain_s:.0f} s")


@pytest.mark.slow
def test_sharded_retrain(tiny_model_path, tmp_path):
    """filter.shards and eval.shards > 1: the retrain's pass-rate estimates and its
    challenger's evaluation come from worker processes (the champion's evaluation is the
    pipeline's, cached), and the decision is recorded as unsharded."""
    workdir, cfg = tmp_path / "ws", _config(tmp_path, tiny_model_path)
    first = subprocess.run([GRPO, "run", str(cfg), "--quiet"], env=run_env(workdir), cwd=ROOT,
                           capture_output=True, text=True, timeout=600, check=False)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    done = _retrain(cfg, workdir, "filter.shards=2", "eval.shards=2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    flows = prefect_flow_runs(workdir / "prefect")
    assert flows["sharded-filter"] == ["COMPLETED"] and flows["sharded-eval"] == ["COMPLETED"]
    _check_retrain_run(workdir, tmp_path)
