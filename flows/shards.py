"""The sharded difficulty filter as a Prefect flow: `filter-shard` tasks in worker
processes (or on Ray / Dask), the calling process ingests their Parquet files.

    fresh = prefill_estimates(cfg, model_path, problems, open_store, workdir, evidence_run)
    report = run_filter(model_path, problems, cfg, store=store, fresh=fresh, priors=...)

`prefill_estimates` hands the problems without a stored estimate to
`filter.shards` workers and writes their rows into the store in one transaction; the
ordinary filter then finds every estimate stored (`fresh` keeps its counts honest). With
rollout evidence (`evidence_run`, filter.rollout_evidence_weight > 0) the priors are read
here and handed to each worker in a file next to its problems.
Resumable: the shard files live in <workdir>/shards/filter-<work key> (grpo_core.eval.shards
.work_key: model, sampling, shard count, the ordered todo), so a run killed while shards
sample reuses the shards that finished and samples only the others; the folder is removed
once its rows are stored.

Evaluation (eval.shards > 1): `eval_scorer(workdir)` is evaluation.evaluate_benchmark's `scorer`.
The `sharded-eval` flow scores contiguous shards of a benchmark's problems in workers
(`eval-shard` tasks, one Parquet file of per-problem records each); the calling process
concatenates them in order, aggregates the metrics and writes the run in one transaction,
exactly as the unsharded evaluate does.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from grpo_core.config import ConfigError, PipelineConfig
from grpo_core.data.problems import Problem
from grpo_core.eval import shards

EXTRAS = {"ray": ("prefect_ray", "RayTaskRunner"), "dask": ("prefect_dask", "DaskTaskRunner")}


def dask_address() -> str | None:
    """The scheduler of an existing Dask cluster to run the shards on: Dask's own setting,
    $DASK_SCHEDULER_ADDRESS (or `scheduler-address` in a Dask config file), e.g.
    tcp://10.0.0.5:8786. None: filter.shard_runner=dask starts a LocalCluster per run."""
    address = os.environ.get("DASK_SCHEDULER_ADDRESS")
    if address is None:
        with contextlib.suppress(ImportError):
            import dask.config

            address = dask.config.get("scheduler-address", None)
    return address or None


def runs_locally(kind: str) -> bool:
    """Whether the shard workers are processes on this machine (and share its cores)."""
    return kind == "process" or (kind == "dask" and not dask_address())


def task_runner(kind: str, workers: int):
    """The Prefect task runner for filter.shard_runner: a local process pool; Dask: the
    cluster at dask_address(), else a LocalCluster of `workers` one-thread worker processes
    started and closed with the flow; Ray: its own address setting (RAY_ADDRESS)."""
    if kind == "process":
        from prefect.task_runners import ProcessPoolTaskRunner

        return ProcessPoolTaskRunner(max_workers=workers)
    module, name = EXTRAS[kind]
    try:
        runner = getattr(importlib.import_module(module), name)
    except ImportError:
        raise ConfigError("filter.shard_runner", f"{kind} needs {module.replace('_', '-')}: "
                          f"pip install 'grpo-pipeline[{kind}]'") from None
    if kind == "dask":
        if address := dask_address():
            return runner(address=address)
        # No dashboard: it needs bokeh (not installed) and would take a fixed port.
        return runner(cluster_kwargs={"n_workers": workers, "threads_per_worker": 1,
                                      "processes": True, "dashboard_address": None})
    return runner()


@task(name="filter-shard", task_run_name="filter-shard-{index}", cache_policy=NO_CACHE)
def filter_shard(index: int, model_path: str, cfg: dict, template: str, model_fp: str,
                 problems_path: str, out_path: str, threads: int | None) -> str:
    problems = shards.read_problems(problems_path)
    priors = shards.read_priors(shards.priors_path(problems_path))  # {} without evidence
    return shards.estimate_shard(model_path, cfg, template, model_fp, problems, out_path,
                                 threads, priors)


@flow(name="sharded-filter", validate_parameters=False)
def sharded_filter(model_path: str, cfg: dict, template: str, model_fp: str,
                   problem_files: list[str], threads: int | None = None,
                   indices: list[int] | None = None) -> list[str]:
    """One filter-shard task per problem file (`indices`: their shard numbers, when only
    some shards run); the Parquet paths, in the files' order."""
    indices = indices if indices is not None else list(range(len(problem_files)))
    futures = [filter_shard.submit(i, model_path, cfg, template, model_fp, f,
                                   str(Path(f).with_suffix(".parquet")), threads)
               for i, f in zip(indices, problem_files)]
    return [f.result() for f in futures]


def shard_path(out_dir: str | Path, index: int) -> Path:
    """Shard `index`'s output file (its input is the same name with .jsonl)."""
    return Path(out_dir) / f"shard-{index:03d}.parquet"


