"""MLflow behind its basic auth, for real, on loopback, set up as infra/compose.yaml sets it
up (infra/mlflow/basic_auth.ini, the admin from the environment, infra/mlflow_users.py for
the other users): it refuses a request without credentials and one with a wrong password;
only an admin creates users; `grpo run` of the quickstart as the pipeline's own (non-admin)
identity, credentials from the environment, logs its runs and registers its champion
(without them, or with a wrong password, it stops in seconds before any work); a
viewer reads all of it but can neither move the champion nor write into the pipeline's
experiment; and no credential lands in the workspace, the server's files or any output.

(Prefect's API auth, with a worker and `prefect deployment run`: tests/test_deployment.py.)"""
from __future__ import annotations

import subprocess
import time

import pytest
import yaml
from mlflow_server import MlflowServer, http_standin
from pipeline_runs import GRPO, ROOT, basic_auth_token, run_env, scan_for_secrets

from tasks.tracking.mlflow_client import stage_of

pytest_plugins = ["fixtures_models"]
pytestmark = pytest.mark.integration

ADMIN = ("admin", "mlfadmin_6d2c9e41b7a0f3")
PIPELINE = ("grpo-pipeline", "mlfpipe_0b7e3c92d5a14f")
VIEWER = ("viewer", "mlfview_59a1e0c7b3d2f8")
VIEWER_ROTATED = "mlfview_rotated_c2e7a9d4"
SECRETS = [ADMIN[1], PIPELINE[1], VIEWER[1], VIEWER_ROTATED,  # and as Authorization headers carry them
           basic_auth_token(*ADMIN), basic_auth_token(*PIPELINE), basic_auth_token(VIEWER[0], VIEWER_ROTATED)]
SEARCH = "/api/2.0/mlflow/experiments/search?max_results=1"


def _config(tmp_path, model_path: str):
    path = tmp_path / "auth.yaml"
    path.write_text(yaml.safe_dump({
        "extends": str(ROOT / "configs/quickstart.yaml"),
        "project": {"name": "itest-auth", "recipe": "r1_zero"},
        "model": {"name_or_path": model_path},
        "data": {"train": [{"source": "synthetic:arith", "limit": 24, "levels": [1]}]},
        "filter": {"k": 2, "max_problems": 4},
        "grpo": {"max_steps": 2, "per_device_train_batch_size": 4, "num_generations": 2, "max_completion_length": 8},
        "eval": {"limit": 4, "samples": 2, "max_new_tokens": 8, "bootstrap": 20},
    }))
    return path


