"""Scheduled retraining: start from the registered champion, re-filter the pool with it,
run one GRPO round, evaluate champion and challenger under one protocol, and promote the
challenger only if the paired per-problem difference (challenger minus champion, same
problems) has a 95% CI above 0. The decision, its rule and the numbers behind it are
recorded on the retrain run (report/retrain_decision.json).

It shares the pipeline's steps (flows/pipeline.py): the preflight holding the store, the parent
run (unsent metrics replayed, FAILED on an exception), the round's filter and choice of
training prompts, sharded filtering and evaluation. Of the round gate only the finding:
with one round, the promotion rule decides (a challenger below the champion is not
promoted), so rounds.rollback_on_regression has nothing to roll back to."""
from __future__ import annotations

from prefect import flow, get_run_logger

from flows.pipeline import (
    contamination_findings,
    eval_budget_findings,
    eval_scorer_for,
    filter_round,
    parent_run,
    scorer_error_findings,
)
from flows.refusals import NoChampion
from flows.run_view import log_findings, publish_result, retrain_run_name
from grpo_core.config import PipelineConfig
from grpo_core.eval.round_gate import Evaluated, regressions
from grpo_core.findings import Finding
from grpo_core.modeling.loading import use_hub_token
from grpo_core.workspace import Workspace, experiment_name
from tasks import stage_data, stages, tracking
from tasks.eval_records import records_store, stage_records
from tasks.finish import finish_pipeline
from tasks.preflight import RunPlan, planned
from tasks.runner import run_stage
from tasks.stage_results import EvalResult
from tasks.tracking import verdict_freshness


@flow(name="grpo-retrain", validate_parameters=True, flow_run_name=retrain_run_name)
def retrain(config: PipelineConfig, progress: bool = True, plan: RunPlan | None = None) -> dict:
    log = get_run_logger()
    cfg = config
    ws = Workspace.at(cfg.project.workdir).ensure()
    use_hub_token(cfg)
    # One pipeline per store, as in grpo_pipeline. Taken before the champion is read, so a
    # pipeline promoting a new champion meanwhile is waited for, not raced; a retrain
    # that gives up has downloaded nothing and started no MLflow run.
    with planned(cfg, plan, loads_model=False) as plan:
        tracking.connect(plan.tracking_uri)
        name = tracking.model_name(cfg)
        champion = tracking.champion_version(name)
        if champion is None:
            raise NoChampion(f"no champion for {name!r} yet: run this config's pipeline first "
                             f"(`grpo run` or its deployment), which registers {name!r}")
        champion_dir = str(tracking.download_champion(name, ws.root / "champions" / name))
        # One retrain run per champion version: a killed retrain resumes under the same run.
        with parent_run(cfg, ws, log, progress, plan,
                        config_hash=f"{cfg.hash()}-retrain-v{champion.version}",
                        recipe=f"{cfg.project.recipe}+retrain") as ctx:
            tracking.set_tags(ctx.parent_run, {"grpo.champion_version": champion.version})
            out = _stages(ctx, champion_dir, log)
        # the champion it was retrained from may be newer than the experiment's verdict
        verdict_freshness.mark_if_stale(experiment_name(cfg))
        report = out["decision"]
        decision, detail = decision_files(cfg, champion.version, report, out)
        tracking.log_json(ctx.parent_run, decision, "report/retrain_decision.json")
        tracking.log_json(ctx.parent_run, detail, "report/retrain_metrics.json")
        publish_retrain(cfg, decision, report, out["findings"])
    log_findings(log, out["findings"])  # as grpo_pipeline does: the count, then each one
    log.info("retrain: %s", report.get("summary"))
    return {"parent_run": ctx.parent_run, "model_dir": out["model_dir"], "decision": report,
            "decided": decision["decision"],
            "findings": out["findings"]}


