"""Expected refusals: a run that cannot start (or go on with) its work for a reason the user
fixes by changing a config, the data or the order of things - not a bug. `grpo run` says
them in one line and exits 2 (1 for an unreachable MLflow); a deployment's flow run ends
Failed with the same line as its state message and in its log, which is what
`prefect deployment run --watch` prints, without a traceback (tests/test_readme_paths.py).

Nothing here imports prefect at import time (flows.deployments configures it first)."""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from grpo_core.config import ConfigError
from grpo_core.data.readers import SourceUnreadable
from grpo_core.data.source import SourceError
from grpo_core.data.stage_split import PoolExhausted
from grpo_core.data.store import StoreLockedError
from grpo_core.train.diagnosis import CollapsedStart
from tasks.preflight import PreflightError


class NoChampion(LookupError):
    """A retrain of a registered model that has no champion yet: which model, and which run
    registers it."""

    exit_code = 2


# (SourceError / SourceUnreadable, data that cannot be read, surface from the data stage's
# Prefect task, which logs its own traceback before the flow says the line.)
REFUSALS = (ConfigError, PreflightError, PoolExhausted, StoreLockedError, CollapsedStart,
            NoChampion, SourceError, SourceUnreadable)


def refusal_line(exc: BaseException) -> str:
    """The one line a refusal is said in: its message, first line only."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class _QuietRefusal(logging.Filter):
    """Prefect's flow engine logs a Failed run's end with the traceback of its own FailedRun
    ("Engine execution exited with unexpected exception", on the worker's terminal): for a
    refusal it is one line instead, the reason having been said."""

    refused: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and type(exc).__name__ == "FailedRun" and str(exc) in self.refused:
            record.exc_info, record.exc_text = None, None
            record.msg, record.args = "flow run refused: %s", (str(exc),)
        return True


def _quiet_engine(line: str) -> None:
    logger = logging.getLogger("prefect.flow_runs")
    if not any(isinstance(f, _QuietRefusal) for f in logger.filters):
        logger.addFilter(_QuietRefusal())
    _QuietRefusal.refused.add(line)


def state_or_refusal(body: Callable[[], Any], done: Callable[[Any], str] | None = None):
    """Run a deployment flow's `body`: a refusal ends the flow run Failed, state name
    "Refused", with its line as the state message (logged too: the `--watch` stream shows
    logs, not state messages);
    else Completed with `done(result)` as its message (the decision or verdict), or the
    result itself when `done` is None."""
    from prefect import get_run_logger
    from prefect.logging.handlers import APILogWorker
    from prefect.states import Completed, Failed

    try:
        out = body()
    except REFUSALS as exc:
        line = refusal_line(exc)
        get_run_logger().error("refused: %s", line)
        # sent before the state: `--watch` stops streaming at the terminal state, and a log
        # still queued then is never printed (`prefect deployment run` prints "finished in
        # state 'Refused'", the state's name, last)
        APILogWorker.drain_all(timeout=5)
        _quiet_engine(line)
        return Failed(message=line, name="Refused")
    if done is None:
        return out
    return Completed(message=done(out))  # the `final:` / `verdict:` / `retrain:` line said it
