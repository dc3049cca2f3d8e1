"""MLflow tracking for the pipeline: one parent run per pipeline run, a child run per stage.

Layout in MLflow (experiment = tracking.experiment or project.name):

    parent run  "<recipe>-<config hash>"   tags recipe, config_hash, git_commit,
                                           prefect_flow_run_id, grpo.pipeline=parent
      params    the resolved config, flattened ("grpo.beta": 0.04), secrets redacted
      metrics   final/<bench>/<primary metric> (+ CI), and the headline (tasks/tracking/headline.py):
                <bench>/base|final|delta (+ _lo, _hi), grpo_steps, sft_steps, wall_min,
                findings; its description says the result in one line
      artifacts config/resolved.yaml, config/environment.json
      model     the registered model, a LoggedModel of the run (tasks/tracking/mlflow_model.py)
      children  "<recipe>/<stage>", stage (tag grpo.stage) one of data, filter/round-N,
                sft, grpo/round-N, eval/base, eval/round-N, eval/final; each ends with
                its stage

Everything goes through the process's MlflowClient (tasks.tracking.mlflow_client), with explicit
run ids; `start_parent_run` chooses the store for the process (`connect`).

Resume: the parent run of a config hash is remembered in <workdir>/runs/<hash>.json and
reused by every later run of the same config, whatever its status. A killed run thus
continues under its parent, and a re-run of a finished config (a cache hit) appears as
the same parent run again rather than as an empty twin. Child runs are found by stage
under their parent, so a resumed stage logs into the run it started.
"""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from grpo_core.eval.metric_names import FINAL_PREFIX, ci_block_keys, shown
from grpo_core.train.findings import count_findings
from grpo_core.workspace import Workspace
from tasks.tracking import comparison, headline
from tasks.tracking.artifacts import log_json, log_text
from tasks.tracking.mlflow_client import (
    child_run,
    child_runs,
    close_children,
    config_params,
    connect,
    eval_metrics,
    experiment_id,
    get_client,
    log_metrics,
    log_params,
    sanitize_key,
    set_tags,
)
from tasks.tracking.redaction import redact
from tasks.tracking.registry import (
    EVAL_RUN_TAG,
    champion_uri,
    champion_version,
    decision_record,
    fmt_ci,
    model_name,
    promote_if_better,
    register_model,
)
from tasks.tracking.tracking_store import (
    artifact_root,
    experiment_name,
    parent_state_path,
    read_state,
    strip_userinfo,
    tracking_uri,
    workdir_of,
    write_state,
)

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

    workdir = workdir_of(workspace, cfg)
    uri = tracking_uri(cfg, workdir)
    client = connect(uri)
    name = experiment_name(cfg)
    exp_id = experiment_id(client, name, artifact_root(uri, workdir, name))
    state_file = parent_state_path(workdir, config_hash)
    state = read_state(state_file)
    tags = {"recipe": recipe, "config_hash": config_hash, "git_commit": git_commit,
            "prefect_flow_run_id": flow_run_id or "", "grpo.pipeline": "parent",
            "project": cfg.project.name}
    headline.set_experiment_view(client, exp_id, cfg.eval.benchmarks, cfg.eval.primary_metric)
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
    write_state(state_file, {"run_id": run_id, "status": "RUNNING", "experiment": name,
                              "experiment_id": exp_id, "tracking_uri": strip_userinfo(uri),
                              "config_hash": config_hash, "recipe": recipe,
                              "created": created, "updated": now})
    return run_id


def _set_state_status(workspace, parent_id: str, status: str, client: MlflowClient) -> None:
    with contextlib.suppress(MlflowException):
        config_hash = client.get_run(parent_id).data.tags.get("config_hash")
        if config_hash and workspace is not None:
            path = parent_state_path(workdir_of(workspace), config_hash)
            state = read_state(path)
            if state.get("run_id") == parent_id:
                write_state(path, {**state, "status": status, "updated": time.time()})


def fail_pipeline(parent_id: str, error: str, workspace=None,
                  client: MlflowClient | None = None) -> None:
    """Mark the parent and its still-running children FAILED, with the error as a tag.
    A later run of the same config reuses the parent and sets it RUNNING again."""
    c = get_client(client)
    set_tags(parent_id, {"grpo.error": error[:2000]}, c)
    close_children(parent_id, "FAILED", c)
    c.set_terminated(parent_id, "FAILED")
    _set_state_status(workspace, parent_id, "FAILED", c)


# --------------------------------------------------------------------------- pipeline end

