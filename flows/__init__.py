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
    # stage on the terminal): tasks.runner puts each stage's end line in its task run's
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

