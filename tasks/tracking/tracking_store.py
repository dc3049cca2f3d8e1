"""Whether a config's MLflow store answers (where it is: grpo_core.workspace.tracking_uri),
so `grpo run` can refuse an unreachable server in seconds, before the heavy imports.
mlflow is imported only to probe a server, with MLflow's own credentials. A leaf: it
imports no other module of `tasks`."""
from __future__ import annotations

import os
import threading
import urllib.parse
from pathlib import Path
from typing import Any

from grpo_core.redaction import strip_userinfo

_MLFLOW_ANSWERS = (200, 401, 403)
_PROBE_PATH = "/api/2.0/mlflow/experiments/search?max_results=1"


class TrackingUnreachable(RuntimeError):
    """The tracking store cannot be used; the message names the URI and what to do."""


def check_reachable(uri: str, timeout: float = 5.0) -> None:
    """Raise TrackingUnreachable, naming the URI, when the store cannot answer.

    http(s): one GET of the REST API with the credentials the MLflow client sends (MLflow's
    own get_default_host_creds and http_request: env, ~/.mlflow/credentials, a token, the
    URI's user:password, its TLS settings). 200, or 403 from an auth layer, is reachable; a
    401 fails, naming the variables to set, never their values, except under a custom auth
    provider (MLFLOW_TRACKING_AUTH, AWS SigV4), which decides for itself and is not asked
    here; anything else, a refusal or silence is unreachable (a 404 from another web app is
    not a tracking server). The probe runs in a daemon thread joined with a deadline, so a
    slow DNS lookup cannot stretch it past `timeout` + 1 s; no retries.
    sqlite: the database's folder must be writable."""
    shown = strip_userinfo(uri)
    scheme = urllib.parse.urlparse(uri).scheme
    if scheme in ("http", "https"):
        from mlflow.utils.credentials import get_default_host_creds
        from mlflow.utils.rest_utils import MlflowHostCreds, http_request

        creds = get_default_host_creds(uri)
        custom = bool(creds.auth or creds.aws_sigv4)
        if custom:
            creds = MlflowHostCreds(shown, ignore_tls_verification=creds.ignore_tls_verification,
                                    server_cert_path=creds.server_cert_path)
        outcome: dict[str, Any] = {}

        def probe() -> None:
            try:
                outcome["status"] = http_request(creds, _PROBE_PATH, "GET", max_retries=0,
                                                 timeout=timeout).status_code
            except Exception as exc:  # noqa: BLE001 - any failure means unreachable
                outcome["error"] = f"{type(exc).__name__}: {exc}".replace(uri, shown)

        t = threading.Thread(target=probe, daemon=True, name="mlflow-health-probe")
        t.start()
        t.join(timeout + 1.0)
        status = outcome.get("status")
        if status == 401 and not custom:
            given = bool((creds.username and creds.password) or creds.token
                         or urllib.parse.urlparse(uri).password)
            said = "refused the credentials given" if given else "requires authentication and none was given"
            raise TrackingUnreachable(
                f"MLflow tracking server {shown} {said} (HTTP 401). Set "
                f"MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD to an MLflow user "
                f"of that server (the compose stack's pipeline user: MLFLOW_PIPELINE_USERNAME "
                f"/ MLFLOW_PIPELINE_PASSWORD in infra/.env).")
        if status in _MLFLOW_ANSWERS:
            return
        why = (f"GET {_PROBE_PATH}: HTTP {status}, not an MLflow server?" if status is not None
               else outcome.get("error", f"no answer within {timeout:g} s"))
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
