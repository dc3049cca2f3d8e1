"""One pass of checks before any work, and the plan it produces.

`preflight(cfg)` decides, once per run, what every layer below would otherwise re-check:
the config's benchmarks exist, a fetchable model is fetched, how a stage starts on this
machine (tasks.launch.stage_plan), where MLflow is and that it answers. It returns a `RunPlan`; the flows and stages receive it and
decide none of it again. `holding_store(plan)` takes the store's pipeline lock, once:
`grpo run` takes it before Prefect and the models load, and hands the held plan to the
flow; a flow started by a Prefect worker gets no plan, so it makes one and takes the lock
itself (`planned`).

The installed TRL is checked earlier, at the CLI's start (flows.cli_common): validating a
config reads TRL's installed config class, so that check comes before any config exists.
Each check raises PreflightError with the exit code the CLI uses (2: the config or the
machine cannot run it, naming the field; 1: the tracking server does not answer)."""
from __future__ import annotations

import contextlib
import os
import threading
import urllib.parse
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from grpo_core.config import PipelineConfig
from grpo_core.redaction import strip_userinfo
from grpo_core.workspace import Workspace, tracking_uri
from tasks.launch import LaunchPlan, stage_plan


class PreflightError(Exception):
    """A run refused before any work; `exit_code` is what the CLI exits with."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


_MLFLOW_ANSWERS = (200, 401, 403)
_PROBE_PATH = "/api/2.0/mlflow/experiments/search?max_results=1"


class RunPlan(BaseModel):
    """What preflight decided for one config on this machine."""

    model_config = ConfigDict(frozen=True)

    launch: LaunchPlan  # how SFT and GRPO stages start (in-process, pinned, launch)
    tracking_uri: str  # the MLflow store, probed
    db_path: str  # the workspace store the pipeline lock guards
    lock_timeout: float  # data.store_lock_timeout
    store_held_by: int | None = None  # the pid holding the pipeline lock for this run

    @property
    def store_held(self) -> bool:
        return self.store_held_by == os.getpid()


def launch_of(cfg: PipelineConfig) -> LaunchPlan:
    """How a stage of `cfg` starts on this machine, or PreflightError with the refusal and
    its fix (more processes than GPUs, a vLLM mode this build cannot run)."""
    plan = stage_plan(cfg)
    if plan.mode == "refuse":
        raise PreflightError(plan.message, 2)
    return plan


def reach_tracking(uri: str) -> str:
    """`uri` when the MLflow store answers (check_reachable)."""
    check_reachable(uri)
    return uri


def check_reachable(uri: str, timeout: float = 5.0) -> None:
    """PreflightError (exit 1), naming the URI, when the MLflow store cannot answer: the
    run's one probe, before the heavy imports (mlflow only to ask a server).
    sqlite: the database's folder must be writable. http(s): `_ask_server`."""
    if urllib.parse.urlparse(uri).scheme in ("http", "https"):
        return _ask_server(uri, timeout)
    path = uri[len("sqlite:///"):] if uri.startswith("sqlite:///") else ""
    if path and path != ":memory:":
        folder = Path(path).parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if not os.access(folder, os.W_OK):
            raise PreflightError(f"MLflow store {uri}: folder {folder} is not writable", 1)


def _ask_server(uri: str, timeout: float) -> None:
    """One GET of the REST API with the credentials the MLflow client sends (MLflow's own
    get_default_host_creds and http_request: env, ~/.mlflow/credentials, a token, the URI's
    user:password, its TLS settings). 200, or 403 from an auth layer, is reachable; a 401
    fails, naming the variables to set, never their values, except under a custom auth
    provider (MLFLOW_TRACKING_AUTH, AWS SigV4), which decides for itself and is not asked
    here; anything else, a refusal or silence is unreachable (a 404 from another web app is
    not a tracking server). The request runs in a daemon thread joined with a deadline, so a
    slow DNS lookup cannot stretch it past `timeout` + 1 s; no retries."""
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import MlflowHostCreds, http_request

    shown = strip_userinfo(uri)
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
        raise PreflightError(
            f"MLflow tracking server {shown} {said} (HTTP 401). Set "
            f"MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD to an MLflow user "
            f"of that server (the compose stack's pipeline user: MLFLOW_PIPELINE_USERNAME "
            f"/ MLFLOW_PIPELINE_PASSWORD in infra/.env).", 1)
    if status not in _MLFLOW_ANSWERS:
        why = (f"GET {_PROBE_PATH}: HTTP {status}, not an MLflow server?" if status is not None
               else outcome.get("error", f"no answer within {timeout:g} s"))
        raise PreflightError(
            f"MLflow tracking server {shown} is not reachable ({why}). Start it "
            f"(mlflow server --host ... --port ...), fix MLFLOW_TRACKING_URI / "
            f"tracking.tracking_uri, or unset both to use the local SQLite store.", 1)


