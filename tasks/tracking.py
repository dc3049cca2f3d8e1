"""MLflow tracking for the pipeline: one parent run per pipeline run, a child run per stage.

Layout in MLflow (experiment = tracking.experiment or project.name):

    parent run  "<recipe>-<config hash>"   tags recipe, config_hash, git_commit,
                                           prefect_flow_run_id, grpo.pipeline=parent
      params    the resolved config, flattened ("grpo.beta": 0.04), secrets redacted
      artifacts config/resolved.yaml, config/environment.json, model/ (registered)
      children  data, filter/round-N, sft, grpo/round-N, eval/base, eval/round-N, eval/final

Everything goes through `MlflowClient` with explicit run ids, never the fluent "active
run": that one is thread-local, so a Prefect task in a worker thread would not see it.
The store is chosen once per process by `connect` (which `start_parent_run` calls);
later calls in any thread of that process use it unless given a client.

Resume: the parent run of a config hash is remembered in <workdir>/runs/<hash>.json and
reused by every later run of the same config, whatever its status. A killed run thus
continues under its parent, and a re-run of a finished config (a cache hit) appears as
the same parent run again rather than as an empty twin. Child runs are found by name
under their parent, so a resumed stage logs into the run it started.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

# Before mlflow is imported: no usage telemetry, no writes to ~/.config/mlflow.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import mlflow
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import (
    MAX_ENTITY_KEY_LENGTH,
    MAX_METRICS_PER_BATCH,
    MAX_PARAM_VAL_LENGTH,
    MAX_PARAMS_TAGS_PER_BATCH,
    MAX_TAG_VAL_LENGTH,
)

from grpo_core.workspace import Workspace
from tasks.redaction import REDACTED, is_secret_name, redact  # noqa: F401 - re-exported
from tasks.tracking_store import (  # noqa: F401 - re-exported
    TrackingUnreachable,
    _slug,
    _strip_userinfo,
    _workdir,
    artifact_root,
    check_reachable,
    experiment_name,
    is_remote,
    tracking_uri,
)

PARENT_RUN_ID_TAG = "mlflow.parentRunId"
CHAMPION, CHALLENGER = "champion", "challenger"

_clients: dict[str, MlflowClient] = {}
_current_uri: str | None = None
_lock = threading.Lock()


def connect(uri: str, check: bool = True) -> MlflowClient:
    """Make `uri` this process's store for every call below that is given no client, and
    return a client for it.

    MLflow's own global (mlflow.set_tracking_uri) is left alone on purpose: it also
    exports MLFLOW_TRACKING_URI, which would then win over the workdir default of the next
    config resolved in this process (a test suite, a comparison of two workdirs).
    """
    global _current_uri
    if check:
        check_reachable(uri)
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    with _lock:
        _current_uri = uri
        if uri not in _clients:
            _clients[uri] = MlflowClient(tracking_uri=uri, registry_uri=uri)
        return _clients[uri]


def current_uri() -> str:
    """The store `connect` chose, else MLflow's default resolution."""
    return _current_uri or mlflow.get_tracking_uri()


def _client(client: MlflowClient | None = None) -> MlflowClient:
    if client is not None:
        return client
    uri = current_uri()
    with _lock:
        if uri not in _clients:
            _clients[uri] = MlflowClient(tracking_uri=uri, registry_uri=uri)
        return _clients[uri]


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


# --------------------------------------------------------------------------- params



