"""Prefect tasks: one unit of work each, thin I/O around grpo_core.

Every task is keyed by content (tasks/stage_keys.py: config section, input model
fingerprint, data; tasks.cache adds the code version and stores the results), so a re-run
skips completed stages and a killed GRPO round resumes from its last checkpoint. The flow process is the single DuckDB writer:
tasks run in it one after another and open the store only while they need it.
Prefect retries two tasks, where a retry can help: ingest (reading sources, twice) and
base-model (a fetch or build, once); none on the filter, training or evaluation. Tracking
calls are not retried by Prefect: the MLflow client retries a refused connection itself,
and a round's metric points go through tasks.tracking.metric_shipper, which resends them
(and keeps what is still unsent for the next run).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

from prefect import task

from grpo_core.config import PipelineConfig
from grpo_core.data.pool import PoolRef
from grpo_core.data.store import Store
from grpo_core.modeling.fetch import provenance_tags
from grpo_core.modeling.gpu import peak_metrics, stage_memory
from grpo_core.modeling.loading import model_fingerprint, resolve_model_path
from grpo_core.train.throughput import PREFIX as THROUGHPUT
from grpo_core.train.throughput import RSS_PEAK_METRIC, rss_peak
from grpo_core.workspace import Workspace
from tasks import stage_data, tracking
from tasks.cache import StageCache
from tasks.launch import LaunchPlan, read_rollouts_file, require_plan, run_launched
from tasks.stage_keys import (
    eval_key,
    filter_key,
    grpo_key,
    ingest_key,
    sft_key,
)
from tasks.vllm_server import vllm_server


@dataclass
class Ctx:
    """What every stage needs: the config, the workspace, the parent MLflow run."""

    cfg: PipelineConfig
    ws: Workspace
    parent_run: str
    progress: bool = True

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


def _cached(ctx: Ctx, key: str, child: str, compute, paths=lambda v: [], metrics=lambda v: {}):
    """Run `compute(child_run_id)` unless the key is done. The child run exists either
    way; on a hit from another pipeline run it gets the stage's numbers, once. The child
    run ends with the stage (FINISHED, or FAILED if compute raises), so its duration in
    MLflow is the stage's; `stage/seconds` is what the stage measured itself.
    `compute` runs inside grpo_core.modeling.gpu.stage_memory: peak GPU memory (CUDA only) is kept
    as `gpu_peak_gb` and logged as system/gpu_peak_gb; its peak resident memory
    (grpo_core.train.throughput.rss_peak) as `rss_peak_gb`, logged as system/rss_peak_gb."""
    run = tracking.child_run(ctx.parent_run, child)
    hit = ctx.cache.get(key)
    if hit is None:
        t0 = time.perf_counter()
        try:
            # Engines built inside are shut down, CUDA memory freed and the environment restored
            # when the stage ends (grpo_core.modeling.gpu); its peak GPU memory goes to the child run.
            with stage_memory() as mem, rss_peak() as rss:
                value = {**compute(run), "mlflow_run": run}
        except BaseException:
            tracking.end_run(run, "FAILED")
            raise
        value["seconds"] = round(time.perf_counter() - t0, 3)
        if mem.peak_gb is not None:
            value["gpu_peak_gb"] = mem.peak_gb
        value["rss_peak_gb"] = rss.peak_gb
        tracking.log_metrics(run, {**metrics(value), **_memory_metrics(value),
                                   "stage/seconds": value["seconds"]})
        tracking.end_run(run)
        return {**ctx.cache.put(key, value, paths(value)), "cached": False}
    if not tracking.has_metrics(run):
        tracking.log_metrics(run, {**metrics(hit), **_memory_metrics(hit)})
        if hit.get("mlflow_run") and hit["mlflow_run"] != run:
            tracking.copy_artifacts(hit["mlflow_run"], run)
            tracking.set_tags(run, {"grpo.cached_from": hit["mlflow_run"]})
    tracking.end_run(run, only_running=True)
    return {**hit, "cached": True}


def _memory_metrics(value: dict) -> dict:
    rss = value.get("rss_peak_gb")
    return {**peak_metrics(value), **({RSS_PEAK_METRIC: rss} if rss is not None else {})}


@task(name="ingest", retries=2, retry_delay_seconds=2)
def ingest(ctx: Ctx) -> dict:
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
    hit = ctx.cache.get(key)
    if hit is not None and hit.get("pool"):
        with ctx.store() as store:
            if stored_pool(store, hit["pool"]) is None:  # a new store under an old cache
                ctx.cache.drop(key)

    def compute(run):
        with ctx.store() as store:
            eval_reports = ingest_eval_sets(ctx.cfg, store)
            reports = ingest_sources(ctx.cfg, store, progress=ctx.progress)
            pool = build_pool(ctx.cfg, store, training_sets(ctx.cfg, reports))
            # The (source, split) of each training source, as ingested (no second read).
            contamination = contamination_by_benchmark(ctx.cfg, store,
                                                       {(r.source, r.split) for r in reports})
        summary = {"pool_size": pool.size, "ingested": sum(r.ingested for r in reports),
                   "quarantined": sum(sum(r.quarantined.values()) for r in reports),
                   "duplicates": sum(r.duplicates for r in reports),
                   "contaminated": sum(c["flagged"] for c in contamination.values())}
        tracking.log_json(run, [r.__dict__ for r in eval_reports + reports],
                          "data/ingest_reports.json")
        tracking.log_json(run, contamination, "data/contamination.json")
        return {**summary, "contamination": contamination, "pool": pool.pool}

    return _cached(ctx, key, "data", compute, metrics=_data_metrics)


def _data_metrics(v: dict) -> dict:
    out = {f"data/{k}": v[k] for k in
           ("pool_size", "ingested", "quarantined", "duplicates", "contaminated")}
    for bench, counts in (v.get("contamination") or {}).items():
        out.update({f"data/contamination/{bench}/{k}": n for k, n in counts.items()})
    return out


@task(name="base-model", retries=1)
def base_model(ctx: Ctx) -> str:
    """The base model's folder (built or fetched); a fetched model's provenance (wheel,
    sha256s, conversion) goes on the parent run as `model.provenance.*` tags."""
    path = resolve_model_path(ctx.cfg.model.name_or_path, ctx.ws.models, progress=ctx.progress)
    tags = provenance_tags(path)
    if tags:
        tracking.set_tags(ctx.parent_run, tags)
    return path


@task(name="filter")
def difficulty_filter(ctx: Ctx, model_path: str, problem_ids: PoolRef | list[str], round_no: int,
                      fresh: list[str] | None = None, evidence_run: str | None = None) -> dict:
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
        return {**summary, "kept_ids": [p.id for p in report.kept],
                "signal_ids": [by_key[k] for k in signal if k in by_key],
                "pass_rates": [r["pass_rate"] for r in report.estimates]}

    return _cached(ctx, key, f"filter/round-{round_no}", compute,
                   metrics=lambda v: {f"filter/{k}": v[k] for k in
                                      ("kept", "considered", "too_easy", "in_band", "too_hard",
                                       "reused", "estimated", "sampled") if k in v})


@task(name="sft")
def sft(ctx: Ctx, model_path: str, problem_ids: PoolRef | list[str]) -> dict:
    from grpo_core.prompts import resolve_template
    from grpo_core.train.sft import SFTResult, run_sft

    problems_fp, read = stage_data.stage_input(ctx, "sft", problem_ids)
    key = sft_key(ctx.cfg, model_fingerprint(model_path), problems_fp)

    def compute(run):
        problems = read()
        template = resolve_template(ctx.cfg.model.template, _tokenizer(model_path))
        out = ctx.ckpt_dir(f"sft-{key[-8:]}")
        plan = require_plan(ctx.cfg)
        if plan.mode != "in-process":
            say_plan(plan)
            res = run_launched("sft", ctx.cfg, model_path, problems, out, template, run,
                               tracking.current_uri(), str(ctx.ws.root), extra_env=plan.env)
            result = SFTResult(res["output_dir"], res["steps"], res["history"])
            findings = res["findings"]
        else:
            with ctx.step_logger(run) as logger:
                result = run_sft(model_path, problems, ctx.cfg, out, template,
                                 extra_callbacks=[logger])
            findings = [f for f in [logger.finding()] if f]
        tracking.log_training_curves(run, result.history, "sft")
        if findings:
            tracking.set_tags(run, {"findings": " | ".join(findings)})
        return {"model_dir": result.output_dir, "steps": result.steps, "findings": findings}

    return _cached(ctx, key, "sft", compute, paths=lambda v: [v["model_dir"]],
                   metrics=lambda v: {"sft/steps": v["steps"]})


@task(name="grpo-round")
def grpo_round(ctx: Ctx, model_path: str, problem_ids: PoolRef | list[str],
               round_no: int) -> dict:
    from grpo_core.data.records import drop_rollouts_after, rollout_sink
    from grpo_core.prompts import resolve_template
    from grpo_core.train.grpo import last_checkpoint, run_grpo_round
    from grpo_core.train.throughput import round_summary

    problems_fp, read = stage_data.stage_input(ctx, "grpo", problem_ids)
    key = grpo_key(ctx.cfg, model_fingerprint(model_path), problems_fp, round_no)

    def compute(run):
        problems = read()
        template = resolve_template(ctx.cfg.model.template, _tokenizer(model_path))
        out = ctx.ckpt_dir(f"grpo-{key[-8:]}")
        with ctx.store() as store:
            # A round killed after a checkpoint continues from it (resume=True); what the
            # killed process recorded past that checkpoint is generated again.
            ckpt = last_checkpoint(out)
            resume_step = int(ckpt.rsplit("-", 1)[1]) if ckpt else 0
            drop_rollouts_after(store, run, resume_step)
            sink = rollout_sink(store, run_id=run, round=round_no)
            plan = require_plan(ctx.cfg)
            if plan.mode != "in-process":
                say_plan(plan)
                result = launched_round(ctx.cfg, str(ctx.ws.root), run, run, store, sink,
                                        model_path, problems, out, template, resume_step,
                                        round_no, plan)
            else:
                with ctx.step_logger(run) as logger:
                    result = run_grpo_round(model_path, problems, ctx.cfg, out, template,
                                            resume=True, rollout_sink=sink,
                                            extra_callbacks=[logger], round_no=round_no)
                result.findings += [f for f in [logger.finding()] if f]
        findings, codes = diagnose_round(run, result.history, ctx.cfg, result.findings)
        tracking.log_training_curves(run, result.history, "grpo")
        throughput = round_summary(result.history)  # the stage line's figures
        tags = {"findings": " | ".join(findings) or "none"}
        if result.in_round_evals:  # in_round_eval.every: which checkpoint the round hands on
            tags.update({"in_round_eval.best_step": str(result.best_step),
                         "in_round_eval.protocol_hash": str(result.in_round_protocol)})
        tracking.set_tags(run, tags)
        return {"model_dir": result.output_dir, "steps": result.steps, "findings": findings,
                "diagnosis": codes,
                "stopped_early": result.stopped_early, "train_seconds": result.train_seconds,
                "best_step": result.best_step, "in_round_evals": result.in_round_evals,
                "throughput": throughput}

    return _cached(ctx, key, f"grpo/round-{round_no}", compute, paths=lambda v: [v["model_dir"]],
                   metrics=lambda v: {"grpo/steps": v["steps"], "grpo/findings": len(v["findings"]),
                                      **{f"{THROUGHPUT}round/{k}": x for k, x in
                                         (v.get("throughput") or {}).items()}})


def diagnose_round(run: str, history: list[dict], cfg: PipelineConfig,
                   in_round: list[str] = ()) -> tuple[list[str], str]:
    """The diagnosis rules over a round's history (grpo_core.train.diagnosis): all findings
    as diagnosis.json and their codes as the `diagnosis` tag of `run`. Returns the round's
    findings (the report's): `in_round` (the monitor's notes and stops) then every rule's
    line but the stops (the in-round ones already), info ones too; the run's description
    counts that same list (findings.count_findings) and lists every rule's line."""
    from grpo_core.train.diagnosis import diagnose
    from grpo_core.train.findings import codes_tag, count_findings

    found = diagnose(history, cfg)
    tracking.log_json(run, [f.as_dict() for f in found], "diagnosis.json")
    lines = [*in_round, *(f.line() for f in found if f.severity != "stop")]
    note = "\n".join(f"- {x}" for x in [*in_round, *(f.line() for f in found)]) or "- none"
    tracking.set_tags(run, {"diagnosis": codes_tag(found), "findings.count": count_findings(lines),
                            "mlflow.note.content":
                            f"**Diagnosis of this round**: {count_findings(lines)}\n\n{note}\n"})
    return lines, codes_tag(found)


