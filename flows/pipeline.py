"""The pipeline flow, read top to bottom:

    ingest -> [eval base] -> [SFT] -> for each round: (re-)filter -> GRPO round -> eval
    -> round gate -> final eval -> register the model, promote it if it beats the champion

The round gate (grpo_core/eval/round_gate.py): a round whose evaluation falls below the
previous one's CI is a finding, and with rounds.rollback_on_regression what follows starts
from the best model evaluated so far.
"""
from __future__ import annotations

import contextlib
import functools
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from prefect import flow, get_run_logger

from flows.prefill import prefill_sharded
from flows.run_view import (
    log_findings,
    pipeline_run_name,
    prefect_run_link,
    publish_result,
)
from grpo_core.config import PipelineConfig
from grpo_core.data.pool import PoolSlice
from grpo_core.data.stage_split import check_rounds, prompts_per_update
from grpo_core.eval.round_gate import Evaluated, gate_round
from grpo_core.findings import Finding
from grpo_core.generation.warm_engine import keep_warm, release_warm
from grpo_core.modeling.loading import use_hub_token
from grpo_core.train.diagnosis import CollapsedStart, start_collapse
from grpo_core.train.eval_budget import budget_findings
from grpo_core.train.throughput import (
    ENGINE_REUSES_METRIC,
    ENGINE_STARTS_METRIC,
    PIPELINE_CHILDREN_METRIC,
    PIPELINE_RSS_METRIC,
    child_processes,
    rss_now_gb,
)
from grpo_core.workspace import Workspace, experiment_name
from tasks import stage_data, stages, tracking
from tasks.finish import finish_pipeline
from tasks.preflight import RunPlan, planned
from tasks.probes import memorisation_probe
from tasks.runner import run_stage
from tasks.stage_results import Compute, EvalResult, FilterResult, PipelineResult
from tasks.tracking import verdict_freshness


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def contamination_findings(contamination: dict) -> list[Finding]:
    """One per evaluation set that training rows reproduce (data run: the counts)."""
    return [Finding.note("contamination", f"{c['flagged']} training problems reproduce {bench} "
                         f"problems; {c['excluded']} excluded from training", stage="data",
                         benchmark=bench, flagged=c["flagged"], excluded=c["excluded"])
            for bench, c in contamination.items() if c.get("flagged")]


def scorer_error_findings(label: str, evaluated: EvalResult) -> list[Finding]:
    """Scorer exceptions are reported, never silently read as wrong answers."""
    return [Finding.note("scorer_errors", f"{bench}: {n} scorer errors (not scored as wrong; "
                         "the log names each input's hash)", stage=label, benchmark=bench,
                         errors=n) for bench, n in evaluated.scorer_errors().items()]


def eval_budget_findings(cfg: PipelineConfig, earlier: list[Evaluated],
                         later: tuple[str, dict]) -> list[Finding]:
    """`eval_budget_truncates` of each delta later - earlier (grpo_core.train.eval_budget)."""
    return [f for e in earlier for f in budget_findings(
        (e.label, e.benchmarks), later, cfg.eval.max_new_tokens, cfg.eval.max_truncated)]


def training_prompts(kept: FilterResult, pool: PoolSlice) -> tuple[PoolSlice | list[str], str | None]:
    """The round's training prompts, as the filter decided (FilterResult.trains_on): the
    in-band problems when they fill one optimizer step; else every problem the policy
    sometimes solves (each still has reward variance); else the round's whole window of
    candidates. A band that keeps too few would otherwise train on nothing. A window too
    small for one step is refused."""
    if len(pool) < kept.need:
        raise ValueError(f"the round's candidates are {len(pool)} problems; one GRPO optimizer step "
                         f"needs {kept.need} (one generation batch: grpo.per_device_train_batch_size"
                         " x train.num_processes x grpo.steps_per_generation / grpo.num_generations)")
    choice = kept.trains_on()
    if choice == "band":
        return kept.kept_ids, None
    if choice == "signal":
        return kept.signal_ids, (f"only {len(kept.kept_ids)} problems in band; training on the "
                                 f"{len(kept.signal_ids)} with pass rate in (0, 1)")
    return pool, (f"only {len(kept.kept_ids)} problems in band and {len(kept.signal_ids)} with "
                  "any success; training on all the round's candidates (re-filter difficulty "
                  "or change the band)")


