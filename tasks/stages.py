"""The pipeline's stages: plain functions, one unit of work each, thin I/O around
grpo_core, each returning its typed result (tasks/stage_results.py). Inside a flow each
runs as one Prefect task (tasks/runner.py: a task run named by its label, `Cached`
when the stage cache served it).

Every stage is keyed by content (tasks/stage_keys.py: config section, input model
fingerprint, data; tasks.cache adds the code version and stores the results), so a re-run
skips completed stages and a killed GRPO round resumes from its last checkpoint. The flow
process is the single DuckDB writer: stages run in it one after another and open the
store only while they need it. Tracking calls are not retried by Prefect: the MLflow
client retries a refused connection itself (a few seconds' worth), and a round's metric
points go through MLflow's asynchronous logging with tasks.tracking.spool behind it, which
resends what MLflow did not confirm and keeps what is still unsent for the next run.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from grpo_core.config import PipelineConfig
from grpo_core.data.stage_split import prompts_per_update
from grpo_core.data.store import Store
from grpo_core.findings import Finding
from grpo_core.modeling.fetch import provenance_tags
from grpo_core.modeling.loading import model_fingerprint, resolve_model_path
from grpo_core.workspace import Workspace
from tasks import stage_data, tracking
from tasks.cache import StageCache
from tasks.launch import LaunchPlan
from tasks.runner import cached_stage, stage_cache, task_result
from tasks.stage_keys import (
    eval_key,
    filter_key,
    grpo_key,
    ingest_key,
    sft_key,
)
from tasks.stage_results import (
    DataResult,
    EvalResult,
    FilterResult,
    GrpoStageResult,
    SftStageResult,
)
from tasks.stage_run import launched_round, launched_sft, say_plan


@dataclass
class Ctx:
    """What every stage needs: the config, the workspace, the parent MLflow run, and how a
    trainer starts on this machine (the run's preflight decided it: tasks.preflight)."""

    cfg: PipelineConfig
    ws: Workspace
    parent_run: str
    progress: bool = True
    launch: LaunchPlan | None = None  # None: no trainer stage runs under this context (tests)

    def launch_plan(self) -> LaunchPlan:
        if self.launch is None:
            raise RuntimeError("a training stage needs the run's launch plan (tasks.preflight)")
        return self.launch

    @property
    def cache(self) -> StageCache:
        # One cache for all configs: keys hold every input, so two recipes share the
        # ingest and the base model's evaluation.
        return StageCache(self.ws.root / "cache")

    def store(self) -> Store:
        return Store.open(self.ws.db_path, timeout=self.cfg.data.store_lock_timeout)

    @contextlib.contextmanager
    def step_logger(self, run: str):
        """The trainer callback that streams per-step metrics into `run`; closed (waiting
        for MLflow, else keeping the points locally) even when training raises."""
        from tasks.tracking.step_logger import StepLogger  # imports transformers

        logger = StepLogger(run, workspace=self.ws.root,
                            close_timeout_s=self.cfg.tracking.flush_timeout_s)
        try:
            yield logger
        finally:
            logger.close()

    def ckpt_dir(self, name: str) -> Path:
        return self.ws.checkpoints / f"{self.cfg.project.name}-{self.cfg.hash()}" / name

    def record_lineage(self, key: str, stage: str, round_no: int | None, model_in: str,
                       model_out: str | None, uses: dict[str, dict[str, float]]) -> None:
        """What stage `key` consumed, in the store's lineage table (grpo_core.data.lineage)."""
        from grpo_core.data.lineage import record_lineage

        with self.store() as store:
            record_lineage(store, stage_key=key, stage=stage, round_no=round_no,
                           config_hash=self.cfg.hash(), recipe=self.cfg.project.recipe,
                           model_in=model_in, model_out=model_out, uses=uses)


def ingest(ctx: Ctx) -> DataResult:
    """The evaluation sets, then the training sources (flagged against them), then the
    pool, stored once in the store (grpo_core.data.pool.build_pool); the data run gets the
    contamination counts per benchmark. Later stages read the pool from the store by its
    fingerprint (`pool`), never the sources: a source file may be gone by then."""
    from grpo_core.data.pool import (
        build_pool,
        contamination_by_benchmark,
        ingest_eval_sets,
        ingest_sources,
        stored_pool,
        training_sets,
    )

    key = ingest_key(ctx.cfg, digests=ctx.ws.root / "cache" / "file-digests.json")
    hit = ctx.cache.get(key, DataResult)
    if hit is not None:
        with ctx.store() as store:
            if stored_pool(store, hit.pool) is None:  # a new store under an old cache
                ctx.cache.drop(key)

    def compute(run):
        with ctx.store() as store:
            eval_reports = ingest_eval_sets(ctx.cfg, store)
            reports = ingest_sources(ctx.cfg, store, progress=ctx.progress)
            pool = build_pool(ctx.cfg, store, training_sets(ctx.cfg, reports))
            # The (source, split) of each training source, as ingested (no second read).
            contamination = contamination_by_benchmark(ctx.cfg, store,
                                                       {(r.source, r.split) for r in reports})
        tracking.log_json(run, [r.__dict__ for r in eval_reports + reports],
                          "data/ingest_reports.json")
        tracking.log_json(run, contamination, "data/contamination.json")
        return DataResult(pool=pool.pool, pool_size=pool.size,
                          ingested=sum(r.ingested for r in reports),
                          quarantined=sum(sum(r.quarantined.values()) for r in reports),
                          duplicates=sum(r.duplicates for r in reports),
                          contaminated=sum(c["flagged"] for c in contamination.values()),
                          contamination=contamination)

    return task_result(cached_stage(ctx, key, "data", DataResult, compute))


def base_model(ctx: Ctx) -> str:
    """The base model's folder (built or fetched); a fetched model's provenance (wheel,
    sha256s, conversion) goes on the parent run as `model.provenance.*` tags."""
    path = resolve_model_path(ctx.cfg.model.name_or_path, ctx.ws.models, progress=ctx.progress)
    tags = provenance_tags(path)
    if tags:
        tracking.set_tags(ctx.parent_run, tags)
    return path


def difficulty_filter(ctx: Ctx, model_path: str, problem_ids: stage_data.Selection, round_no: int,
                      fresh: list[str] | None = None, evidence_run: str | None = None
                      ) -> FilterResult:
    """`fresh`: ids whose estimates sharded workers stored just now (flows/shards.py);
    they count as estimated, not reused. `evidence_run`: the previous GRPO round's run,
    whose rollouts are priors of the estimates (filter.rollout_evidence_weight > 0)."""
    from grpo_core.data.records import problem_key
    from grpo_core.eval.difficulty import run_filter
    from grpo_core.eval.evidence import evidence_fingerprint, rollout_priors

    problems_fp, read = stage_data.stage_input(ctx, "filter", problem_ids)
    priors = {}
    if evidence_run and ctx.cfg.filter.rollout_evidence_weight > 0:
        with ctx.store() as store:
            priors = rollout_priors(store, evidence_run, read(), ctx.cfg)
    # Sharding changes where estimates are computed, not what they are: not in the key.
    key = filter_key(ctx.cfg, model_fingerprint(model_path), problems_fp,
                     evidence_fingerprint(priors))

    def compute(run):
        problems = read()
        with ctx.store() as store:
            report = run_filter(model_path, problems, ctx.cfg, store=store, progress=ctx.progress,
                                models_cache=str(ctx.ws.models), fresh=fresh or [],
                                priors=priors)
        summary = report.summary()
        tracking.log_passrate_histogram(run, [r["pass_rate"] for r in report.estimates],
                                        report.band, k=report.k)
        tracking.log_json(run, summary, "filter/summary.json")
        # Problems the policy sometimes solves: any group of them has reward variance.
        signal = [r["problem_id"] for r in report.estimates if 0.0 < r["pass_rate"] < 1.0]
        by_key = {problem_key(p): p.id for p in problems}
        ctx.record_lineage(key, "filter", round_no, model_fingerprint(model_path), None, {
            "filter_candidate": {r["problem_id"]: 1 for r in report.estimates},
            "filter_kept": {problem_key(p): 1 for p in report.kept}})
        return FilterResult.from_summary(
            summary, kept_ids=[p.id for p in report.kept],
            signal_ids=[by_key[k] for k in signal if k in by_key],
            pass_rates=[r["pass_rate"] for r in report.estimates])

    kept = cached_stage(ctx, key, f"filter/round-{round_no}", FilterResult, compute)
    return task_result(kept.model_copy(update={"need": prompts_per_update(ctx.cfg)}))


def sft(ctx: Ctx, model_path: str, problem_ids: stage_data.Selection) -> SftStageResult:
    from grpo_core.train.sft import examples_per_step, has_trace, run_sft
    from grpo_core.train.throughput import training_compute

    problems_fp, read = stage_data.stage_input(ctx, "sft", problem_ids)
    key = sft_key(ctx.cfg, model_fingerprint(model_path), problems_fp)

    def compute(run):
        problems = read()
        template = ctx.cfg.model.template  # "auto" resolved by run_sft's tokenizer
        out = ctx.ckpt_dir(f"sft-{key[-8:]}")
        plan = ctx.launch_plan()
        if plan.mode != "in-process":
            result, findings = launched_sft(ctx.cfg, str(ctx.ws.root), run, model_path,
                                            problems, out, template, plan)
        else:
            with ctx.step_logger(run) as logger:
                result = run_sft(model_path, problems, ctx.cfg, out, template,
                                 extra_callbacks=[logger])
            findings = [f for f in [logger.finding()] if f]
        tracking.log_training_curves(run, result.history, "sft")
        trained = [p for p in problems if has_trace(p)]
        epochs = result.steps * examples_per_step(ctx.cfg) / max(len(trained), 1)
        ctx.record_lineage(key, "sft", None, model_fingerprint(model_path),
                           model_fingerprint(result.output_dir),
                           {"sft_example": {p.id or p.fingerprint: epochs for p in trained}})
        findings = [f.at("sft") for f in findings]
        if findings:
            tracking.set_tags(run, {"findings": " | ".join(f.line() for f in findings)})
        return SftStageResult(model_dir=result.output_dir, steps=result.steps,
                              findings=findings, paths=[result.output_dir],
                              compute=training_compute(result.history, result.total_flos),
                              trained_sample=[p.id or p.fingerprint
                                              for p in trained[:ctx.cfg.probe.problems]])

    return task_result(cached_stage(ctx, key, "sft", SftStageResult, compute))


def grpo_round(ctx: Ctx, model_path: str, problem_ids: stage_data.Selection,
               round_no: int) -> GrpoStageResult:
    from grpo_core.data.records import drop_rollouts_after, rollout_sink
    from grpo_core.train.grpo import checkpoint_step, last_checkpoint, run_grpo_round
    from grpo_core.train.memorisation import repeat_findings
    from grpo_core.train.throughput import round_summary, training_compute

    problems_fp, read = stage_data.stage_input(ctx, "grpo", problem_ids)
    key = grpo_key(ctx.cfg, model_fingerprint(model_path), problems_fp, round_no)

    # The work runs in this frame, under the stage's cache (tasks/runner.py).
    with stage_cache(ctx, key, f"grpo/round-{round_no}", GrpoStageResult) as slot:
        if slot.hit is None:
            problems = read()
            template = ctx.cfg.model.template  # "auto" resolved by run_grpo_round's tokenizer
            out = ctx.ckpt_dir(f"grpo-{key[-8:]}")
            with ctx.store() as store:
                # A round killed after a checkpoint continues from it (resume=True); what the
                # killed process recorded past that checkpoint is generated again.
                resume_step = checkpoint_step(last_checkpoint(out))
                drop_rollouts_after(store, slot.run, resume_step)
                sink = rollout_sink(store, run_id=slot.run, round=round_no)
                plan = ctx.launch_plan()
                if plan.mode != "in-process":
                    say_plan(plan)
                    result = launched_round(ctx.cfg, str(ctx.ws.root), slot.run, slot.run,
                                            store, sink, model_path, problems, out, template,
                                            resume_step, round_no, plan)
                else:
                    with ctx.step_logger(slot.run) as logger:
                        result = run_grpo_round(model_path, problems, ctx.cfg, out, template,
                                                resume=True, rollout_sink=sink,
                                                extra_callbacks=[logger], round_no=round_no)
                    result.findings += [f for f in [logger.finding()] if f]
            with ctx.store() as store:  # the prompts it trained on, in groups of G completions
                uses = {pid: n / ctx.cfg.grpo.num_generations for pid, n in store.con.execute(
                    "SELECT problem_id, count(*) FROM rollouts WHERE run_id = ? GROUP BY ALL",
                    [slot.run]).fetchall()}
            ctx.record_lineage(key, "grpo", round_no, model_fingerprint(model_path),
                               model_fingerprint(result.output_dir), {"grpo_prompt": uses})
            result.findings += repeat_findings(f"grpo/round-{round_no}", uses,
                                               ctx.cfg.probe.max_prompt_repeats)
            findings, codes = diagnose_round(slot.run, result.history, ctx.cfg, result.findings,
                                             f"grpo/round-{round_no}")
            tracking.log_training_curves(slot.run, result.history, "grpo")
            throughput = round_summary(result.history)  # the stage line's figures
            tags = {"findings": " | ".join(f.line() for f in findings) or "none"}
            if result.in_round_evals:  # in_round_eval.every: which checkpoint the round hands on
                tags.update({"in_round_eval.best_step": str(result.best_step),
                             "in_round_eval.protocol_hash": str(result.in_round_protocol)})
            tracking.set_tags(slot.run, tags)
            slot.value = GrpoStageResult(
                model_dir=result.output_dir, steps=result.steps, findings=findings,
                diagnosis=codes,
                stopped_early=result.stopped_early, train_seconds=result.train_seconds,
                best_step=result.best_step, in_round_evals=result.in_round_evals,
                throughput=throughput, paths=[result.output_dir],
                compute=training_compute(result.history),
                trained_sample=sorted(uses, key=lambda i: (-uses[i], i))[:ctx.cfg.probe.problems])
    return task_result(slot.result)


def diagnose_round(run: str, history: list[dict], cfg: PipelineConfig,
                   in_round: list[Finding] = (), stage: str = "") -> tuple[list[Finding], str]:
    """The diagnosis rules over a round's history (grpo_core.train.diagnosis), said of `stage`: all findings
    as diagnosis.json and their codes as the `diagnosis` tag of `run`. Returns the round's
    findings (the report's): `in_round` (the monitor's notes and stops) then every rule's
    line but the stops (the in-round ones already), info ones too; the run's description
    counts that same list (findings.count_findings) and lists every rule's line."""
    from grpo_core.findings import codes_tag, count_findings
    from grpo_core.train.diagnosis import diagnose

    found = [f.at(stage) if stage else f for f in diagnose(history, cfg)]
    in_round = [f.at(stage) if stage else f for f in in_round]
    tracking.log_json(run, [f.as_dict() for f in found], "diagnosis.json")
    kept = [*in_round, *(f for f in found if f.severity != "stop")]
    note = "\n".join(f"- {f.line()}" for f in [*in_round, *found]) or "- none"
    tracking.set_tags(run, {"diagnosis": codes_tag(found), "findings.count": count_findings(kept),
                            "mlflow.note.content":
                            f"**Diagnosis of this round**: {count_findings(kept)}\n\n{note}\n"})
    return kept, codes_tag(found)


def evaluate_model(ctx: Ctx, model_path: str, label: str, benchmarks: list[str],
                   scorer=None) -> EvalResult:
    """The eval stage `label`: `model_path` on each of `benchmarks`
    (grpo_core.eval.evaluation.evaluate_benchmark), cached by content. `scorer`: scores the
    problems in workers (flows/shards.py eval_scorer, for eval.shards > 1); None scores
    them here. The rows and metrics are the same."""
    from grpo_core.data.benchmarks import benchmark_problems, fingerprint
    from grpo_core.eval.evaluation import evaluate_benchmark
    from grpo_core.generation.sampling import build_backend

    with ctx.store() as store:
        problem_sets = {b: fingerprint(benchmark_problems(b, ctx.cfg, store, ctx.cfg.eval.limit))
                        for b in benchmarks}
    # Sharding changes where records are computed, not what they are: not in the key.
    model_fp = model_fingerprint(model_path)
    key = eval_key(ctx.cfg, model_fp, benchmarks, problem_sets)

    def compute(run):
        out = scored_already(ctx, model_fp, benchmarks, problem_sets, run)
        todo = [b for b in benchmarks if b not in out]
        backend = tokenizer = None
        if scorer is None and todo:  # the workers load the model themselves
            backend, tokenizer = build_backend(model_path, ctx.cfg, progress=ctx.progress)
        with ctx.store() as store:
            for bench in todo:
                res = evaluate_benchmark(model_path, bench, ctx.cfg, store=store, backend=backend,
                                         tokenizer=tokenizer, progress=ctx.progress,
                                         scorer=scorer)
                out[bench] = res.score()
                tracking.log_eval_table(run, res.per_problem, f"eval/{bench}.json")
        out = {b: out[b] for b in benchmarks}
        tracking.set_tags(run, {f"{b}.{k}": getattr(v, k) for b, v in out.items()
                                for k in ("split", "problems_hash", "eval_run_id")})
        return EvalResult(benchmarks=out)

    # Cached by content: the same model under the same protocol is evaluated once, even
    # when two labels ask for it (the last round's eval and the final eval; with more
    # benchmarks, the final eval reads back the one the round scored: scored_already).
    return task_result(cached_stage(ctx, key, label, EvalResult, compute))


def scored_already(ctx: Ctx, model_fp: str, benchmarks: list[str], problem_sets: dict[str, str],
                   run: str) -> dict:
    """The benchmarks of a multi-benchmark evaluation that this model was already scored on,
    under the same protocol, by a one-benchmark evaluation (the last round's eval, asked
    again by the final eval with the other benchmarks): their results, read back from that
    stage's cache entry with its per-problem table, instead of generating them again."""
    if len(benchmarks) < 2:
        return {}  # a one-benchmark evaluation is its own cache entry
    out = {}
    for bench in benchmarks:
        done = ctx.cache.get(eval_key(ctx.cfg, model_fp, [bench], {bench: problem_sets[bench]}),
                             EvalResult)
        if done is not None and bench in done.benchmarks:
            out[bench] = done.benchmarks[bench]
            if done.mlflow_run:
                tracking.copy_artifacts(done.mlflow_run, run)
    return out