def say_plan(plan: LaunchPlan) -> None:
    """A pinned stage says on which GPUs it runs (the Prefect run's log, or stderr)."""
    if plan.message:
        import logging

        from prefect.exceptions import MissingContextError
        from prefect.logging import get_run_logger

        try:
            get_run_logger().info(plan.message)
        except MissingContextError:
            logging.getLogger("grpo").warning(plan.message)


def launched_round(cfg: PipelineConfig, workspace: str, run_id: str, mlflow_run: str | None,
                   store, sink, model_path: str, problems, out: Path, template: str,
                   resume_step: int, round_no: int, plan: LaunchPlan):
    """The round in its own processes (tasks.launch, under `plan`'s CUDA_VISIBLE_DEVICES,
    beside the round's vLLM server if it launches one); then its rollouts, all of them from
    the rank-0 file, into DuckDB under `run_id` (re-written whole: idempotent on a re-run)."""
    from grpo_core.data.records import drop_rollouts_after
    from grpo_core.train.grpo import RoundResult

    with vllm_server(cfg, model_path, Path(out) / "vllm-server.log") as gpu_env:
        res = run_launched("grpo", cfg, model_path, problems, out, template, mlflow_run,
                           tracking.current_uri() if mlflow_run else None, workspace,
                           resume_step, {**gpu_env, **plan.env}, round_no)
    drop_rollouts_after(store, run_id, 0)
    for step, rows in sorted(read_rollouts_file(Path(res["rollouts_file"])).items()):
        sink(step, rows)
    sink.flush()
    return RoundResult(**{f: res[f] for f in RoundResult.__dataclass_fields__ if f in res})