@flow(name="grpo-pipeline", validate_parameters=True, flow_run_name=pipeline_run_name)
def grpo_pipeline(config: PipelineConfig, progress: bool = True,
                  plan: RunPlan | None = None) -> PipelineResult:
    """Run one recipe end to end; returns the final metrics and where the model is.
    `plan`: the run's preflight with the store held (`grpo run`); None: made here (a
    deployment's run), refusing before any work what this machine cannot run."""
    log = get_run_logger()
    cfg = config
    ws = Workspace.at(cfg.project.workdir).ensure()
    use_hub_token(cfg)
    # One pipeline per store: a second one waits, then stops before its MLflow run exists.
    with planned(cfg, plan) as plan, \
            parent_run(cfg, ws, log, progress, plan, config_hash=cfg.hash(),
                       recipe=cfg.project.recipe) as ctx, \
            keep_warm(cfg.rollout.reuse_engine) as warm:
        # The stages, top to bottom (each between its start and end lines: tasks.runner).
        parent, started = ctx.parent_run, time.monotonic()
        run = _Run(ctx, log)
        eval_stage, findings = run.eval_stage, run.findings
        # what this process runs beside the stages (e.g. Prefect's temporary server): step 0
        tracking.log_metrics(parent, {PIPELINE_CHILDREN_METRIC: child_processes()}, step=0)
        run.data()
        model = run_stage(log, "model", "model", stages.base_model, ctx)
        base = eval_stage(model, "eval/base", cfg.eval.benchmarks)
        findings += scorer_error_findings("eval/base", base)
        start = Evaluated("eval/base", base.benchmarks, model)  # what the next round trains
        evaluated = [start]  # the trained model's lineage, for the stage attribution
        if cfg.sft_stage.enabled:
            start = run.sft(model)
            evaluated.append(start)
        start, pipeline_rss = run.rounds(start, evaluated)
        model = start.model
        # the last round's eval (or the base's, eval/sft's) of this model, when it covered
        # every benchmark: the cache serves it, and the line says so
        covered = set(start.benchmarks) >= set(cfg.eval.benchmarks)
        final = eval_stage(model, "eval/final", cfg.eval.benchmarks,
                           reuses=start.label if covered else None)
        findings += scorer_error_findings("eval/final", final)
        findings += eval_budget_findings(cfg, [e for e in evaluated
                                               if e.label in ("eval/base", "eval/sft")],
                                         ("eval/final", final.benchmarks))
        evaluated.append(("eval/final", final.benchmarks, model))
        tracking.log_metrics(parent, {f"compute/{k}": v
                                      for k, v in run.compute.model_dump().items()})
        report = finish_pipeline(parent, cfg, model, final.benchmarks, findings, ws,
                                 base=base.benchmarks, wall_s=time.monotonic() - started,
                                 stages=evaluated)
        log.info("final: %s", report.get("summary"))
        out = PipelineResult(parent_run=parent, model_dir=model, final=final.benchmarks,
                             base=base.benchmarks, pipeline_rss_gb=pipeline_rss,
                             findings=findings, registered=report, memorisation=run.probes,
                             compute=run.compute)
        if warm.starts:  # vLLM sampled the filter or an eval here
            log.info("vLLM engines: %d started for the filter and eval stages, %d taken again "
                     "by the next stage on the same model (rollout.reuse_engine)",
                     warm.starts, warm.reuses)
            tracking.log_metrics(parent, {ENGINE_STARTS_METRIC: warm.starts,
                                          ENGINE_REUSES_METRIC: warm.reuses})
        verdict_freshness.mark_if_stale(experiment_name(cfg))  # a newer champion?
    log_findings(log, out.findings)
    publish_pipeline(cfg, out)
    return out