def flatten(tree: Mapping, prefix: str = "", sep: str = ".") -> dict[str, Any]:
    """{"grpo": {"beta": 0.04}} -> {"grpo.beta": 0.04}. Lists of scalars stay one value;
    lists holding mappings are indexed ("data.train.0.source")."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{sep}{k}" if prefix else str(k)
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key, sep))
        elif isinstance(v, (list, tuple)) and any(isinstance(x, Mapping) for x in v):
            for i, x in enumerate(v):
                if isinstance(x, Mapping):
                    out.update(flatten(x, f"{key}{sep}{i}", sep))
                else:
                    out[f"{key}{sep}{i}"] = x
        else:
            out[key] = v
    return out


def _param_value(v: Any) -> str:
    text = json.dumps(v) if isinstance(v, (list, tuple, dict)) else str(v)
    return text if len(text) <= MAX_PARAM_VAL_LENGTH else text[: MAX_PARAM_VAL_LENGTH - 3] + "..."


def config_params(cfg) -> dict[str, str]:
    """The resolved config as MLflow params: flattened, redacted, stringified."""
    return {k[:MAX_ENTITY_KEY_LENGTH]: _param_value(v)
            for k, v in flatten(redact(cfg.model_dump(mode="json"))).items()}


def log_params(run_id: str, params: Mapping[str, Any], client: MlflowClient | None = None) -> None:
    c = _client(client)
    """Nested params flattened ("a.b"), secrets redacted, values cut to MLflow's limit."""
    items = [Param(sanitize_key(k), _param_value(v)) for k, v in flatten(redact(dict(params))).items()]
    for i in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
        c.log_batch(run_id, params=items[i: i + MAX_PARAMS_TAGS_PER_BATCH])


def set_tags(run_id: str, tags: Mapping[str, Any], client: MlflowClient | None = None) -> None:
    """Set run tags (secret-named ones redacted, values cut to MLflow's limit)."""
    c = _client(client)
    items = []
    for k, v in redact(dict(tags)).items():
        text = v if isinstance(v, str) else json.dumps(v, default=str)
        items.append(RunTag(sanitize_key(k), text[:MAX_TAG_VAL_LENGTH]))
    for i in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
        c.log_batch(run_id, tags=items[i: i + MAX_PARAMS_TAGS_PER_BATCH])


_ENV_PREFIXES = ("GRPO_", "MLFLOW_", "HF_", "HUGGING", "TRANSFORMERS_", "PREFECT_", "CUDA_",
                 "TORCH", "VLLM_", "OMP_", "ACCELERATE_", "TOKENIZERS_")
_VERSIONED = ("torch", "transformers", "trl", "accelerate", "datasets", "mlflow", "prefect",
              "duckdb", "math-verify", "vllm")


def environment_snapshot() -> dict:
    """Package versions and the env vars that change behaviour (secrets redacted)."""
    from importlib import metadata

    versions = {}
    for pkg in _VERSIONED:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[pkg] = metadata.version(pkg)
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(_ENV_PREFIXES)}
    import platform
    import sys

    return redact({"python": sys.version.split()[0], "platform": platform.platform(),
                   "packages": versions, "env": env})


# --------------------------------------------------------------------------- runs

def _state_path(workdir: Path, config_hash: str) -> Path:
    return workdir / "runs" / f"{config_hash}.json"


