"""Model registry: a pipeline's model as a version of <project>-<recipe>, the promotion
rule's decision (grpo_core.eval.promotion) recorded on it, the champion fetched."""
from __future__ import annotations

import contextlib
import os
import shutil
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from grpo_core.eval import promotion
from grpo_core.eval.promotion import Decision
from grpo_core.modeling.loading import hf_folder
from grpo_core.redaction import redact
from grpo_core.workspace import read_state, slug, write_state
from tasks.tracking.mlflow_client import get_client, set_tags
from tasks.tracking.mlflow_model import log_and_register

CHAMPION, CHALLENGER = "champion", "challenger"
EVAL_RUN_TAG = "grpo.eval_run_id"


def model_name(cfg) -> str:
    """<project>-<recipe>: a new config hash of the same recipe competes for its champion."""
    return slug(f"{cfg.project.name}-{cfg.project.recipe}")


def register_model(run_id: str, model_dir: str | os.PathLike, name: str,
                   tags: Mapping[str, Any] | None = None, client: MlflowClient | None = None) -> str:
    """Log the HF folder `model_dir` as an MLflow model of run `run_id` (tasks.tracking.
    mlflow_model: `mlflow.transformers.load_model("models:/<name>@champion")` returns a
    generating pipeline) and register it as a new version of `name` with alias
    `challenger`; returns the version. A second call for the same run (a re-run of a
    finished config) returns the existing version instead of copying the weights again."""
    c = get_client(client)
    _ensure_registered_model(c, name)
    existing = [v for v in c.search_model_versions(f"name = '{name}'") if v.run_id == run_id]
    if existing:
        version = max(existing, key=lambda v: int(v.version)).version
    else:
        art = c.get_run(run_id).info.artifact_uri
        if art.startswith("file:"):
            store = Path(urllib.parse.urlparse(art).path).resolve()
            if Path(model_dir).resolve() in (store, *store.parents):
                raise ValueError(f"model_dir {model_dir} contains the artifact store {store}")
        version_tags = {k: str(v) for k, v in redact(dict(tags or {})).items()}
        mv = log_and_register(c, run_id, model_dir, name, version_tags)
        version = mv.version
    c.set_registered_model_alias(name, CHALLENGER, version)
    set_tags(run_id, {"grpo.registered_model": name, "grpo.model_version": str(version)}, c)
    return str(version)


def _ensure_registered_model(client: MlflowClient, name: str) -> None:
    try:
        client.get_registered_model(name)
    except MlflowException:
        with contextlib.suppress(MlflowException):  # created meanwhile
            client.create_registered_model(name, description="GRPO pipeline model; aliases "
                                           "champion (serving) and challenger (latest).")


def promote(client: MlflowClient | None, name: str, version: str, metric: str, value: float,
            ci_lo: float | None = None, champion_metrics: Mapping[str, Any] | None = None, *,
            ci_hi: float | None = None, protocol_hash: str | None = None,
            records: Sequence[Mapping] | None = None,
            champion_records: Sequence[Mapping] | None = None, eval_run_id: str | None = None,
            n_resamples: int = 1000, seed: int = 0) -> Decision:
    """Judge `version` against the champion by grpo_core.eval.promotion's rule and record
    it on the version: its number and the decision as tags, in words as its description,
    the champion alias when it wins."""
    c = get_client(client)
    version = str(version)
    for k, v in promotion.metric_tags(metric, value, ci_lo, ci_hi, protocol_hash, eval_run_id).items():
        c.set_model_version_tag(name, version, k, v)
    champ = champion_version(name, c)
    d = promotion.decide(version, metric, value, ci_lo, ci_hi,
                         (str(champ.version), champ.tags) if champ is not None else None,
                         protocol_hash=protocol_hash, records=records,
                         champion_records=champion_records, champion_metrics=champion_metrics,
                         n_resamples=n_resamples, seed=seed)
    if d.promoted:
        c.set_registered_model_alias(name, CHAMPION, version)
    tags = {**promotion.decision_tags(d, metric), "grpo.decided_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    for k, v in tags.items():
        c.set_model_version_tag(name, version, k, v)
    c.update_model_version(name, version, description=d.text())
    return d


def champion_uri(name: str) -> str:
    return f"models:/{name}@{CHAMPION}"


def champion_version(name: str, client: MlflowClient | None = None):
    """The champion ModelVersion of `name`, or None."""
    try:
        return get_client(client).get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        return None


def download_champion(name: str, dst: str | os.PathLike, client: MlflowClient | None = None) -> Path:
    """Download the champion into `dst` (skipped when it already holds that version; the
    previous champion's v<N>/ removed) and return its from_pretrained folder (hf_folder).
    Raises LookupError when `name` has no champion."""
    c = get_client(client)
    mv = champion_version(name, c)
    if mv is None:
        raise LookupError(f"registered model {name!r} has no {CHAMPION!r} alias")
    dst = Path(dst)
    marker = dst / ".grpo_model_version.json"
    want = {"name": name, "version": str(mv.version), "run_id": mv.run_id}
    seen = read_state(marker)
    if {k: seen.get(k) for k in want} == want and (dst / seen.get("folder", "")).is_dir():
        return dst / seen["folder"]
    out = dst / f"v{mv.version}"  # where the registry says it is (a logged model or runs:/)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    local = Path(mlflow.artifacts.download_artifacts(
        artifact_uri=c.get_model_version_download_uri(name, str(mv.version)),
        dst_path=str(out), tracking_uri=c.tracking_uri))
    folder = hf_folder(local)
    old = seen.get("version")
    if old and str(old) != str(mv.version) and (dst / f"v{old}").is_dir():
        shutil.rmtree(dst / f"v{old}", ignore_errors=True)
    write_state(marker, {**want, "folder": os.path.relpath(folder, dst)})
    return folder