def decision_files(cfg: PipelineConfig, champion_version, report: dict, out: dict
                   ) -> tuple[dict, dict]:
    """(report/retrain_decision.json: the decision first - promoted or not, why, by which
    rule, the paired delta, champion and challenger on the primary metric -, and
    report/retrain_metrics.json beside it: every metric of both)."""
    bench, primary = cfg.eval.benchmarks[0], cfg.eval.primary_metric
    champ, chall = out["champion"][bench].metrics, out["challenger"][bench].metrics
    decision = {
        "decision": (f"promoted v{report.get('version')}" if report.get("promoted")
                     else f"kept champion v{champion_version}"),
        "promoted": report.get("promoted"), "reason": report.get("reason"),
        "rule": report.get("rule"), "paired": report.get("paired"),
        "benchmark": bench, "metric": primary, "champion_version": str(champion_version),
        "challenger_version": str(report.get("version")),
        "champion": {primary: champ.get(primary)}, "challenger": {primary: chall.get(primary)},
        "detail": "report/retrain_metrics.json"}
    return decision, {"benchmark": bench, "champion": champ, "challenger": chall}


def publish_retrain(cfg: PipelineConfig, decision: dict, report: dict, findings: list[Finding]) -> None:
    """The retrain's Prefect artifact (`retrain-<recipe>`): the decision and its rule, the
    champion-vs-challenger table with the paired delta, the findings, the MLflow links."""
    publish_result("retrain", cfg.project.recipe, [
        f"**{decision['decision']}**: {decision['reason']}", "",
        f"Rule: {decision['rule'] or 'none'}", "",
        "Columns: base = the champion, final = the challenger, delta = challenger minus "
        "champion, paired per problem."], report, findings,
        "The retrain's decision: champion vs challenger")


def _stages(ctx: stages.Ctx, champion_dir: str, log) -> dict:
    """The retrain's stages, each between its start and end lines (tasks.runner), as the
    pipeline's are: data, filter/round-1, grpo/round-1, eval/champion, eval/final."""
    cfg, ws = ctx.cfg, ctx.ws
    scorer = eval_scorer_for(cfg, ws, ctx.launch_plan().own_process)
    primary = cfg.eval.primary_metric
    data = run_stage(log, "data", "data", stages.ingest, ctx)
    findings = contamination_findings(data.contamination)
    pool = stage_data.pool_of(data)
    # The window after the pipeline's rounds: candidates the champion's rounds did not read
    # (tasks.stage_data.round_candidates; none left stops with the numbers and the fix).
    prompts, note = stage_data.round_candidates(cfg, pool, stage_data.rl_size(ctx, pool),
                                                cfg.rounds.count + 1)
    findings += [Finding.note("pool_window", note, stage="data")] if note else []
    if cfg.filter.enabled:
        prompts, note = filter_round(ctx, champion_dir, prompts, 1, log)
        findings += [note] if note else []
    train = run_stage(log, "grpo/round-1", "grpo", stages.grpo_round, ctx, champion_dir, prompts, 1)

    def eval_stage(model: str, label: str) -> EvalResult:
        return run_stage(log, label, "eval", stages.evaluate_model, ctx, model, label,
                         cfg.eval.benchmarks, scorer, primary=primary)

    before = eval_stage(champion_dir, "eval/champion")
    after = eval_stage(train.model_dir, "eval/final")
    findings += train.findings
    for label, evaluated in (("eval/champion", before), ("eval/final", after)):
        findings += scorer_error_findings(label, evaluated)
    findings += regressions(1, before.benchmarks, after.benchmarks, primary, "champion_regressed")
    findings += eval_budget_findings(cfg, [Evaluated("eval/champion", before.benchmarks, champion_dir)],
                             ("eval/final", after.benchmarks))
    # The champion's per-problem rows, scored under today's protocol, to pair with the
    # challenger's.
    bench = cfg.eval.benchmarks[0]
    with records_store(ws, cfg.data.store_lock_timeout) as store:
        champion_records = stage_records(store, before.benchmarks[bench], champion_dir) or None
    # The champion's eval as the base: the headline's base, final and delta columns (and the
    # result line) read champion, challenger and the paired difference.
    report = finish_pipeline(ctx.parent_run, cfg, train.model_dir, after.benchmarks, findings, ws,
                             champion_records=champion_records, base=before.benchmarks,
                             base_model=champion_dir, over="the champion")
    return {"model_dir": train.model_dir, "champion": before.benchmarks,
            "challenger": after.benchmarks, "findings": findings, "decision": report}