@task(name="evaluate")
def evaluate_model(ctx: Ctx, model_path: str, label: str, benchmarks: list[str],
                   scorer=None) -> dict:
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
                out[bench] = {"metrics": res.metrics, "protocol_hash": res.protocol_hash,
                              "eval_run_id": res.run_id, "split": res.protocol["split"],
                              "problems_hash": res.protocol["problems_hash"]}
                tracking.log_eval_table(run, res.per_problem, f"eval/{bench}.json")
        out = {b: out[b] for b in benchmarks}
        tracking.set_tags(run, {f"{b}.{k}": v[k] for b, v in out.items()
                                for k in ("split", "problems_hash", "eval_run_id")})
        return {"benchmarks": out}

    # Cached by content: the same model under the same protocol is evaluated once, even
    # when two labels ask for it (the last round's eval and the final eval; with more
    # benchmarks, the final eval reads back the one the round scored: scored_already).
    return _cached(ctx, key, label, compute, metrics=lambda v: tracking.eval_metrics(v["benchmarks"]))


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
        done = ctx.cache.get(eval_key(ctx.cfg, model_fp, [bench], {bench: problem_sets[bench]}))
        if done and bench in done.get("benchmarks", {}):
            out[bench] = done["benchmarks"][bench]
            if done.get("mlflow_run"):
                tracking.copy_artifacts(done["mlflow_run"], run)
    return out


def _tokenizer(path: str):
    from grpo_core.modeling.loading import load_tokenizer

    return load_tokenizer(path)
