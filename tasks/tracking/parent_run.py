"""A pipeline's parent run from start to close. The run tree (experiment =
tracking.experiment or project.name):

    parent run  "<recipe>-<config hash>"   tags recipe, config_hash, git_commit,
                                           prefect_flow_run_id, grpo.pipeline=parent
      params    the resolved config, flattened ("grpo.beta": 0.04), secrets redacted
      metrics   final/<bench>/<primary metric> (+ CI) and the headline (grpo_core.eval.headline)
      artifacts config/resolved.yaml, config/environment.json; the registered model
      children  "<recipe>/<stage>", tag grpo.stage: data, filter/round-N, sft, grpo/round-N,
                eval/base, eval/round-N, eval/final; each ended by its stage

Resume: the parent run of a config hash is remembered in <workdir>/runs/<hash>.json and
reused by every later run of the same config, whatever its status: a killed run continues
under its parent, a re-run of a finished config shows as the same parent again. Child
runs are found by stage under their parent (mlflow_client.child_run).
"""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from grpo_core.eval import headline as text
from grpo_core.eval.comparison import delta_metrics
from grpo_core.eval.promotion import Decision
from grpo_core.eval.score import BenchmarkScore, Scores
from grpo_core.findings import Finding, count_findings, lines
from grpo_core.redaction import redact, strip_userinfo
from grpo_core.versions import environment_snapshot
from grpo_core.workspace import (
    Workspace,
    artifact_root,
    experiment_name,
    read_state,
    tracking_uri,
    workdir_of,
    write_state,
)
from tasks.tracking import headline
from tasks.tracking.artifacts import log_json, log_text
from tasks.tracking.mlflow_client import (
    child_run,
    child_runs,
    close_children,
    connect,
    experiment_id,
    get_client,
    log_metrics,
    log_params,
    set_tags,
)
from tasks.tracking.registry import champion_uri, promote, register_model

PREFECT_URL_TAG = "prefect_flow_run_url"  # the Prefect UI's page of the run, with a server


