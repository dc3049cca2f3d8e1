"""The deployment path, for real, on loopback, locked down as infra/compose.yaml runs it: a
`prefect server` that requires an API auth string (it refuses a call without it or with a
wrong one), a `process` work pool and worker (flows.worker), `prefect deploy` of
infra/prefect.yaml and `prefect deployment run` of the compare, quickstart and
weekly-retrain deployments (with a tiny model), all given the string through
PREFECT_API_AUTH_STRING, against an `mlflow server` behind basic auth that the flow runs
reach as the pipeline's user (MLFLOW_TRACKING_USERNAME / _PASSWORD from the worker's
environment). The runs tell the story `grpo run` tells (issue 34, item 7): named as it names
them, every stage's start/end lines and the findings in the retrain's log too, no library
warnings or progress bars on the worker's terminal, the promotion's delta written as
everywhere else, the verdict saying which versions it was computed with and marked STALE
once a newer champion is in; and the worker stops promptly on SIGTERM mid-run, its flow run
and every process under it with it. Then the runs are checked in MLflow, and no credential
is found in Prefect's database, the workspace, MLflow's stores, any log or output.
Everything started here is stopped by process group."""
import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from fixtures_models import MAIN_JOB_SHRINK
from mlflow_server import MlflowServer
from pipeline_runs import basic_auth_token, scan_for_secrets
from prefect_services import (
    Services,
    free_port,
    prefect_status,
    prefect_story,
    run_state,
    wait_http,
)

from grpo_core.config import load_config
from tasks.tracking.mlflow_client import stage_of

pytest_plugins = ["fixtures_models"]
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PREFECT_AUTH = "grpo:prefauth_3a9d71c0e5b2"
MLFLOW_ADMIN = ("admin", "mlfadmin_d80f2b6e1c97")
MLFLOW_PIPELINE = ("grpo-pipeline", "mlfpipe_47c1a9e3f0b6")


RUN_NAME = re.compile(r"^((r1_zero|sft_grpo|retrain-r1_zero)-[0-9a-f]{8}|compare-r1_zero-vs-sft_grpo)$")
# what `grpo run` keeps off a terminal (flows.cli_common.quiet_libraries)
NOISE = ("FutureWarning", "UserWarning", "Loading weights", "Writing model shards", "it/s]")
RETRAIN_STAGES = ("data", "filter/round-1", "grpo/round-1", "eval/champion", "eval/final")


def _config_hash(config: Path, workdir: Path, overrides: list[str] | None = None) -> str:
    cfg = load_config(config, overrides or [])
    cfg.project.workdir = str(workdir)
    return cfg.hash()


def _deployment_overrides(name: str) -> list[str]:
    """The `overrides` parameter infra/prefect.yaml gives deployment `name` (a run's own
    parameters are merged over it)."""
    spec = yaml.safe_load((ROOT / "infra/prefect.yaml").read_text())
    (dep,) = [d for d in spec["deployments"] if d["name"] == name]
    return list(dep.get("parameters", {}).get("overrides") or [])