def publish_pipeline(cfg: PipelineConfig, out: PipelineResult) -> None:
    """The run's Prefect artifact (`pipeline-<recipe>`), where a Prefect user looks: the
    result line with the paired delta and the registry's decision, the headline table
    (base, final, paired delta per benchmark), the findings, the MLflow links."""
    reg = out.registered
    publish_result("pipeline", cfg.project.recipe, [f"**{cfg.project.recipe}**: {reg.get('summary')}"],
                   reg, out.findings, f"{cfg.project.recipe}: held-out result, paired delta")


@contextlib.contextmanager
def parent_run(cfg: PipelineConfig, ws: Workspace, log, progress: bool, plan: RunPlan, *,
               config_hash: str, recipe: str) -> Iterator[stages.Ctx]:
    """Start (or resume) the parent MLflow run of `config_hash`, send the metric points
    kept while MLflow was unreachable, and yield the stages' context. An exception in the
    block marks the runs FAILED (a SIGKILL leaves them to resume). `plan` holds the store
    (tasks.preflight.planned): everything from here on writes."""
    prefect = prefect_run_link()  # one name per run: MLflow's parent is named as Prefect's run
    parent = tracking.start_parent_run(cfg, config_hash=config_hash, recipe=recipe,
                                       git_commit=git_commit(), flow_run_id=prefect["id"],
                                       workspace=ws, run_name=prefect["name"],
                                       flow_run_url=prefect["url"])
    replayed = tracking.replay_unsent_metrics(ws)
    if replayed:
        log.info("sent %d metric points kept while MLflow was unreachable",
                 sum(replayed.values()))
    try:
        yield stages.Ctx(cfg=cfg, ws=ws, parent_run=parent, progress=progress,
                         launch=plan.launch)
    except BaseException as exc:  # mark the runs FAILED (a SIGKILL leaves them to resume)
        tracking.fail_pipeline(parent, f"{type(exc).__name__}: {exc}", ws)
        raise


def eval_scorer_for(cfg: PipelineConfig, ws: Workspace, own_process: bool):
    """stages.evaluate_model's `scorer`: with eval.shards > 1 workers score the problems and
    this process aggregates and writes (one worker process when the plan puts stages in
    their own process: LaunchPlan.own_process); otherwise None (scored in this process)."""
    if cfg.eval.shards <= 1 and not own_process:
        return None
    from flows.shards import eval_scorer

    return eval_scorer(ws.root)


def filter_round(ctx: stages.Ctx, model: str, problem_ids: PoolSlice, round_no: int,
                 log, evidence_run: str | None = None, compute: Compute | None = None
                 ) -> tuple[PoolSlice | list[str], Finding | None]:
    """Round `round_no`'s difficulty filter of its candidates `problem_ids` (a fresh window
    of the RL part: tasks.stage_data.round_candidates) under `model` (estimates
    prefilled by shards when filter.shards > 1), then its training prompts: the
    `training_prompts` choice, and the finding it notes (None when the band was enough).
    `evidence_run`: the previous round's GRPO run, whose rollouts count as weighted
    evidence (filter.rollout_evidence_weight; grpo_core.eval.evidence). A round whose every
    group would start collapsed (no problem solved only sometimes) raises CollapsedStart
    before any training when diagnosis.stop_on_collapsed_start is set. `compute`: the run's
    ledger, the filter's seconds and samples added."""
    fresh = prefill_sharded(ctx.cfg, model, lambda: stage_data.filter_candidates(ctx, problem_ids),
                            ctx.store, ctx.ws.root, evidence_run,
                            own_process=ctx.launch_plan().own_process)  # store: planned
    kept = run_stage(log, f"filter/round-{round_no}", "filter", stages.difficulty_filter,
                     ctx, model, problem_ids, round_no, fresh, evidence_run)
    if compute is not None:
        compute.add(kept)
    collapsed = start_collapse(kept.pass_rates, ctx.cfg, round_no)
    if collapsed is not None and collapsed.severity == "stop":  # diagnosis.stop_on_collapsed_start
        raise CollapsedStart(collapsed.line(), collapsed)
    prompts, note = training_prompts(kept, problem_ids)
    found = (Finding.note("few_in_band", note) if note else
             window_note(ctx.cfg, kept, len(problem_ids)))
    return prompts, (found.at(f"round {round_no}") if found else None)


