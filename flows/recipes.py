"""The recipes `grpo run` compares: the two shipped ones by default, or those a config
names in `project.recipes` (no Prefect import: the CLI validates them before anything
starts)."""
from __future__ import annotations

from pathlib import Path

from grpo_core.config import PipelineConfig, load_config, recipe_config

RECIPES_DIR = Path(__file__).resolve().parents[1] / "configs" / "recipes"

# What each recipe name means on top of any config: only the SFT cold start differs
# (configs/recipes/*.yaml say the same for the built-in model).
RECIPE_SFT = {"r1_zero": False, "sft_grpo": True}


def default_recipes(overrides: list[str] | None = None) -> list[PipelineConfig]:
    return [load_config(RECIPES_DIR / f"{name}.yaml", overrides) for name in ("r1_zero", "sft_grpo")]


def expand_recipes(cfg: PipelineConfig) -> list[PipelineConfig]:
    """One config per recipe of `project.recipes` (its project.recipe_overrides merged in,
    the recipe label set, the SFT stage on for sft_grpo only, `recipes` and the overrides
    emptied so each is a plain one-recipe config); [cfg] when it names none (with the
    overrides of its own `recipe` merged in, when it has any)."""
    if not cfg.project.recipes:
        if cfg.project.recipe not in cfg.project.recipe_overrides:
            return [cfg]
        one = recipe_config(cfg, cfg.project.recipe)
        one.project.recipe_overrides = {}
        return [one]
    out = []
    for name in cfg.project.recipes:
        one = recipe_config(cfg, name)
        one.project.recipe, one.project.recipes, one.project.recipe_overrides = name, [], {}
        one.sft_stage.enabled = RECIPE_SFT[name]
        out.append(one)
    return out
