"""Where the MLflow store is, and whether it answers: no mlflow import, so `grpo run`
can refuse an unreachable tracking server in a second, before the heavy imports. Also the
workspace side of tracking: the workdir of a config, and the small JSON state files
(<workdir>/runs/<config hash>.json remembers a config's parent run).

A leaf: it imports no other module of `tasks`."""
from __future__ import annotations

import base64
import configparser
import contextlib
import json
import os
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from grpo_core.workspace import Workspace

_MLFLOW_ANSWERS = (200, 401, 403)


class TrackingUnreachable(RuntimeError):
    """The tracking store cannot be used; the message names the URI and what to do."""


def workdir_of(workspace: Workspace | str | os.PathLike | None, cfg=None) -> Path:
    """The workdir folder of `workspace` (a Workspace or a path), else of the config."""
    if isinstance(workspace, Workspace):
        return workspace.root
    if workspace is not None:
        return Path(workspace).expanduser().resolve()
    return Workspace.at(cfg.project.workdir if cfg is not None else None).root


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


def strip_userinfo(uri: str) -> str:
    """The URI without user:password@, for messages and for our own health probe."""
    p = urllib.parse.urlparse(uri)
    if p.username is None and p.password is None:
        return uri
    host = p.hostname or ""
    if p.port:
        host = f"{host}:{p.port}"
    return urllib.parse.urlunparse(p._replace(netloc=host))


def parent_state_path(workdir: Path, config_hash: str) -> Path:
    """Where the parent run of `config_hash` is remembered."""
    return workdir / "runs" / f"{config_hash}.json"


def read_state(path: Path) -> dict:
    """A JSON state file, {} when it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_state(path: Path, state: dict) -> None:
    """Write a JSON state file atomically (temp file + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
    os.replace(tmp, path)


def _client_auth_header() -> dict[str, str] | None:
    """The Authorization header the MLflow client will send: MLFLOW_TRACKING_USERNAME and
    _PASSWORD (else those of ~/.mlflow/credentials), else MLFLOW_TRACKING_TOKEN; {} for none.
    None when a custom auth provider (MLFLOW_TRACKING_AUTH, AWS SigV4) decides instead."""
    if os.environ.get("MLFLOW_TRACKING_AUTH") or os.environ.get("MLFLOW_TRACKING_AWS_SIGV4", "").lower() == "true":
        return None
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if not (user and password):
        creds = configparser.ConfigParser()
        creds.read(os.path.expanduser("~/.mlflow/credentials"))
        if creds.has_section("mlflow"):
            user = user or creds["mlflow"].get("mlflow_tracking_username")
            password = password or creds["mlflow"].get("mlflow_tracking_password")
    if user and password:
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


def check_reachable(uri: str, timeout: float = 5.0) -> None:
    """Raise TrackingUnreachable, naming the URI, when the store cannot answer.

    http(s): GET <uri>/health, then the REST API; 200 (or 401/403 from an auth layer)
    counts as reachable, anything else, a refusal or silence does not. Then one REST call
    with the credentials the MLflow client will send: a 401 (none given, or wrong ones for
    a server behind basic auth) fails here too, naming the variables to set, never their
    values. The probe runs in a daemon thread joined with a deadline, so a slow DNS
    lookup cannot stretch it past `timeout` + 1 s. The MLflow client itself retries for
    minutes, hence this check before any work. sqlite: the folder of the database file
    must be writable.
    """
    shown = strip_userinfo(uri)
    scheme = urllib.parse.urlparse(uri).scheme
    if scheme in ("http", "https"):
        outcome: dict[str, Any] = {}

        context = None
        if scheme == "https":  # the TLS settings the MLflow client itself honours
            import ssl

            if os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true":
                context = ssl._create_unverified_context()  # the user asked for it
            elif os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH"):
                context = ssl.create_default_context(
                    cafile=os.environ["MLFLOW_TRACKING_SERVER_CERT_PATH"])

        # Something must answer like MLflow: /health with 200, or the REST API with 200
        # (401/403: an auth layer in front of it). A 404 from whatever else listens there
        # (a gateway, another web app) is not a tracking server.
        paths = ("/health", "/api/2.0/mlflow/experiments/search?max_results=1")
        headers = _client_auth_header()
        userinfo = urllib.parse.urlparse(uri)
        if headers == {} and userinfo.username and userinfo.password:  # http://user:pw@host
            pair = f"{urllib.parse.unquote(userinfo.username)}:{urllib.parse.unquote(userinfo.password)}"
            headers = {"Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}

        def get(path: str, extra: dict[str, str]) -> int:
            req = urllib.request.Request(shown.rstrip("/") + path, headers=extra)
            try:
                with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
                    return resp.status
            except urllib.error.HTTPError as exc:
                return exc.code

        def probe() -> None:
            for path in paths:
                try:
                    outcome["status"] = get(path, {})
                except Exception as exc:  # noqa: BLE001 - any failure means unreachable
                    outcome["error"] = f"{type(exc).__name__}: {exc}"
                    return
                outcome["path"] = path
                if outcome["status"] in _MLFLOW_ANSWERS:
                    break
            if outcome["status"] in _MLFLOW_ANSWERS and headers is not None:
                with contextlib.suppress(Exception):  # only a clear 401 counts below
                    outcome["auth_status"] = get(paths[1], headers)

        t = threading.Thread(target=probe, daemon=True, name="mlflow-health-probe")
        t.start()
        t.join(timeout + 1.0)  # one deadline for both requests: a slow DNS cannot stretch it
        if outcome.get("status") in _MLFLOW_ANSWERS:
            if outcome.get("auth_status") == 401:
                given = ("refused the credentials given" if headers else
                         "requires authentication and none was given")
                raise TrackingUnreachable(
                    f"MLflow tracking server {shown} {given} (HTTP 401). Set "
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
