"""Deployment entry points: flows whose parameters are plain JSON (a config path and
overrides), so `prefect deployment run` and schedules can start them.

They tell the same story as `grpo run`: each runs the pipeline's (the comparison's, the
retrain's) body in its own flow run rather than under a wrapper run, so the run a user
started is named as `grpo run` names it (`r1_zero-7ee43f68`, `compare-r1_zero-vs-sft_grpo`,
`retrain-r1_zero-7ee43f68`, not Prefect's "frisky-bat") and holds the stage task runs and
lines itself; and library warnings and third-party progress bars are off, as `grpo run`
has them (GRPO_VERBOSE=1 on the worker keeps them, as `grpo run --verbose` does).

A run that cannot start its work (no champion to retrain, a pool too small, an unreachable
MLflow: flows/refusals.py) ends Failed with that one line as its state message and log
line, no traceback; a finished run's state message is its result line, verdict or
retrain decision."""
from __future__ import annotations

import os
from pathlib import Path

from flows import configure_prefect

configure_prefect()  # before prefect is imported: a worker imports this module first
if os.environ.get("GRPO_VERBOSE", "") in ("", "0"):
    from flows.cli_common import quiet_libraries

    quiet_libraries()  # before transformers & co. are imported: they read it at import

from prefect import flow
from prefect.runtime import flow_run

from flows.compare import compare_recipes
from flows.pipeline import grpo_pipeline
from flows.recipes import default_recipes
from flows.refusals import state_or_refusal
from flows.run_view import config_run_name
from grpo_core.config import load_config

REPO = Path(__file__).resolve().parents[1]
QUICKSTART, R1_ZERO = "configs/quickstart.yaml", "configs/recipes/r1_zero.yaml"


def _config(path: str, overrides: list[str] | None, workdir: str | None):
    cfg = load_config(REPO / path if not Path(path).is_absolute() else path, overrides or [])
    if workdir:
        cfg.project.workdir = workdir
    return cfg


def _compare_configs(overrides: list[str] | None, workdir: str | None):
    configs = default_recipes(overrides)
    for c in configs:
        if workdir:
            c.project.workdir = workdir
    return configs


def _run_name(make) -> str:
    """The run's name from its parameters (Prefect calls this with the run's context set);
    a name that cannot be made keeps Prefect's generated one rather than failing the run."""
    try:
        return make(flow_run.parameters)
    except Exception:  # noqa: BLE001 - never fail a run over its name
        return flow_run.name


def _config_name(default: str, prefix: str = ""):
    return lambda: _run_name(lambda p: config_run_name(
        _config(p.get("config_path") or default, p.get("overrides"), p.get("workdir")), prefix))


def _compare_name() -> str:
    return _run_name(lambda p: "compare-" + "-vs-".join(
        c.project.recipe for c in _compare_configs(p.get("overrides"), p.get("workdir"))))


@flow(name="grpo-run-config", flow_run_name=_config_name(QUICKSTART))
def run_config(config_path: str = QUICKSTART, overrides: list[str] | None = None,
               workdir: str | None = None) -> dict:
    """One config through the pipeline (quickstart and each recipe deploy this flow)."""
    return state_or_refusal(
        lambda: grpo_pipeline.fn(_config(config_path, overrides, workdir), progress=False),
        lambda out: out.registered.get("summary") or "finished")


@flow(name="grpo-compare-recipes", flow_run_name=_compare_name)
def compare_default(overrides: list[str] | None = None, workdir: str | None = None) -> dict:
    return state_or_refusal(
        lambda: compare_recipes.fn(_compare_configs(overrides, workdir), progress=False),
        lambda out: out.get("verdict") or "compared")


@flow(name="grpo-retrain", flow_run_name=_config_name(R1_ZERO, "retrain-"))
def retrain_config(config_path: str = R1_ZERO, overrides: list[str] | None = None,
                   workdir: str | None = None) -> dict:
    from flows.retrain import retrain

    return state_or_refusal(
        lambda: retrain.fn(_config(config_path, overrides, workdir), progress=False),
        lambda out: f"{out['decided']}: {out['decision'].get('summary')}")