def _state_path(workdir: Path, config_hash: str) -> Path:
    return workdir / "runs" / f"{config_hash}.json"


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
                     extra_params: Mapping[str, Any] | None = None, *, run_name: str = "",
                     flow_run_url: str | None = None) -> str:
    """The parent run of this config hash, created (params, config/resolved.yaml,
    config/environment.json) or reused: set RUNNING again, its git_commit,
    prefect_flow_run_id and prefect_flow_run_url tags this run's, grpo.resumes counting the
    reuses. `run_name`: the Prefect flow run's, one name in both UIs (else `<recipe>-<hash8>`)."""
    import yaml

    workdir = workdir_of(workspace, cfg)
    uri = tracking_uri(cfg, workdir)
    client = connect(uri)
    name = experiment_name(cfg)
    exp_id = experiment_id(client, name, artifact_root(uri, workdir, name))
    state_file = _state_path(workdir, config_hash)
    state = read_state(state_file)
    tags = {"recipe": recipe, "config_hash": config_hash, "git_commit": git_commit,
            "prefect_flow_run_id": flow_run_id or "", PREFECT_URL_TAG: flow_run_url or "",
            "grpo.pipeline": "parent",
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
        run_id = client.create_run(exp_id, run_name=run_name or f"{recipe}-{config_hash[:8]}",
                                   tags={k: str(v) for k, v in tags.items()}).info.run_id
        config = cfg.model_dump(mode="json")
        log_params(run_id, {**config, **(extra_params or {})}, client)  # flattened, redacted
        client.log_text(run_id, yaml.safe_dump(redact(config), sort_keys=False), "config/resolved.yaml")
        log_json(run_id, redact(environment_snapshot()), "config/environment.json", client)
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
            path = _state_path(workdir_of(workspace), config_hash)
            state = read_state(path)
            if state.get("run_id") == parent_id:
                write_state(path, {**state, "status": status, "updated": time.time()})


def fail_pipeline(parent_id: str, error: str, workspace=None,
                  client: MlflowClient | None = None) -> None:
    """Mark the parent and its still-running children FAILED, with the error as a tag."""
    c = get_client(client)
    set_tags(parent_id, {"grpo.error": error[:2000]}, c)
    close_children(parent_id, "FAILED", c)
    c.set_terminated(parent_id, "FAILED")
    _set_state_status(workspace, parent_id, "FAILED", c)


def close_pipeline(parent_id: str, cfg, model_dir: str | os.PathLike, benchmarks: Scores,
                   findings: Sequence[Finding], workspace, *, deltas: Mapping[str, Any],
                   attribution: Mapping | None, base: Scores | None,
                   wall_s: float | None, model: str | None, records: Mapping[str, list],
                   champion_records: Sequence[Mapping] | None, over: str = "the base",
                   client: MlflowClient | None = None) -> dict:
    """Log what the end of a pipeline decided (tasks/finish.py): final metrics and findings
    on the parent, the paired `deltas` on the eval/final run, the model registered as a
    version of `model` and judged against the champion on the first benchmark (`records`:
    {bench: the final eval's rows}), the headline and the description; the runs FINISHED."""
    c = get_client(client)
    primary, bench = cfg.eval.primary_metric, next(iter(cfg.eval.benchmarks), None)
    log_metrics(parent_id, text.final_headline(benchmarks, primary), client=c)
    said = count_findings(findings)  # one count, by severity, as each round's page says it
    set_tags(parent_id, {"findings": " | ".join(lines(findings)) or "none", "findings.count": said}, c)
    if findings:
        log_text(parent_id, f"{said}\n\n" + "\n".join(f"- {x}" for x in lines(findings)) + "\n",
                 "report/findings.md", c)
    if deltas:
        log_metrics(child_run(parent_id, "eval/final", c), delta_metrics(deltas), client=c)
    res = benchmarks.get(bench) if bench else None
    block = res.metric(primary) if res else {}
    out: dict[str, Any] = {"parent_run": parent_id, "benchmark": bench, "metric": primary,
                           "value": block.get("mean"), "ci_lo": block.get("lo"),
                           "ci_hi": block.get("hi"), "deltas": dict(deltas)}
    if model:
        out.update(_register_and_promote(parent_id, cfg, model_dir, model, res, block,
                                         records.get(bench) or [], champion_records, c))
    summary = text.result_line(bench, primary, block, (model, out["version"], out["promoted"],
                                                       out["reason"]) if model else None,
                               delta=deltas.get(bench, {}).get(primary), over=over)
    out["summary"], out["attribution"] = summary, attribution
    out["links"] = headline.links_for_run(parent_id, (model, out["version"]) if model else None, c)
    out["table"] = _log_headline(parent_id, cfg, benchmarks, base, deltas, findings, wall_s,
                                 summary, c, attribution)
    close_children(parent_id, "FINISHED", c)
    c.set_terminated(parent_id, "FINISHED")
    _set_state_status(workspace, parent_id, "FINISHED", c)
    return out


def _register_and_promote(parent_id: str, cfg, model_dir, name: str, res: BenchmarkScore | None,
                          block: Mapping[str, Any], records: list[dict],
                          champion_records: Sequence[Mapping] | None, c: MlflowClient) -> dict:
    """Register the model and record the promotion rule's decision, tagged on the parent too;
    the final eval's run id (of `records`) is tagged on the version, for the next challenger."""
    primary = cfg.eval.primary_metric
    version = register_model(parent_id, model_dir, name,
                             tags={"recipe": cfg.project.recipe, "config_hash": cfg.hash()}, client=c)
    out = {"model_name": name, "version": version, "model_uri": f"models:/{name}/{version}",
           "champion_uri": champion_uri(name)}
    if block.get("mean") is None:
        bench = next(iter(cfg.eval.benchmarks), None)
        d = Decision(False, f"no {primary} on {bench}; not compared", "", "none")
    else:
        d = promote(c, name, version, primary, block["mean"], block.get("lo"), ci_hi=block.get("hi"),
                    protocol_hash=res.protocol_hash, records=records,
                    champion_records=champion_records,
                    eval_run_id=records[0]["run_id"] if records else None,
                    n_resamples=cfg.eval.bootstrap, seed=cfg.project.seed)
    set_tags(parent_id, {"grpo.promotion": "promoted" if d.promoted else "rejected",
                         "grpo.promotion_reason": d.reason, "grpo.promotion_rule": d.rule}, c)
    return {**out, "promoted": d.promoted, "reason": d.reason,
            "rule": None if d.rule == "none" else d.rule, "paired": d.paired}


def _log_headline(parent_id: str, cfg, final: Scores, base: Scores | None,
                  deltas: Mapping[str, Any], findings: Sequence[Finding], wall_s: float | None,
                  summary: str, c: MlflowClient, attribution: Mapping | None = None) -> str:
    """The headline metrics and tags on the parent, its description (and the Prefect run's
    address, tag prefect_flow_run_url); returns the headline table. The steps are the
    children's (`grpo/steps`, `sft/steps`): a cached stage counts too."""
    steps = {"grpo": 0, "sft": 0}
    for run in child_runs(parent_id, c):
        for kind in steps:
            steps[kind] += int(run.data.metrics.get(f"{kind}/steps", 0))
    if wall_s is None:
        wall_s = time.time() - c.get_run(parent_id).info.start_time / 1000
    benches, metric = cfg.eval.benchmarks, cfg.eval.primary_metric
    numbers = text.headline_metrics(benches, metric, base or {}, final, deltas,
                                    grpo_steps=steps["grpo"], sft_steps=steps["sft"],
                                    wall_s=wall_s, findings=len(findings))
    log_metrics(parent_id, numbers, client=c)
    table = text.headline_table(benches, metric, numbers, count_findings(findings))
    prefect_url = c.get_run(parent_id).data.tags.get(PREFECT_URL_TAG)
    set_tags(parent_id, {**text.headline_tags(benches, metric, numbers), "mlflow.note.content":
                         text.parent_description(cfg.project.recipe, summary, attribution, table,
                                                 prefect_url)}, c)
    return table