def test_mlflow_basic_auth_pipeline_run_and_guarded_registry(tiny_model_path, tmp_path, monkeypatch):
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    folder = tmp_path / "server"
    folder.mkdir()
    t0 = time.monotonic()
    server = MlflowServer(folder, folder / "mlflow.db", admin=ADMIN).start()
    outputs = []
    try:
        server.wait_healthy()  # /health answers without credentials (compose's healthcheck)
        print(f"mlflow server (basic auth) healthy in {time.monotonic() - t0:.1f} s")
        # Refused: no credentials, a wrong password, MLflow's old shipped default; the admin passes.
        assert server.request(SEARCH)[0] == 401
        assert server.request(SEARCH, (ADMIN[0], "wrong-password-1234"))[0] == 401
        assert server.request(SEARCH, ("admin", "password1234"))[0] == 401
        assert server.request(SEARCH, ADMIN)[0] == 200

        # Users: an admin creates them; nobody else can; a re-run rotates the password.
        for user, password in (PIPELINE, VIEWER):
            out = server.ensure_user(user, password)
            outputs.append(out.stdout + out.stderr)
            assert out.returncode == 0 and f"{user}: created" in out.stdout, out.stdout + out.stderr
        out = server.ensure_user("intruder", "intruder-pass-1234", admin=VIEWER)
        outputs.append(out.stdout + out.stderr)
        assert out.returncode != 0 and "HTTP 403" in out.stderr, out.stdout + out.stderr
        assert server.request(SEARCH, ("intruder", "intruder-pass-1234"))[0] == 401
        out = server.ensure_user(VIEWER[0], VIEWER_ROTATED)
        outputs.append(out.stdout + out.stderr)
        assert out.returncode == 0 and "password updated" in out.stdout
        assert server.request(SEARCH, VIEWER)[0] == 401
        assert server.request(SEARCH, (VIEWER[0], VIEWER_ROTATED))[0] == 200

        # Without credentials, or with a wrong password, `grpo run` stops in seconds, before
        # any work, naming the variables to set (never a value).
        config = _config(tmp_path, tiny_model_path)
        for creds in ({}, {"MLFLOW_TRACKING_USERNAME": PIPELINE[0],
                           "MLFLOW_TRACKING_PASSWORD": "wrong-password-5678"}):
            t1 = time.monotonic()
            refused = subprocess.run([GRPO, "run", str(config), "--quiet"],
                                     env=run_env(tmp_path / "refused", MLFLOW_TRACKING_URI=server.uri, **creds),
                                     cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
            took = time.monotonic() - t1
            outputs.append(refused.stdout + refused.stderr)
            assert refused.returncode == 1, refused.stdout + refused.stderr
            assert "HTTP 401" in refused.stderr and "MLFLOW_TRACKING_PASSWORD" in refused.stderr
            assert "Traceback" not in refused.stderr and "wrong-password-5678" not in refused.stderr
            # Refused before any stage: the bound catches a retry loop (MLflow's default
            # retries take minutes), not speed; start-up alone took 23 s on a loaded machine.
            assert took < 60, f"{took:.1f} s to refuse"
            assert not (tmp_path / "refused").exists(), "workspace state created before the check"

        # The pipeline, as its own identity, credentials from the environment only.
        workdir = tmp_path / "ws"
        env = run_env(workdir, MLFLOW_TRACKING_URI=server.uri, MLFLOW_TRACKING_USERNAME=PIPELINE[0],
                      MLFLOW_TRACKING_PASSWORD=PIPELINE[1])
        t1 = time.monotonic()
        run = subprocess.run([GRPO, "run", str(config), "--quiet"],
                             env=env, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
        print(f"grpo run against it: {time.monotonic() - t1:.1f} s")
        outputs.append(run.stdout + run.stderr)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

        # A viewer reads everything the run logged, through the server ...
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", VIEWER[0])
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", VIEWER_ROTATED)
        viewer = MlflowClient(server.uri)
        exp = viewer.get_experiment_by_name("itest-auth")
        runs = viewer.search_runs([exp.experiment_id])
        parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
        assert len(parents) == 1 and parents[0].info.status == "FINISHED"
        assert {"data", "filter/round-1", "grpo/round-1", "eval/final"} <= {stage_of(r) for r in runs}
        champion = viewer.get_model_version_by_alias("itest-auth-r1_zero", "champion")
        assert champion.run_id == parents[0].info.run_id
        assert [a.path for a in viewer.list_artifacts(parents[0].info.run_id, "config")]
        # ... but cannot move or drop the champion, nor write into the pipeline's experiment.
        for attempt in (lambda: viewer.set_registered_model_alias("itest-auth-r1_zero", "champion", "1"),
                        lambda: viewer.delete_registered_model_alias("itest-auth-r1_zero", "champion"),
                        lambda: viewer.create_run(exp.experiment_id)):
            with pytest.raises(MlflowException) as err:
                attempt()
            assert err.value.error_code == "PERMISSION_DENIED", err.value
        # The pipeline's identity may (it created the model, so it holds MANAGE on it).
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", PIPELINE[0])
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PIPELINE[1])
        MlflowClient(server.uri).set_registered_model_alias("itest-auth-r1_zero", "champion",
                                                            champion.version)
    finally:
        server.stop()

    # No credential in the workspace, the server's stores, artifacts and log, or any output.
    leaks = scan_for_secrets(tmp_path, "\n".join(outputs), SECRETS)
    assert not leaks, leaks
    assert not (ROOT / "mlruns").exists()


def test_check_reachable_probes_with_the_clients_credentials(tmp_path, monkeypatch):
    """tasks.preflight.check_reachable against a stand-in for a basic-auth MLflow (open
    /health, 401 elsewhere without the right header): the header is built as the MLflow
    client builds it, from the environment, ~/.mlflow/credentials or the URI's userinfo."""
    from tasks.preflight import PreflightError, check_reachable

    good = "Basic " + basic_auth_token(*PIPELINE)

    def status_of(request) -> int:
        return 200 if request.path == "/health" or request.headers.get("Authorization") == good else 401

    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN",
                 "MLFLOW_TRACKING_AUTH", "MLFLOW_TRACKING_AWS_SIGV4"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.mlflow/credentials yet
    with http_standin(status_of) as uri:
        with pytest.raises(PreflightError, match="requires authentication and none was given"):
            check_reachable(uri, timeout=3)
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", PIPELINE[0])
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong-password-5678")
        with pytest.raises(PreflightError, match="refused the credentials") as err:
            check_reachable(uri, timeout=3)
        assert "wrong-password-5678" not in str(err.value) and "MLFLOW_TRACKING_PASSWORD" in str(err.value)
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PIPELINE[1])
        check_reachable(uri, timeout=3)
        monkeypatch.delenv("MLFLOW_TRACKING_USERNAME")
        monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
        check_reachable(uri.replace("://", f"://{PIPELINE[0]}:{PIPELINE[1]}@"), timeout=3)
        (tmp_path / ".mlflow").mkdir()
        (tmp_path / ".mlflow" / "credentials").write_text(
            f"[mlflow]\nmlflow_tracking_username = {PIPELINE[0]}\nmlflow_tracking_password = {PIPELINE[1]}\n")
        check_reachable(uri, timeout=3)
        (tmp_path / ".mlflow" / "credentials").unlink()
        monkeypatch.setenv("MLFLOW_TRACKING_AUTH", "some_plugin")  # a custom provider decides
        check_reachable(uri, timeout=3)
