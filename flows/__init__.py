"""Prefect flows and the `grpo` CLI."""
import os
import sys


def configure_prefect(workdir: str | os.PathLike | None = None) -> None:
    """Local defaults for Prefect, set before prefect is imported (it reads settings at
    import time): a longer start-up timeout for the temporary local server (10-20 s on 2
    cores), no telemetry, and PREFECT_HOME inside the workspace so nothing lands in the
    user's home unasked. An explicit environment always wins."""
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    # ... but the flows' own lines (the stage start/end lines, findings) at INFO: on the
    # terminal and in the Prefect run log ("This run didn't generate logs" otherwise).
    # The task-run logger stays at WARNING (its INFO is one "Finished in state" line per
    # stage on the terminal): flows.stage_log puts each stage's end line in its task run's
    # log instead. Sending to the API (PREFECT_LOGGING_TO_API_ENABLED) is Prefect's default,
    # and its log worker drains before the temporary server stops at exit
    # (tests/test_prefect_story.py reads the lines back).
    os.environ.setdefault("PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL", "INFO")
    # filter.shard_runner=dask: the scheduler and every worker log each start and stop at INFO
    # (read when `distributed` is imported, here and in the worker processes).
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    if "PREFECT_HOME" not in os.environ and "prefect" not in sys.modules:
        work = workdir or os.environ.get("GRPO_WORKDIR") or ".grpo"
        home = os.path.abspath(os.path.join(work, "prefect"))
        os.makedirs(home, exist_ok=True)
        os.environ["PREFECT_HOME"] = home


def prefill_sharded(cfg, model: str, problems, open_store, workdir: str | os.PathLike,
                    evidence_run: str | None = None, progress: bool = False) -> list[str]:
    """With filter.shards > 1 (or train.stage_process putting the filter in its own
    process: one worker), workers estimate the missing pass rates and this process
    stores them (one writer; flows/shards.py prefill_estimates): the ids stored now, for
    the filter's `fresh`. Otherwise nothing to do: []. The one sharded prefill of `grpo
    filter`, the pipeline and retraining.

    `model`: a name or path (a built-in model is built here); `problems`: a function
    returning them, called only when sharding (the pipeline reads them from the store);
    `open_store`: opens the workspace store, closed while workers run. Raises
    StoreLockedError when another process holds the workspace."""
    from tasks.launch import own_process

    if cfg.filter.shards <= 1 and not own_process(cfg):
        return []
    from grpo_core.modeling.loading import resolve_model_path
    from grpo_core.workspace import Workspace

    configure_prefect(cfg.project.workdir)  # Prefect's home in the workspace, before import
    from flows.shards import prefill_estimates

    path = resolve_model_path(model, Workspace.at(workdir).models, progress)
    return prefill_estimates(cfg, path, problems(), open_store, workdir, evidence_run)
