"""The pipeline flow, read top to bottom:

    ingest -> [eval base] -> [SFT] -> for each round: (re-)filter -> GRPO round -> eval
    -> health gate -> final eval -> register the model, promote it if it beats the champion
"""
from __future__ import annotations

import subprocess

from flows import configure_prefect

configure_prefect()  # before prefect is imported

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from grpo_core.config import PipelineConfig
from grpo_core.locks import pipeline_lock
from grpo_core.models import use_hub_token
from grpo_core.workspace import Workspace
from tasks import stages, tracking


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def health_gate(round_no: int, train: dict, before: dict, after: dict, primary: str) -> list[str]:
    """Findings worth a human's look; training goes on from the last good model."""
    findings = list(train.get("findings", []))
    for bench, res in after["benchmarks"].items():
        now = res["metrics"].get(primary) or {}
        was = (before["benchmarks"].get(bench) or {}).get("metrics", {}).get(primary) or {}
        if now.get("mean") is not None and was.get("hi") is not None and now["mean"] < was.get("lo", 0):
            findings.append(f"round {round_no}: {bench} {primary} fell below the previous CI "
                            f"({now['mean']:.3f} < {was['lo']:.3f})")
    return findings


def training_prompts(kept: dict, pool: list[str], need: int) -> tuple[list[str], str | None]:
    """The in-band problems when there are enough for one step; else every problem the
    policy sometimes solves (each still has reward variance); else the whole pool. A
    band that keeps too few would otherwise train on nothing."""
    if len(kept["kept_ids"]) >= need:
        return kept["kept_ids"], None
    signal = kept.get("signal_ids") or []
    if len(signal) >= need:
        return signal, (f"only {len(kept['kept_ids'])} problems in band; training on the "
                        f"{len(signal)} with pass rate in (0, 1)")
    return pool, (f"only {len(kept['kept_ids'])} problems in band and {len(signal)} with any "
                  "success; training on the whole pool (re-filter difficulty or change the band)")


@flow(name="grpo-pipeline", validate_parameters=True)
def grpo_pipeline(config: PipelineConfig, progress: bool = True) -> dict:
    """Run one recipe end to end; returns the final metrics and where the model is."""
    log = get_run_logger()
    cfg = config
    ws = Workspace.at(cfg.project.workdir).ensure()
    use_hub_token(cfg)
    # One pipeline per store: a second one waits, then stops before its MLflow run exists.
    with pipeline_lock(ws.db_path, cfg.data.store_lock_timeout):
        parent = tracking.start_parent_run(cfg, config_hash=cfg.hash(), recipe=cfg.project.recipe,
                                           git_commit=git_commit(), flow_run_id=str(flow_run.id),
                                           workspace=ws)
        replayed = tracking.replay_unsent_metrics(ws)
        if replayed:
            log.info("sent %d metric points kept while MLflow was unreachable",
                     sum(replayed.values()))
        ctx = stages.Ctx(cfg=cfg, ws=ws, parent_run=parent, progress=progress)
        try:
            return _stages(ctx, log)
        except BaseException as exc:  # mark the runs FAILED (a SIGKILL leaves them to resume)
            tracking.fail_pipeline(parent, f"{type(exc).__name__}: {exc}", ws)
            raise


def _prefill_sharded(ctx: stages.Ctx, model: str, problem_ids: list[str]) -> list[str]:
    """With filter.shards > 1, workers estimate the missing pass rates and this process
    stores them (one writer); returns the ids stored now. Otherwise nothing to do."""
    if ctx.cfg.filter.shards <= 1:
        return []
    from flows.shards import prefill_estimates

    return prefill_estimates(ctx.cfg, model, stages.pool_problems(ctx, problem_ids),
                             ctx.store, ctx.ws.root)


def _stages(ctx: stages.Ctx, log) -> dict:
    cfg, ws, parent = ctx.cfg, ctx.ws, ctx.parent_run
    primary_bench = cfg.eval.benchmarks[:1]  # per-round evals: the first benchmark only

    scorer = None
    if cfg.eval.shards > 1:  # workers score the problems; this process aggregates, writes
        from flows.shards import eval_scorer

        scorer = eval_scorer(ws.root)

    data = stages.ingest(ctx)
    log.info("data: %d problems in the training pool", data["pool_size"])
    model = stages.base_model(ctx)
    base = stages.evaluate(ctx, model, "eval/base", cfg.eval.benchmarks, scorer)
    before = base

    findings: list[str] = []
    if cfg.sft.enabled:
        sft = stages.sft(ctx, model, data["problem_ids"])
        model = sft["model_dir"]
        findings += [f"sft: {f}" for f in sft.get("findings", [])]
        before = stages.evaluate(ctx, model, "eval/sft", primary_bench, scorer)

    pool = data["problem_ids"]
    for r in range(1, cfg.grpo.rounds + 1):
        if cfg.filter.enabled and (r == 1 or cfg.filter.refilter_each_round):
            fresh = _prefill_sharded(ctx, model, data["problem_ids"])
            kept = stages.difficulty_filter(ctx, model, data["problem_ids"], r, fresh)
            log.info("filter round %d: kept %d of %d", r, kept["kept"], kept["considered"])
            pool, note = training_prompts(kept, data["problem_ids"], cfg.grpo.prompts_per_step)
            if note:
                findings.append(f"round {r}: {note}")
        train = stages.grpo_round(ctx, model, pool, r)
        model = train["model_dir"]
        after = stages.evaluate(ctx, model, f"eval/round-{r}", primary_bench, scorer)
        findings += health_gate(r, train, before, after, cfg.eval.primary_metric)
        before = after

    final = stages.evaluate(ctx, model, "eval/final", cfg.eval.benchmarks, scorer)
    report = tracking.finish_pipeline(parent, cfg, model, final, findings, ws)
    log.info("final: %s", report.get("summary"))
    return {"parent_run": parent, "model_dir": model, "final": final["benchmarks"],
            "base": base["benchmarks"],
            "findings": findings, "registered": report}
