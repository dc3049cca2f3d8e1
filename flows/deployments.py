"""Deployment entry points: flows whose parameters are plain JSON (a config path and
overrides), so `prefect deployment run` and schedules can start them."""
from __future__ import annotations

from pathlib import Path

from flows import configure_prefect

configure_prefect()  # before prefect is imported: a worker imports this module first

from prefect import flow

from flows.compare import compare_recipes, default_recipes
from flows.pipeline import grpo_pipeline
from grpo_core.config import load_config

REPO = Path(__file__).resolve().parents[1]


def _config(path: str, overrides: list[str] | None, workdir: str | None):
    cfg = load_config(REPO / path if not Path(path).is_absolute() else path, overrides or [])
    if workdir:
        cfg.project.workdir = workdir
    return cfg


@flow(name="grpo-run-config")
def run_config(config_path: str = "configs/quickstart.yaml", overrides: list[str] | None = None,
               workdir: str | None = None) -> dict:
    """One config through the pipeline (quickstart and each recipe deploy this flow)."""
    return grpo_pipeline(_config(config_path, overrides, workdir), progress=False)


@flow(name="grpo-compare-recipes")
def compare_default(overrides: list[str] | None = None, workdir: str | None = None) -> dict:
    configs = default_recipes(overrides)
    for c in configs:
        if workdir:
            c.project.workdir = workdir
    return compare_recipes(configs, progress=False)


@flow(name="grpo-retrain")
def retrain_config(config_path: str = "configs/recipes/r1_zero.yaml", overrides: list[str] | None = None,
                   workdir: str | None = None) -> dict:
    from flows.retrain import retrain

    return retrain(_config(config_path, overrides, workdir), progress=False)
