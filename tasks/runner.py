"""How a pipeline stage runs, in one place: its start and end lines, its Prefect task, its
content-keyed cache and its MLflow child run. What a stage does is tasks/stages.py's.

    result = run_stage(log, "grpo/round-1", "grpo", stages.grpo_round, ctx, model, prompts, 1)

`run_stage` logs `grpo/round-1: started`, runs the stage function (inside a flow run as a
Prefect task run named by its label, the stage function itself: no wrapper between) and
logs the end line: cached or computed, seconds, the result's key number. A stage function
returns `task_result(result)`: the result, in Prefect's `Cached` state when the stage
cache served it inside a task run, else as it is. Prefect's own cache policy is off (NO_CACHE):
why, in docs/pipeline.md ("One orchestration layer").

Inside the stage, `stage_cache` is the project's cache around its work:

    with stage_cache(ctx, key, "grpo/round-1", GrpoStageResult) as slot:
        if slot.hit is None:
            slot.value = ...            # the work, with slot.run the stage's MLflow run
    return slot.result

The key (tasks/stage_keys.py) names everything the result depends on; a computed value is
saved under it (tasks/cache.py) with its seconds and peak memory, and a hit hands back the
saved result with `cached` set. The work runs in the stage's own frame (a `with` block, not
a callback): the path from `grpo run` to the trainer stays short.

Retries, where a retry can help: the data stage (reading sources, twice) and the base model
(a fetch or build, once); none on the filter, training or evaluation."""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext, TaskRunContext
from prefect.states import Completed

from grpo_core.modeling.gpu import stage_memory
from grpo_core.train.throughput import rss_peak
from tasks import tracking
from tasks.stage_results import StageResult

R = TypeVar("R", bound=StageResult)

RETRIES = {"data": (2, 2), "model": (1, 0)}  # kind -> (retries, delay in seconds)
TASK_NAMES = {"data": "ingest", "model": "base-model", "filter": "filter", "sft": "sft",
              "grpo": "grpo-round", "eval": "evaluate"}


def summary(result: Any, primary: str = "") -> str:
    """The key number of a stage's result (tasks/stage_results.py: its summary), then its
    throughput (GRPO) and peak memory when measured; a result of another type (the base
    model's folder) as it is."""
    return result.summary(primary) if isinstance(result, StageResult) else str(result)


def run_stage(log, name: str, kind: str, fn: Callable, *args, primary: str = "",
              reuses: str | None = None, **kwargs):
    """fn(*args, **kwargs) between a start line and an end line, as the task run `name`
    inside a flow run (plainly outside one). `reuses`: the stage whose result the cache
    holds for this one (eval/final of the model eval/round-2 evaluated): the end line says
    "reused from" it."""
    log.info("%s: started", name)
    t0 = time.perf_counter()
    task_run = None
    if FlowRunContext.get() is None:
        result = fn(*args, **kwargs)
        cached = bool(getattr(result, "cached", False))
    else:
        retries, delay = RETRIES.get(kind, (0, 0))
        # task_run_name is a str.format template over the task's parameters: escape braces
        runnable = task(fn, name=TASK_NAMES.get(kind, kind), cache_policy=NO_CACHE,
                        retries=retries, retry_delay_seconds=delay,
                        task_run_name=name.replace("{", "{{").replace("}", "}}"))
        state = runnable(*args, return_state=True, **kwargs)
        result = state.result()  # the stage's value, or its exception raised here
        cached, task_run = state.name == "Cached", state.state_details.task_run_id
    key = summary(result, primary)
    said = (f"reused from {reuses}" if reuses else "cached") if cached else "computed"
    log.info("%s: %s in %.1f s%s", name, said, time.perf_counter() - t0,
             f": {key}" if key else "", **({"extra": {"task_run_id": task_run}} if task_run else {}))
    return result


def task_result(result: R) -> R:
    """What a stage function returns: `result`; inside a task run (run_stage in a flow run)
    a result the stage cache served is returned in Prefect's `Cached` state (type
    COMPLETED), so the Prefect UI tells cached stages from computed ones."""
    if result.cached and TaskRunContext.get() is not None:
        return Completed(name="Cached", data=result, message="served from the stage cache")
    return result


@dataclass
class CacheSlot(Generic[R]):
    """A stage's cache entry while it runs: `hit` the saved result (None: compute it into
    `value`), `run` its MLflow child run, `result` what the stage returns."""

    run: str
    hit: R | None
    value: R | None = None
    result: R | None = None


@contextlib.contextmanager
def stage_cache(ctx, key: str, child: str, result_type: type[R]) -> Iterator[CacheSlot[R]]:
    """The child run `child` exists either way; on a hit from another pipeline run it gets
    the stage's numbers, once. The child run ends with the stage (FINISHED, or FAILED if
    the work raises), so its duration in MLflow is the stage's; `seconds` is what the
    stage measured itself. The work runs inside grpo_core.modeling.gpu.stage_memory (peak
    GPU memory, CUDA only: engines built inside are shut down, CUDA memory freed and the
    environment restored when the stage ends) and grpo_core.train.throughput.rss_peak
    (peak resident memory), both kept on the result and logged under system/."""
    slot: CacheSlot[R] = CacheSlot(tracking.child_run(ctx.parent_run, child),
                                   ctx.cache.get(key, result_type))
    if slot.hit is not None:
        yield slot
        hit = slot.result = slot.hit
        if not tracking.has_metrics(slot.run):
            tracking.log_metrics(slot.run, {**hit.metrics(), **hit.memory_metrics()})
            if hit.mlflow_run and hit.mlflow_run != slot.run:
                tracking.copy_artifacts(hit.mlflow_run, slot.run)
                tracking.set_tags(slot.run, {"grpo.cached_from": hit.mlflow_run})
        tracking.end_run(slot.run, only_running=True)
        return
    t0 = time.perf_counter()
    try:
        with stage_memory() as mem, rss_peak() as rss:
            yield slot
        if slot.value is None:
            raise RuntimeError(f"stage {child} computed no value")
    except BaseException:
        tracking.end_run(slot.run, "FAILED")
        raise
    value = slot.value.model_copy(update={"mlflow_run": slot.run,
                                          "seconds": round(time.perf_counter() - t0, 3),
                                          "gpu_peak_gb": mem.peak_gb, "rss_peak_gb": rss.peak_gb})
    tracking.log_metrics(slot.run, {**value.metrics(), **value.memory_metrics(),
                                    "stage/seconds": value.seconds})
    tracking.end_run(slot.run)
    ctx.cache.put(key, value)
    slot.result = value


def cached_stage(ctx, key: str, child: str, result_type: type[R],
                 compute: Callable[[str], R]) -> R:
    """`compute(child_run)` under `stage_cache` unless `key` is done: for a stage whose
    work is one call."""
    with stage_cache(ctx, key, child, result_type) as slot:
        if slot.hit is None:
            slot.value = compute(slot.run)
    return slot.result