def window_note(cfg: PipelineConfig, kept: FilterResult, window: int) -> Finding | None:
    """Before training: a round whose draws (grpo.max_steps x prompts per step) would train
    each kept prompt more than probe.max_prompt_repeats times, and the window that would not."""
    draws, limit = cfg.grpo.max_steps * prompts_per_update(cfg), cfg.probe.max_prompt_repeats
    if not kept.kept_ids or draws <= limit * len(kept.kept_ids):
        return None
    need = -(-draws * window // (limit * len(kept.kept_ids)))  # ceil, at this keep rate
    return Finding.note(
        "prompt_repeats", f"{draws} prompt draws over the {len(kept.kept_ids)} kept of {window} "
        f"candidates: each ~{draws / len(kept.kept_ids):.1f} times (probe.max_prompt_repeats "
        f"{limit}); ~{need} candidates (filter.max_problems) would keep it within",
        draws=draws, kept=len(kept.kept_ids), window=window, limit=limit, need=need)


@dataclass
class _Run:
    """What the stages of one pipeline run share: the context, the log, the findings so
    far, the memorisation probes, and the data parts every stage reads (set by data())."""

    ctx: stages.Ctx
    log: object
    findings: list[Finding] = field(default_factory=list)
    probes: list = field(default_factory=list)
    compute: Compute = field(default_factory=Compute)  # what the recipe spent, per stage kind
    pool: object = None
    rl_size: int = 0

    @functools.cached_property
    def scorer(self):
        """Where eval records are scored (eval_scorer_for), decided once for the run."""
        return eval_scorer_for(self.ctx.cfg, self.ctx.ws, self.ctx.launch_plan().own_process)

    def eval_stage(self, model: str, label: str, benchmarks: list[str],
                   reuses: str | None = None) -> EvalResult:
        """The eval stage `label` of `model` (stages.evaluate_model), its start/end lines;
        `reuses`: the eval stage of the same model whose result the cache may serve."""
        return self.compute.add(run_stage(
            self.log, label, "eval", stages.evaluate_model, self.ctx, model, label, benchmarks,
            self.scorer, primary=self.ctx.cfg.eval.primary_metric, reuses=reuses))

    def data(self):
        """Ingest, then check that every round has a fresh window of the RL part before any
        work (grpo_core.data.stage_split: PoolExhausted names the numbers and the fix)."""
        cfg = self.ctx.cfg
        data = run_stage(self.log, "data", "data", stages.ingest, self.ctx)
        self.findings += contamination_findings(data.contamination)
        for f in self.findings:
            self.log.warning(f)
        self.pool = stage_data.pool_of(data)
        self.rl_size = stage_data.rl_size(self.ctx, self.pool)
        self.findings += [Finding.note("pool_window", note, stage="data")
                          for note in check_rounds(cfg, self.rl_size)]
        if cfg.data.stage_overlap:
            self.findings.append(Finding.note(
                "stage_overlap", "data.stage_overlap is set: SFT and GRPO read the whole pool, "
                "so GRPO trains on problems SFT trained on", stage="data"))
        return data

    def probe(self, start_model: str, model_dir: str, stage: str, trained: list[str],
              evaluated: EvalResult, readiness: bool = False) -> None:
        """The memorisation probe of the model `stage` made from `start_model` (tasks.probes)."""
        cfg = self.ctx.cfg
        if not cfg.probe.problems:
            return
        heldout = evaluated.benchmarks[cfg.eval.benchmarks[0]].metric(cfg.eval.primary_metric).get("mean")
        unseen = stage_data.unseen_part(cfg, self.pool, self.rl_size)
        self.probes.append(run_stage(self.log, f"probe/{stage.split('/')[-1]}", "probe",
                                     memorisation_probe, self.ctx, start_model, model_dir,
                                     stage, trained, unseen, heldout, readiness,
                                     self.scorer))
        self.findings.extend(self.probes[-1].findings)

    def sft(self, model: str) -> Evaluated:
        release_warm()  # eval/base's engine: SFT needs the memory
        cfg = self.ctx.cfg
        sft = self.compute.add(run_stage(self.log, "sft", "sft", stages.sft, self.ctx, model,
                                         stage_data.sft_part(cfg, self.pool)))
        self.findings += sft.findings
        sft_eval = self.eval_stage(sft.model_dir, "eval/sft", cfg.eval.benchmarks[:1])
        self.probe(model, sft.model_dir, "sft", sft.trained_sample, sft_eval, readiness=True)
        return Evaluated("eval/sft", sft_eval.benchmarks, sft.model_dir)

    def rounds(self, start: Evaluated, evaluated: list) -> tuple[Evaluated, list[float]]:
        """The GRPO rounds, each on a fresh window of the RL part, re-filtered under the
        model it starts from; returns the model the rounds hand on and this process's RSS
        after each round's training."""
        ctx, cfg, log, parent = self.ctx, self.ctx.cfg, self.log, self.ctx.parent_run
        best = start  # the best model evaluated so far: where a regressed round rolls back to
        prompts: PoolSlice | list[str] = []  # what each round trains on
        pipeline_rss = []
        evidence_run = None  # the last GRPO round's run: its rollouts inform the next filter
        for r in range(1, cfg.rounds.count + 1):
            candidates, _ = stage_data.round_candidates(cfg, self.pool, self.rl_size, r)
            if not cfg.filter.enabled:
                prompts = candidates
            elif r == 1 or cfg.filter.refilter_each_round:
                try:
                    prompts, note = filter_round(ctx, start.model, candidates, r, log,
                                                 evidence_run, self.compute)
                except CollapsedStart as stop:
                    if r == 1:
                        raise  # nothing trained: the run stops, naming what to change
                    self.findings.append(stop.finding.at(f"round {r}"))  # the rounds so far made the model
                    log.warning("%s", stop)
                    break
                self.findings += [note] if note else []
            release_warm()  # the filter's engine: the trainer (or TRL's own) needs the memory
            train = self.compute.add(run_stage(log, f"grpo/round-{r}", "grpo",
                                               stages.grpo_round, ctx, start.model, prompts, r))
            # measured here, where no filter/eval engine is parked: what the stages so far left
            pipeline_rss.append(rss_now_gb())
            tracking.log_metrics(parent, {PIPELINE_RSS_METRIC: pipeline_rss[-1],
                                          PIPELINE_CHILDREN_METRIC: child_processes()}, step=r)
            evidence_run = train.mlflow_run
            label = f"eval/round-{r}"
            after = self.eval_stage(train.model_dir, label, cfg.eval.benchmarks[:1])
            self.findings += scorer_error_findings(label, after) + train.findings
            self.probe(start.model, train.model_dir, f"grpo/round-{r}", train.trained_sample,
                       after)
            gate = gate_round(r, start, best, Evaluated(label, after.benchmarks, train.model_dir),
                              cfg.eval.primary_metric, cfg.rounds.rollback_on_regression)
            self.findings += gate.findings
            if gate.rolled_back:
                evidence_run = None  # its rollouts are the regressed model's, not the next start's
            else:
                evaluated.append(gate.start)
            start, best = gate.start, gate.best
        return start, pipeline_rss
