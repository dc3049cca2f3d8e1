"""The sharded prefill of the difficulty filter's pass-rate estimates, one door for `grpo
filter`, the pipeline and retraining. Prefect (flows.shards) is imported only when the
filter shards: a `grpo filter` that does not shard never loads it."""
from __future__ import annotations

import os


def prefill_sharded(cfg, model: str, problems, open_store, workdir: str | os.PathLike,
                    evidence_run: str | None = None, progress: bool = False,
                    own_process: bool = False) -> list[str]:
    """With filter.shards > 1 (or train.stage_process putting the filter in its own
    process: one worker), workers estimate the missing pass rates and this process
    stores them (one writer; flows/shards.py prefill_estimates): the ids stored now, for
    the filter's `fresh`. Otherwise nothing to do: []. The one sharded prefill of `grpo
    filter`, the pipeline and retraining.

    `model`: a name or path (a built-in model is built here); `problems`: a function
    returning them, called only when sharding (the pipeline reads them from the store);
    `open_store`: opens the workspace store, closed while workers run. The shard work
    folders under `workdir` are one run's at a time: the caller holds the store's pipeline
    lock (the pipeline and the retrain from their plan, `grpo filter` itself).
    `own_process`: the run's LaunchPlan.own_process (one worker process even unsharded).
    Prefect is configured by the process's entry before this imports it."""
    if cfg.filter.shards <= 1 and not own_process:
        return []
    from flows.shards import prefill_estimates
    from grpo_core.modeling.loading import resolve_model_path
    from grpo_core.workspace import Workspace

    path = resolve_model_path(model, Workspace.at(workdir).models, progress)
    return prefill_estimates(cfg, path, problems(), open_store, workdir, evidence_run)
