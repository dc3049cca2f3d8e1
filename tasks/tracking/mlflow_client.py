"""The process's MlflowClient and what `tasks` logs through it: params, tags, metrics and
the child runs of a parent run. Always explicit run ids, never the fluent "active run"
(thread-local: a Prefect task in a worker thread would not see it). `connect` chooses the
store once per process; calls given no client use it, from any thread."""
from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_TAG_VAL_LENGTH

from grpo_core.eval.metric_names import flatten, flatten_metrics, sanitize_key
from grpo_core.redaction import redact

PARENT_RUN_ID_TAG = "mlflow.parentRunId"

_clients: dict[str, MlflowClient] = {}
_current_uri: str | None = None
_lock = threading.Lock()


# MLflow's HTTP client retries a refused connection for minutes, and its asynchronous
# logging drains its queue at process exit: seconds instead (a value already set wins);
# what cannot be sent goes to the offline spool (tasks.tracking.spool).
FAIL_FAST = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
             "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}


def _client(uri: str) -> MlflowClient:
    if uri.startswith(("http://", "https://")):
        for k, v in FAIL_FAST.items():
            os.environ.setdefault(k, v)
    if uri not in _clients:
        _clients[uri] = MlflowClient(tracking_uri=uri, registry_uri=uri)
    return _clients[uri]


def connect(uri: str) -> MlflowClient:
    """Make `uri` this process's store for every call below that is given no client, and
    return a client for it. It does not probe the store: the run's preflight did
    (tasks.preflight.reach_tracking), once.

    MLflow's own global (mlflow.set_tracking_uri) is left alone on purpose: it also
    exports MLFLOW_TRACKING_URI, which would then win over the workdir default of the next
    config resolved in this process (a test suite, a comparison of two workdirs).
    """
    global _current_uri
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    with _lock:
        _current_uri = uri
        return _client(uri)


def current_uri() -> str:
    return _current_uri or mlflow.get_tracking_uri()


def get_client(client: MlflowClient | None = None) -> MlflowClient:
    return client if client is not None else client_for(None)


def client_for(uri: str | None) -> MlflowClient:
    """A client of `uri`, or of this process's store when None (read-only views)."""
    with _lock:
        return _client(uri or current_uri())


def experiment_id(client: MlflowClient, name: str, artifact_root: str | None = None) -> str:
    """Get or create the experiment `name` (restoring it if it was deleted)."""
    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            return client.create_experiment(name, artifact_location=artifact_root)
        except MlflowException:  # created meanwhile by another process
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
    if exp.lifecycle_stage == "deleted":
        client.restore_experiment(exp.experiment_id)
    return exp.experiment_id


def _param_value(v: Any) -> str:
    text = json.dumps(v) if isinstance(v, (list, tuple, dict)) else str(v)
    return text if len(text) <= MAX_PARAM_VAL_LENGTH else text[: MAX_PARAM_VAL_LENGTH - 3] + "..."


def log_params(run_id: str, params: Mapping[str, Any], client: MlflowClient | None = None) -> None:
    """Nested params flattened ("a.b"), secrets redacted, values cut to MLflow's limit."""
    get_client(client).log_batch(run_id, params=[
        Param(sanitize_key(k), _param_value(v)) for k, v in flatten(redact(dict(params))).items()])


def set_tags(run_id: str, tags: Mapping[str, Any], client: MlflowClient | None = None) -> None:
    """Set run tags (secret-named ones redacted, values cut to MLflow's limit)."""
    get_client(client).log_batch(run_id, tags=[
        RunTag(sanitize_key(k), (v if isinstance(v, str) else json.dumps(v, default=str))[:MAX_TAG_VAL_LENGTH])
        for k, v in redact(dict(tags)).items()])


