"""How a pipeline stage runs: one orchestration layer.

A stage (tasks/stages.py) is a plain function that returns its typed result
(tasks/stage_results.py). `cached_stage` is the project's content-keyed cache around its
work: the key (tasks/stage_keys.py) names everything the result depends on, the result is
saved under it (tasks/cache.py), and a hit hands back the saved result with `cached` set.
`stage_task` is the one Prefect task a stage runs as inside a flow: a task run named by
the stage's label, whose state is `Completed` when the stage computed and `Cached`
(type COMPLETED) when the cache served it, as the Prefect UI shows it. Prefect's own
cache policy is off (NO_CACHE): why, in docs/pipeline.md ("One orchestration layer").

Retries, where a retry can help: the data stage (reading sources, twice) and the base
model (a fetch or build, once); none on the filter, training or evaluation."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext
from prefect.states import Completed

from grpo_core.modeling.gpu import stage_memory
from grpo_core.train.throughput import rss_peak
from tasks import tracking
from tasks.stage_results import StageResult

R = TypeVar("R", bound=StageResult)

RETRIES = {"data": (2, 2), "model": (1, 0)}  # kind -> (retries, delay in seconds)
TASK_NAMES = {"data": "ingest", "model": "base-model", "filter": "filter", "sft": "sft",
              "grpo": "grpo-round", "eval": "evaluate"}


@task(name="stage", cache_policy=NO_CACHE)
def stage_task(fn: Callable, *args, **kwargs):
    """`fn(*args, **kwargs)` as a task run: its result, in a `Cached` state when the
    stage cache served it."""
    result = fn(*args, **kwargs)
    if isinstance(result, StageResult) and result.cached:
        return Completed(name="Cached", data=result, message="served from the stage cache")
    return result


def run_stage_fn(kind: str, label: str, fn: Callable, *args, **kwargs) -> tuple[object, bool, Any]:
    """Run the stage `fn` of `kind` labelled `label`: inside a flow run as `stage_task`
    (named by the label), else plainly. Returns (result, served from the cache, task run id)."""
    if FlowRunContext.get() is None:
        result = fn(*args, **kwargs)
        return result, bool(getattr(result, "cached", False)), None
    retries, delay = RETRIES.get(kind, (0, 0))
    # task_run_name is a str.format template over the task's parameters: escape braces
    runnable = stage_task.with_options(
        name=TASK_NAMES.get(kind, kind), retries=retries, retry_delay_seconds=delay,
        task_run_name=label.replace("{", "{{").replace("}", "}}"))
    state = runnable(fn, *args, return_state=True, **kwargs)
    result = state.result()  # the stage's value, or its exception raised here
    return result, state.name == "Cached", state.state_details.task_run_id


def cached_stage(ctx, key: str, child: str, result_type: type[R],
                 compute: Callable[[str], R]) -> R:
    """`compute(child_run_id)` unless `key` is done. The child run exists either way; on a
    hit from another pipeline run it gets the stage's numbers, once. The child run ends
    with the stage (FINISHED, or FAILED if compute raises), so its duration in MLflow is
    the stage's; `seconds` is what the stage measured itself. `compute` runs inside
    grpo_core.modeling.gpu.stage_memory (peak GPU memory, CUDA only) and
    grpo_core.train.throughput.rss_peak (peak resident memory), both kept on the result
    and logged under system/."""
    run = tracking.child_run(ctx.parent_run, child)
    hit = ctx.cache.get(key, result_type)
    if hit is None:
        t0 = time.perf_counter()
        try:
            # Engines built inside are shut down, CUDA memory freed and the environment
            # restored when the stage ends (grpo_core.modeling.gpu).
            with stage_memory() as mem, rss_peak() as rss:
                value = compute(run)
        except BaseException:
            tracking.end_run(run, "FAILED")
            raise
        value = value.model_copy(update={"mlflow_run": run,
                                         "seconds": round(time.perf_counter() - t0, 3),
                                         "gpu_peak_gb": mem.peak_gb, "rss_peak_gb": rss.peak_gb})
        tracking.log_metrics(run, {**value.metrics(), **value.memory_metrics(),
                                   "stage/seconds": value.seconds})
        tracking.end_run(run)
        ctx.cache.put(key, value)
        return value
    if not tracking.has_metrics(run):
        tracking.log_metrics(run, {**hit.metrics(), **hit.memory_metrics()})
        if hit.mlflow_run and hit.mlflow_run != run:
            tracking.copy_artifacts(hit.mlflow_run, run)
            tracking.set_tags(run, {"grpo.cached_from": hit.mlflow_run})
    tracking.end_run(run, only_running=True)
    return hit
