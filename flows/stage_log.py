"""One line when a pipeline stage starts and one when it ends: cached or computed, seconds
and the stage's key number, so a log reader can tell which stage is running and where the
time went. The lines go through the flow's logger: the terminal and the Prefect run log.

Also the names the Prefect UI shows: a stage's task run is named by its label (`data`,
`grpo/round-1`, `eval/final`, and its end line is in that task run's log too), a flow run
by what it runs (`r1_zero-7ee43f68`: recipe and config hash; `compare-r1_zero-vs-sft_grpo`).
Nothing here imports prefect at import time (flows.pipeline imports this module before
flows.configure_prefect has run)."""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any


def _metric(m: dict | None) -> str:
    if not m or m.get("mean") is None:
        return "n/a"
    ci = f" [{m['lo']:.3f}, {m['hi']:.3f}]" if m.get("lo") is not None else ""
    return f"{m['mean']:.3f}{ci}"


def summary(kind: str, result: Any, primary: str = "") -> str:
    """The key number of a stage's result (the dicts tasks/stages.py returns), then its
    throughput (GRPO) and peak memory (grpo_core.train.throughput) when measured."""
    if not isinstance(result, dict):
        return str(result)
    from grpo_core.train.findings import count_findings
    from grpo_core.train.throughput import format_memory, format_throughput

    figures = " | ".join(f for f in (format_throughput(result.get("throughput")),
                                     format_memory(result)) if f)
    key = _key(kind, result, primary)
    if kind in ("sft", "grpo"):
        diagnosis = result.get("diagnosis", "none")  # the rules' codes, info ones too
        # the same count as the round's page and the parent's (findings.count_findings)
        said = count_findings(result["findings"]) if result.get("findings") else ""
        return (key + (f"; {figures}" if figures else "") + (f"; {said}" if said else "")
                + (f"; diagnosis: {diagnosis}" if diagnosis != "none" else ""))
    return "; ".join(f for f in (key, figures) if f)


def _key(kind: str, result: dict, primary: str) -> str:
    if kind == "data":
        return (f"{result['pool_size']} problems in the pool, {result.get('quarantined', 0)} "
                f"quarantined, {result.get('contaminated', 0)} contaminated")
    if kind == "filter":
        kept, considered = result["kept"], result["considered"]
        share = f" ({kept / considered:.0%})" if considered else ""  # the round's kept share
        return f"kept {kept} of {considered}{share}"
    if kind in ("sft", "grpo"):
        return f"{result['steps']} steps" + (" (stopped early)" if result.get("stopped_early") else "")
    if kind == "eval":
        return ", ".join(f"{bench} {primary} {_metric(v['metrics'].get(primary))}"
                         for bench, v in result["benchmarks"].items())
    return ""


def _is_task(fn: Callable) -> bool:
    if "prefect" not in sys.modules:  # nothing imported prefect: fn cannot be a Task
        return False
    from prefect import Task

    return isinstance(fn, Task)


def named(fn: Callable, name: str) -> Callable:
    """A Prefect task whose runs are named `name` (the stage label); anything else as is."""
    if not _is_task(fn):
        return fn
    # task_run_name is a str.format template over the task's parameters: escape braces
    return fn.with_options(task_run_name=name.replace("{", "{{").replace("}", "}}"))


def run_stage(log, name: str, kind: str, fn: Callable, *args, primary: str = "", **kwargs):
    """fn(*args, **kwargs) between a start line and an end line. A Prefect task runs as a
    task run named `name`, and the end line is in its log too (the UI's task-run page)."""
    log.info("%s: started", name)
    t0 = time.perf_counter()
    extra = None
    if _is_task(fn):
        state = named(fn, name)(*args, return_state=True, **kwargs)
        extra = {"task_run_id": state.state_details.task_run_id}
        result = state.result()  # the task's value, or its exception raised here
    else:
        result = fn(*args, **kwargs)
    how = "cached" if isinstance(result, dict) and result.get("cached") else "computed"
    key = summary(kind, result, primary)
    log.info("%s: %s in %.1f s%s", name, how, time.perf_counter() - t0, f": {key}" if key else "",
             **({"extra": extra} if extra else {}))
    return result


def log_findings(log, findings: list[str]) -> None:
    """Each finding (worth a human's look) as a line of the terminal and the Prefect run
    log, where `grpo run` over both recipes shows them nowhere else: after their count by
    severity, info ones at INFO, the others at WARNING."""
    from grpo_core.train.findings import count_findings, severity_of

    if findings:
        log.info("findings: %s", count_findings(findings))
    for f in findings:
        (log.info if severity_of(f) == "info" else log.warning)("finding: %s", f)


# --------------------------------------------------------------------------- run names
# Callables for @flow(flow_run_name=...): Prefect calls them with the run's context set,
# its parameters validated (so `config` is a PipelineConfig). A name that cannot be made
# keeps Prefect's generated one rather than failing the run.

def config_run_name(cfg, prefix: str = "") -> str:
    """`<prefix><recipe>-<first 8 of the config hash>`, the hash the MLflow parent run is
    tagged with (config_hash)."""
    if isinstance(cfg, dict):
        from grpo_core.config import PipelineConfig

        cfg = PipelineConfig.model_validate(cfg)
    return f"{prefix}{cfg.project.recipe}-{cfg.hash()[:8]}"


def _named_from_parameters(make: Callable[[dict], str]) -> str:
    from prefect.runtime import flow_run

    try:
        return make(flow_run.parameters)
    except Exception:  # noqa: BLE001 - never fail a run over its name
        return flow_run.name


def pipeline_run_name() -> str:
    """grpo-pipeline: `r1_zero-7ee43f68`."""
    return _named_from_parameters(lambda p: config_run_name(p["config"]))


def retrain_run_name() -> str:
    """grpo-retrain: `retrain-r1_zero-7ee43f68` (the config's hash, as the pipeline's)."""
    return _named_from_parameters(lambda p: config_run_name(p["config"], "retrain-"))


def compare_run_name() -> str:
    """grpo-compare: `compare-r1_zero-vs-sft_grpo`."""
    def make(p: dict) -> str:
        recipes = [c["project"]["recipe"] if isinstance(c, dict) else c.project.recipe
                   for c in p["configs"]]
        return "compare-" + "-vs-".join(recipes)

    return _named_from_parameters(make)