def test_deployments_tell_the_grpo_run_story_on_a_worker(tiny_model_path, tmp_path):
    prefect_port, mlflow_port = free_port(), free_port()
    api = f"http://127.0.0.1:{prefect_port}/api"
    mlflow_uri = f"http://127.0.0.1:{mlflow_port}"
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("PREFECT_", "MLFLOW_", "GRPO_VERBOSE"))}
    env = {**base, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_API_URL": api,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "MLFLOW_TRACKING_URI": mlflow_uri,
           "MLFLOW_DISABLE_TELEMETRY": "true", "GRPO_TORCH_THREADS": "1", "GRPO_REPO_DIR": str(ROOT),
           "PYTHONUNBUFFERED": "1"}
    # The server checks the string; the CLI, the worker and its flow runs send it (compose:
    # PREFECT_AUTH_STRING); the worker's flow runs sign in to MLflow as the pipeline's user.
    server_env = {**env, "PREFECT_SERVER_API_AUTH_STRING": PREFECT_AUTH}
    env.update(PREFECT_API_AUTH_STRING=PREFECT_AUTH, MLFLOW_TRACKING_USERNAME=MLFLOW_PIPELINE[0],
               MLFLOW_TRACKING_PASSWORD=MLFLOW_PIPELINE[1])
    config = tmp_path / "deploy.yaml"
    config.write_text(yaml.safe_dump({
        "extends": str(ROOT / "configs/quickstart.yaml"),
        "project": {"name": "itest-deploy"},
        "model": {"name_or_path": tiny_model_path},
        "data": {"train": [{"source": "synthetic:arith", "limit": 24, "levels": [1]}]},
        "filter": {"k": 2, "max_problems": 4},
        "grpo": {"max_steps": 2, "per_device_train_batch_size": 4, "num_generations": 2, "max_completion_length": 8},
        "eval": {"limit": 4, "samples": 2, "max_new_tokens": 8, "bootstrap": 20},
    }))
    ws = tmp_path / "ws"
    params = {"config_path": str(config), "workdir": str(ws)}
    # the default recipes (r1_zero, sft_grpo), shrunk, in the same experiment and store
    compare_params = {"overrides": [*MAIN_JOB_SHRINK, f"model.name_or_path={tiny_model_path}",
                                    "project.name=itest-deploy"], "workdir": str(ws)}
    services = Services(tmp_path)
    (tmp_path / "mlflow").mkdir()
    mlflow = MlflowServer(tmp_path / "mlflow", tmp_path / "mlflow" / "mlflow.db", port=mlflow_port,
                          admin=MLFLOW_ADMIN)
    outputs, timings = [], {}
    try:
        server = services.start("prefect-server", [str(BIN / "prefect"), "server", "start", "--host",
                                                   "127.0.0.1", "--port", str(prefect_port)], server_env)
        mlflow.start()
        wait_http(f"{api}/health", 120, server, tmp_path / "prefect-server.log")
        # Every API call but the health check needs the auth string, and only the right one.
        assert prefect_status(api, None) == 401
        assert prefect_status(api, "grpo:not-the-string") == 401
        assert prefect_status(api, PREFECT_AUTH) == 200
        mlflow.wait_healthy(120)
        user = mlflow.ensure_user(*MLFLOW_PIPELINE)
        outputs.append(user.stdout + user.stderr)
        assert user.returncode == 0, user.stdout + user.stderr

        def cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
            t0 = time.monotonic()
            out = subprocess.run([str(BIN / "prefect"), "--no-prompt", *args], env=env, cwd=ROOT,
                                 capture_output=True, text=True, timeout=timeout, check=False)
            timings[" ".join(args[:3])] = round(time.monotonic() - t0)
            outputs.append(out.stdout + out.stderr)
            assert out.returncode == 0, f"prefect {' '.join(args)}:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
            return out

        def deployment_run(name: str, body: dict) -> None:
            run = cli("deployment", "run", name, "--params", json.dumps(body), "--watch", timeout=900)
            assert "Completed" in run.stdout, run.stdout[-3000:]

        cli("work-pool", "create", "grpo-cpu", "--type", "process")
        cli("deploy", "--prefect-file", "infra/prefect.yaml", "--all")
        worker = services.start("worker", [str(BIN / "python"), "-m", "flows.worker", "--pool",
                                           "grpo-cpu"], env)
        deployment_run("grpo-compare-recipes/compare", compare_params)  # r1_zero v1, champion
        experiment = mlflow.request("/api/2.0/mlflow/experiments/get-by-name?experiment_name="
                                    "itest-deploy", MLFLOW_ADMIN)[1]["experiment"]
        note = {t["key"]: t["value"] for t in experiment["tags"]}["mlflow.note.content"]
        assert "(computed with itest-deploy-r1_zero v1 (champion), itest-deploy-sft_grpo v1 " \
               "(champion))" in note, note
        deployment_run("grpo-run-config/quickstart", params)  # r1_zero v2, a challenger
        # A newer champion than the verdict's (what a retrain that wins does; here by hand, a
        # tiny random model never wins): the retrain started from it marks the verdict STALE.
        status, said = mlflow.request("/api/2.0/mlflow/registered-models/alias", MLFLOW_ADMIN, "POST",
                                      {"name": "itest-deploy-r1_zero", "alias": "champion",
                                       "version": "2"})
        assert status == 200, said
        deployment_run("grpo-retrain/weekly-retrain", params)
        story = prefect_story(api, PREFECT_AUTH)  # checked below, with MLflow's config hashes

        # SIGTERM mid-run: the worker and its flow run (and all under it) stop within seconds.
        started = cli("deployment", "run", "grpo-run-config/quickstart", "--params",
                      json.dumps({**params, "workdir": str(tmp_path / "ws-killed")}))
        run_id = re.search(r"UUID: ([0-9a-f-]{36})", started.stdout).group(1)
        deadline = time.monotonic() + 300
        while "data: started" not in run_state(api, PREFECT_AUTH, run_id)[1]:
            assert time.monotonic() < deadline, run_state(api, PREFECT_AUTH, run_id)
            time.sleep(1)
        family = psutil.Process(worker.pid).children(recursive=True)
        assert any("prefect.engine" in " ".join(p.cmdline()) for p in family), family
        t0 = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
        timings["worker stop after SIGTERM"] = stopped_s = round(time.monotonic() - t0, 1)
        _, alive = psutil.wait_procs(family, timeout=5)
        assert not alive, alive
        assert stopped_s < 30, stopped_s
        time.sleep(2)
        killed_state = run_state(api, PREFECT_AUTH, run_id)[0]
    finally:
        services.stop()
        mlflow.stop()
        worker_log = tmp_path / "worker.log"
        terminal = worker_log.read_text() if worker_log.exists() else "no worker log"
        print(terminal[-3000:], "\ntimings (s):", timings)
    assert killed_state == "CRASHED", killed_state  # not left RUNNING, as a SIGKILLed worker leaves it

    # No credential in Prefect's database and home, the workspace, MLflow's stores and
    # artifacts, the servers' and the worker's logs, or the CLI's output.
    # (Prefect sends the string as HTTP basic auth: its base64 form counts as a leak too.)
    leaks = scan_for_secrets(tmp_path, "\n".join(outputs),
                             [PREFECT_AUTH, MLFLOW_ADMIN[1], MLFLOW_PIPELINE[1],
                              base64.b64encode(PREFECT_AUTH.encode()).decode(),
                              basic_auth_token(*MLFLOW_ADMIN), basic_auth_token(*MLFLOW_PIPELINE)])
    assert not leaks, leaks
    # The worker's terminal: the stage lines, none of the libraries' noise `grpo run` hides.
    assert "grpo/round-1: started" in terminal
    assert not [n for n in NOISE if n in terminal], [n for n in NOISE if n in terminal]

    # The runs are in the MLflow server's store (read back from its SQLite file, the
    # server being stopped).
    from mlflow import MlflowClient

    from tasks.tracking.verdict_freshness import comparison_verdict

    db = f"sqlite:///{tmp_path}/mlflow/mlflow.db"
    client = MlflowClient(db, db)
    exp = client.get_experiment_by_name("itest-deploy")
    runs = client.search_runs([exp.experiment_id])
    parents = {r.data.tags.get("config_hash"): r for r in runs if "mlflow.parentRunId" not in r.data.tags}
    quick_hash = _config_hash(config, ws)
    quick = parents[quick_hash]
    assert quick.info.status == "FINISHED"
    assert quick.data.tags.get("prefect_flow_run_id") not in (None, "", "None")
    # the cross-link: the MLflow parent names its Prefect flow run's page (issue 47)
    url = quick.data.tags["prefect_flow_run_url"]
    assert url.startswith(f"http://127.0.0.1:{prefect_port}/"), url
    assert url.endswith(f"/flow-run/{quick.data.tags['prefect_flow_run_id']}"), url
    assert quick.data.tags["prefect_flow_run_url"] in quick.data.tags["mlflow.note.content"]
    names = {stage_of(r) for r in runs}
    assert {"data", "filter/round-1", "grpo/round-1", "eval/final", "eval/champion"} <= names
    assert not (ROOT / "mlruns").exists()

    # Every run a deployment started is named as `grpo run` names it: no "frisky-bat".
    assert all(RUN_NAME.match(n) for n in story), sorted(story)
    # (the SIGTERMed run below the story's capture left a parent of its own: not finished)
    pipelines = {f"{r.data.tags['recipe']}-{h[:8]}" for h, r in parents.items()
                 if h and r.data.tags.get("recipe") in ("r1_zero", "sft_grpo")
                 and r.info.status == "FINISHED"}
    # the retrain's config: the quickstart's with the deployment's own overrides
    retrain_hash = _config_hash(config, ws, _deployment_overrides("weekly-retrain"))
    retrain_name = f"retrain-r1_zero-{retrain_hash[:8]}"
    assert pipelines | {"compare-r1_zero-vs-sft_grpo", retrain_name} <= set(story), sorted(story)
    top = {n for n, s in story.items() if not s["sub"]}
    assert {f"r1_zero-{quick_hash[:8]}", "compare-r1_zero-vs-sft_grpo", retrain_name} <= top
    # The quickstart's run is the pipeline's: task runs after the stages, the lines in its log.
    pipeline = story[f"r1_zero-{quick_hash[:8]}"]
    assert {"data", "filter/round-1", "grpo/round-1", "eval/final"} <= pipeline["tasks"]
    assert "data: started" in pipeline["logs"], pipeline["logs"]
    assert any(re.match(r"eval/final: (computed|reused from eval/(round-1|base)) in", m)
               for m in pipeline["logs"]), pipeline["logs"]
    assert any(m.startswith("final: ") for m in pipeline["logs"]), pipeline["logs"]
    assert client.get_model_version_by_alias("itest-deploy-r1_zero", "champion")

    # The retrain's log: every stage's start and end lines, its findings as MLflow counts them
    # (one `finding:` line each), its decision with the delta written as `grpo run` writes it.
    logs = story[retrain_name]["logs"]
    for stage in RETRAIN_STAGES:
        assert f"{stage}: started" in logs, (stage, logs)
        assert any(m.startswith((f"{stage}: computed in", f"{stage}: cached in")) for m in logs), (stage, logs)
    retrain_run = next(r for h, r in parents.items() if h and "-retrain-v2" in h)
    counted = retrain_run.data.tags["findings.count"]
    findings = [m for m in logs if m.startswith("finding: ")]
    if findings:
        assert f"findings: {counted}" in logs, (counted, logs)
    assert len(findings) == (0 if retrain_run.data.tags["findings"] == "none"
                             else len(retrain_run.data.tags["findings"].split(" | "))), logs
    said = next(m for m in logs if m.startswith("retrain: "))
    assert re.search(r"paired delta [+-]\d", said) or "paired delta" not in said, said

    # The verdict says what it was computed with, and that the champion is newer now.
    verdict = comparison_verdict(db, "itest-deploy")
    assert "computed with itest-deploy-r1_zero v1" in verdict, verdict
    assert "STALE: itest-deploy-r1_zero's champion is now v2" in verdict, verdict
    landing = client.get_experiment(exp.experiment_id).tags["mlflow.note.content"]
    assert landing.startswith("STALE: itest-deploy-r1_zero's champion is now v2"), landing
