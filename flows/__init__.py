"""Prefect flows and the `grpo` CLI.

Prefect reads its settings at import time, so sensible local defaults are set here,
before anything imports prefect: a longer start-up timeout for the temporary local
server (10-20 s on 2 cores), no telemetry, and PREFECT_HOME inside the workspace so
nothing lands in the user's home unasked. An explicit environment always wins.
"""
import os

os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "1")
if "PREFECT_HOME" not in os.environ:
    _work = os.environ.get("GRPO_WORKDIR") or ".grpo"
    os.environ["PREFECT_HOME"] = os.path.abspath(os.path.join(_work, "prefect"))
