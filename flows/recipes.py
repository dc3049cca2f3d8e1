"""The two shipped recipes `grpo run` compares by default (no Prefect import: the CLI
validates them before anything starts)."""
from __future__ import annotations

from pathlib import Path

from grpo_core.config import PipelineConfig, load_config

RECIPES_DIR = Path(__file__).resolve().parents[1] / "configs" / "recipes"


def default_recipes(overrides: list[str] | None = None) -> list[PipelineConfig]:
    return [load_config(RECIPES_DIR / f"{name}.yaml", overrides) for name in ("r1_zero", "sft_grpo")]