def run_shards(cfg: PipelineConfig, model_path: str, template: str, model_fp: str,
               problems: list[Problem], out_dir: str | Path,
               priors: dict | None = None) -> list[str]:
    """Split `problems` into cfg.filter.shards parts, run the sharded-filter flow on the
    parts whose Parquet file out_dir does not hold finished already (shards.finished_shard:
    out_dir must be this very work's, see prefill_estimates) with cfg.filter.shard_runner;
    return every shard's Parquet path, in shard order (under out_dir, which Ray / Dask
    workers must see too). `priors`: problem key -> rollout evidence, written next to
    each shard's problems."""
    from grpo_core.data.records import problem_key
    from grpo_core.eval.difficulty import sampling_key

    parts = shards.split(problems, cfg.filter.shards)
    key = sampling_key(cfg, template)
    todo = {i: part for i, part in enumerate(parts)
            if not shards.finished_shard(shard_path(out_dir, i), part, model_fp, key)}
    for i, part in todo.items():
        mine = {problem_key(p): priors[problem_key(p)] for p in part
                if problem_key(p) in (priors or {})}
        if mine:
            shards.write_priors(mine, shards.priors_path(shard_path(out_dir, i)))
    if todo:
        _run_parts(sharded_filter, cfg, todo, model_path, template, out_dir,
                   model_fp=model_fp)
    return [str(shard_path(out_dir, i)) for i in range(len(parts))]


def _map_shards(flow_fn, cfg: PipelineConfig, n: int, model_path: str, template: str,
                problems: list[Problem], out_dir: str | Path, **extra: Any) -> list[str]:
    """`flow_fn` over min(n, len(problems)) contiguous shards on cfg.filter.shard_runner;
    the shard output paths, in shard order."""
    parts = shards.split(problems, n)
    if not parts:
        return []
    return _run_parts(flow_fn, cfg, dict(enumerate(parts)), model_path, template, out_dir,
                      **extra)


def _run_parts(flow_fn, cfg: PipelineConfig, parts: dict[int, list[Problem]],
               model_path: str, template: str, out_dir: str | Path,
               **extra: Any) -> list[str]:
    """`flow_fn` over `parts` (shard number -> its problems) on cfg.filter.shard_runner,
    one worker each; their output paths, in the order of `parts`. One shard of an
    unsharded stage (train.stage_process): in its own process through tasks.launch."""
    shards_n = cfg.filter.shards if flow_fn is sharded_filter else cfg.eval.shards
    if shards_n <= 1:
        return [_own_process_part(flow_fn, cfg, part, i, model_path, template, out_dir,
                                  extra.get("model_fp")) for i, part in parts.items()]
    kind = cfg.filter.shard_runner
    runner = task_runner(kind, len(parts))
    # Local processes share this machine's cores; a cluster's workers keep their own.
    threads = shards.worker_threads(len(parts)) if runs_locally(kind) else None
    files = [shards.write_problems(part, shard_path(out_dir, i).with_suffix(".jsonl"))
             for i, part in parts.items()]
    with workers_share_the_api():
        return flow_fn.with_options(task_runner=runner)(
            model_path=model_path, cfg=_worker_config(cfg), template=template,
            problem_files=files, threads=threads, indices=list(parts), **extra)


def _worker_config(cfg: PipelineConfig) -> dict:
    """The secret-free dump: Prefect stores flow parameters, the launch path a spec file
    (tokens reach workers as HF_TOKEN)."""
    dumped = cfg.model_dump(mode="json", exclude={"tracking"})
    dumped["model"]["hub_token"] = None
    return dumped


def _own_process_part(flow_fn, cfg: PipelineConfig, part: list[Problem], index: int,
                      model_path: str, template: str, out_dir: str | Path,
                      model_fp: str | None) -> str:
    from grpo_core.workspace import Workspace
    from tasks.launch import run_shard_process

    problems_file = shards.write_problems(part, shard_path(out_dir, index).with_suffix(".jsonl"))
    kind = "filter" if flow_fn is sharded_filter else "eval"
    return run_shard_process(kind, cfg, _worker_config(cfg), model_path, template, problems_file,
                             str(shard_path(out_dir, index)), model_fp,
                             str(Workspace.at(cfg.project.workdir).root))


