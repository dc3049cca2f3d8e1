"""The deployment path, for real, on loopback: a `prefect server`, a `process` work pool
and worker, `prefect deploy` of infra/prefect.yaml, `prefect deployment run` of the
quickstart deployment (with a tiny model) against an `mlflow server` over HTTP; then the
runs are checked in MLflow. Everything started here is stopped by process group."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

pytest_plugins = ["fixtures_models"]
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


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
    config = tmp_path / "deploy.yaml"
    config.write_text(yaml.safe_dump({
        "extends": str(ROOT / "configs/quickstart.yaml"),
        "project": {"name": "itest-deploy"},
        "model": {"name_or_path": tiny_model_path},
        "data": {"train": [{"source": "synthetic:arith", "limit": 24, "levels": [1]}]},
        "filter": {"k": 2, "max_problems": 4},
        "grpo": {"max_steps": 2, "prompts_per_step": 2, "num_generations": 2, "max_completion_length": 8},
        "eval": {"limit": 4, "samples": 2, "max_new_tokens": 8, "bootstrap": 20},
    }))
    services = Services(tmp_path)
    try:
        server = services.start("prefect-server", [str(BIN / "prefect"), "server", "start", "--host",
                                                   "127.0.0.1", "--port", str(prefect_port)], env)
        mlflow = services.start("mlflow-server", [
            str(BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{tmp_path}/mlflow.db",
            "--artifacts-destination", str(tmp_path / "mlartifacts"), "--host", "127.0.0.1",
            "--port", str(mlflow_port), "--workers", "1"],
            {**env, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        _wait_http(f"{api}/health", 120, server, tmp_path / "prefect-server.log")
        _wait_http(f"{mlflow_uri}/health", 120, mlflow, tmp_path / "mlflow-server.log")

        def cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
            out = subprocess.run([str(BIN / "prefect"), "--no-prompt", *args], env=env, cwd=ROOT,
                                 capture_output=True, text=True, timeout=timeout, check=False)
            assert out.returncode == 0, f"prefect {' '.join(args)}:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
            return out

        cli("work-pool", "create", "grpo-cpu", "--type", "process")
        cli("deploy", "--prefect-file", "infra/prefect.yaml", "--all")
        services.start("worker", [str(BIN / "prefect"), "worker", "start", "--pool", "grpo-cpu"], env)
        params = {"config_path": str(config), "workdir": str(tmp_path / "ws")}
        run = cli("deployment", "run", "grpo-run-config/quickstart", "--params", json.dumps(params),
                  "--watch", timeout=600)
        assert "Completed" in run.stdout, run.stdout[-3000:]
    finally:
        services.stop()
        worker_log = tmp_path / "worker.log"
        print(worker_log.read_text()[-3000:] if worker_log.exists() else "no worker log")

    # The runs are in the MLflow server's store (read back from its SQLite file, the
    # server being stopped): one FINISHED parent with its children and a champion.
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name("itest-deploy")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert parents[0].data.tags.get("prefect_flow_run_id") not in (None, "", "None")
    names = {r.info.run_name for r in runs}
    assert {"data", "filter/round-1", "grpo/round-1", "eval/final"} <= names
    assert client.get_model_version_by_alias("itest-deploy-r1_zero", "champion")
    assert not (ROOT / "mlruns").exists()
