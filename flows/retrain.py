"""Scheduled retraining: start from the registered champion, re-filter the pool with it,
run one GRPO round, evaluate champion and challenger under one protocol, and promote the
challenger only if it beats the champion beyond the champion's CI. The decision and the
numbers behind it are recorded on the retrain run."""
from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from flows.pipeline import git_commit  # first: it configures prefect before import
from grpo_core.config import PipelineConfig
from grpo_core.workspace import Workspace
from tasks import stages, tracking


@flow(name="grpo-retrain", validate_parameters=True)
def retrain(config: PipelineConfig, progress: bool = True) -> dict:
    log = get_run_logger()
    cfg = config
    ws = Workspace.at(cfg.project.workdir).ensure()
    tracking.connect(tracking.tracking_uri(cfg, ws))
    name = tracking.model_name(cfg)
    champion = tracking.champion_version(name)
    if champion is None:
        raise LookupError(f"no champion for {name!r}: run the pipeline for this config first")
    champion_dir = str(tracking.download_champion(name, ws.root / "champions" / name))
    # One retrain run per champion version: a killed retrain resumes under the same run.
    parent = tracking.start_parent_run(cfg, config_hash=f"{cfg.hash()}-retrain-v{champion.version}",
                                       recipe=f"{cfg.project.recipe}+retrain", git_commit=git_commit(),
                                       flow_run_id=str(flow_run.id), workspace=ws)
    tracking.set_tags(parent, {"grpo.champion_version": champion.version})
    ctx = stages.Ctx(cfg=cfg, ws=ws, parent_run=parent, progress=progress)
    try:
        data = stages.ingest(ctx)
        pool = data["problem_ids"]
        if cfg.filter.enabled:
            pool = stages.difficulty_filter(ctx, champion_dir, pool, 1)["kept_ids"] or pool
        train = stages.grpo_round(ctx, champion_dir, pool, 1)
        before = stages.evaluate(ctx, champion_dir, "eval/champion", cfg.eval.benchmarks)
        after = stages.evaluate(ctx, train["model_dir"], "eval/final", cfg.eval.benchmarks)
        bench = cfg.eval.benchmarks[0]
        champion_metrics = before["benchmarks"][bench]["metrics"]
        report = tracking.finish_pipeline(parent, cfg, train["model_dir"], after, train["findings"], ws,
                                          champion_metrics=champion_metrics)
    except BaseException as exc:
        tracking.fail_pipeline(parent, f"{type(exc).__name__}: {exc}", ws)
        raise
    tracking.log_json(parent, {"champion_version": champion.version, "champion": champion_metrics,
                               "challenger": after["benchmarks"][bench]["metrics"],
                               "promoted": report.get("promoted"), "reason": report.get("reason")},
                      "report/retrain_decision.json")
    log.info("retrain: %s", report.get("summary"))
    return {"parent_run": parent, "model_dir": train["model_dir"], "decision": report}