@contextlib.contextmanager
def workers_share_the_api() -> Iterator[None]:
    """Worker processes start bare: without PREFECT_API_URL each one would start a
    temporary Prefect server of its own (~40 s on 2 busy cores). Hand them this process's
    (the one get_client() starts, reused when running). A configured server is kept."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_EPHEMERAL_ENABLED,
        temporary_settings,
    )

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        yield
        return
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    server.start()
    with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
        yield


def prefill_estimates(cfg: PipelineConfig, model_path: str, problems: list[Problem],
                      open_store: Callable[[], AbstractContextManager[Any]],
                      workdir: str | Path, evidence_run: str | None = None) -> list[str]:
    """Estimate, on cfg.filter.shards workers, what the filter would sample now, and
    store it (one transaction); returns the ids stored. The store is opened only to read
    what is missing and to ingest, never while workers run. `model_path` is resolved.
    The caller holds the workspace store's pipeline lock (flows.prefill.prefill_sharded):
    the shard work folders under `workdir` are one run's at a time. `evidence_run`: the
    previous round's GRPO run, whose rollouts are the estimates' priors
    (grpo_core.eval.evidence), or None."""
    from grpo_core.eval.difficulty import missing_estimates, sampling_spec
    from grpo_core.eval.evidence import rollout_priors
    from grpo_core.modeling.loading import load_tokenizer, model_fingerprint
    from grpo_core.prompts import resolve_template

    tokenizer = load_tokenizer(model_path)
    template = resolve_template(cfg.model.template, tokenizer)
    fp = model_fingerprint(model_path)
    with open_store() as store:
        priors = rollout_priors(store, evidence_run, problems, cfg)
        todo = missing_estimates(problems, fp, cfg, template, tokenizer, store, priors)
    root = Path(workdir) / "shards"
    if not todo:
        _remove_filter_dirs(root, keep=None)
        return []
    chat = getattr(tokenizer, "chat_template", None) if template == "chat" else None
    key = shards.work_key(fp, sampling_spec(cfg, template), cfg.filter.shards, todo, chat,
                          priors)
    work = root / f"filter-{key}"
    _remove_filter_dirs(root, keep=work)
    work.mkdir(parents=True, exist_ok=True)
    # A shard file already in `work` is one a killed (or failed) run finished: same key,
    # same problems; run_shards samples only the others.
    paths = run_shards(cfg, model_path, template, fp, todo, work, priors)
    with open_store() as store:
        fresh = shards.ingest_shards(store, paths)
    shutil.rmtree(work, ignore_errors=True)  # stored: nothing left to resume
    return fresh


def _remove_filter_dirs(root: Path, keep: Path | None) -> None:
    """Remove the sharded filters' work folders under `root` but `keep`: those left by
    runs killed (or failed) under other inputs (another model, config or todo: a resumed
    run with the same inputs finds its own folder, `keep`) and older versions' temporary
    folders. Their files cannot serve this run, and keeping them for a return to those
    exact inputs would let a workdir fill up with shards nobody reads. No age limit is
    needed because nothing else can be using them now: prefill_estimates holds the
    workspace store's pipeline lock (grpo_core.data.locks), as the pipeline and retrain do."""
    if not root.is_dir():
        return
    for path in root.glob("filter-*"):
        if path.is_dir() and path != keep:
            shutil.rmtree(path, ignore_errors=True)


# ----------------------------------------------------------------------------- evaluation


@task(name="eval-shard", task_run_name="eval-shard-{index}", cache_policy=NO_CACHE)
def eval_shard(index: int, model_path: str, cfg: dict, template: str, problems_path: str,
               out_path: str, threads: int | None) -> str:
    problems = shards.read_problems(problems_path)
    return shards.score_shard(model_path, cfg, template, problems, out_path, threads)


@flow(name="sharded-eval", validate_parameters=False)
def sharded_eval(model_path: str, cfg: dict, template: str, problem_files: list[str],
                 threads: int | None = None, indices: list[int] | None = None) -> list[str]:
    """One eval-shard task per problem file (`indices`: their shard numbers); the
    records' Parquet paths, in shard order."""
    indices = indices if indices is not None else list(range(len(problem_files)))
    futures = [eval_shard.submit(i, model_path, cfg, template, f,
                                 str(Path(f).with_suffix(".parquet")), threads)
               for i, f in zip(indices, problem_files)]
    return [f.result() for f in futures]


def score_sharded(cfg: PipelineConfig, model_path: str, template: str,
                  problems: list[Problem], *, workdir: str | Path) -> list[dict]:
    """The eval records of `problems`, scored on cfg.eval.shards workers (runner:
    cfg.filter.shard_runner), in problem order; the shard files are removed after."""
    root = Path(workdir) / "shards"
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix="eval-") as tmp:
        paths = _map_shards(sharded_eval, cfg, cfg.eval.shards, model_path, template,
                            problems, tmp)
        return [r for path in paths for r in shards.read_records(path)]


def eval_scorer(workdir: str | Path) -> Callable[..., list[dict]]:
    """evaluation.evaluate_benchmark's (and tasks.stages.evaluate_model's) `scorer` for eval.shards > 1."""
    return functools.partial(score_sharded, workdir=str(workdir))