def finish_pipeline(parent_id: str, cfg, model_dir: str | os.PathLike, final: Mapping[str, Any],
                    findings: Sequence[str], workspace: Workspace | str | os.PathLike | None = None,
                    client: MlflowClient | None = None, *,
                    champion_records: Sequence[Mapping] | None = None,
                    base: Mapping[str, Any] | None = None, base_model: str | None = None,
                    wall_s: float | None = None,
                    stages: Sequence[tuple[str, Mapping, str | None]] = ()) -> dict:
    """Close a pipeline run: final metrics on the parent (prefix final/), findings, the
    paired deltas of final vs base on the eval/final run, the model registered and
    promoted on the primary metric of the first benchmark by the paired rule, running
    children and the parent set FINISHED. Returns what happened, with a one-line summary
    and the deltas ({bench: {metric: {"delta", "lo", "hi", "n"}}}).

    Per-problem records come from the workspace's store: the final eval's, the base
    model's (`base`: its stage results, else found by `base_model`, else by the config's
    model) and the champion's (`champion_records`, as retrain passes them, else read back
    through the champion version's eval run id tag).

    The parent also gets the headline metrics (tasks/tracking/headline.py; `wall_s`: this
    pipeline run's wall time, else since the parent run started) and a description
    saying them in one line, shown at the top of its page, with the gain of each stage
    over the one before (`stages`: (eval label, {bench: result}, model path) in pipeline
    order; comparison.stage_attribution) as out["attribution"]."""
    c = get_client(client)
    benchmarks = final.get("benchmarks", final)
    workdir = workspace if workspace is not None else workdir_of(None, cfg)
    log_metrics(parent_id, final_headline(benchmarks, cfg.eval.primary_metric), client=c)
    said = count_findings(findings)  # one count, by severity, as each round's page says it
    set_tags(parent_id, {"findings": " | ".join(findings) or "none", "findings.count": said}, c)
    if findings:
        log_text(parent_id, f"{said}\n\n" + "\n".join(f"- {f}" for f in findings) + "\n",
                 "report/findings.md", c)
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
        attribution = comparison.stage_attribution(store, cfg, stages) if stages else None
    out: dict[str, Any] = {"parent_run": parent_id, "benchmark": bench, "metric": primary,
                           "value": block.get("mean"), "ci_lo": block.get("lo"),
                           "ci_hi": block.get("hi"),
                           "deltas": _log_deltas(parent_id, cfg, benchmarks, mine, before, c)}
    result = (f"{bench} {primary} {fmt_ci(block['mean'], block.get('lo'), block.get('hi'))}"
                if block.get("mean") is not None else f"{bench} {primary}: n/a")
    summary = result
    if name:
        out.update(_register_and_promote(parent_id, cfg, model_dir, name, res, mine.get(bench) or [],
                                         champion_records, c))
        summary = (f"{result}; {name} v{out['version']} "
                   f"{'champion' if out['promoted'] else 'challenger'} ({out['reason']})")
    out["summary"], out["attribution"] = summary, attribution
    out["links"] = headline.links_for_run(
        parent_id, (name, out["version"]) if name else None, c)
    _log_headline(parent_id, cfg, benchmarks, base, out["deltas"], findings, wall_s, summary, c,
                  attribution)
    close_children(parent_id, "FINISHED", c)
    c.set_terminated(parent_id, "FINISHED")
    _set_state_status(workdir, parent_id, "FINISHED", c)
    return out


def final_headline(benchmarks: Mapping[str, Any], primary: str) -> dict[str, float]:
    """The parent's copy of the final evaluation: the primary metric's block per benchmark
    (final/<bench>/<metric>, _ci_lo, _ci_hi, _n). Every other metric stays on the eval/final
    run: a parent holding all of them (hundreds on a real benchmark set) buries the
    headline in its metrics list and its charts."""
    keep = {FINAL_PREFIX + k for b in benchmarks
            for k in ci_block_keys(f"{sanitize_key(str(b))}/{sanitize_key(primary)}").values()}
    return {FINAL_PREFIX + k: shown(v) for k, v in eval_metrics(benchmarks).items()
            if FINAL_PREFIX + k in keep}


def _register_and_promote(parent_id: str, cfg, model_dir, name: str, res: Mapping[str, Any],
                          records: list[dict], champion_records: Sequence[Mapping] | None,
                          c: MlflowClient) -> dict:
    """Register the model and decide on it by the paired rule (tasks/tracking/registry.py), the
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


def _log_headline(parent_id: str, cfg, final: Mapping[str, Any], base: Mapping[str, Any] | None,
                  deltas: Mapping[str, Any], findings: Sequence[str], wall_s: float | None,
                  summary: str,
                  c: MlflowClient, attribution: Mapping | None = None) -> None:
    """The headline metrics (tasks/tracking/headline.py) on the parent, and its description. The
    steps are the children's (`grpo/steps`, `sft/steps`): a cached stage counts too."""
    steps = {"grpo": 0, "sft": 0}
    for run in child_runs(parent_id, c):
        for kind in steps:
            steps[kind] += int(run.data.metrics.get(f"{kind}/steps", 0))
    if wall_s is None:
        wall_s = time.time() - c.get_run(parent_id).info.start_time / 1000
    numbers = headline.headline_metrics(
        cfg.eval.benchmarks, cfg.eval.primary_metric, base or {}, final, deltas,
        grpo_steps=steps["grpo"], sft_steps=steps["sft"], wall_s=wall_s, findings=len(findings))
    log_metrics(parent_id, numbers, client=c)
    tags = headline.headline_tags(cfg.eval.benchmarks, cfg.eval.primary_metric, numbers)
    set_tags(parent_id, {**tags, "mlflow.note.content": f"**{cfg.project.recipe}**: {summary}.\n\n"
                         + headline.headline_table(cfg.eval.benchmarks,
                                                   cfg.eval.primary_metric, numbers,
                                                   count_findings(findings))
                         + headline.attribution_text(attribution)}, c)