def check_model(cfg: PipelineConfig) -> None:
    """A fetchable model name not fetched into the workspace: the fetch command to run."""
    from grpo_core.modeling.fetch import unfetched_message

    message = unfetched_message(cfg.model.name_or_path, Workspace.at(cfg.project.workdir).models)
    if message:
        raise PreflightError(message, 2)


def check_benchmarks(cfg: PipelineConfig) -> None:
    """Every benchmark's evaluation split must exist. A user's own benchmark is looked up
    in the workspace store when there is one (read-only; a busy store is left to the stage,
    which finds or misses it later)."""
    from grpo_core.data.benchmarks import BenchmarkError
    from grpo_core.data.benchmarks import check_benchmarks as check
    from grpo_core.data.store import Store, StoreError

    db = Workspace.at(cfg.project.workdir).db_path
    store = None
    if db.exists():
        try:
            store = Store.open(db, read_only=True)
        except StoreError:
            store = None
    try:
        check(cfg, store)
    except BenchmarkError as exc:
        raise PreflightError(f"config error: eval.benchmarks: {exc}", 2) from None
    finally:
        if store is not None:
            store.close()


def preflight(cfg: PipelineConfig, loads_model: bool = True, probed: Collection[str] = ()
              ) -> RunPlan:
    """Every check of a run of `cfg`, in the order a user fixes them; its plan.
    `loads_model`: False for a retrain, which starts from the registered champion;
    `probed`: MLflow stores already found answering in this pass (not asked again)."""
    if loads_model:
        check_model(cfg)
    check_benchmarks(cfg)
    launch = launch_of(cfg)
    ws = Workspace.at(cfg.project.workdir)
    uri = tracking_uri(cfg, ws)
    return RunPlan(launch=launch, tracking_uri=uri if uri in probed else reach_tracking(uri),
                   db_path=str(ws.db_path), lock_timeout=cfg.data.store_lock_timeout)


def preflight_all(configs: Sequence[PipelineConfig]) -> list[RunPlan]:
    """The plans of configs run together (a comparison): each MLflow store probed once."""
    plans: list[RunPlan] = []
    for cfg in configs:
        plans.append(preflight(cfg, probed={p.tracking_uri for p in plans}))
    return plans


@contextlib.contextmanager
def hold_store(db_path: str | os.PathLike, timeout: float) -> Iterator[None]:
    """The store's pipeline lock (grpo_core.data.locks: one pipeline per store, released by
    the kernel on any exit; StoreLockedError after `timeout` s), for `grpo filter`'s shards
    and `holding_store`."""
    from grpo_core.data.locks import pipeline_lock

    with pipeline_lock(db_path, timeout):
        yield


@contextlib.contextmanager
def holding_store(plan: RunPlan) -> Iterator[RunPlan]:
    """`plan` with its store's pipeline lock held by this process (grpo_core.data.locks: one
    pipeline per store; StoreLockedError after data.store_lock_timeout). A plan already held
    here is yielded as it is: the lock is taken once per run."""
    if plan.store_held:
        yield plan
        return
    with hold_store(plan.db_path, plan.lock_timeout):
        yield plan.model_copy(update={"store_held_by": os.getpid()})


@contextlib.contextmanager
def planned(cfg: PipelineConfig, plan: RunPlan | None, loads_model: bool = True
            ) -> Iterator[RunPlan]:
    """At a flow's entry: the caller's plan when it holds one (`grpo run`), else this
    config's preflight (a deployment's flow run), with the store held either way."""
    with holding_store(plan if plan is not None else preflight(cfg, loads_model)) as held:
        yield held
