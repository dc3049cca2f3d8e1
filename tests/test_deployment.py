"""The deployment path, for real, on loopback, locked down as infra/compose.yaml runs it: a
`prefect server` that requires an API auth string (it refuses a call without it or with a
wrong one), a `process` work pool and worker, `prefect deploy` of infra/prefect.yaml and
`prefect deployment run` of the quickstart deployment (with a tiny model), all given the
string through PREFECT_API_AUTH_STRING, against an `mlflow server` behind basic auth that the
flow run reaches as the pipeline's user (MLFLOW_TRACKING_USERNAME / _PASSWORD from the
worker's environment). Then the runs are checked in MLflow, and no credential is found in
Prefect's database, the workspace, MLflow's stores, any log or output. Everything started
here is stopped by process group."""
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from mlflow_server import MlflowServer
from pipeline_runs import basic_auth_token, scan_for_secrets

from tasks.tracking.mlflow_client import stage_of

pytest_plugins = ["fixtures_models"]
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PREFECT_AUTH = "grpo:prefauth_3a9d71c0e5b2"
MLFLOW_ADMIN = ("admin", "mlfadmin_d80f2b6e1c97")
MLFLOW_PIPELINE = ("grpo-pipeline", "mlfpipe_47c1a9e3f0b6")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, seconds: float, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited: {log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} not healthy after {seconds} s: {log.read_text()[-2000:]}")


def _prefect_status(api: str, auth: str | None) -> int:
    """HTTP status of one Prefect API call (list flows), with `auth` as the auth string."""
    req = urllib.request.Request(f"{api}/flows/filter", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json"})
    if auth is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _prefect_post(api: str, path: str, body: dict, auth: str) -> list[dict]:
    req = urllib.request.Request(f"{api}/{path}", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization":
                                          "Basic " + base64.b64encode(auth.encode()).decode()})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.load(resp)


def _prefect_story(api: str, auth: str) -> dict:
    """Flow run name -> its task run names and log lines, read from the server's API."""
    story = {}
    for run in _prefect_post(api, "flow_runs/filter", {}, auth):
        ids = {"any_": [run["id"]]}
        story[run["name"]] = {
            "tasks": {t["name"] for t in _prefect_post(api, "task_runs/filter",
                                                        {"flow_runs": {"id": ids}}, auth)},
            "logs": [x["message"] for x in _prefect_post(
                api, "logs/filter", {"logs": {"flow_run_id": ids}, "limit": 200}, auth)]}
    return story


class Services:
    def __init__(self, tmp: Path):
        self.tmp, self.procs = tmp, []

    def start(self, name: str, args: list[str], env: dict) -> subprocess.Popen:
        log = self.tmp / f"{name}.log"
        proc = subprocess.Popen(args, env=env, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)  # a Prefect worker ignores SIGTERM
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_quickstart_deployment_runs_on_a_worker(tiny_model_path, tmp_path):
    prefect_port, mlflow_port = _free_port(), _free_port()
    api = f"http://127.0.0.1:{prefect_port}/api"
    mlflow_uri = f"http://127.0.0.1:{mlflow_port}"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
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
    services = Services(tmp_path)
    (tmp_path / "mlflow").mkdir()
    mlflow = MlflowServer(tmp_path / "mlflow", tmp_path / "mlflow" / "mlflow.db", port=mlflow_port,
                          admin=MLFLOW_ADMIN)
    outputs = []
    try:
        server = services.start("prefect-server", [str(BIN / "prefect"), "server", "start", "--host",
                                                   "127.0.0.1", "--port", str(prefect_port)], server_env)
        mlflow.start()
        _wait_http(f"{api}/health", 120, server, tmp_path / "prefect-server.log")
        # Every API call but the health check needs the auth string, and only the right one.
        assert _prefect_status(api, None) == 401
        assert _prefect_status(api, "grpo:not-the-string") == 401
        assert _prefect_status(api, PREFECT_AUTH) == 200
        mlflow.wait_healthy(120)
        user = mlflow.ensure_user(*MLFLOW_PIPELINE)
        outputs.append(user.stdout + user.stderr)
        assert user.returncode == 0, user.stdout + user.stderr

        def cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
            out = subprocess.run([str(BIN / "prefect"), "--no-prompt", *args], env=env, cwd=ROOT,
                                 capture_output=True, text=True, timeout=timeout, check=False)
            outputs.append(out.stdout + out.stderr)
            assert out.returncode == 0, f"prefect {' '.join(args)}:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
            return out

        cli("work-pool", "create", "grpo-cpu", "--type", "process")
        cli("deploy", "--prefect-file", "infra/prefect.yaml", "--all")
        services.start("worker", [str(BIN / "prefect"), "worker", "start", "--pool", "grpo-cpu"], env)
        params = {"config_path": str(config), "workdir": str(tmp_path / "ws")}
        run = cli("deployment", "run", "grpo-run-config/quickstart", "--params", json.dumps(params),
                  "--watch", timeout=600)
        assert "Completed" in run.stdout, run.stdout[-3000:]
        story = _prefect_story(api, PREFECT_AUTH)  # checked below, with MLflow's config hash
    finally:
        services.stop()
        mlflow.stop()
        worker_log = tmp_path / "worker.log"
        print(worker_log.read_text()[-3000:] if worker_log.exists() else "no worker log")

    # No credential in Prefect's database and home, the workspace, MLflow's stores and
    # artifacts, the servers' and the worker's logs, or the CLI's output.
    # (Prefect sends the string as HTTP basic auth: its base64 form counts as a leak too.)
    leaks = scan_for_secrets(tmp_path, "\n".join(outputs),
                             [PREFECT_AUTH, MLFLOW_ADMIN[1], MLFLOW_PIPELINE[1],
                              base64.b64encode(PREFECT_AUTH.encode()).decode(),
                              basic_auth_token(*MLFLOW_ADMIN), basic_auth_token(*MLFLOW_PIPELINE)])
    assert not leaks, leaks

    # The runs are in the MLflow server's store (read back from its SQLite file, the
    # server being stopped): one FINISHED parent with its children and a champion.
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow/mlflow.db")
    exp = client.get_experiment_by_name("itest-deploy")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert parents[0].data.tags.get("prefect_flow_run_id") not in (None, "", "None")
    # The worker's flow run told Prefect the same story: the pipeline subflow named after
    # recipe and config hash, task runs after the stages, the stage lines in its log.
    pipeline = story.get(f"r1_zero-{parents[0].data.tags['config_hash'][:8]}")
    assert pipeline is not None, sorted(story)
    assert {"data", "filter/round-1", "grpo/round-1", "eval/final"} <= pipeline["tasks"]
    assert "data: started" in pipeline["logs"], pipeline["logs"]
    assert any(m.startswith(("eval/final: computed in", "eval/final: cached in"))
               for m in pipeline["logs"]), pipeline["logs"]
    assert any(m.startswith("final: ") for m in pipeline["logs"]), pipeline["logs"]
    names = {stage_of(r) for r in runs}
    assert {"data", "filter/round-1", "grpo/round-1", "eval/final"} <= names
    assert client.get_model_version_by_alias("itest-deploy-r1_zero", "champion")
    assert not (ROOT / "mlruns").exists()
