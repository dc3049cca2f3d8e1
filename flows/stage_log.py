"""One line when a pipeline stage starts and one when it ends: cached or computed, seconds
and the stage's key number, so a log reader can tell which stage is running and where the
time went. The lines go through the flow's logger: the terminal and the Prefect run log."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def _metric(m: dict | None) -> str:
    if not m or m.get("mean") is None:
        return "n/a"
    ci = f" [{m['lo']:.3f}, {m['hi']:.3f}]" if m.get("lo") is not None else ""
    return f"{m['mean']:.3f}{ci}"


def summary(kind: str, result: Any, primary: str = "") -> str:
    """The key number of a stage's result (the dicts tasks/stages.py returns)."""
    if not isinstance(result, dict):
        return str(result)
    if kind == "data":
        return (f"{result['pool_size']} problems in the pool, {result.get('quarantined', 0)} "
                f"quarantined, {result.get('contaminated', 0)} contaminated")
    if kind == "filter":
        return f"kept {result['kept']} of {result['considered']}"
    if kind in ("sft", "grpo"):
        return f"{result['steps']} steps" + (" (stopped early)" if result.get("stopped_early") else "")
    if kind == "eval":
        return ", ".join(f"{bench} {primary} {_metric(v['metrics'].get(primary))}"
                         for bench, v in result["benchmarks"].items())
    return ""


def run_stage(log, name: str, kind: str, fn: Callable, *args, primary: str = "", **kwargs):
    """fn(*args, **kwargs) between a start line and an end line."""
    log.info("%s: started", name)
    t0 = time.perf_counter()
    result = fn(*args, **kwargs)
    how = "cached" if isinstance(result, dict) and result.get("cached") else "computed"
    key = summary(kind, result, primary)
    log.info("%s: %s in %.1f s%s", name, how, time.perf_counter() - t0, f": {key}" if key else "")
    return result