def _read_state(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write_state(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
    os.replace(tmp, path)


def _usable_run(client: MlflowClient, run_id: str | None, exp_id: str):
    if not run_id:
        return None
    try:
        run = client.get_run(run_id)
    except MlflowException:  # another store, or deleted for good
        return None
    if run.info.lifecycle_stage != "active" or run.info.experiment_id != exp_id:
        return None
    return run


def start_parent_run(cfg, config_hash: str, recipe: str, git_commit: str, flow_run_id: str | None,
                     workspace: Workspace | str | os.PathLike | None = None,
                     extra_params: Mapping[str, Any] | None = None) -> str:
    """The parent run of this config hash, created or reused (see the module docstring).

    A new run gets the flattened, redacted config as params, config/resolved.yaml and
    config/environment.json; a reused one gets its status set back to RUNNING and its
    git_commit / prefect_flow_run_id tags moved to this run (grpo.resumes counts reuses).
    """
    import yaml

    workdir = _workdir(workspace, cfg)
    uri = tracking_uri(cfg, workdir)
    client = connect(uri)
    name = experiment_name(cfg)
    exp_id = experiment_id(client, name, artifact_root(uri, workdir, name))
    state_file = _state_path(workdir, config_hash)
    state = _read_state(state_file)
    tags = {"recipe": recipe, "config_hash": config_hash, "git_commit": git_commit,
            "prefect_flow_run_id": flow_run_id or "", "grpo.pipeline": "parent",
            "project": cfg.project.name}
    run = _usable_run(client, state.get("run_id"), exp_id)
    if run is not None:
        run_id = run.info.run_id
        resumes = int(run.data.tags.get("grpo.resumes", "0")) + 1
        client.update_run(run_id, status="RUNNING")
        set_tags(run_id, {**tags, "grpo.resumes": str(resumes),
                          "grpo.resumed_from_status": run.info.status}, client)
    else:
        run_id = client.create_run(exp_id, run_name=f"{recipe}-{config_hash[:8]}",
                                   tags={k: str(v) for k, v in tags.items()}).info.run_id
        log_params(run_id, {**config_params(cfg), **(extra_params or {})}, client)
        client.log_text(run_id, yaml.safe_dump(redact(cfg.model_dump(mode="json")), sort_keys=False),
                        "config/resolved.yaml")
        log_json(run_id, environment_snapshot(), "config/environment.json", client)
    now = time.time()
    created = state.get("created", now) if run is not None else now
    _write_state(state_file, {"run_id": run_id, "status": "RUNNING", "experiment": name,
                              "experiment_id": exp_id, "tracking_uri": _strip_userinfo(uri),
                              "config_hash": config_hash, "recipe": recipe,
                              "created": created, "updated": now})
    return run_id


def parent_state(workspace: Workspace | str | os.PathLike | None, config_hash: str) -> dict:
    """What <workdir>/runs/<hash>.json says about the config's parent run ({} if none)."""
    return _read_state(_state_path(_workdir(workspace), config_hash))


_experiment_of: dict[str, str] = {}


def _experiment_id_of(run_id: str, client: MlflowClient) -> str:
    if run_id not in _experiment_of:
        _experiment_of[run_id] = client.get_run(run_id).info.experiment_id
    return _experiment_of[run_id]


def _children(parent_id: str, client: MlflowClient, name: str | None = None) -> list:
    flt = f"tags.`{PARENT_RUN_ID_TAG}` = '{parent_id}'"
    if name is not None:
        flt += f" and attributes.run_name = '{name}'"
    return list(client.search_runs([_experiment_id_of(parent_id, client)], flt, max_results=1000,
                                   order_by=["attributes.start_time ASC"]))


def child_run(parent_id: str, name: str, client: MlflowClient | None = None) -> str:
    """The child run `name` of `parent_id`, created or found again (a resumed stage logs
    into the run it started). Names: data, filter/round-N, sft, grpo/round-N, eval/...
    A found run that is not FINISHED (killed, failed) is set back to RUNNING."""
    if "'" in name:
        raise ValueError(f"child run name must not contain a quote: {name!r}")
    c = _client(client)
    found = _children(parent_id, c, name)
    if found:
        run = found[0]
        if run.info.status != "FINISHED":
            c.update_run(run.info.run_id, status="RUNNING")
        return run.info.run_id
    parent = c.get_run(parent_id)
    tags = {PARENT_RUN_ID_TAG: parent_id, "grpo.pipeline": "child", "grpo.stage": name}
    for key in ("recipe", "config_hash", "project"):
        if key in parent.data.tags:
            tags[key] = parent.data.tags[key]
    run = c.create_run(parent.info.experiment_id, run_name=name, tags=tags)
    _experiment_of[run.info.run_id] = parent.info.experiment_id
    return run.info.run_id


def end_run(run_id: str, status: str = "FINISHED", client: MlflowClient | None = None) -> None:
    _client(client).set_terminated(run_id, status)


@contextlib.contextmanager
def stage_run(parent_id: str, name: str, client: MlflowClient | None = None) -> Iterator[str]:
    """`with stage_run(parent, "eval/final") as run_id:` -> FINISHED, or FAILED on error."""
    run_id = child_run(parent_id, name, client)
    try:
        yield run_id
    except BaseException:
        end_run(run_id, "FAILED", client)
        raise
    end_run(run_id, "FINISHED", client)


def _close_children(parent_id: str, status: str, client: MlflowClient) -> None:
    for run in _children(parent_id, client):
        if run.info.status == "RUNNING":
            client.set_terminated(run.info.run_id, status)


def _set_state_status(workspace, parent_id: str, status: str, client: MlflowClient) -> None:
    with contextlib.suppress(MlflowException):
        config_hash = client.get_run(parent_id).data.tags.get("config_hash")
        if config_hash and workspace is not None:
            path = _state_path(_workdir(workspace), config_hash)
            state = _read_state(path)
            if state.get("run_id") == parent_id:
                _write_state(path, {**state, "status": status, "updated": time.time()})


def fail_pipeline(parent_id: str, error: str, workspace=None,
                  client: MlflowClient | None = None) -> None:
    """Mark the parent and its still-running children FAILED, with the error as a tag.
    A later run of the same config reuses the parent and sets it RUNNING again."""
    c = _client(client)
    set_tags(parent_id, {"grpo.error": error[:2000]}, c)
    _close_children(parent_id, "FAILED", c)
    c.set_terminated(parent_id, "FAILED")
    _set_state_status(workspace, parent_id, "FAILED", c)


# --------------------------------------------------------------------------- metrics

_BAD_CHARS = re.compile(r"[^A-Za-z0-9_\-. /]")


def sanitize_key(name: str) -> str:
    """A valid MLflow metric/param/tag name: alphanumerics, `_ - . /` and space only
    ("pass@4" -> "pass_at_4", other characters -> "_"), no empty or dot path segments."""
    name = _BAD_CHARS.sub("_", str(name).replace("@", "_at_"))
    parts = [p for p in name.split("/") if p not in ("", ".", "..")]
    return ("/".join(parts) or "_")[:MAX_ENTITY_KEY_LENGTH]


metric_key = sanitize_key


def _number(v: Any) -> float | None:
    if v is None or isinstance(v, str):
        return None
    if isinstance(v, bool):
        return float(v)
    if hasattr(v, "item") and getattr(v, "ndim", 0) == 0:  # numpy / torch scalars
        with contextlib.suppress(Exception):
            v = v.item()
    if isinstance(v, (int, float)):
        f = float(v)
        return f if math.isfinite(f) else None
    return None


def flatten_metrics(metrics: Mapping, prefix: str = "") -> dict[str, float]:
    """Nested metric dicts to flat numbers. A CI block {"mean", "lo", "hi", "n"} becomes
    name, name_ci_lo, name_ci_hi, name_n; other nesting joins with "/"; strings, lists,
    None and NaN are dropped."""
    out: dict[str, float] = {}
    for k, v in metrics.items():
        key = f"{prefix}/{k}" if prefix else str(k)
        if isinstance(v, Mapping):
            if "mean" in v and ("lo" in v or "hi" in v):
                for sub, suffix in (("mean", ""), ("lo", "_ci_lo"), ("hi", "_ci_hi"), ("n", "_n")):
                    x = _number(v.get(sub))
                    if x is not None:
                        out[key + suffix] = x
            else:
                out.update(flatten_metrics(v, key))
            continue
        x = _number(v)
        if x is not None:
            out[key] = x
    return out


def log_metrics(run_id: str, metrics: Mapping[str, Any], step: int | None = None,
                client: MlflowClient | None = None, timestamp_ms: int | None = None) -> int:
    """Log numbers (nested dicts flattened, names sanitised, None/NaN/inf skipped) in
    batches of MLflow's maximum; returns how many were logged."""
    flat = flatten_metrics(metrics)
    if not flat:
        return 0
    ts = timestamp_ms or int(time.time() * 1000)
    items = [Metric(sanitize_key(k), v, ts, step or 0) for k, v in flat.items()]
    _log_metric_items(run_id, items, _client(client))
    return len(items)


def _log_metric_items(run_id: str, items: list, client: MlflowClient) -> None:
    for i in range(0, len(items), MAX_METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=items[i: i + MAX_METRICS_PER_BATCH])


def has_metrics(run_id: str, client: MlflowClient | None = None) -> bool:
    return bool(_client(client).get_run(run_id).data.metrics)


def eval_metrics(benchmarks: Mapping[str, Any]) -> dict[str, float]:
    """{bench: {"metrics": {...}}} (stages.evaluate's output) -> "<bench>/<metric>" numbers,
    e.g. synthetic/greedy_accuracy, synthetic/greedy_accuracy_ci_lo, synthetic/pass_at_4."""
    out: dict[str, float] = {}
    for bench, res in benchmarks.items():
        m = res.get("metrics", res) if isinstance(res, Mapping) else {}
        out.update({sanitize_key(k): v for k, v in flatten_metrics(m, str(bench)).items()})
    return out


_HISTORY_TAG = "grpo.history_last_step"


def history_to_mlflow(run_id: str, history: Sequence[Mapping[str, Any]], prefix: str = "",
                      client: MlflowClient | None = None) -> int:
    """Log TRL's per-step log rows (each with "step") as metric series. Rows at or below
    the step recorded by the previous call are skipped, so calling it again after a
    resume does not double the curves. Returns the number of points logged."""
    c = _client(client)
    done = int(float(c.get_run(run_id).data.tags.get(_HISTORY_TAG, "-1")))
    ts = int(time.time() * 1000)
    items, last = [], done
    for i, row in enumerate(history):
        step = int(row.get("step", i + 1))
        if step <= done:
            continue
        last = max(last, step)
        for k, v in flatten_metrics({k: v for k, v in row.items() if k != "step"}).items():
            items.append(Metric(sanitize_key(f"{prefix}{k}"), v, ts, step))
    if items:
        _log_metric_items(run_id, items, c)
        set_tags(run_id, {_HISTORY_TAG: str(last)}, c)
    return len(items)


# --------------------------------------------------------------------------- pipeline end

def finish_pipeline(parent_id: str, cfg, model_dir: str | os.PathLike, final: Mapping[str, Any],
                    findings: Sequence[str], workspace: Workspace | str | os.PathLike | None = None,
                    client: MlflowClient | None = None, *,
                    champion_records: Sequence[Mapping] | None = None,
                    base: Mapping[str, Any] | None = None, base_model: str | None = None) -> dict:
    """Close a pipeline run: final metrics on the parent (prefix final/), findings, the
    paired deltas of final vs base on the eval/final run, the model registered and
    promoted on the primary metric of the first benchmark by the paired rule, running
    children and the parent set FINISHED. Returns what happened, with a one-line summary
    and the deltas ({bench: {metric: {"delta", "lo", "hi", "n"}}}).

    Per-problem records come from the workspace's store: the final eval's, the base
    model's (`base`: its stage results, else found by `base_model`, else by the config's
    model) and the champion's (`champion_records`, as retrain passes them, else read back
    through the champion version's eval run id tag)."""
    c = _client(client)
    benchmarks = final.get("benchmarks", final)
    workdir = workspace if workspace is not None else _workdir(None, cfg)
    log_metrics(parent_id, {f"final/{k}": v for k, v in eval_metrics(benchmarks).items()}, client=c)
    set_tags(parent_id, {"findings": " | ".join(findings) or "none"}, c)
    if findings:
        log_text(parent_id, "\n".join(f"- {f}" for f in findings) + "\n", "report/findings.md", c)
    primary = cfg.eval.primary_metric
    bench = next(iter(cfg.eval.benchmarks), None)
    res = benchmarks.get(bench, {}) if bench else {}
    block = (res.get("metrics") or {}).get(primary) or {}
    name = model_name(cfg) if cfg.tracking.register_model else None
    champ = champion_version(name, c) if name else None
    with comparison.records_store(workdir, cfg.data.store_lock_timeout) as store:
        mine = {b: comparison.stage_records(store, r, str(model_dir)) for b, r in benchmarks.items()}
        before = comparison.base_records(store, cfg, workdir, benchmarks, base, base_model) \
            if base is not None or any(mine.values()) else {}
        if champion_records is None and champ is not None:
            champion_records = comparison.run_records(store, champ.tags.get(EVAL_RUN_TAG)) or None
    out: dict[str, Any] = {"parent_run": parent_id, "benchmark": bench, "metric": primary,
                           "value": block.get("mean"), "ci_lo": block.get("lo"),
                           "ci_hi": block.get("hi"),
                           "deltas": _log_deltas(parent_id, cfg, benchmarks, mine, before, c)}
    headline = (f"{bench} {primary} {_fmt_ci(block['mean'], block.get('lo'), block.get('hi'))}"
                if block.get("mean") is not None else f"{bench} {primary}: n/a")
    summary = headline
    if name:
        out.update(_register_and_promote(parent_id, cfg, model_dir, name, res, mine.get(bench) or [],
                                         champion_records, c))
        summary = (f"{headline}; {name} v{out['version']} "
                   f"{'champion' if out['promoted'] else 'challenger'} ({out['reason']})")
    out["summary"] = summary
    _close_children(parent_id, "FINISHED", c)
    c.set_terminated(parent_id, "FINISHED")
    _set_state_status(workdir, parent_id, "FINISHED", c)
    return out


def _register_and_promote(parent_id: str, cfg, model_dir, name: str, res: Mapping[str, Any],
                          records: list[dict], champion_records: Sequence[Mapping] | None,
                          c: MlflowClient) -> dict:
    """Register the model and decide on it by the paired rule (tasks/registry.py), the
    decision tagged on the parent too. `records`: the final eval's rows of the first
    benchmark; its run id is tagged on the version, for the next challenger to pair with."""
    primary = cfg.eval.primary_metric
    block = (res.get("metrics") or {}).get(primary) or {}
    version = register_model(parent_id, model_dir, name,
                             tags={"recipe": cfg.project.recipe, "config_hash": cfg.hash()}, client=c)
    out = {"model_name": name, "version": version, "model_uri": f"models:/{name}/{version}",
           "champion_uri": champion_uri(name)}
    if block.get("mean") is None:
        bench = next(iter(cfg.eval.benchmarks), None)
        promoted, reason, decided = False, f"no {primary} on {bench}; not compared", {}
    else:
        promoted, reason = promote_if_better(
            c, name, version, primary, block["mean"], block.get("lo"), ci_hi=block.get("hi"),
            protocol_hash=res.get("protocol_hash"), records=records,
            champion_records=champion_records,
            eval_run_id=records[0]["run_id"] if records else None,
            n_resamples=cfg.eval.bootstrap, seed=cfg.project.seed)
        decided = decision_record(name, version, c)
    set_tags(parent_id, {"grpo.promotion": "promoted" if promoted else "rejected",
                         "grpo.promotion_reason": reason,
                         "grpo.promotion_rule": decided.get("rule") or "none"}, c)
    return {**out, "promoted": promoted, "reason": reason, "rule": decided.get("rule"),
            "paired": decided.get("paired")}


def _log_deltas(parent_id: str, cfg, benchmarks: Mapping[str, Any], mine: Mapping[str, list],
                before: Mapping[str, list], client: MlflowClient) -> dict:
    """Paired deltas (final minus base) of every pairable metric per benchmark, logged on
    the eval/final run where `grpo compare` reads them; both sides scored the same
    problems, so the CI is of the per-problem difference, not of two separate means."""
    deltas = {}
    for bench, res in benchmarks.items():
        names = list((res.get("metrics") or {}) if isinstance(res, Mapping) else [])
        found = comparison.paired_deltas(mine.get(bench) or [], before.get(bench) or [], names,
                                         n_resamples=cfg.eval.bootstrap, seed=cfg.project.seed)
        if found:
            deltas[bench] = found
    if deltas:
        log_metrics(child_run(parent_id, "eval/final", client), comparison.delta_metrics(deltas),
                    client=client)
    return deltas


# --------------------------------------------------------------------------- split-out concerns
# Artifacts, the model registry and the comparison reader live in their own modules; their
# names are re-exported here so callers keep one entry point (`tracking.<name>`). Imported
# last: those modules import the core above from this one (at their own end, so any of
# them may be imported first).

from tasks import comparison
from tasks.artifacts import (  # noqa: F401
    copy_artifacts,
    eval_table_rows,
    log_comparison,
    log_eval_table,
    log_file,
    log_json,
    log_passrate_histogram,
    log_text,
    log_training_curves,
)
from tasks.comparison import COMPARE_COLUMNS, compare_table  # noqa: F401
from tasks.registry import (  # noqa: F401
    EVAL_RUN_TAG,
    _fmt_ci,
    champion_uri,
    champion_version,
    decision_record,
    download_champion,
    model_name,
    promote_if_better,
    register_model,
)
from tasks.trainer_logging import (  # noqa: F401
    StepLogger,
    replay_unsent_metrics,
    trl_env,
    trl_mlflow_env,
)
