"""Where the MLflow store is (a config's tracking URI, experiment and artifact root), and
whether it answers (mlflow imported only to probe a server, with MLflow's own
credentials), so `grpo run` can refuse an unreachable server in seconds, before the heavy
imports. A leaf: it imports no other module of `tasks`."""
from __future__ import annotations

import contextlib
import os
import re
import threading
import urllib.parse
from pathlib import Path
from typing import Any

from grpo_core.redaction import strip_userinfo
from grpo_core.workspace import Workspace, workdir_of

_MLFLOW_ANSWERS = (200, 401, 403)
_PROBE_PATHS = ("/health", "/api/2.0/mlflow/experiments/search?max_results=1")


class TrackingUnreachable(RuntimeError):
    """The tracking store cannot be used; the message names the URI and what to do."""


def tracking_uri(cfg, workspace: Workspace | str | os.PathLike | None = None) -> str:
    """cfg.tracking.tracking_uri, else $MLFLOW_TRACKING_URI, else SQLite under the workdir."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    explicit = cfg.tracking.tracking_uri if cfg is not None else None
    if explicit:
        return explicit
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{workdir_of(workspace, cfg) / 'mlflow.db'}"


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
    return (workdir_of(workspace, cfg) / "mlartifacts" / slug(name)).as_uri()


def slug(text: str) -> str:
    """`text` as a file/registry-safe name (runs of other characters -> "-")."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.") or "default"


def check_reachable(uri: str, timeout: float = 5.0) -> None:
    """Raise TrackingUnreachable, naming the URI, when the store cannot answer.

    http(s): GET <uri>/health, then the REST API; 200 (or 401/403 from an auth layer)
    counts as reachable, anything else, a refusal or silence does not. Then one REST call
    with the credentials the MLflow client sends (MLflow's own get_default_host_creds and
    http_request: env, ~/.mlflow/credentials, a token, the URI's user:password, its TLS
    settings): a 401 fails here too, naming the variables to set, never their values. The
    probe runs in a daemon thread joined with a deadline, so a slow DNS lookup cannot
    stretch it past `timeout` + 1 s; no retries. sqlite: the database's folder must be
    writable."""
    shown = strip_userinfo(uri)
    scheme = urllib.parse.urlparse(uri).scheme
    if scheme in ("http", "https"):
        from mlflow.utils.credentials import get_default_host_creds
        from mlflow.utils.rest_utils import MlflowHostCreds, http_request

        creds = get_default_host_creds(uri)
        given = bool((creds.username and creds.password) or creds.token
                     or urllib.parse.urlparse(uri).password)
        bare = MlflowHostCreds(shown, ignore_tls_verification=creds.ignore_tls_verification,
                               server_cert_path=creds.server_cert_path)
        outcome: dict[str, Any] = {}

        def get(host, path: str) -> int:
            return http_request(host, path, "GET", max_retries=0, timeout=timeout).status_code

        # Something must answer like MLflow: /health with 200, or the REST API with 200
        # (401/403: an auth layer in front of it). A 404 from whatever else listens there
        # (a gateway, another web app) is not a tracking server.
        def probe() -> None:
            for path in _PROBE_PATHS:
                try:
                    outcome["status"] = get(bare, path)
                except Exception as exc:  # noqa: BLE001 - any failure means unreachable
                    outcome["error"] = f"{type(exc).__name__}: {exc}".replace(uri, shown)
                    return
                outcome["path"] = path
                if outcome["status"] in _MLFLOW_ANSWERS:
                    break
            # a custom auth provider (MLFLOW_TRACKING_AUTH, AWS SigV4) decides for itself
            if outcome["status"] in _MLFLOW_ANSWERS and not (creds.auth or creds.aws_sigv4):
                with contextlib.suppress(Exception):  # only a clear 401 counts below
                    outcome["auth_status"] = get(creds, _PROBE_PATHS[1])

        t = threading.Thread(target=probe, daemon=True, name="mlflow-health-probe")
        t.start()
        t.join(timeout + 1.0)  # one deadline for both requests: a slow DNS cannot stretch it
        if outcome.get("status") in _MLFLOW_ANSWERS:
            if outcome.get("auth_status") == 401:
                said = "refused the credentials given" if given else "requires authentication and none was given"
                raise TrackingUnreachable(
                    f"MLflow tracking server {shown} {said} (HTTP 401). Set "
                    f"MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD to an MLflow user "
                    f"of that server (the compose stack's pipeline user: MLFLOW_PIPELINE_USERNAME "
                    f"/ MLFLOW_PIPELINE_PASSWORD in infra/.env).")
            return
        why = (f"GET {outcome['path']}: HTTP {outcome['status']}, not an MLflow server?"
               if "status" in outcome else outcome.get("error", f"no answer within {timeout:g} s"))
        raise TrackingUnreachable(
            f"MLflow tracking server {shown} is not reachable ({why}). Start it "
            f"(mlflow server --host ... --port ...), fix MLFLOW_TRACKING_URI / "
            f"tracking.tracking_uri, or unset both to use the local SQLite store.")
    if scheme == "sqlite":
        path = uri[len("sqlite:///"):] if uri.startswith("sqlite:///") else ""
        if not path or path == ":memory:":
            return
        folder = Path(path).parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if not os.access(folder, os.W_OK):
            raise TrackingUnreachable(f"MLflow store {uri}: folder {folder} is not writable")
