"""The sharded prefill of the difficulty filter's pass-rate estimates, one door for `grpo
filter`, the pipeline and retraining. Prefect (flows.shards) is imported only when the
filter shards: a `grpo filter` that does not shard never loads it."""
from __future__ import annotations

import contextlib
import os

from flows import configure_prefect


def prefill_sharded(cfg, model: str, problems, open_store, workdir: str | os.PathLike,
                    evidence_run: str | None = None, progress: bool = False,
                    store_held: bool = False) -> list[str]:
    """With filter.shards > 1 (or train.stage_process putting the filter in its own
    process: one worker), workers estimate the missing pass rates and this process
    stores them (one writer; flows/shards.py prefill_estimates): the ids stored now, for
    the filter's `fresh`. Otherwise nothing to do: []. The one sharded prefill of `grpo
    filter`, the pipeline and retraining.

    `model`: a name or path (a built-in model is built here); `problems`: a function
    returning them, called only when sharding (the pipeline reads them from the store);
    `open_store`: opens the workspace store, closed while workers run. The shard work
    folders under `workdir` are one run's at a time: the store's pipeline lock is taken
    here unless the caller holds it (`store_held`: the pipeline and the retrain do, from
    their preflight); StoreLockedError when another process holds it."""
    from tasks.launch import own_process

    if cfg.filter.shards <= 1 and not own_process(cfg):
        return []
    from grpo_core.modeling.loading import resolve_model_path
    from grpo_core.workspace import Workspace

    configure_prefect(cfg.project.workdir)  # Prefect's home in the workspace, before import
    from flows.shards import prefill_estimates
    from tasks.preflight import hold_store

    path = resolve_model_path(model, Workspace.at(workdir).models, progress)
    with contextlib.nullcontext() if store_held else \
            hold_store(Workspace.at(workdir).db_path, cfg.data.store_lock_timeout):
        return prefill_estimates(cfg, path, problems(), open_store, workdir, evidence_run)