def log_metrics(run_id: str, metrics: Mapping[str, Any], step: int | None = None,
                client: MlflowClient | None = None, timestamp_ms: int | None = None) -> int:
    """Nested numbers flattened and sanitised (None/NaN/inf skipped) in one log_batch
    (MLflow splits it); returns how many were logged."""
    flat = flatten_metrics(metrics)
    if not flat:
        return 0
    ts = timestamp_ms or int(time.time() * 1000)
    items = [Metric(sanitize_key(k), v, ts, step or 0) for k, v in flat.items()]
    get_client(client).log_batch(run_id, metrics=items)
    return len(items)


def has_metrics(run_id: str, client: MlflowClient | None = None) -> bool:
    return bool(get_client(client).get_run(run_id).data.metrics)


_experiment_of: dict[str, str] = {}


def _experiment_id_of(run_id: str, client: MlflowClient) -> str:
    if run_id not in _experiment_of:
        _experiment_of[run_id] = client.get_run(run_id).info.experiment_id
    return _experiment_of[run_id]


STAGE_TAG = "grpo.stage"


def stage_of(run) -> str:
    """A child run's stage (data, grpo/round-1, eval/final...): its `grpo.stage` tag."""
    return run.data.tags.get(STAGE_TAG) or run.info.run_name


def child_runs(parent_id: str, client: MlflowClient, stage: str | None = None) -> list:
    """The child runs of `parent_id` (only those of `stage`, if given), oldest first."""
    flt = f"tags.`{PARENT_RUN_ID_TAG}` = '{parent_id}'"
    if stage is not None:
        flt += f" and tags.`{STAGE_TAG}` = '{stage}'"
    return list(client.search_runs([_experiment_id_of(parent_id, client)], flt, max_results=1000,
                                   order_by=["attributes.start_time ASC"]))


def child_run(parent_id: str, stage: str, client: MlflowClient | None = None) -> str:
    """The child run of `stage` under `parent_id`, found again (set RUNNING unless
    FINISHED: a resumed stage logs into the run it started) or created, named
    `<recipe>/<stage>` so two recipes' stages differ in every MLflow view."""
    if "'" in stage:
        raise ValueError(f"stage name must not contain a quote: {stage!r}")
    c = get_client(client)
    found = child_runs(parent_id, c, stage)
    if found:
        run = found[0]
        if run.info.status != "FINISHED":
            c.update_run(run.info.run_id, status="RUNNING")
        return run.info.run_id
    parent = c.get_run(parent_id)
    tags = {PARENT_RUN_ID_TAG: parent_id, "grpo.pipeline": "child", STAGE_TAG: stage}
    for key in ("recipe", "config_hash", "project"):
        if key in parent.data.tags:
            tags[key] = parent.data.tags[key]
    recipe = parent.data.tags.get("recipe")
    run = c.create_run(parent.info.experiment_id, tags=tags,
                       run_name=f"{recipe}/{stage}" if recipe else stage)
    _experiment_of[run.info.run_id] = parent.info.experiment_id
    return run.info.run_id


def end_run(run_id: str, status: str = "FINISHED", client: MlflowClient | None = None,
            only_running: bool = False) -> None:
    """End `run_id`; with only_running, a run already ended keeps its end time."""
    c = get_client(client)
    if only_running and c.get_run(run_id).info.status != "RUNNING":
        return
    c.set_terminated(run_id, status)


def close_children(parent_id: str, status: str, client: MlflowClient) -> None:
    """End the still-RUNNING child runs of `parent_id` with `status`."""
    for run in child_runs(parent_id, client):
        if run.info.status == "RUNNING":
            client.set_terminated(run.info.run_id, status)


def metric_history(run_id: str, client: MlflowClient | None = None) -> list[dict]:
    """Every metric of `run_id` as one dict per step, {"step": n, key: value, ...}."""
    c = get_client(client)
    steps: dict[int, dict] = {}
    for key in c.get_run(run_id).data.metrics:
        for m in c.get_metric_history(run_id, key):
            steps.setdefault(m.step, {"step": m.step})[key] = m.value
    return [steps[s] for s in sorted(steps)]
